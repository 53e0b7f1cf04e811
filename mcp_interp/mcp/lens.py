"""Lens tools: reading the residual stream and the heads of one prompt — ``logit_lens``, ``dla``,
``attention``, ``induction``, ``steer``. Their figures are ``core/lens/figures``' plots, which ``explain`` draws too."""

from __future__ import annotations

import time
from typing import Annotated

from mcp.types import CallToolResult
from pydantic import Field

import mcp_interp.figures as figures
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.lens.attention import attention as measure_attention
from mcp_interp.core.lens.dla import dla as measure_dla
from mcp_interp.core.lens.figures import attention_plot, dla_plot, logit_lens_plot
from mcp_interp.core.lens.induction import induction as measure_induction
from mcp_interp.core.lens.logit_lens import layer_label
from mcp_interp.core.lens.logit_lens import logit_lens as measure_logit_lens
from mcp_interp.core.lens.steer import SteerJob, steer_job
from mcp_interp.mcp.arguments import MostRandomDraws
from mcp_interp.mcp.family import Family
from mcp_interp.mcp.toolkit import ToolContext, Toolkit
from mcp_interp.schemas.lens import (
    AttentionResult,
    DLAResult,
    InductionResult,
    LogitLensResult,
    SteerResult,
)

family = Family("lens")


@family.tool(view="logit-lens")
async def logit_lens(
    prompt: str,
    ctx: ToolContext,
    target: Annotated[str | None, Field(description="Default: the model's top-1.")] = None,
    top_k: Annotated[int, Field(ge=1, le=50)] = 5,
) -> Annotated[CallToolResult, LogitLensResult]:
    """The final norm and unembedding after every layer at the answer: top tokens, the target's probability and
    rank per layer, the first layer from which it stays top-1."""
    kit = Toolkit.of(ctx)
    model = await kit.model(ctx)
    started = time.perf_counter()
    measurement = await kit.call(measure_logit_lens, model, prompt, target, top_k)
    measurement.figure_uri, link = await kit.draw(logit_lens_plot(measurement, f"logit lens {measurement.target!r}"))
    result = kit.with_provenance(LogitLensResult, measurement, started)
    first = result.first_top1_layer
    settled = "never top-1 to the end" if first is None else f"top-1 from layer {layer_label(first)} on"
    summary = f"logit lens for {result.target!r}: final P = {result.final_prob:.3f}, {settled}. Figure: "
    summary += str(result.figure_uri)
    return kit.finish(result, summary, [link])


@family.tool()
async def dla(
    prompt: str,
    answer: Annotated[str, Field(description="One token, e.g. ' Mary'.")],
    ctx: ToolContext,
    baseline: Annotated[str | None, Field(description="One token: decomposes logit(answer) − logit(baseline).")] = None,
    top_k: Annotated[int, Field(ge=1, le=100)] = 10,
) -> Annotated[CallToolResult, DLAResult]:
    """Direct logit attribution: what each head, MLP and the embeddings write to logit(answer) [− logit(baseline)],
    the final norm's scale frozen; the parts sum to the measured value. Correlational."""
    kit = Toolkit.of(ctx)
    model = await kit.model(ctx)
    started = time.perf_counter()
    measurement = await kit.call(measure_dla, model, prompt, answer, baseline, top_k)
    measurement.figure_uri, link = await kit.draw(dla_plot(measurement, f"DLA {measurement.quantity}"))
    result = kit.with_provenance(DLAResult, measurement, started)
    tops = ", ".join(f"{c.component} {c.value:+.3f}" for c in result.top[:5])
    summary = f"DLA of {result.quantity} = {result.measured:+.3f}: {tops}. Figure: {result.figure_uri}"
    return kit.finish(result, summary, [link])


@family.tool(view="attention")
async def attention(
    prompt: str,
    head: Annotated[int | str, Field(description="'L9H3', or a query head's index within `layer`.")],
    ctx: ToolContext,
    layer: Annotated[int | None, Field(description="Needed when `head` is an index.")] = None,
) -> Annotated[CallToolResult, AttentionResult]:
    """One head's attention pattern and what the answer position attends to."""
    kit = Toolkit.of(ctx)
    model = await kit.model(ctx)
    started = time.perf_counter()
    measurement = await kit.call(measure_attention, model, prompt, layer, head)
    measurement.figure_uri, link = await kit.draw(attention_plot(measurement))
    result = kit.with_provenance(AttentionResult, measurement, started)
    tops = ", ".join(f"{t.token!r}@{t.position} {t.weight:.2f}" for t in result.top_attended)
    return kit.finish(result, f"L{result.layer}H{result.head} at the answer position attends to: {tops}", [link])


@family.tool(view="heads-heatmap")
async def induction(
    ctx: ToolContext,
    seq_len: Annotated[int, Field(ge=2, le=512, description="Random tokens, repeated once.")] = 50,
    n_seqs: Annotated[int, Field(ge=1, le=64)] = 8,
    seed: int = 0,
    prefix: Annotated[
        str | None, Field(description="Text before every sequence, e.g. 'Words:' (an attention sink).")
    ] = None,
) -> Annotated[CallToolResult, InductionResult]:
    """Induction score of every head on random tokens repeated twice (attention to the token after the earlier
    copy); returns the token ids and the positions to pass to `loss`."""
    kit = Toolkit.of(ctx)
    model = await kit.model(ctx)
    started = time.perf_counter()
    measurement = await kit.call(measure_induction, model, seq_len, n_seqs, seed, prefix)
    measurement.figure_uri, link = await kit.figure(
        "induction scores", figures.layer_head_heatmap, measurement.scores, "induction score", "score", 0.0
    )
    result = kit.with_provenance(InductionResult, measurement, started)
    tops = ", ".join(f"{c.component} {c.value:.3f}" for c in result.heads[:5])
    return kit.finish(result, f"top induction heads: {tops}. Figure: {result.figure_uri}", [link])


@family.tool()
async def steer(
    prompt: str,
    coefficient: Annotated[
        float, Field(description="× the vector; with `direction`, in units of its probe texts' projection std.")
    ],
    ctx: ToolContext,
    positive: Annotated[str | None, Field(description="ActAdd: text added, e.g. 'Love'.")] = None,
    negative: Annotated[str | None, Field(description="ActAdd: text subtracted, e.g. 'Hate'.")] = None,
    layer: Annotated[
        int | None, Field(description="ActAdd: the block whose input is steered (default ⌊L/3⌋); or the transcoder's.")
    ] = None,
    direction: Annotated[
        str | list[float] | None,
        Field(description="'direction://…' from `probe` (at its resid_post), or d_model floats with `layer`."),
    ] = None,
    sae: Annotated[str | None, Field(description="With `feature`: an SAELens-format folder.")] = None,
    feature: Annotated[int | None, Field(description="An SAE or transcoder feature: its decoder row is added.")] = None,
    transcoders: Annotated[
        str | None, Field(description="With `layer`, `feature`: a transcoder set (circuit-tracer format).")
    ] = None,
    max_new_tokens: Annotated[int, Field(ge=1)] = 20,
    seed: Annotated[int, Field(description="Seed of the reference texts' order (decoding is greedy).")] = 0,
    concept: Annotated[
        list[str] | str | None,
        Field(
            description="What the steered text should be about: words (' sea') or a 'direction://'; its score is "
            "ranked among the stand-ins' continuations."
        ),
    ] = None,
    random_draws: MostRandomDraws = 200,
) -> Annotated[CallToolResult, SteerResult]:
    """Steer greedy generation by adding resid(positive) − resid(negative) at `layer`'s input, a probe's
    `direction`, or an SAE/transcoder `feature`; the next-token KL (and `concept`'s score) ranked among other texts'
    activation differences, same norm."""
    kit = Toolkit.of(ctx)

    def make(model: LoadedModel) -> SteerJob:
        return steer_job(
            model, kit.direction_lookup, direction, concept, prompt=prompt, positive=positive, negative=negative,
            layer=layer, coefficient=coefficient, max_new_tokens=max_new_tokens, seed=seed, sae=sae,
            transcoders=transcoders, feature=feature, random_draws=random_draws,
        )  # fmt: skip

    job, started = await kit.measured_job(ctx, make)
    assert job.result is not None
    r = kit.with_provenance(SteerResult, job.result, started)
    summary = (
        f"steer at L{r.layer} {r.site} × {r.coefficient:g} (added norm {r.added_norm:.3g}): next-token KL "
        f"{r.next_token_kl:.4f} nats (stand-ins of norm {r.random_norm:.3g}: p = {r.random_p_value:.3g})."
        + (
            f" Concept score {r.concept_baseline.real:.3f} (unsteered {r.concept_baseline.unsteered:.3f}) against "
            f"the stand-ins' texts: p = {r.concept_baseline.p_value:.3g}."
            if r.concept_baseline is not None
            else ""
        )
        + f" Steered: {r.steered_text[:300]!r}; unsteered: {r.baseline_text[:300]!r}."
    )
    return kit.finish(r, summary, [])
