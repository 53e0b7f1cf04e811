"""The measured effect of an ablation: every metric before and after, and where they disagree.

Shared by ``ablate`` (any components) and ``ablate_head`` (heads). Metrics see different things (see
``metrics``). The most common way to a confident wrong conclusion is reading one that is blind to the
effect — rank stuck at 0 while the logit difference halves, KL tiny while the correct−incorrect margin
collapses — so disagreements are written into ``notes`` rather than left for the reader to spot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mcp_interp.core.engine.ablation.targets import (
    Ablation,
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
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.schemas.ablation import AblationOutcome, MetricSet
from mcp_interp.schemas.common import Intervention, Score

# Thresholds for disagreement notes, in the metrics' own units.
LOGIT_DIFF_MOVED = 0.5  # nats of log-odds: a change worth reporting
KL_SMALL = 0.1  # nats


def parsed_ablation(model: LoadedModel, ablation: Ablation | Intervention, lookup: Lookup | None = None) -> Ablation:
    """The core ``Ablation`` of a tool's arguments (an ``Intervention``, resolved once here), or the ``Ablation``
    itself."""
    if isinstance(ablation, Ablation):
        return ablation
    parsed = resolve_intervention(ablation, model, lookup)
    assert parsed is not None
    return parsed


def ablation_outcome(
    model: LoadedModel,
    prompts: Sequence[str],
    ablation: Ablation,
    correct: Any = None,
    incorrect: Any = None,
) -> AblationOutcome:
    """Every metric with and without ``ablation``. Answers may be several tokens or sets
    (``answers``): their log-prob and logit difference are then teacher-forced, ranks are of
    the first token."""
    batch = encode(model.tokenizer, prompts, model.device)
    n = len(batch.texts)
    good = resolve_answer_specs(model.tokenizer, correct, n, "correct") if correct is not None else None
    bad = resolve_answer_specs(model.tokenizer, incorrect, n, "incorrect") if incorrect is not None else None
    prepared = prepare_ablation(model, batch, ablation)
    clean = logits_at_answers(model, batch)
    ablated = logits_at_answers(model, batch, prepared)

    notes: list[str] = []
    if good is None:
        tracked = [Answer(model.tokenizer.decode([int(i)]), ((int(i),),), "token") for i in clean.argmax(dim=-1)]
        answer = "clean top-1"
        notes.append("No `correct` answer given: log_prob and rank track each prompt's clean top-1 token.")
    else:
        tracked, answer = good, "correct"
        not_top = [i for i in range(n) if int(clean[i].argmax()) != good[i].first_token]
        if not_top:
            what = "The correct answer" if all(a.kind == "token" for a in good) else "The correct answer's first token"
            notes.append(f"{what} is not the clean top-1 for examples {not_top}.")
    if good is not None and bad is not None:
        same = [i for i in range(n) if good[i].alternatives == bad[i].alternatives]
        if same:
            notes.append(
                f"Examples {same}: correct and incorrect are the same answer, so the logit difference is 0 by "
                "construction, with and without the ablation."
            )
    sequences = any(a.kind != "token" for a in tracked + (bad or []))
    if sequences:
        notes.append(
            "Some answer is several tokens or a set: log_prob and logit_diff are teacher-forced sequence "
            "log-probabilities (logit_diff = log P(correct) − log P(incorrect)); the ablation's replacements come from "
            "the prompts alone, and with positions 'all' the answer's tokens are ablated too (with the answer "
            "position's replacement); rank is that of the first token."
        )
        notes.extend(spacing_notes(model.tokenizer, tracked + (bad or [])))

    def metric_set(logits: torch.Tensor, with_ablation: PreparedAblation | None) -> MetricSet:
        first = [a.first_token for a in tracked]
        both = bad is not None and good is not None
        lists = [tracked, bad] if both and bad is not None else [tracked]
        log_probs = read_log_probs(model.backend, batch, logits, lists, with_ablation)
        diff = prob_diff = None
        if both:
            if sequences:
                diff = metrics.score_of(log_probs[0] - log_probs[1])
            else:
                assert bad is not None
                diff = metrics.logit_difference(logits, first, [a.first_token for a in bad])
            prob_diff = metrics.score_of(log_probs[0].exp() - log_probs[1].exp())
        return MetricSet(
            logit_diff=diff, prob_diff=prob_diff, log_prob=metrics.score_of(log_probs[0]),
            rank=metrics.answer_ranks(logits, first),
        )  # fmt: skip

    before, after = metric_set(clean, None), metric_set(ablated, prepared)
    kl = metrics.kl_divergence(clean, ablated)
    first = [a.first_token for a in tracked]
    notes.extend(tie_notes([(before, clean), (after, ablated)], first))
    if (good is None) != (bad is None):
        notes.append("Give both `correct` and `incorrect` to get the logit difference.")
    notes.extend(disagreements(before, after, kl))
    return AblationOutcome(
        method=ablation.method,
        positions=ablation.positions if ablation.positions is not None else "all",
        mean_over=prepared.mean_over,
        permutation=prepared.permutation,
        answer=answer,
        answer_kind=answer_kind(tracked + (bad or [])),
        answer_tokens=[
            describe(model.tokenizer, a) if sequences else model.tokenizer.decode([a.first_token]) for a in tracked
        ],
        before=before,
        after=after,
        kl=kl,
        notes=notes,
    )


def tie_notes(runs: list[tuple[MetricSet, torch.Tensor]], answers: list[int]) -> list[str]:
    """Where a rank of 0 is a shared first place (the answer's logit tied with others', as on a flat output), before
    or after the ablation: rank counts only the tokens strictly above, so a tie reads as top-1 unless said."""
    notes = []
    for when, (measured, logits) in zip(("before", "after"), runs, strict=True):
        ranks = measured.rank.per_example  # the ranks the result reports, not computed again
        tied = metrics.ties_with(logits, answers)
        shared = [i for i, r in enumerate(ranks) if r == 0 and int(tied[i]) > 0]
        if shared:
            notes.append(
                f"{when.capitalize()} the ablation, on {len(shared)} of {len(ranks)} examples the answer's rank 0 is "
                f"shared: its logit ties {int(tied[shared[0]])} other token(s) (example {shared[0]}; a flat output "
                "when all tie). A tie is no top-1: read the logit difference or log-prob."
            )
    return notes


def disagreements(before: MetricSet, after: MetricSet, kl: Score) -> list[str]:
    """Plain-language notes where one metric moved and another cannot see it."""
    notes = []
    if before.logit_diff is not None and after.logit_diff is not None:
        ld_before, ld_after = before.logit_diff.value, after.logit_diff.value
        moved = abs(ld_after - ld_before)
        ranks_stuck_at_zero = all(r == 0 for r in before.rank.per_example + after.rank.per_example)
        if ranks_stuck_at_zero and moved >= LOGIT_DIFF_MOVED:
            notes.append(
                f"Rank stayed 0 on every example while the logit difference moved from {ld_before:+.3f} to "
                f"{ld_after:+.3f}: rank is saturated and blind to this effect; cite the logit difference."
            )
        if ld_before > 0 and ld_after < 0.5 * ld_before and kl.value < KL_SMALL:
            notes.append(
                f"KL(clean‖ablated) is only {kl.value:.4f} nats although the logit difference fell from "
                f"{ld_before:+.3f} to {ld_after:+.3f}: the probability mass that moved is small, but the "
                "correct−incorrect margin collapsed. KL alone would call this ablation unimportant."
            )
        if kl.value >= 1.0 and moved < 0.1 * max(abs(ld_before), 1e-9):
            notes.append(
                f"KL(clean‖ablated) is {kl.value:.3f} nats but the logit difference barely moved "
                f"({ld_before:+.3f} → {ld_after:+.3f}): the ablation changes the output distribution, "
                "not the correct−incorrect comparison."
            )
        if ld_before > 0 > ld_after:
            notes.append(f"The ablation flips the preference: logit difference {ld_before:+.3f} → {ld_after:+.3f}.")
    elif all(r == 0 for r in before.rank.per_example + after.rank.per_example) and kl.value >= KL_SMALL:
        notes.append(
            f"Rank stayed 0 everywhere although KL(clean‖ablated) = {kl.value:.3f} nats: rank is saturated; "
            "give correct/incorrect answers to measure the logit difference."
        )
    return notes
