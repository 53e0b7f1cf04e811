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
    """The loaded model: name, source, layer/head counts, sizes, dtype, device, weight fingerprint,
    load time, and the tokenization rule every tool uses. Call this first."""
    return await Toolkit.of(ctx).run(ctx, ModelInfoResult, info.model_info, locked=False)


@family.tool()
async def tokenize(
    texts: Annotated[list[str], Field(description="Texts to tokenize exactly as every tool will.")],
    ctx: ToolContext,
) -> TokenizeResult:
    """Token strings and ids of each text, by the same rule every tool uses. Use it to check that
    an answer is one token and that a minimal pair tokenizes to equal length before experimenting."""
    return await Toolkit.of(ctx).run(ctx, TokenizeResult, info.tokenize, texts, locked=False)


@family.tool()
async def logit_diff(
    prompts: Prompts,
    correct: SequenceAnswers,
    incorrect: SequenceAnswers,
    ctx: ToolContext,
    intervention: OptionalIntervention = None,
) -> LogitDiffResult:
    """logit(correct) − logit(incorrect) at each prompt's answer position (its last token), per
    example and mean, with the model's top-1 token. Positive = the model prefers `correct`.
    With `intervention`, the numbers are read from the intervened run."""
    return await Toolkit.of(ctx).run(
        ctx, LogitDiffResult, readouts.logit_diff, prompts, correct, incorrect, intervention
    )


@family.tool()
async def kl(
    prompts: Prompts,
    ctx: ToolContext,
    compare_prompts: Annotated[
        list[str] | None,
        Field(
            description="One prompt per entry of `prompts`, each with the same token length as its partner; "
            "default: `prompts` themselves (then give an `intervention`)."
        ),
    ] = None,
    intervention: OptionalIntervention = None,
) -> KLResult:
    """KL(P‖Q) in nats between next-token distributions at the answer position: P = clean run on
    `prompts`; Q = run on `compare_prompts` (default `prompts`) under `intervention` (default none).
    `kl(prompts, intervention=...)` is KL(clean‖intervened). 0 = identical; ≥ 0."""
    return await Toolkit.of(ctx).run(ctx, KLResult, readouts.kl, prompts, compare_prompts, intervention)


@family.tool()
async def answer_rank(
    prompts: Prompts, correct: SequenceAnswers, ctx: ToolContext, intervention: OptionalIntervention = None
) -> AnswerRankResult:
    """Rank (tokens with a strictly higher logit; 0 = top-1) and log-probability of the correct
    answer at each prompt's answer position. Rank saturates at 0: see `notes`."""
    return await Toolkit.of(ctx).run(ctx, AnswerRankResult, readouts.answer_rank, prompts, correct, intervention)
