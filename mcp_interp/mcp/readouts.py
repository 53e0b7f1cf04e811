"""Readout tools: what the model is and predicts — ``model_info``, ``tokenize``, ``logit_diff``, ``kl``,
``answer_rank``. Each is one core call with provenance (``Toolkit.run``)."""

from __future__ import annotations

from typing import Annotated

from mcp.types import CallToolResult
from pydantic import Field

from mcp_interp.core.readouts import info
from mcp_interp.core.readouts import predictions as readouts
from mcp_interp.mcp.arguments import OptionalIntervention, OtherSequenceAnswers, Prompts, SequenceAnswers
from mcp_interp.mcp.family import Family
from mcp_interp.mcp.toolkit import ToolContext, Toolkit
from mcp_interp.schemas.common import Measurement, Score
from mcp_interp.schemas.readouts import (
    AnswerRankResult,
    KLResult,
    LogitDiffResult,
    ModelInfoResult,
    TokenizeResult,
)

family = Family("readouts")


def _notes(result: Measurement) -> str:
    return f" Notes: {len(result.notes)} (read them)." if result.notes else ""


def _score(name: str, score: Score) -> str:
    values = ", ".join(f"{v:+.3f}" for v in score.per_example[:8])
    more = ", …" if len(score.per_example) > 8 else ""
    return f"{name} mean {score.value:+.4f} over {len(score.per_example)} prompts ({values}{more})"


@family.tool()
async def model_info(ctx: ToolContext) -> Annotated[CallToolResult, ModelInfoResult]:
    """The loaded model: sizes, dtype, device, weights fingerprint, the tokenization rule. Call this first."""

    def summary(r: ModelInfoResult) -> str:
        return (
            f"{r.name} ({r.architecture}, {r.source}): {r.n_layers} layers, {r.n_heads} heads ({r.n_kv_heads} KV), "
            f"d_model {r.d_model}, {r.dtype} on {r.device}, fingerprint {r.fingerprint}. {r.tokenization_rule}"
        )

    return await Toolkit.of(ctx).run(ctx, ModelInfoResult, info.model_info, summary=summary, locked=False)


@family.tool()
async def tokenize(
    texts: list[str],
    ctx: ToolContext,
    top_k: Annotated[int, Field(description="≥ 1: also the model's top k at every position.")] = 0,
) -> Annotated[CallToolResult, TokenizeResult]:
    """Token strings and ids, exactly as every tool tokenizes: check answers and minimal pairs first."""

    def summary(r: TokenizeResult) -> str:
        shown = "; ".join(f"{t.n_tokens} tokens {t.tokens[:12]}" for t in r.texts[:4])
        predicted = "; ".join(f"predicted {t.predicted[:12]}" for t in r.texts[:2] if t.predicted is not None)
        more = " …" if len(r.texts) > 4 else ""
        return f"tokenize {len(r.texts)} texts: {shown}{more}{'. ' + predicted if predicted else ''}{_notes(r)}"

    kit = Toolkit.of(ctx)
    return await kit.run(ctx, TokenizeResult, info.tokenize, texts, top_k, summary=summary, locked=top_k > 0)


@family.tool()
async def logit_diff(
    prompts: Prompts,
    correct: SequenceAnswers,
    incorrect: OtherSequenceAnswers,
    ctx: ToolContext,
    intervention: OptionalIntervention = None,
) -> Annotated[CallToolResult, LogitDiffResult]:
    """logit(correct) − logit(incorrect) at the answer (several tokens: log P difference, teacher-forced).
    Positive = prefers `correct`."""

    def summary(r: LogitDiffResult) -> str:
        return f"logit_diff ({r.answer_kind}): {_score('logit difference', r.logit_diff)}.{_notes(r)}"

    kit = Toolkit.of(ctx)
    return await kit.run(
        ctx, LogitDiffResult, readouts.logit_diff, prompts, correct, incorrect, intervention, kit.direction_lookup,
        summary=summary,
    )  # fmt: skip


@family.tool()
async def kl(
    prompts: Prompts,
    ctx: ToolContext,
    compare_prompts: Annotated[
        list[str] | None, Field(description="Q's prompts, one per prompt, same token length; default `prompts`.")
    ] = None,
    intervention: OptionalIntervention = None,
) -> Annotated[CallToolResult, KLResult]:
    """KL(P‖Q) (nats, ≥ 0) of the next-token distributions: P = `prompts`, Q = `compare_prompts` and/or the
    `intervention`."""

    def summary(r: KLResult) -> str:
        return f"kl: {_score('KL (nats)', r.kl)}.{_notes(r)}"

    kit = Toolkit.of(ctx)
    return await kit.run(
        ctx, KLResult, readouts.kl, prompts, compare_prompts, intervention, kit.direction_lookup, summary=summary
    )


@family.tool()
async def answer_rank(
    prompts: Prompts, correct: SequenceAnswers, ctx: ToolContext, intervention: OptionalIntervention = None
) -> Annotated[CallToolResult, AnswerRankResult]:
    """Rank (tokens strictly above; 0 = top-1) and log-probability of the correct answer."""

    def summary(r: AnswerRankResult) -> str:
        return f"answer_rank: {_score('rank', r.rank)}; {_score('log-prob', r.log_prob)}.{_notes(r)}"

    kit = Toolkit.of(ctx)
    return await kit.run(
        ctx, AnswerRankResult, readouts.answer_rank, prompts, correct, intervention, kit.direction_lookup,
        summary=summary,
    )  # fmt: skip
