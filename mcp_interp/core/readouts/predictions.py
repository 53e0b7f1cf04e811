"""The measurements behind ``logit_diff``, ``kl`` and ``answer_rank``: what the model predicts at the answer.

Each function takes a ``LoadedModel`` and plain Python inputs and returns a measurement model
from ``schemas`` (numbers, per-example values, notes). No MCP here: the server adds
provenance and runs these in a worker thread under the model lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mcp_interp.core.engine.ablation.targets import (
    PreparedAblation,
    logits_at_answers,
    prepare_ablation,
)
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.numbers import metrics
from mcp_interp.core.engine.references import Lookup, resolve_intervention
from mcp_interp.core.engine.text.answers import (
    Answer,
    answer_kind,
    describe,
    read_log_probs,
    resolve_answer_specs,
    spacing_notes,
)
from mcp_interp.core.engine.text.tokens import (
    Batch,
    encode,
    validate_pairs,
)
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import Intervention
from mcp_interp.schemas.readouts import (
    AnswerRankExample,
    AnswerRankMeasurement,
    KLExample,
    KLMeasurement,
    LogitDiffExample,
    LogitDiffMeasurement,
)


def _prepared(
    model: LoadedModel, batch: Batch, intervention: Intervention | None, lookup: Lookup | None
) -> PreparedAblation | None:
    """The intervention resolved and made concrete once for the prompts (its replacements shared by every metric read
    from them)."""
    ablation = resolve_intervention(intervention, model, lookup)
    return None if ablation is None else prepare_ablation(model, batch, ablation)


def _top1(model: LoadedModel, logits: torch.Tensor) -> list[tuple[int, str]]:
    ids = [int(i) for i in logits.argmax(dim=-1)]
    return [(i, model.tokenizer.decode([i])) for i in ids]


def logit_diff(
    model: LoadedModel,
    prompts: Sequence[str],
    correct: Any,
    incorrect: Any,
    intervention: Intervention | None = None,
    lookup: Lookup | None = None,
) -> LogitDiffMeasurement:
    batch = encode(model.tokenizer, prompts, model.device)
    n = len(batch.texts)
    good = resolve_answer_specs(model.tokenizer, correct, n, "correct")
    bad = resolve_answer_specs(model.tokenizer, incorrect, n, "incorrect")
    ablation = _prepared(model, batch, intervention, lookup)
    logits = logits_at_answers(model, batch, ablation)
    top1 = _top1(model, logits)
    sequences = any(a.kind != "token" for a in good + bad)
    good_lp, bad_lp = read_log_probs(model.backend, batch, logits, [good, bad], ablation)
    if sequences:
        score = metrics.score_of(good_lp - bad_lp)
    else:
        score = metrics.logit_difference(logits, [a.first_token for a in good], [a.first_token for a in bad])
    examples = [
        LogitDiffExample(
            prompt=batch.texts[i],
            correct=describe(model.tokenizer, good[i]),
            incorrect=describe(model.tokenizer, bad[i]),
            correct_id=good[i].first_token if good[i].kind != "set" else None,
            incorrect_id=bad[i].first_token if bad[i].kind != "set" else None,
            logit_diff=score.per_example[i],
            correct_log_prob=float(good_lp[i]),
            incorrect_log_prob=float(bad_lp[i]),
            top1_token=top1[i][1],
            top1_id=top1[i][0],
            answer_position=int(batch.answer_positions[i]),
        )
        for i in range(n)
    ]
    notes = []
    if sequences:
        notes.append(SEQUENCE_NOTE.format(metric="logit_diff is log P(correct) − log P(incorrect)"))
        notes.extend(spacing_notes(model.tokenizer, good + bad))
    same = [i for i in range(n) if good[i].alternatives == bad[i].alternatives]
    if same:
        notes.append(
            f"Examples {same}: correct and incorrect are the same answer, so the difference is 0 by construction."
        )
    negative = [i for i, v in enumerate(score.per_example) if v < 0]
    if negative:
        notes.append(
            f"{len(negative)} of {n} examples have a negative logit difference "
            f"(the model prefers the incorrect answer): {negative}."
        )
    not_top = [i for i in range(n) if top1[i][0] not in {alt[0] for alt in good[i].alternatives}]
    if not_top:
        listed = ", ".join(f"{i}: {top1[i][1]!r}" for i in not_top[:8])
        sets = any(a.kind == "set" for a in good)
        what = (
            "No member of the correct set (its first token)"
            if sets
            else f"The correct answer{FIRST_TOKEN if sequences else ''}"
        )
        notes.append(
            f"{what} is not the model's top-1 in {len(not_top)} "
            f"of {n} examples ({listed}{', ...' if len(not_top) > 8 else ''}); a positive logit difference "
            "there only says correct beats incorrect, not that the model would say it."
        )
    return LogitDiffMeasurement(
        logit_diff=score,
        prob_diff=metrics.score_of(good_lp.exp() - bad_lp.exp()),
        examples=examples,
        notes=notes,
        intervention=ablation.describe() if ablation else None,
        answer_kind=answer_kind(good + bad),
    )


FIRST_TOKEN = "'s first token"
SEQUENCE_NOTE = (
    "Some answer is several tokens or a set: {metric} of the teacher-forced sequences (prompt followed by the "
    "answer's tokens; a set scores the log of its members' summed probability); any intervention is applied to "
    "that teacher-forced run too."
)


def kl(
    model: LoadedModel,
    prompts: Sequence[str],
    compare_prompts: Sequence[str] | None = None,
    intervention: Intervention | None = None,
    lookup: Lookup | None = None,
) -> KLMeasurement:
    """KL(P‖Q): P = clean run on ``prompts``; Q = run on ``compare_prompts`` (default: the same
    prompts) under ``intervention`` (default: none). At least one of the two must be given."""
    if compare_prompts is None and intervention is None:
        raise InputError(
            "`kl` needs something to compare against: pass `compare_prompts` (one per prompt, same token "
            "length), an `intervention` (KL(clean‖intervened)), or both."
        )
    compare = list(prompts) if compare_prompts is None else compare_prompts
    diffs = validate_pairs(model.tokenizer, prompts, compare, ("prompts", "compare_prompts"))
    batch_p = encode(model.tokenizer, prompts, model.device)
    batch_q = encode(model.tokenizer, compare, model.device)
    ablation = resolve_intervention(intervention, model, lookup)
    logits_p = logits_at_answers(model, batch_p)
    logits_q = logits_at_answers(model, batch_q, ablation)
    score = metrics.kl_divergence(logits_p, logits_q)
    top_p, top_q = _top1(model, logits_p), _top1(model, logits_q)
    examples = [
        KLExample(
            prompt=batch_p.texts[i],
            compare_prompt=batch_q.texts[i],
            kl=score.per_example[i],
            differing_positions=diffs[i].positions,
            top1_p=top_p[i][1],
            top1_q=top_q[i][1],
        )
        for i in range(len(batch_p.texts))
    ]
    notes = []
    identical = [d.index for d in diffs if not d.positions]
    if identical and ablation is None:
        notes.append(f"Pairs {identical} are token-for-token identical, so their KL is 0 by construction.")
    return KLMeasurement(
        kl=score, examples=examples, notes=notes, intervention=ablation.describe() if ablation else None
    )


def _best_first_token(logits: torch.Tensor, answer: Answer) -> int:
    """The first token of the answer's best-ranked alternative (the only one for a string)."""
    firsts = sorted({alt[0] for alt in answer.alternatives})
    return firsts[int(logits[firsts].argmax())]


def answer_rank(
    model: LoadedModel,
    prompts: Sequence[str],
    correct: Any,
    intervention: Intervention | None = None,
    lookup: Lookup | None = None,
) -> AnswerRankMeasurement:
    batch = encode(model.tokenizer, prompts, model.device)
    n = len(batch.texts)
    answers = resolve_answer_specs(model.tokenizer, correct, n, "correct")
    ablation = _prepared(model, batch, intervention, lookup)
    logits = logits_at_answers(model, batch, ablation)
    sequences = any(a.kind != "token" for a in answers)
    # A set is ranked by its best-ranked member's first token.
    first = [_best_first_token(logits[i], a) for i, a in enumerate(answers)]
    rank = metrics.answer_ranks(logits, first)
    if sequences:
        log_prob = metrics.score_of(read_log_probs(model.backend, batch, logits, [answers], ablation)[0])
    else:
        log_prob = metrics.answer_logprob(logits, first)
    top1 = _top1(model, logits)
    tied, sharing_top = metrics.ties_with(logits, first), metrics.top_ties(logits)
    examples = [
        AnswerRankExample(
            prompt=batch.texts[i],
            correct=describe(model.tokenizer, answers[i]),
            correct_id=first[i],
            rank=int(rank.per_example[i]),
            tied=int(tied[i]),
            log_prob=log_prob.per_example[i],
            prob=float(torch.tensor(log_prob.per_example[i], dtype=torch.float64).exp()),
            top1_token=top1[i][1] if sharing_top[i] == 1 else None,  # a tie at the top has no winner
            top1_id=top1[i][0] if sharing_top[i] == 1 else None,
        )
        for i in range(n)
    ]
    notes = []
    flat = [i for i in range(n) if sharing_top[i] > 1]
    if flat:
        notes.append(
            f"{len(flat)} of {n} outputs have no single top token: {int(sharing_top[flat[0]])} tokens share the "
            f"highest logit at example {flat[0]} (a flat output, no value). There top1_token is null, and a rank of 0 "
            "with `tied` > 0 is a shared first place, not a prediction."
        )
    if sequences:
        notes.append(SEQUENCE_NOTE.format(metric="log_prob is log P(correct)") + " rank is that of the first token.")
        notes.extend(spacing_notes(model.tokenizer, answers))
    if all(r == 0 for r in rank.per_example):
        notes.append(
            "Every rank is 0 (the correct answer is top-1 everywhere): rank is saturated and cannot "
            "show a change that keeps the answer on top; read the logit difference or log-prob too."
        )
    return AnswerRankMeasurement(
        rank=rank,
        log_prob=log_prob,
        examples=examples,
        notes=notes,
        intervention=ablation.describe() if ablation else None,
        answer_kind=answer_kind(answers),
    )
