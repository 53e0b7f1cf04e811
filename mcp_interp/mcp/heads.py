"""Head tools: ``ablate_head`` (every metric before and after ablating heads) and ``patch_heads``
(activation patching of every head on minimal pairs, with its heatmap)."""

from __future__ import annotations

from typing import Annotated

from mcp.types import CallToolResult, ResourceLink
from pydantic import Field

from mcp_interp import figures
from mcp_interp.core.heads.ablate_head import ablate_heads
from mcp_interp.core.heads.patch_heads import PatchHeadsJob
from mcp_interp.mcp.arguments import (
    AblationMethod,
    AblationPositions,
    CleanPrompts,
    CorruptPrompts,
    OptionalCorrect,
    OptionalIncorrect,
    PatchDirection,
    PatchMethod,
    PatchMetric,
    Prompts,
    ResampleSeed,
    VerifyTop,
)
from mcp_interp.mcp.toolkit import Family, ToolContext, Toolkit, tool_arguments
from mcp_interp.schemas.common import AblationSpec, HeadSpec, PositionsSpec
from mcp_interp.schemas.heads import AblateHeadResult, PatchHeadsMeasurement, PatchHeadsResult

family = Family("heads")


@family.tool()
async def ablate_head(
    prompts: Prompts,
    heads: Annotated[
        HeadSpec | list[HeadSpec],
        Field(description="Heads to ablate together in one forward pass: 'L9H3' or {layer, head}, or a list."),
    ],
    ctx: ToolContext,
    method: AblationMethod = "zero",
    correct: OptionalCorrect = None,
    incorrect: OptionalIncorrect = None,
    positions: AblationPositions = "all",
    seed: ResampleSeed = 0,
) -> AblateHeadResult:
    """Ablate attention heads (on hook_z, so grouped-query attention works) and report, before and
    after: logit difference (with answers), KL(clean‖ablated), answer log-prob and rank, per example
    and mean. `notes` flags metrics that disagree (e.g. rank stuck at 0 while the logit difference
    moved) — read them before concluding a head does or does not matter."""
    spec = AblationSpec(heads=heads, method=method, positions=positions, seed=seed)
    return await Toolkit.of(ctx).run(ctx, AblateHeadResult, ablate_heads, prompts, spec, correct, incorrect)


async def heads_heatmap(
    kit: Toolkit, patching: PatchHeadsMeasurement, model_name: str, name: str | None = None
) -> tuple[str, ResourceLink]:
    """The layer × head heatmap of a head-patching result (``patch_heads`` and ``explain`` draw the same one)."""
    title = f"patch_heads {patching.direction} ({patching.method}) score: {model_name}"
    label = "recovered fraction" if patching.direction == "denoise" else "destroyed fraction"
    return await kit.figure(name or title, figures.layer_head_heatmap, patching.scores, title, label)


@family.tool(view="heads-heatmap")
async def patch_heads(
    clean_prompts: CleanPrompts,
    corrupt_prompts: CorruptPrompts,
    ctx: ToolContext,
    correct: OptionalCorrect = None,
    incorrect: OptionalIncorrect = None,
    direction: PatchDirection = "denoise",
    method: PatchMethod = "exact",
    metric: PatchMetric = "logit_diff",
    positions: Annotated[
        PositionsSpec, Field(description="'all' (default), 'last' or token indices to patch at.")
    ] = "all",
    heads: Annotated[
        list[HeadSpec] | None, Field(description="Subset of heads to patch; default every (layer, head).")
    ] = None,
    verify_top: VerifyTop = 0,
) -> Annotated[CallToolResult, PatchHeadsResult]:
    """Activation patching of each attention head's output (hook_z) on minimal pairs. Score per
    head = fraction of the clean−corrupt logit-difference gap it restores (denoise) or destroys
    (noise): 1 = carries the whole effect, 0 = none. Returns a [layer][head] grid, heads sorted by
    |score| with per-example values for the top 10, and a heatmap (figure:// resource). Reports
    progress per layer and stops at the next layer when cancelled."""
    arguments = tool_arguments(locals())
    kit = Toolkit.of(ctx)
    job, started = await kit.measured_job(
        ctx,
        lambda model: PatchHeadsJob(model=model, **arguments),
    )
    assert job.result is not None
    job.result.figure_uri, link = await heads_heatmap(kit, job.result, job.model.name)
    result = kit.with_provenance(PatchHeadsResult, job.result, started)
    top = ", ".join(f"{h.head} {h.score:+.3f}" for h in result.heads[:5] if h.score is not None)
    summary = (
        f"patch_heads ({method}, {direction}): clean logit diff {result.clean_logit_diff.value:+.3f}, corrupt "
        f"{result.corrupt_logit_diff.value:+.3f}; top heads by |score|: {top}. Heatmap: {result.figure_uri}"
    )
    return kit.finish(result, summary, [link])
