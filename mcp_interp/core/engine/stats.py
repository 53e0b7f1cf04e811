"""Statistics every family's verdicts rest on: exact intervals and exact tests, model-free.

Model-free on purpose (numbers in, numbers out), so each statistic is checked by a seeded simulation of
its size under its null and its power without a model (``tests/engine/test_stats.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

CONFIDENCE = 0.95


def clopper_pearson(successes: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
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
    """Exact two-sided sign test of paired differences; with one control per trial, the exact McNemar test."""

    real_better: int  # trials where the real edit succeeded and the control did not
    control_better: int  # where the control succeeded and the real edit did not
    ties: int  # both or neither (they carry no information and drop out)
    p_value: float


def mcnemar(real: Sequence[bool], control: Sequence[bool]) -> SignTest:
    """Exact McNemar test of one control draw per trial against the real edit (discordant pairs vs ½)."""
    if len(real) != len(control):
        raise ValueError(f"{len(real)} real outcomes but {len(control)} control outcomes")
    better = sum(r and not c for r, c in zip(real, control, strict=True))
    worse = sum(c and not r for r, c in zip(real, control, strict=True))
    informative = better + worse
    p_value = 1.0 if informative == 0 else float(stats.binomtest(better, informative, 0.5).pvalue)
    return SignTest(real_better=better, control_better=worse, ties=len(real) - informative, p_value=p_value)
