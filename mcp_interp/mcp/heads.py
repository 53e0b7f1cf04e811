"""Head tools: ``ablate_head`` (every metric before and after ablating heads) and ``patch_heads``
(activation patching of every head on minimal pairs, with its heatmap)."""

from __future__ import annotations

from typing import Annotated

from mcp.types import CallToolResult
from pydantic import Field

from mcp_interp.core.heads.ablate_head import ablate_heads
from mcp_interp.core.heads.figures import heads_plot
from mcp_interp.core.heads.patch_heads import PatchHeadsJob
from mcp_interp.mcp.arguments import (
    AblationMethodArgument,
    AblationPositions,
    Background,
    CleanPrompts,
    CorruptPrompts,
    MostRandomDraws,
    OptionalCorrect,
    OptionalIncorrect,
    PatchDirectionArgument,
    PatchMethodArgument,
    PatchMetricArgument,
    Prompts,
    ReferencePrompts,
    ResampleSeed,
    Top,
    VerifyTop,
)
from mcp_interp.mcp.family import Family
from mcp_interp.mcp.summaries import ablation_summary
from mcp_interp.mcp.toolkit import ToolContext, Toolkit, tool_arguments
from mcp_interp.schemas.common import Intervention, PositionsSpec, TargetSpec
from mcp_interp.schemas.heads import AblateHeadResult, PatchHeadsResult

family = Family("heads")


@family.tool()
async def ablate_head(
    prompts: Prompts,
    heads: Annotated[str | list[str], Field(description="'L9H3' or a list, ablated together.")],
    ctx: ToolContext,
    method: AblationMethodArgument = "zero",
    correct: OptionalCorrect = None,
    incorrect: OptionalIncorrect = None,
    positions: AblationPositions = "all",
    seed: ResampleSeed = 0,
    reference_prompts: ReferencePrompts = None,
    random_draws: MostRandomDraws = 200,
) -> Annotated[CallToolResult, AblateHeadResult]:
    """`ablate` for heads (hook_z): every metric before and after; `notes` flag metrics that disagree; the effect
    ranked among random heads of the same layers (p-value)."""
    names: list[TargetSpec] = [heads] if isinstance(heads, str) else list(heads)
    spec = Intervention(
        ablate=names, method=method, positions=positions, seed=seed, reference_prompts=reference_prompts or []
    )
    kit = Toolkit.of(ctx)
    return await kit.run(
        ctx, AblateHeadResult, ablate_heads, prompts, spec, correct, incorrect, random_draws, kit.direction_lookup,
        summary=ablation_summary,
    )  # fmt: skip


@family.tool(view="heads-heatmap", background=True)
async def patch_heads(
    clean_prompts: CleanPrompts,
    corrupt_prompts: CorruptPrompts,
    ctx: ToolContext,
    correct: OptionalCorrect = None,
    incorrect: OptionalIncorrect = None,
    direction: PatchDirectionArgument = "denoise",
    method: PatchMethodArgument = "exact",
    metric: PatchMetricArgument = "logit_diff",
    positions: Annotated[PositionsSpec, Field(description="Where heads are patched.")] = "all",
    heads: Annotated[list[str] | None, Field(description="Default: every head.")] = None,
    verify_top: VerifyTop = 0,
    top: Top = 20,
    background: Background = False,
) -> Annotated[CallToolResult, PatchHeadsResult]:
    """Activation patching of every head's output (hook_z): the fraction of the clean−corrupt gap each restores
    (denoise) or destroys (noise); 1 = all of it. A [layer][head] grid, top heads, a heatmap."""
    arguments = tool_arguments(locals())
    kit = Toolkit.of(ctx)
    job, started = await kit.measured_job(
        ctx,
        lambda model: PatchHeadsJob(model=model, **arguments),
    )
    assert job.result is not None
    job.result.figure_uri, link = await kit.draw(heads_plot(job.result, job.model.name))
    result = kit.with_provenance(PatchHeadsResult, job.result, started)
    best = ", ".join(f"{h.head} {h.score:+.3f}" for h in result.heads[:5] if h.score is not None)
    summary = (
        f"patch_heads ({method}, {direction}, {metric}): clean {result.clean_logit_diff.value:+.3f}, corrupt "
        f"{result.corrupt_logit_diff.value:+.3f}; top heads by |score|: {best}. Heatmap: {result.figure_uri}"
    )
    return kit.finish(result, summary, [link], top=top)
