"""Localize tools: ``patch`` (which component, at which layer and token, carries the effect),
``ablate`` (remove any components and measure every metric), and ``loss`` (next-token loss of
texts, under any intervention)."""

from __future__ import annotations

from typing import Annotated

from mcp.types import CallToolResult, ResourceLink
from pydantic import Field

from mcp_interp.core.localize import figures as localize_figures
from mcp_interp.core.localize.ablate import ablate as ablate_targets
from mcp_interp.core.localize.loss import text_losses
from mcp_interp.core.localize.patch import PatchJob
from mcp_interp.mcp.arguments import (
    AblationMethod,
    AblationPositions,
    CleanPrompts,
    CorruptPrompts,
    OptionalCorrect,
    OptionalIncorrect,
    OptionalIntervention,
    PatchDirection,
    PatchMethod,
    PatchMetric,
    Prompts,
    ResampleSeed,
    VerifyTop,
)
from mcp_interp.mcp.toolkit import Family, ToolContext, Toolkit, tool_arguments
from mcp_interp.schemas.common import TARGETS_DESCRIPTION, AblationSpec, TargetSpec
from mcp_interp.schemas.localize import (
    AblateResult,
    Component,
    LossResult,
    PatchMeasurement,
    PatchResult,
)

family = Family("localize")


async def patch_figure(kit: Toolkit, result: PatchMeasurement, model_name: str) -> tuple[str, ResourceLink]:
    """The heatmap of a ``patch`` result: layers × tokens (heads × tokens for heads_by_pos; bars for neurons)."""
    title = f"patch {result.component} {result.direction} ({result.method}, {result.metric}): {model_name}"
    label = "recovered fraction" if result.direction == "denoise" else "destroyed fraction"
    tokens = [t.clean_token if not t.differs_in_pairs else f"{t.clean_token}/{t.corrupt_token}" for t in result.tokens]
    if result.scores is not None:
        return await kit.figure(title, localize_figures.layer_position_heatmap, result.scores, tokens, title, label)
    if result.head_scores is not None:
        rows, names = [], []
        for layer, heads in enumerate(result.head_scores):
            for head, row in enumerate(heads):
                if any(v is not None for v in row):
                    rows.append(row)
                    names.append(f"L{layer}H{head}")
        return await kit.figure(
            title, localize_figures.layer_position_heatmap, rows, tokens, title, label, "head", names
        )
    labels = [cell.label for cell in result.cells]
    return await kit.figure(title, localize_figures.cell_bars, labels, [c.score for c in result.cells], title, label)


@family.tool(view="layer-position")
async def patch(
    clean_prompts: CleanPrompts,
    corrupt_prompts: CorruptPrompts,
    component: Annotated[
        Component,
        Field(
            description="resid_pre/resid_mid/resid_post (residual stream entering a block / between attention and "
            "MLP / leaving it), attn_out, mlp_out: a [layer][position] grid; heads_by_pos: each head's output at "
            "each position, [layer][head][position]; mlp_neurons: single MLP neurons at every position "
            "(`neurons`, or the top neurons of each layer by attribution, then patched exactly)."
        ),
    ],
    ctx: ToolContext,
    correct: OptionalCorrect = None,
    incorrect: OptionalIncorrect = None,
    direction: PatchDirection = "denoise",
    method: PatchMethod = "exact",
    metric: PatchMetric = "logit_diff",
    layers: Annotated[list[int] | None, Field(description="Layers to patch; default every layer.")] = None,
    positions: Annotated[
        list[int] | None, Field(description="Token positions to patch (0-based); default every position.")
    ] = None,
    neurons: Annotated[
        list[int] | None, Field(description="mlp_neurons: neuron indices to patch in each of `layers`.")
    ] = None,
    top_neurons: Annotated[
        int, Field(ge=1, le=256, description="mlp_neurons without `neurons`: neurons per layer chosen by attribution.")
    ] = 10,
    verify_top: VerifyTop = 0,
) -> Annotated[CallToolResult, PatchResult]:
    """Activation patching of one component at every layer × token position on minimal pairs — the
    map of where the information flows. Score per cell = fraction of the clean−corrupt gap of the
    metric it restores (denoise) or destroys (noise): 1 = carries the whole effect, 0 = none.
    Positions before the first differing token are 0 by construction and not run. Returns the grid,
    the top cells in words with per-example values, the tokens, and a heatmap (figure://).
    Reports progress per layer; stops at the next layer when cancelled."""
    arguments = tool_arguments(locals())
    kit = Toolkit.of(ctx)
    job, started = await kit.measured_job(
        ctx,
        lambda model: PatchJob(model=model, **arguments),
    )
    assert job.result is not None
    job.result.figure_uri, link = await patch_figure(kit, job.result, job.model.name)
    result = kit.with_provenance(PatchResult, job.result, started)
    top = "; ".join(f"{c.label}: {c.score:+.2f}" for c in result.cells[:5] if c.score is not None)
    summary = (
        f"patch {component} ({method}, {direction}, {metric}): clean {result.clean.value:+.3f}, corrupt "
        f"{result.corrupt.value:+.3f}. Top cells: {top or 'none (every score undefined)'}. "
        f"Heatmap: {result.figure_uri}"
    )
    return kit.finish(result, summary, [link])


@family.tool()
async def ablate(
    prompts: Prompts,
    targets: Annotated[list[TargetSpec], Field(description=TARGETS_DESCRIPTION)],
    ctx: ToolContext,
    method: AblationMethod = "zero",
    correct: OptionalCorrect = None,
    incorrect: OptionalIncorrect = None,
    positions: AblationPositions = "all",
    seed: ResampleSeed = 0,
) -> AblateResult:
    """Ablate any components together — heads, MLPs ('L28MLP'), attention layers ('L12ATTN'), MLP
    neurons, residual directions — and report, before and after: logit difference (with answers),
    KL(clean‖ablated), answer log-prob and rank, per example and mean. `notes` flags metrics that
    disagree; read them before concluding a component does or does not matter."""
    spec = AblationSpec(targets=targets, method=method, positions=positions, seed=seed)
    return await Toolkit.of(ctx).run(ctx, AblateResult, ablate_targets, prompts, spec, correct, incorrect)


@family.tool()
async def loss(
    ctx: ToolContext,
    texts: Annotated[
        list[str] | None, Field(description="Texts to score; every next token of each is predicted.")
    ] = None,
    intervention: OptionalIntervention = None,
    token_ids: Annotated[
        list[list[int]] | None,
        Field(description="Instead of texts: token ids run exactly as given (e.g. `induction`'s `sequences`)."),
    ] = None,
    positions: Annotated[
        list[int] | None,
        Field(description="Token indices k ≥ 1 whose loss enters the means (e.g. `induction`'s predicted_positions)."),
    ] = None,
) -> LossResult:
    """Next-token cross-entropy (nats) and top-1 accuracy of every token of each text, per token and
    mean, optionally under an intervention (ablate heads, ...) — with the unablated loss beside it.
    The measure of "ablate and see what breaks" for induction heads and other general mechanisms."""
    return await Toolkit.of(ctx).run(ctx, LossResult, text_losses, texts, intervention, token_ids, positions)
