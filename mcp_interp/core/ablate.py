"""The measurement behind ``ablate_head``: every metric before and after, and where they disagree.

Metrics see different things (see ``core.metrics``). The most common way to a confident wrong
conclusion is reading one that is blind to the effect — rank stuck at 0 while the logit
difference halves, KL tiny while the correct−incorrect margin collapses — so disagreements are
written into ``notes`` rather than left for the reader to spot.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mcp_interp.core import metrics
from mcp_interp.core.interventions import Ablation, ablation_from_spec, prepare_ablation
from mcp_interp.core.readouts import answer_logits
from mcp_interp.core.tokens import encode, resolve_answers
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.common import AblationSpec, Score
from mcp_interp.schemas.heads import AblateHeadMeasurement, MetricSet

# Thresholds for disagreement notes, in the metrics' own units.
LOGIT_DIFF_MOVED = 0.5  # nats of log-odds: a change worth reporting
KL_SMALL = 0.1  # nats


def ablate_heads(
    model: LoadedModel,
    prompts: Sequence[str],
    ablation: Ablation | AblationSpec,
    correct: str | Sequence[str] | None = None,
    incorrect: str | Sequence[str] | None = None,
) -> AblateHeadMeasurement:
    if isinstance(ablation, AblationSpec):  # a tool's arguments: heads named as strings or objects
        cfg = model.bridge.cfg
        parsed = ablation_from_spec(ablation, cfg.n_layers, cfg.n_heads)
        assert parsed is not None
        ablation = parsed
    batch = encode(model.tokenizer, prompts, model.device)
    n = len(batch.texts)
    correct_ids = resolve_answers(model.tokenizer, correct, n, "correct") if correct is not None else None
    incorrect_ids = resolve_answers(model.tokenizer, incorrect, n, "incorrect") if incorrect is not None else None
    prepared = prepare_ablation(model.bridge, batch, ablation)
    clean = answer_logits(model, batch)
    with torch.inference_mode(), model.bridge.hooks(fwd_hooks=prepared.hooks):
        ablated = metrics.at_answer_positions(
            model.bridge(batch.input_ids, return_type="logits"), batch.answer_positions
        )

    notes: list[str] = []
    if correct_ids is None:
        answer_ids = [int(i) for i in clean.argmax(dim=-1)]
        answer = "clean top-1"
        notes.append("No `correct` answer given: log_prob and rank track each prompt's clean top-1 token.")
    else:
        answer_ids, answer = correct_ids, "correct"
        not_top = [i for i in range(n) if int(clean[i].argmax()) != correct_ids[i]]
        if not_top:
            notes.append(f"The correct answer is not the clean top-1 for examples {not_top}.")

    def metric_set(logits: torch.Tensor) -> MetricSet:
        diff = None
        if correct_ids is not None and incorrect_ids is not None:
            diff = metrics.logit_diff(logits, correct_ids, incorrect_ids)
        return MetricSet(
            logit_diff=diff,
            log_prob=metrics.answer_logprob(logits, answer_ids),
            rank=metrics.answer_rank(logits, answer_ids),
        )

    before, after = metric_set(clean), metric_set(ablated)
    kl = metrics.kl_divergence(clean, ablated)
    if (correct_ids is None) != (incorrect_ids is None):
        notes.append("Give both `correct` and `incorrect` to get the logit difference.")
    notes.extend(disagreements(before, after, kl))
    return AblateHeadMeasurement(
        heads=[str(h) for h in ablation.heads],
        method=ablation.method,
        positions=ablation.positions if ablation.positions is not None else "all",  # type: ignore[arg-type]
        mean_over=prepared.mean_over,
        permutation=prepared.permutation,
        answer=answer,
        answer_tokens=[model.tokenizer.decode([i]) for i in answer_ids],
        before=before,
        after=after,
        kl=kl,
        notes=notes,
    )


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
                "correct−incorrect margin collapsed. KL alone would call this head unimportant."
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
