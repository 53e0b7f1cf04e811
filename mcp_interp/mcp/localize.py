"""Localize tools: ``patch`` (which component, at which layer and token, carries the effect),
``ablate`` (remove any components and measure every metric), and ``loss`` (next-token loss of
texts, under any intervention)."""

from __future__ import annotations

from typing import Annotated

from mcp.types import CallToolResult
from pydantic import Field, WithJsonSchema

from mcp_interp.core.localize.ablate import ablate as ablate_targets
from mcp_interp.core.localize.figures import patch_plot
from mcp_interp.core.localize.loss import LossJob
from mcp_interp.core.localize.patch import PatchJob
from mcp_interp.mcp.arguments import (
    AblationMethodArgument,
    AblationPositions,
    Background,
    CleanPrompts,
    MostRandomDraws,
    OptionalCorrect,
    OptionalIncorrect,
    OptionalIntervention,
    PatchDirectionArgument,
    PatchMethodArgument,
    PatchMetricArgument,
    Prompts,
    ReferencePrompts,
    ResampleSeed,
    Targets,
    Top,
    VerifyTop,
)
from mcp_interp.mcp.family import Family
from mcp_interp.mcp.summaries import ablation_summary
from mcp_interp.mcp.toolkit import ToolContext, Toolkit, tool_arguments
from mcp_interp.schemas.common import Intervention
from mcp_interp.schemas.localize import (
    AblateResult,
    Component,
    LossResult,
    NoiseCorruption,
    PatchResult,
)

family = Family("localize")
# Published by shape (validated in full on arrival); its fields are described once, in the parameter's description.
NOISE_SHAPE = {
    "type": ["object", "null"],
    "properties": {
        "subjects": {"type": ["string", "array"]},
        "positions": {"type": "array", "items": {"type": "integer"}},
        "scale": {"type": "number"},
        "samples": {"type": "integer"},
        "seed": {"type": "integer"},
    },
}


@family.tool(view="layer-position", background=True)
async def patch(
    clean_prompts: CleanPrompts,
    component: Annotated[
        Component,
        Field(
            description="resid_*, attn_out, mlp_out: [layer][position]; heads_by_pos: [layer][head][position]; "
            "mlp_neurons: `neurons` (or the top by attribution) at every position."
        ),
    ],
    ctx: ToolContext,
    corrupt_prompts: Annotated[list[str] | None, Field(description="One per clean prompt, same token length.")] = None,
    noise: Annotated[
        NoiseCorruption | None,
        WithJsonSchema(NOISE_SHAPE),
        Field(
            description="Instead of corrupt_prompts: {subjects | positions, scale: 3 (× embedding std), samples: 10}."
        ),
    ] = None,
    correct: OptionalCorrect = None,
    incorrect: OptionalIncorrect = None,
    direction: PatchDirectionArgument = "denoise",
    method: PatchMethodArgument = "exact",
    metric: PatchMetricArgument = "logit_diff",
    layers: Annotated[list[int] | None, Field(description="Default: every layer.")] = None,
    positions: Annotated[list[int] | None, Field(description="Default: every position.")] = None,
    neurons: Annotated[list[int] | None, Field(description="mlp_neurons: the neurons of each layer.")] = None,
    top_neurons: Annotated[int, Field(ge=1, le=256, description="mlp_neurons without `neurons`: per layer.")] = 10,
    verify_top: VerifyTop = 0,
    top: Top = 20,
    background: Background = False,
) -> Annotated[CallToolResult, PatchResult]:
    """Activation patching of one component at every layer × position: each cell is the fraction of the
    clean−corrupt gap it restores (denoise) or destroys (noise); causal: positions before the first difference are 0."""
    arguments = tool_arguments(locals())
    kit = Toolkit.of(ctx)
    job, started = await kit.measured_job(
        ctx,
        lambda model: PatchJob(model=model, **arguments),
    )
    assert job.result is not None
    job.result.figure_uri, link = await kit.draw(patch_plot(job.result, job.model.name))
    result = kit.with_provenance(PatchResult, job.result, started)
    best = "; ".join(f"{c.label}: {c.score:+.2f}" for c in result.cells[:5] if c.score is not None)
    summary = (
        f"patch {component} ({method}, {direction}, {metric}): clean {result.clean.value:+.3f}, corrupt "
        f"{result.corrupt.value:+.3f}. Top cells: {best or 'none (every score undefined)'}. "
        f"Heatmap: {result.figure_uri}"
    )
    return kit.finish(result, summary, [link], top=top)


@family.tool()
async def ablate(
    prompts: Prompts,
    targets: Targets,
    ctx: ToolContext,
    method: AblationMethodArgument = "zero",
    correct: OptionalCorrect = None,
    incorrect: OptionalIncorrect = None,
    positions: AblationPositions = "all",
    seed: ResampleSeed = 0,
    reference_prompts: ReferencePrompts = None,
    random_draws: MostRandomDraws = 200,
) -> Annotated[CallToolResult, AblateResult]:
    """Remove components together: every metric before and after (logit and probability difference, KL,
    log-prob, rank), `notes` flagging disagreement; the effect ranked among random components (p-value)."""
    spec = Intervention(
        ablate=targets, method=method, positions=positions, seed=seed, reference_prompts=reference_prompts or []
    )
    kit = Toolkit.of(ctx)
    return await kit.run(
        ctx, AblateResult, ablate_targets, prompts, spec, correct, incorrect, random_draws, kit.direction_lookup,
        summary=ablation_summary,
    )  # fmt: skip


@family.tool()
async def loss(
    ctx: ToolContext,
    texts: Annotated[list[str] | None, Field(description="Every next token of each text is scored.")] = None,
    intervention: OptionalIntervention = None,
    token_ids: Annotated[
        list[list[int]] | None, Field(description="Instead of texts: ids run as given (induction's sequences).")
    ] = None,
    positions: Annotated[
        list[int] | None, Field(description="Token indices k ≥ 1 the means cover (induction's predicted_positions).")
    ] = None,
) -> Annotated[CallToolResult, LossResult]:
    """Next-token loss (nats) and top-1 accuracy per token and text, under an intervention if given (the loss
    without it beside)."""

    kit = Toolkit.of(ctx)
    job, started = await kit.measured_job(
        ctx,
        lambda model: LossJob(
            model=model,
            texts=texts,
            intervention=intervention,
            token_ids=token_ids,
            positions=positions,
            lookup=kit.direction_lookup,
        ),
    )
    assert job.result is not None
    r = kit.with_provenance(LossResult, job.result, started)
    clean = "" if r.clean_mean_loss is None else f" (without the intervention {r.clean_mean_loss:.4f})"
    summary = f"loss over {len(r.texts)} texts: {r.mean_loss:.4f} nats{clean}, top-1 accuracy {r.accuracy:.3f}."
    return kit.finish(r, summary, [])
