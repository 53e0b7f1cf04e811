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
from mcp_interp.core.features.sae_report import sae_feature_activations, sae_report
from mcp_interp.mcp.toolkit import Family, ToolContext, Toolkit, tool_arguments
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.features import ProbeResult
from mcp_interp.schemas.sae import SaeFeaturesMeasurement, SaeFeaturesResult, SaeResult

family = Family("features")


@family.tool()
async def probe(
    texts: Annotated[list[str], Field(description="Texts to read, e.g. 'The dogs near the river'.")],
    labels: Annotated[
        list[str | int | bool],
        Field(description="One label per text, exactly 2 distinct values, e.g. 'singular' / 'plural'."),
    ],
    ctx: ToolContext,
    layers: Annotated[
        list[int] | None, Field(description="Layers whose output residual (resid_post) to probe; default all.")
    ] = None,
    position: Annotated[
        Literal["last", "mean"] | int,
        Field(description="Where to read each text: 'last' token, 'mean' over tokens, or a token index (−1 = last)."),
    ] = "last",
    method: Annotated[
        Literal["logistic", "diff_means"],
        Field(
            description="logistic: scikit-learn LogisticRegression (lbfgs, L2, C=1) on standardised residuals; "
            "diff_means: direction = difference of the class means (often the better one to intervene on), "
            "accuracy from those means under the shared covariance (LDA with shrinkage)."
        ),
    ] = "logistic",
    test_fraction: Annotated[float, Field(description="Fraction of texts held out (stratified), 0..1.")] = 0.25,
    seed: Annotated[int, Field(description="Seed of the split and the control tasks.")] = 0,
    control: Annotated[
        bool,
        Field(
            description="Also fit a control task (Hewitt & Liang word-identity labels when the labels are word-level, "
            "else shuffled labels) and report selectivity = accuracy − control accuracy."
        ),
    ] = True,
) -> Annotated[CallToolResult, ProbeResult]:
    """Linear probe of the residual stream, per layer, from one forward pass: held-out accuracy with an exact
    95 % interval, a control task and selectivity, and the fitted direction stored as direction://… (a unit
    vector in that layer's resid_post) for `ablate` ({layer, direction: 'direction://…'}), any `intervention`,
    and `steer(direction=...)`. Accuracy alone does not show the model uses a direction: ablate it and compare
    with the random directions the result reports."""
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
    best = next(r for r in result.layers if r.layer == result.best_layer)
    selectivity = "" if best.selectivity is None else f", selectivity {best.selectivity:+.3f} ({result.control_kind})"
    summary = (
        f"probe: best layer {best.layer}, held-out accuracy {best.accuracy:.3f} [{best.ci_low:.3f}, "
        f"{best.ci_high:.3f}] on {result.n_test} texts (chance {result.chance:.3f}){selectivity}. Direction: "
        f"{best.direction_uri}. Figure: {result.figure_uri}"
    )
    return kit.finish(result, summary, links)


SaeFolder = Annotated[
    str,
    Field(
        description="A local folder in SAELens' format: cfg.json (architecture standard / jumprelu / topk, d_in, "
        "d_sae, hook_name such as 'blocks.12.hook_resid_post', model_name) and sae_weights.safetensors; or a hub id "
        "'org/repo/subfolder' already in the Hugging Face cache."
    ),
]


@family.tool()
async def sae(
    text: Annotated[str, Field(description="One text to encode, token by token.")],
    sae: SaeFolder,
    ctx: ToolContext,
    top_k: Annotated[int, Field(description="Features to list per token, by activation (1 to 100).")] = 10,
) -> Annotated[CallToolResult, SaeResult]:
    """Sparse-autoencoder features of one text: per token the top-k active features, and the SAE's quality on
    this text — fraction of variance explained, L0, and the next-token loss with the SAE's reconstruction spliced
    in at its hook, next to the clean and zero-ablation losses (loss recovered). Check quality before trusting
    its features. A token × feature heatmap as a figure."""
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
    texts: Annotated[list[str], Field(description="Texts to encode.")],
    sae: SaeFolder,
    features: Annotated[list[int], Field(description="Feature ids (0..d_sae-1), at most 256.")],
    ctx: ToolContext,
) -> SaeFeaturesResult:
    """The requested SAE features' activations on every token of every text, their maximum per text (and where),
    and how often each fires."""

    def measure(model: LoadedModel) -> SaeFeaturesMeasurement:
        return sae_feature_activations(model, texts, sae, features)

    return await Toolkit.of(ctx).run(ctx, SaeFeaturesResult, measure)


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
