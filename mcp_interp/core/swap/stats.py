"""Statistics of the causal-swap protocol: top-1 scoring, exact intervals and the paired test.

Model-free so every number here can be checked by hand. Two choices a reader should know:

* **Success is a strict top-1** (``margin > 0``): the scored answer's logit is above every other
  token's. A tie for first is *not* a success, the same rule as the baseline-capability filter
  (a prompt tied for top is not capable). ``rank`` keeps the project's convention (tokens
  strictly above; ties optimistic; 0 = top-1), so a tie shows as rank 0 with margin 0.
* **The paired comparison is a sign test on per-trial differences.** For trial *i*,
  ``d_i = real_i − mean_s(control_{i,s})`` over the control seeds; trials with ``d_i = 0`` drop
  out and the signs of the rest are tested against 1/2 with an exact binomial test. With one
  control seed this *is* the exact McNemar test (``d_i`` is +1 for real-only successes, −1 for
  control-only ones). Per-seed McNemar tests are reported too, for the spread.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from scipy import stats


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


def clopper_pearson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper–Pearson) two-sided interval for a binomial proportion, from beta quantiles.

    ``(0, 1)`` when ``n == 0``: no trials, no information. 0 of 6 gives ``(0, 0.4593)``.
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    tail = (1 - confidence) / 2
    low = 0.0 if successes == 0 else float(stats.beta.ppf(tail, successes, n - successes + 1))
    high = 1.0 if successes == n else float(stats.beta.ppf(1 - tail, successes + 1, n - successes))
    return low, high


@dataclass(frozen=True)
class Rate:
    successes: int
    n: int
    low: float
    high: float

    @property
    def rate(self) -> float | None:
        return self.successes / self.n if self.n else None


def rate(successes: Sequence[bool]) -> Rate:
    k, n = sum(bool(s) for s in successes), len(successes)
    low, high = clopper_pearson(k, n)
    return Rate(successes=k, n=n, low=low, high=high)


@dataclass(frozen=True)
class SignTest:
    """Exact two-sided sign test of paired differences (real − control) against zero."""

    real_better: int  # trials (or clusters) where the real edit beat its controls
    control_better: int  # where the controls beat the real edit
    ties: int  # no difference (they carry no information and drop out)
    p_value: float


def sign_test(real: Sequence[bool], controls: Sequence[Sequence[bool]]) -> SignTest:
    """``real[i]`` is trial i's real success; ``controls[i]`` its control successes, one per seed."""
    if len(real) != len(controls):
        raise ValueError(f"{len(real)} real outcomes but {len(controls)} control rows")
    if any(not row for row in controls):
        raise ValueError("every trial needs at least one control outcome")
    return sign_test_of(
        [float(outcome) - sum(map(float, row)) / len(row) for outcome, row in zip(real, controls, strict=True)]
    )


def sign_test_of(differences: Sequence[float]) -> SignTest:
    """Exact two-sided sign test of paired differences (zeros drop out)."""
    better = sum(d > 0 for d in differences)
    worse = sum(d < 0 for d in differences)
    informative = better + worse
    p_value = 1.0 if informative == 0 else float(stats.binomtest(better, informative, 0.5).pvalue)
    return SignTest(real_better=better, control_better=worse, ties=len(differences) - informative, p_value=p_value)


def by_cluster(real: Sequence[bool], controls: Sequence[Sequence[bool]], clusters: Sequence[str]) -> SignTest:
    """The sign test with one difference per cluster (e.g. prompt): mean real − mean control over its trials.

    Trials of one prompt are not independent; this is the test whose n is the number of prompts.
    """
    grouped: dict[str, tuple[list[float], list[float]]] = {}
    for outcome, row, cluster in zip(real, controls, clusters, strict=True):
        real_values, control_values = grouped.setdefault(cluster, ([], []))
        real_values.append(float(outcome))
        control_values.extend(map(float, row))
    return sign_test_of([statistics.fmean(r) - statistics.fmean(c) for r, c in grouped.values()])


def spread(values: Sequence[float]) -> tuple[float, float, float, float]:
    """(mean, sample standard deviation, min, max); the deviation is 0 for fewer than two values."""
    if not values:
        return math.nan, math.nan, math.nan, math.nan
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), sd, min(values), max(values)
