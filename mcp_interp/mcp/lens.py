"""Lens tools: reading the residual stream and the heads of one prompt — ``logit_lens``, ``dla``,
``attention``, ``induction``, ``steer``. The figure helpers here are also what ``explain`` draws."""

from __future__ import annotations

import time
from typing import Annotated

from mcp.types import CallToolResult, ResourceLink
from pydantic import Field

from mcp_interp import figures
from mcp_interp.core.engine.dictionary import SparseAutoencoder
from mcp_interp.core.engine.saelens import load_sae
from mcp_interp.core.engine.transcoder_format import load_transcoders
from mcp_interp.core.engine.transcoders import TranscoderFeature
from mcp_interp.core.features.directions import load_direction
from mcp_interp.core.lens import figures as lens_figures
from mcp_interp.core.lens.attention import attention as measure_attention
from mcp_interp.core.lens.dla import dla as measure_dla
from mcp_interp.core.lens.induction import induction as measure_induction
from mcp_interp.core.lens.logit_lens import logit_lens as measure_logit_lens
from mcp_interp.core.lens.steer import steer as steer_core
from mcp_interp.errors import InputError
from mcp_interp.mcp.toolkit import Family, ToolContext, Toolkit
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.lens import (
    AttentionMeasurement,
    AttentionResult,
    DLAMeasurement,
    DLAResult,
    InductionResult,
    LogitLensMeasurement,
    LogitLensResult,
    SteerMeasurement,
    SteerResult,
)

family = Family("lens")


async def logit_lens_figure(kit: Toolkit, measurement: LogitLensMeasurement, name: str) -> tuple[str, ResourceLink]:
    """The target's probability and rank across layers."""
    rows = measurement.layers
    layers, probs, ranks = [r.layer for r in rows], [r.target_prob for r in rows], [r.target_rank for r in rows]
    return await kit.figure(name, lens_figures.logit_lens_figure, layers, probs, ranks, measurement.target)


async def dla_figure(kit: Toolkit, measurement: DLAMeasurement, name: str) -> tuple[str, ResourceLink]:
    """Layer × head heatmap of direct contributions plus the MLPs' bars."""
    return await kit.figure(name, lens_figures.dla_figure, measurement.heads, measurement.mlps, measurement.quantity)


async def attention_figure(kit: Toolkit, measurement: AttentionMeasurement) -> tuple[str, ResourceLink]:
    """One head's query × key pattern with token labels."""
    title = f"L{measurement.layer}H{measurement.head} attention"
    return await kit.figure(title, lens_figures.attention_figure, measurement.pattern, measurement.tokens, title)


@family.tool(view="logit-lens")
async def logit_lens(
    prompt: Annotated[str, Field(description="One prompt; read at its last token.")],
    ctx: ToolContext,
    target: Annotated[str | None, Field(description="Token to track (default: the model's top-1).")] = None,
    top_k: Annotated[int, Field(ge=1, le=50, description="Top tokens listed per layer.")] = 5,
) -> Annotated[CallToolResult, LogitLensResult]:
    """Logit lens: the final norm + unembedding applied to the residual after every layer at the
    answer position — top-k tokens per layer, the target's probability and rank per layer, and the
    first layer from which it stays top-1. Figure: probability and rank across layers."""
    kit = Toolkit.of(ctx)
    model = await kit.model(ctx)
    started = time.perf_counter()
    measurement = await kit.call(measure_logit_lens, model, prompt, target, top_k)
    measurement.figure_uri, link = await logit_lens_figure(kit, measurement, f"logit lens {measurement.target!r}")
    result = kit.with_provenance(LogitLensResult, measurement, started)
    summary = (
        f"logit lens for {result.target!r}: final P = {result.final_prob:.3f}, top-1 from layer "
        f"{result.first_top1_layer}. Figure: {result.figure_uri}"
    )
    return kit.finish(result, summary, [link])


@family.tool()
async def dla(
    prompt: Annotated[str, Field(description="One prompt; read at its last token.")],
    answer: Annotated[str, Field(description="Single-token answer, e.g. ' Mary'.")],
    ctx: ToolContext,
    baseline: Annotated[
        str | None, Field(description="Single-token baseline; decomposes logit(answer) − logit(baseline).")
    ] = None,
    top_k: Annotated[int, Field(ge=1, le=100, description="Components listed in `top`.")] = 10,
) -> Annotated[CallToolResult, DLAResult]:
    """Direct logit attribution: what every attention head, every MLP and the embeddings write
    directly to logit(answer) − logit(baseline) (or logit(answer)), with the final norm's scale
    frozen from the real run. The parts sum to the measured value (see residual_error).
    Correlational, not causal. Figure: layer × head heatmap plus MLP bars."""
    kit = Toolkit.of(ctx)
    model = await kit.model(ctx)
    started = time.perf_counter()
    measurement = await kit.call(measure_dla, model, prompt, answer, baseline, top_k)
    measurement.figure_uri, link = await dla_figure(kit, measurement, f"DLA {measurement.quantity}")
    result = kit.with_provenance(DLAResult, measurement, started)
    tops = ", ".join(f"{c.component} {c.value:+.3f}" for c in result.top[:5])
    summary = f"DLA of {result.quantity} = {result.measured:+.3f}: {tops}. Figure: {result.figure_uri}"
    return kit.finish(result, summary, [link])


@family.tool(view="attention")
async def attention(
    prompt: Annotated[str, Field(description="One prompt.")],
    layer: Annotated[int, Field(description="Layer index, 0-based.")],
    head: Annotated[int, Field(description="Query-head index, 0-based.")],
    ctx: ToolContext,
) -> Annotated[CallToolResult, AttentionResult]:
    """Attention pattern of one head (query × key, token labels) and the tokens the answer
    position attends to most, with weights."""
    kit = Toolkit.of(ctx)
    model = await kit.model(ctx)
    started = time.perf_counter()
    measurement = await kit.call(measure_attention, model, prompt, layer, head)
    measurement.figure_uri, link = await attention_figure(kit, measurement)
    result = kit.with_provenance(AttentionResult, measurement, started)
    tops = ", ".join(f"{t.token!r}@{t.position} {t.weight:.2f}" for t in result.top_attended)
    return kit.finish(result, f"L{layer}H{head} at the answer position attends to: {tops}", [link])


@family.tool(view="heads-heatmap")
async def induction(
    ctx: ToolContext,
    seq_len: Annotated[int, Field(ge=2, le=512, description="Length of the random sequence (repeated once).")] = 50,
    n_seqs: Annotated[int, Field(ge=1, le=64, description="Number of random sequences.")] = 8,
    seed: Annotated[int, Field(description="Seed of the random tokens (CPU generator).")] = 0,
) -> Annotated[CallToolResult, InductionResult]:
    """Induction score of every head: on random tokens repeated twice, the mean attention from each
    token of the second copy to the token after its earlier occurrence. Heatmap; heads sorted."""
    kit = Toolkit.of(ctx)
    model = await kit.model(ctx)
    started = time.perf_counter()
    measurement = await kit.call(measure_induction, model, seq_len, n_seqs, seed)
    measurement.figure_uri, link = await kit.figure(
        "induction scores", figures.layer_head_heatmap, measurement.scores, "induction score", "score", 0.0
    )
    result = kit.with_provenance(InductionResult, measurement, started)
    tops = ", ".join(f"{c.component} {c.value:.3f}" for c in result.heads[:5])
    return kit.finish(result, f"top induction heads: {tops}. Figure: {result.figure_uri}", [link])


def steered_feature(
    model: LoadedModel, sae: str | None, transcoders: str | None, layer: int | None, feature: int | None
) -> tuple[SparseAutoencoder, int] | TranscoderFeature | None:
    """The SAE or transcoder feature `steer` was given, or None."""
    if sae is not None and transcoders is not None:
        raise InputError("Give `sae` or `transcoders` (with `feature`), not both.")
    if transcoders is not None:
        if feature is None or layer is None:
            raise InputError("Give `transcoders`, `layer` and `feature` to steer along a transcoder feature.")
        loaded = load_transcoders(transcoders, model)
        if not 0 <= layer < loaded.n_layers:
            raise InputError(f"layer {layer} does not exist; the transcoders have layers 0..{loaded.n_layers - 1}.")
        return TranscoderFeature(loaded, layer, feature)
    if (sae is None) != (feature is None):
        raise InputError("Give both `sae` (the folder) and `feature` (its id) to steer along an SAE feature.")
    return None if sae is None or feature is None else (load_sae(sae, model), feature)


@family.tool()
async def steer(
    prompt: Annotated[str, Field(description="Prompt to continue.")],
    coefficient: Annotated[
        float,
        Field(
            description="Multiplier of the steering vector. With `direction`: in units of the spread (std) of its "
            "probe texts' projections — the direction's `projection_gap` is how far apart its two classes sit."
        ),
    ],
    ctx: ToolContext,
    positive: Annotated[str | None, Field(description="ActAdd: text whose direction to add, e.g. 'Love'.")] = None,
    negative: Annotated[str | None, Field(description="ActAdd: text whose direction to subtract, e.g. 'Hate'.")] = None,
    layer: Annotated[
        int | None,
        Field(description="ActAdd: block whose input residual is steered. With `direction`: default its own layer."),
    ] = None,
    direction: Annotated[
        str | None,
        Field(description="A stored direction 'direction://…' from `probe`, added to resid_post of its layer."),
    ] = None,
    sae: Annotated[
        str | None, Field(description="With `feature`: a local SAELens-format folder whose feature to steer along.")
    ] = None,
    feature: Annotated[
        int | None,
        Field(description="An SAE feature id: coefficient × its decoder row is added at the SAE's hook."),
    ] = None,
    transcoders: Annotated[
        str | None,
        Field(
            description="With `layer` and `feature`: a transcoder set (circuit-tracer format) whose layer-`layer` "
            "feature to steer along: coefficient × its decoder row is added to the MLP write(s) it feeds."
        ),
    ] = None,
    max_new_tokens: Annotated[int, Field(ge=1, description="Tokens to generate (server limit applies).")] = 20,
    seed: Annotated[int, Field(description="Seed of the random-direction comparison; decoding is greedy.")] = 0,
) -> SteerResult:
    """Steer generation and compare greedy continuations with and without it: activation addition
    (coefficient × (resid(positive) − resid(negative)) at `layer`'s input), a probe's stored `direction`, or an SAE
    `feature`'s decoder direction.
    Also measures how far the next-token distribution moves (KL) against 5 random directions of the same norm;
    `notes` say when the steered text only degenerates (repetition) rather than shifting meaning."""
    kit = Toolkit.of(ctx)

    def measure(model: LoadedModel) -> SteerMeasurement:
        stored = load_direction(direction, kit.direction_lookup, model) if direction is not None else None
        chosen = steered_feature(model, sae, transcoders, layer, feature)
        act_add_layer = None if transcoders is not None else layer
        return steer_core(
            model,
            prompt,
            positive,
            negative,
            act_add_layer,
            coefficient,
            max_new_tokens,
            seed,
            stored,
            direction,
            chosen,
        )

    return await kit.run(ctx, SteerResult, measure)
