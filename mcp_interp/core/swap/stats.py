"""Statistics of the causal-swap protocol: top-1 scoring, and the per-prompt arm tables its tests read.

Model-free so every number here can be checked by hand. Choices a reader should know:

* **Success is a strict top-1** (``margin > 0``): the scored answer's logit is above every other
  token's. A tie for first is *not* a success, the same rule as the baseline-capability filter
  (a prompt tied for top is not capable). ``rank`` keeps the project's convention (tokens
  strictly above; ties optimistic; 0 = top-1), so a tie shows as rank 0 with margin 0.
* **Real edits are compared with their controls per target, one swap each, not per trial.** A
  trial has m + 1 arms — the real edit and its m displacement-matched controls, one token per
  seed — and a swap (function, source, target) has a trial at every layer it runs at. The real
  arm is the target's token at every layer, and so is each control (``swap.controls``), so a
  token's effect is shared by all of a column's trials; the target's token is moreover the real
  arm of every swap toward it (about 6 prompts per function), whose controls are tokens of their
  own. The tests therefore take one swap per target (``summary.tested_swaps``), summarise each
  (target, arm) by one number over that swap's trials (``arm_means``: a success rate, a mean
  margin gain, or the fraction of trials in which that arm ``beats_all`` the others) and relabel
  which *column* is real, once per target (``engine.stats.relabel_test``). Relabelling each trial
  independently rejects a true null 12–49 % of the time at α = 0.05 once tokens have effects of
  their own (σ = 0.5–1.5 logits), and so does relabelling per prompt (function, source) or per
  target over all its swaps (``tests/swap/test_stats.py`` simulates them on the shipped corpora).
  A sign test of real − mean(controls) per trial is not valid either: with m > 1 its signs are
  unbalanced under the null unless p = ½, and its trials are not independent.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class TopScore:
    """How one answer token fares in one next-token distribution (logits at one position)."""

    logit: float
    rank: int  # tokens with a strictly larger logit; 0 = top-1 (a tie counts as 0)
    margin: float  # answer logit − the largest logit among all other tokens; > 0 = strict top-1
    top_token: int  # argmax (lowest id among ties)

    @property
    def strict_top1(self) -> bool:
        return self.margin > 0


def score_answer(logits: torch.Tensor, answer_id: int) -> TopScore:
    """Score ``answer_id`` in a ``[vocab]`` logit vector (computed in float64)."""
    if logits.ndim != 1:
        raise ValueError(f"expected a [vocab] logit vector, got shape {tuple(logits.shape)}")
    values = logits.detach().to("cpu", torch.float64)
    answer = values[answer_id]
    others = torch.cat([values[:answer_id], values[answer_id + 1 :]])
    return TopScore(
        logit=float(answer),
        rank=int((values > answer).sum()),
        margin=float(answer - others.max()),
        top_token=int(values.argmax()),
    )


def score_sequence(step_logits: torch.Tensor, answer: Sequence[int]) -> TopScore:
    """Score an answer of one or more tokens from ``[len(answer), vocab]`` teacher-forced logits (row k
    predicts ``answer[k]`` after the prompt and ``answer[:k]``).

    The answer is the strict top-1 exactly when greedy decoding produces all of it, so ``margin`` is the
    smallest margin over its tokens (> 0 iff every token is the strict top-1); ``logit`` and ``rank`` are
    the first token's; ``top_token`` is the model's top token at the first step where the answer is not
    the strict top-1 (the first step's when it always is). One token: exactly ``score_answer``.
    """
    if step_logits.ndim != 2 or step_logits.shape[0] != len(answer) or not len(answer):
        raise ValueError(f"expected [{len(answer)}, vocab] step logits, got shape {tuple(step_logits.shape)}")
    steps = [score_answer(row, token) for row, token in zip(step_logits, answer, strict=True)]
    failing = next((step for step in steps if not step.strict_top1), steps[0])
    return TopScore(
        logit=steps[0].logit,
        rank=steps[0].rank,
        margin=min(step.margin for step in steps),
        top_token=failing.top_token,
    )


def arm_means(rows: Sequence[Sequence[float]], clusters: Sequence[Hashable]) -> list[list[float]]:
    """Per cluster (in order of first appearance), the mean over its trials of each arm's value.

    ``rows[i]`` is trial i's arms, the real edit first and then one value per control seed (every trial of a
    cluster has the same arms); ``clusters[i]`` names its cluster (the target of a tested swap). The result is
    ``relabel_test``'s input: one number per (cluster, arm), so a target counts once however many layers it has."""
    if len(rows) != len(clusters):
        raise ValueError(f"{len(rows)} trials but {len(clusters)} cluster labels")
    sums: dict[Hashable, np.ndarray] = {}
    counts: dict[Hashable, int] = {}
    for row, cluster in zip(rows, clusters, strict=True):
        values = np.asarray(row, dtype=np.float64)
        if cluster in sums and sums[cluster].shape != values.shape:
            raise ValueError(f"cluster {cluster!r} has trials with {sums[cluster].size} and {values.size} arms")
        sums[cluster] = sums.get(cluster, 0.0) + values
        counts[cluster] = counts.get(cluster, 0) + 1
    return [(sums[c] / counts[c]).tolist() for c in sums]


def beats_all(row: Sequence[float]) -> list[float]:
    """1.0 for the arm whose value is strictly above every other arm's, 0.0 for the rest (all 0 on a tie for first).

    With m + 1 exchangeable arms and no ties, each arm beats all the others with probability 1/(m + 1)."""
    values = np.asarray(row, dtype=np.float64)
    best = int(values.argmax())
    out = [0.0] * values.size
    if values.size < 2 or values[best] > np.delete(values, best).max():
        out[best] = 1.0
    return out


def spread(values: Sequence[float]) -> tuple[float, float, float, float]:
    """(mean, sample standard deviation, min, max); the deviation is 0 for fewer than two values."""
    if not values:
        return math.nan, math.nan, math.nan, math.nan
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), sd, min(values), max(values)
