"""Feature tools: ``probe`` (linear probes with controls; each layer's direction stored as ``direction://``),
the ``direction://`` resource that interventions (``ablate``, every ``intervention``, ``steer``) accept, and
``sae`` / ``sae_features`` (sparse-autoencoder features from SAELens-format folders), and feature naming:
``feature_examples`` (what makes a neuron, direction, SAE or transcoder feature fire) and ``score_explanation`` (an
assistant's explanation scored on texts it writes or predicts; quizzes kept as ``quiz://`` with their truth hidden until
scored, scores as ``explanation://``). The science is in ``core/features/``."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field, WithJsonSchema

from mcp_interp.core.features import figures as features_figures
from mcp_interp.core.features.examples import FeatureExamplesJob
from mcp_interp.core.features.explanations import ScoreExplanationJob
from mcp_interp.core.features.probe_job import ProbeJob
from mcp_interp.core.features.sae_report import SaeFeaturesJob, sae_report
from mcp_interp.errors import InputError
from mcp_interp.mcp.arguments import Background
from mcp_interp.mcp.family import Family
from mcp_interp.mcp.toolkit import ToolContext, Toolkit, error_boundary, tool_arguments
from mcp_interp.schemas.features import ProbeMethod, ProbeResult
from mcp_interp.schemas.naming import (
    FEATURE_DESCRIPTION,
    FeatureExamplesResult,
    FeatureSpec,
    ScoredExplanation,
    ScoreExplanationResult,
)
from mcp_interp.schemas.sae import SaeFeaturesResult, SaeResult
from mcp_interp.state.store import parse_uri

family = Family("features")


@family.tool(background=True)
async def probe(
    texts: list[str],
    labels: Annotated[list[str | int | bool], Field(description="One per text, 2 distinct values.")],
    ctx: ToolContext,
    layers: Annotated[list[int] | None, Field(description="resid_post of these layers; default all.")] = None,
    position: Annotated[Literal["last", "mean"] | int, Field(description="Token read, or the mean.")] = "last",
    method: Annotated[
        ProbeMethod,
        Field(description="logistic regression, or the class means' difference (classified with LDA)."),
    ] = "logistic",
    test_fraction: Annotated[float, Field(description="Held out.")] = 0.25,
    seed: Annotated[int, Field(description="Seed of the split and the controls.")] = 0,
    control: Annotated[bool, Field(description="Run the controls.")] = True,
    control_draws: Annotated[int, Field(description="Most draws per control (stops early), 19 to 1000.")] = 200,
    groups: Annotated[list[str | int] | None, Field(description="One id per text; groups held out whole.")] = None,
    background: Background = False,
) -> Annotated[CallToolResult, ProbeResult]:
    """Linear probes of resid_post per layer: held-out accuracy, shuffled-label and (labels a function of a token or
    group) type-keyed controls with p-values, selectivity; directions stored as direction://."""
    arguments = tool_arguments(locals())
    kit = Toolkit.of(ctx)
    job, started = await kit.measured_job(
        ctx,
        lambda model: ProbeJob(model=model, **arguments),
    )
    measurement = job.result
    assert measurement is not None
    links = []
    for row, direction in zip(measurement.layers, job.directions, strict=True):
        row.direction_uri, _ = kit.store(
            "direction", direction.model_dump_json().encode(), f"probe direction L{row.layer}"
        )
    rows = measurement.layers
    title = f"probe ({method}, position {position!r}): {' vs '.join(measurement.labels)} — {job.model.name}"
    measurement.figure_uri, link = await kit.figure(
        title,
        features_figures.probe_accuracy,
        [r.layer for r in rows],
        [r.accuracy for r in rows],
        [r.ci_low for r in rows],
        [r.ci_high for r in rows],
        [r.control_accuracy for r in rows],
        measurement.chance,
        title,
    )
    links.append(link)
    result = kit.with_provenance(ProbeResult, measurement, started)
    return kit.finish(result, probe_summary(result), links)


def probe_summary(result: ProbeResult) -> str:
    """The best layer's accuracy and, from the family-wise p-values only, whether it beats chance and is selective."""
    best = next(r for r in result.layers if r.layer == result.best_layer)
    low, high = result.best_ci_adjusted
    text = (
        f"probe: best layer {best.layer}, held-out accuracy {best.accuracy:.3f} (Bonferroni interval [{low:.3f}, "
        f"{high:.3f}]) on {result.n_test} texts, chance {result.chance:.3f}. Directions point toward "
        f"{result.points_to!r} (from {result.labels[0]!r})."
    )
    if best.selectivity is not None and best.selectivity_ci is not None and best.selectivity_p is not None:
        control = "type-keyed control" if result.control_kind == "type_keyed" else "shuffled-label control"
        key = f" on {result.control_key}" if result.control_key else ""
        layers = len(result.layers)
        verdict = "selective" if best.layer in result.layers_selective else "not shown selective"
        text += (
            f" Selectivity over the {control}{key}: {best.selectivity:+.3f} [{best.selectivity_ci[0]:+.3f}, "
            f"{best.selectivity_ci[1]:+.3f}], family-wise p = {best.selectivity_p:.3g} over {layers} layers "
            f"({verdict}). Family-wise: beat chance {len(result.layers_beating_chance)}, selective "
            f"{len(result.layers_selective)} of {layers}."
        )
    return f"{text} Direction: {best.direction_uri}. Figure: {result.figure_uri}"


SaeFolder = Annotated[
    str,
    Field(description="An SAELens-format folder (cfg.json + sae_weights.safetensors) or a cached hub id org/repo/sub."),
]


@family.tool()
async def sae(
    text: str,
    sae: SaeFolder,
    ctx: ToolContext,
    top_k: Annotated[int, Field(description="Features per token (1 to 100).")] = 10,
) -> Annotated[CallToolResult, SaeResult]:
    """An SAE on one text: the top features per token, fraction of variance explained, L0, and the loss with the
    reconstruction spliced in (clean and zero-ablation beside it)."""
    kit = Toolkit.of(ctx)
    model = await kit.model(ctx)
    started = time.perf_counter()
    measurement, heatmap = await kit.call(sae_report, model, text, sae, top_k)
    measurement.figure_uri, link = await kit.figure(
        heatmap.title,
        features_figures.token_feature_heatmap,
        heatmap.values,
        heatmap.tokens,
        heatmap.features,
        heatmap.title,
    )
    result = kit.with_provenance(SaeResult, measurement, started)
    fve = "n/a" if result.fraction_variance_explained is None else f"{result.fraction_variance_explained:.3f}"
    recovered = "n/a" if result.loss_recovered is None else f"{result.loss_recovered:.3f}"
    summary = (
        f"sae on {len(result.tokens)} tokens: L0 {result.l0:.1f}, fraction of variance explained {fve}, "
        f"loss recovered {recovered}. Figure: {result.figure_uri}"
    )
    return kit.finish(result, summary, [link])


@family.tool()
async def sae_features(
    texts: list[str],
    sae: SaeFolder,
    features: Annotated[list[int], Field(description="At most 256.")],
    ctx: ToolContext,
) -> Annotated[CallToolResult, SaeFeaturesResult]:
    """Chosen SAE features on every token of every text: activations, the maximum per text, how often each fires."""

    kit = Toolkit.of(ctx)
    job, started = await kit.measured_job(
        ctx, lambda model: SaeFeaturesJob(model=model, texts=texts, sae=sae, features=features)
    )
    assert job.result is not None
    result = kit.with_provenance(SaeFeaturesResult, job.result, started)

    fires = ", ".join(f"{f.feature}: {f.active_fraction:.2f}" for f in result.features[:10])
    return kit.finish(
        result, f"sae_features on {len(result.texts)} texts; fraction of tokens where each fires: {fires}.", []
    )


@family.resource(
    "direction://{direction_id}",
    name="direction",
    description="A unit direction in one layer's output residual stream (JSON: layer, position rule, vector, norm, "
    "projection statistics, model fingerprint, data hash), from `probe`. Pass its URI as "
    "{layer, direction: 'direction://…'} to `ablate` or any `intervention`, or to `steer(direction=…)`.",
    mime_type="application/json",
)
def direction(direction_id: str, ctx: ToolContext) -> str:
    return Toolkit.of(ctx).read("direction", direction_id).decode("utf-8")


# Published by shape only (validated in full when a call arrives, extra keys refused): the three reference types'
# definitions, inlined in two tools, were 2.5 KB of the model-facing definitions; the description names every form.
FeatureArgument = Annotated[
    FeatureSpec, WithJsonSchema({"type": ["string", "object"]}), Field(description=FEATURE_DESCRIPTION)
]
# score_explanation stores quizzes and scores and marks a quiz scored (a second scoring is refused): not read-only, not
# idempotent, nothing destroyed.
FILES_SCORES = ToolAnnotations(
    read_only_hint=False, idempotent_hint=False, open_world_hint=False, destructive_hint=False
)
Corpus = Annotated[str | None, Field(description="Shipped: 'wordnet_examples' (default), 'lens_corpus'.")]


@family.tool(background=True)
async def feature_examples(
    feature: FeatureArgument,
    ctx: ToolContext,
    texts: Annotated[list[str] | None, Field(description="Instead of the corpus.")] = None,
    corpus: Corpus = None,
    top_k: Annotated[int, Field(description="1 to 50.")] = 10,
    window: Annotated[int, Field(description="Tokens each side of the max, 0 to 64.")] = 8,
    background: Background = False,
) -> Annotated[CallToolResult, FeatureExamplesResult]:
    """What makes a feature fire: top corpus texts by max activation with per-token activations, quantiles, firing
    rate, output tokens, explanations scored so far."""
    kit = Toolkit.of(ctx)
    job, started = await kit.measured_job(
        ctx,
        lambda model: FeatureExamplesJob(
            model=model,
            feature=feature,
            texts=texts,
            corpus=corpus,
            top_k=top_k,
            window=window,
            lookup=kit.direction_lookup,
        ),
    )
    measurement, complete = job.result, job.complete
    assert measurement is not None and complete is not None
    measurement.examples_uri, link = kit.store("result", json.dumps(complete).encode(), "feature examples")
    documents = explanation_documents(kit, measurement.feature.key, job.model.fingerprint)
    measurement.explanations = [summary for _, summary in documents]
    result = kit.with_provenance(FeatureExamplesResult, measurement, started)
    top = result.examples[0]
    text = (
        f"feature_examples {result.feature.key} on {result.corpus.n_texts} texts ({result.corpus.name}): top "
        f"{top.max_activation:.4g} at {top.max_token!r} in {top.text[:80]!r}; {result.firing.texts_firing:.1%} of "
        f"texts fire (> {result.firing.threshold:.4g}); {len(result.explanations)} explanations scored so far."
    )
    return kit.finish(result, text, [link])


def explanation_documents(kit: Toolkit, key: str, fingerprint: str) -> list[tuple[dict[str, Any], ScoredExplanation]]:
    """Every stored explanation of the feature ``key`` on these weights, newest first (read from disk without
    refreshing the store's least-recently-used order)."""
    store = kit.workspace.store
    found = []
    for entry in reversed(store.ids("explanation")):
        try:
            document = json.loads(store.path("explanation", entry).read_bytes())
        except (OSError, ValueError):
            continue  # evicted meanwhile, or unreadable
        if document.get("feature", {}).get("key") != key or document.get("model_fingerprint") != fingerprint:
            continue
        generation, detection = document.get("generation") or {}, document.get("detection") or {}
        summary = ScoredExplanation(
            explanation_uri=f"explanation://{entry}",
            explanation=document["explanation"],
            created=document["created"],
            auroc=generation.get("auroc"),
            auroc_p=generation.get("p_value"),
            auroc_p_floor=generation.get("p_floor"),
            balanced_accuracy=detection.get("balanced_accuracy"),
            detection_p=detection.get("p_value"),
            detection_p_floor=detection.get("p_floor"),
        )
        found.append((document, summary))
    return sorted(found, key=lambda pair: pair[1].created, reverse=True)


def quiz_record(kit: Toolkit, quiz_id: str | None) -> tuple[str | None, dict[str, Any] | None]:
    """The stored quiz behind ``quiz_id`` ('quiz://…' or its 32 hex digits) as (its id, its document)."""
    if quiz_id is None:
        return None, None
    uri = quiz_id if "://" in str(quiz_id) else f"quiz://{quiz_id}"
    try:
        entry = parse_uri(uri, "quiz").id
    except LookupError as exc:
        raise InputError(str(exc)) from None
    record: dict[str, Any] = json.loads(kit.read_entry("quiz", entry))
    return entry, record


@family.tool(annotations=FILES_SCORES)
async def score_explanation(
    feature: FeatureArgument,
    explanation: str,
    ctx: ToolContext,
    activating_texts: list[str] | None = None,
    non_activating_texts: list[str] | None = None,
    quiz: Annotated[int | None, Field(description="Texts to draw, 4–100.")] = None,
    texts: Annotated[list[str] | None, Field(description="Quiz pool instead of the corpus.")] = None,
    corpus: Corpus = None,
    threshold: Annotated[float | None, Field(description="Fires: max > this.")] = None,
    seed: int | None = None,
    quiz_id: str | None = None,
    predictions: Annotated[list[bool] | None, Field(description="Per quiz text, in order.")] = None,
) -> Annotated[CallToolResult, ScoreExplanationResult]:
    """Score an explanation: AUROC of texts you wrote (generation); `quiz` draws held-out texts to predict, `quiz_id`
    + `predictions` scores them (balanced accuracy, p) and reveals the truth."""
    arguments = tool_arguments(locals())
    kit = Toolkit.of(ctx)
    with error_boundary():
        entry, record = quiz_record(kit, quiz_id)
    arguments["quiz_id"] = None if entry is None else f"quiz://{entry}"
    fingerprint = kit.host.model_ref().fingerprint

    def history(key: str) -> list[dict[str, Any]]:
        return [document for document, _ in explanation_documents(kit, key, fingerprint)]

    job, started = await kit.measured_job(
        ctx,
        lambda model: ScoreExplanationJob(
            model=model,
            **arguments,
            lookup=kit.direction_lookup,
            quiz_record=record,
            history=history,
        ),
    )
    measurement, links = job.result, []
    assert measurement is not None
    if job.quiz_document is not None and measurement.quiz is not None:
        measurement.quiz.quiz_id, link = kit.store("quiz", json.dumps(job.quiz_document).encode(), "detection quiz")
        links.append(link)
    if job.explanation_document is not None:
        document = {**job.explanation_document, "quiz_uri": None if entry is None else f"quiz://{entry}"}
        measurement.explanation_uri, link = kit.store("explanation", json.dumps(document).encode(), "explanation")
        links.append(link)
        if entry is not None and record is not None:
            record["scored_by"] = measurement.explanation_uri
            kit.workspace.store.replace("quiz", entry, json.dumps(record).encode(), [measurement.explanation_uri])
    result = kit.with_provenance(ScoreExplanationResult, measurement, started)
    parts = [f"score_explanation {result.feature.key}:"]
    if result.generation is not None:
        parts.append(f"generation: {result.generation.verdict}.")
    if result.quiz is not None:
        parts.append(
            f"quiz {result.quiz.quiz_id}: predict for each of its {len(result.quiz.texts)} texts whether the "
            f"feature fires (max > {result.threshold:.4g}), then call again with quiz_id and predictions."
        )
    if result.detection is not None:
        parts.append(f"detection: {result.detection.verdict}.")
    if result.explanation_uri is not None:
        parts.append(f"Stored as {result.explanation_uri}.")
    return kit.finish(result, " ".join(parts), links)


@family.resource(
    "explanation://{explanation_id}",
    name="explanation",
    description="An explanation of a feature with its scores (score_explanation): the feature, the model, the "
    "explanation, the generation score with every text's activation, the detection quiz's truth and predictions.",
    mime_type="application/json",
)
def explanation_resource(explanation_id: str, ctx: ToolContext) -> str:
    return Toolkit.of(ctx).read("explanation", explanation_id).decode("utf-8")


@family.resource(
    "quiz://{quiz_id}",
    name="quiz",
    description="A detection quiz (score_explanation): the feature, its texts and threshold. Which texts fire stays "
    "hidden until the quiz is scored (then `scored_by` names the explanation:// holding the truth).",
    mime_type="application/json",
)
def quiz_resource(quiz_id: str, ctx: ToolContext) -> str:
    record = json.loads(Toolkit.of(ctx).read("quiz", quiz_id))
    if not record.get("scored_by"):
        record = {k: v for k, v in record.items() if k not in ("fires", "max_activations")}
    return json.dumps(record)
