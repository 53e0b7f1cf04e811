"""Readout tools: what the model is and predicts — ``model_info``, ``tokenize``, ``logit_diff``, ``kl``,
``answer_rank``. Each is one core call with provenance (``Toolkit.run``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from mcp_interp.core.readouts import info
from mcp_interp.core.readouts import predictions as readouts
from mcp_interp.mcp.arguments import OptionalIntervention, Prompts, SequenceAnswers
from mcp_interp.mcp.toolkit import Family, ToolContext, Toolkit
from mcp_interp.schemas.readouts import (
    AnswerRankResult,
    KLResult,
    LogitDiffResult,
    ModelInfoResult,
    TokenizeResult,
)

family = Family("readouts")


@family.tool()
async def model_info(ctx: ToolContext) -> ModelInfoResult:
    """The loaded model: sizes, dtype, device, weights fingerprint, the tokenization rule. Call this first."""
    return await Toolkit.of(ctx).run(ctx, ModelInfoResult, info.model_info, locked=False)


@family.tool()
async def tokenize(
    texts: list[str],
    ctx: ToolContext,
) -> TokenizeResult:
    """Token strings and ids, exactly as every tool tokenizes: check answers and minimal pairs first."""
    return await Toolkit.of(ctx).run(ctx, TokenizeResult, info.tokenize, texts, locked=False)


@family.tool()
async def logit_diff(
    prompts: Prompts,
    correct: SequenceAnswers,
    incorrect: SequenceAnswers,
    ctx: ToolContext,
    intervention: OptionalIntervention = None,
) -> LogitDiffResult:
    """logit(correct) − logit(incorrect) at the answer (several tokens: log P difference, teacher-forced).
    Positive = prefers `correct`."""
    return await Toolkit.of(ctx).run(
        ctx, LogitDiffResult, readouts.logit_diff, prompts, correct, incorrect, intervention
    )


@family.tool()
async def kl(
    prompts: Prompts,
    ctx: ToolContext,
    compare_prompts: Annotated[
        list[str] | None, Field(description="Q's prompts, one per prompt, same token length; default `prompts`.")
    ] = None,
    intervention: OptionalIntervention = None,
) -> KLResult:
    """KL(P‖Q) (nats, ≥ 0) of the next-token distributions: P = `prompts`, Q = `compare_prompts` and/or the
    `intervention`."""
    return await Toolkit.of(ctx).run(ctx, KLResult, readouts.kl, prompts, compare_prompts, intervention)


@family.tool()
async def answer_rank(
    prompts: Prompts, correct: SequenceAnswers, ctx: ToolContext, intervention: OptionalIntervention = None
) -> AnswerRankResult:
    """Rank (tokens strictly above; 0 = top-1) and log-probability of the correct answer."""
    return await Toolkit.of(ctx).run(ctx, AnswerRankResult, readouts.answer_rank, prompts, correct, intervention)
