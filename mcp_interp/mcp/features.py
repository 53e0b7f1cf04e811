"""Feature tools: ``probe`` (linear probes with controls; each layer's direction stored as ``direction://``),
the ``direction://`` resource that interventions (``ablate``, every ``intervention``, ``steer``) accept, and
``sae`` / ``sae_features`` (sparse-autoencoder features from SAELens-format folders). The science is in
``core/features/``."""

from __future__ import annotations

import time
from typing import Annotated, Literal

from mcp.types import CallToolResult
from pydantic import Field

from mcp_interp.core.features import figures as features_figures
from mcp_interp.core.features.directions import encode_direction
from mcp_interp.core.features.probe_job import ProbeJob
from mcp_interp.core.features.sae_report import SaeFeaturesJob, sae_report
from mcp_interp.mcp.arguments import Background
from mcp_interp.mcp.toolkit import Family, ToolContext, Toolkit, tool_arguments
from mcp_interp.schemas.features import ProbeResult
from mcp_interp.schemas.sae import SaeFeaturesResult, SaeResult

family = Family("features")


@family.tool(background=True)
async def probe(
    texts: list[str],
    labels: Annotated[list[str | int | bool], Field(description="One per text, 2 distinct values.")],
    ctx: ToolContext,
    layers: Annotated[list[int] | None, Field(description="resid_post of these layers; default all.")] = None,
    position: Annotated[Literal["last", "mean"] | int, Field(description="Token read, or the mean.")] = "last",
    method: Annotated[
        Literal["logistic", "diff_means"],
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
        row.direction_uri, _ = kit.store("direction", encode_direction(direction), f"probe direction L{row.layer}")
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
        f"{high:.3f}]) on {result.n_test} texts, chance {result.chance:.3f}."
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
