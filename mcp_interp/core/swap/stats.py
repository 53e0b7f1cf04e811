"""Statistics of the causal-swap protocol: top-1 scoring, exact intervals and the paired test.

Model-free so every number here can be checked by hand. Two choices a reader should know:

* **Success is a strict top-1** (``margin > 0``): the scored answer's logit is above every other
  token's. A tie for first is *not* a success, the same rule as the baseline-capability filter
  (a prompt tied for top is not capable). ``rank`` keeps the project's convention (tokens
  strictly above; ties optimistic; 0 = top-1), so a tie shows as rank 0 with margin 0.
* **The paired comparison is an exact conditional test.** A trial has m + 1 arms — the real edit
  and its m displacement-matched controls, one per seed. Under the null the real edit is one more
  control (the arms are exchangeable), so given s_i successes among trial i's arms the real arm
  succeeds with probability s_i / (m + 1); the number of real successes then has a
  Poisson-binomial null (``exchangeable_test``), and a prompt-weighted version re-labels the same
  way (``prompt_level_test``). A sign test of real − mean(controls) is *not* valid here: with
  m > 1 its signs are unbalanced under the null unless p = ½ (P(d > 0) = p(1 − pᵐ) against
  P(d < 0) = (1 − p)(1 − (1 − p)ᵐ)). Per-seed McNemar tests (m = 1, where the sign test is exact)
  are reported too, for the spread across seeds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
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


@dataclass(frozen=True)
class ExchangeableTest:
    """The exact conditional (exchangeable-arm) test of real edits against their matched controls.

    H0: in every trial the real edit is just one more control — its m + 1 arms (the real edit and
    m controls) are exchangeable. Given that trial i had s_i successes among its arms, the real arm
    is then a success with probability s_i / (m_i + 1), independently across trials (conditioning on
    the arms' outcomes, the only randomness left is which arm carries the "real" label). So
    T = number of real successes has a Poisson-binomial null, exactly, whatever p is and however
    trials depend on each other through shared prompts — unlike a sign test of
    real − mean(controls), which is biased unless m = 1 or p = ½.
    """

    real_successes: int  # T, observed
    expected: float  # E[T] under H0 = Σ s_i / (m_i + 1)
    informative_trials: int  # trials whose arms disagree (0 < s_i < m_i + 1); the rest are fixed under H0
    p_real_better: float  # P(T ≥ observed) under H0: one-sided, real edits succeed more than controls
    p_control_better: float  # P(T ≤ observed) under H0
    p_value: float  # two-sided: 2 · min(one-sided), capped at 1


def arm_successes(real: Sequence[bool], controls: Sequence[Sequence[bool]]) -> tuple[list[float], list[int]]:
    """Per trial: the null probability s_i / (m_i + 1) that the real arm succeeds, and m_i."""
    if len(real) != len(controls):
        raise ValueError(f"{len(real)} real outcomes but {len(controls)} control rows")
    if any(not row for row in controls):
        raise ValueError("every trial needs at least one control outcome")
    probabilities = [(int(r) + sum(map(int, row))) / (len(row) + 1) for r, row in zip(real, controls, strict=True)]
    return probabilities, [len(row) for row in controls]


def exchangeable_test(real: Sequence[bool], controls: Sequence[Sequence[bool]]) -> ExchangeableTest:
    """``real[i]``: trial i's real success; ``controls[i]``: its control successes (one per seed)."""
    probabilities, _ = arm_successes(real, controls)
    observed = sum(map(int, real))
    if not real:
        return ExchangeableTest(0, 0.0, 0, 1.0, 1.0, 1.0)
    null = stats.poisson_binom(probabilities)
    greater = float(null.sf(observed - 1))
    less = float(null.cdf(observed))
    return ExchangeableTest(
        real_successes=observed,
        expected=float(sum(probabilities)),
        informative_trials=sum(0 < q < 1 for q in probabilities),
        p_real_better=min(1.0, greater),
        p_control_better=min(1.0, less),
        p_value=min(1.0, 2 * min(greater, less)),
    )


@dataclass(frozen=True)
class PromptLevelTest:
    """The exchangeable-arm test with prompts weighted equally instead of trials.

    Statistic: the mean over prompts of each prompt's mean per-trial difference
    d_i = real_i − mean(controls_i). Its null distribution comes from the same relabelling as
    ``ExchangeableTest`` (in each trial the real label sits on a uniformly random arm), computed
    exactly by convolution when the support stays small, else by a seeded Monte Carlo whose own
    standard error is reported.
    """

    statistic: float  # observed mean over prompts of the mean difference real − control; in [−1, 1]
    null_mean: float  # its expectation under H0
    real_better: int  # prompts whose mean difference is > 0
    control_better: int  # < 0
    ties: int  # = 0
    p_real_better: float
    p_control_better: float
    p_value: float  # two-sided: 2 · min(one-sided), capped at 1
    method: str  # "exact" or "monte_carlo"
    monte_carlo_draws: int  # 0 when exact
    monte_carlo_se: float  # standard error of the reported p-values (0 when exact)


EXACT_SUPPORT_LIMIT = 200_000
MONTE_CARLO_DRAWS = 100_000
MONTE_CARLO_CHUNK = 5_000
_TOLERANCE = 1e-9


def prompt_level_test(
    real: Sequence[bool], controls: Sequence[Sequence[bool]], clusters: Sequence[str], seed: int = 0
) -> PromptLevelTest:
    """``clusters[i]`` names trial i's prompt (e.g. 'capital/France')."""
    probabilities, arms = arm_successes(real, controls)
    if len(clusters) != len(real):
        raise ValueError(f"{len(real)} trials but {len(clusters)} cluster labels")
    sizes: dict[str, int] = {}
    for cluster in clusters:
        sizes[cluster] = sizes.get(cluster, 0) + 1
    n_prompts = len(sizes)
    if not n_prompts:
        return PromptLevelTest(0.0, 0.0, 0, 0, 0, 1.0, 1.0, 1.0, "exact", 0, 0.0)
    # d_i = −s_i/m_i + (1 + 1/m_i)·real_i with s_i all arms' successes, so the statistic is a constant plus
    # Σ w_i·real_i, w_i = (1 + 1/m_i) / (n_prompts · n_prompt(i)): a weighted sum of independent Bernoullis.
    weights = [(1 + 1 / m) / (n_prompts * sizes[c]) for m, c in zip(arms, clusters, strict=True)]
    offset = sum(
        -q * (m + 1) / m / (n_prompts * sizes[c]) for q, m, c in zip(probabilities, arms, clusters, strict=True)
    )
    observed = sum(w for w, r in zip(weights, real, strict=True) if r)
    differences: dict[str, float] = {}
    for q, m, c, r in zip(probabilities, arms, clusters, real, strict=True):
        differences[c] = differences.get(c, 0.0) + (int(r) - (q * (m + 1) - int(r)) / m) / sizes[c]
    greater, less, draws, error = _weighted_bernoulli_tails(weights, probabilities, observed, seed)
    return PromptLevelTest(
        statistic=offset + observed,
        null_mean=offset + sum(w * q for w, q in zip(weights, probabilities, strict=True)),
        real_better=sum(d > _TOLERANCE for d in differences.values()),
        control_better=sum(d < -_TOLERANCE for d in differences.values()),
        ties=sum(abs(d) <= _TOLERANCE for d in differences.values()),
        p_real_better=greater,
        p_control_better=less,
        p_value=min(1.0, 2 * min(greater, less)),
        method="exact" if draws == 0 else "monte_carlo",
        monte_carlo_draws=draws,
        monte_carlo_se=error,
    )


def _weighted_bernoulli_tails(
    weights: Sequence[float], probabilities: Sequence[float], observed: float, seed: int
) -> tuple[float, float, int, float]:
    """P(X ≥ observed), P(X ≤ observed) for X = Σ w_i·B_i, B_i ~ Bernoulli(p_i) independent; then the number of
    Monte Carlo draws (0 = exact) and the standard error of the larger-variance tail."""
    support: dict[float, float] = {0.0: 1.0}
    for w, q in zip(weights, probabilities, strict=True):
        if q <= 0.0 or q >= 1.0:  # a fixed arm shifts the sum without spreading it
            shift = w if q >= 1.0 else 0.0
            support = {round(v + shift, 12): mass for v, mass in support.items()}
            continue
        grown: dict[float, float] = {}
        for v, mass in support.items():
            grown[v] = grown.get(v, 0.0) + mass * (1 - q)
            key = round(v + w, 12)
            grown[key] = grown.get(key, 0.0) + mass * q
        support = grown
        if len(support) > EXACT_SUPPORT_LIMIT:
            return _monte_carlo_tails(weights, probabilities, observed, seed)
    greater = sum(mass for v, mass in support.items() if v >= observed - _TOLERANCE)
    less = sum(mass for v, mass in support.items() if v <= observed + _TOLERANCE)
    return min(1.0, greater), min(1.0, less), 0, 0.0


def _monte_carlo_tails(
    weights: Sequence[float], probabilities: Sequence[float], observed: float, seed: int
) -> tuple[float, float, int, float]:
    generator = np.random.default_rng(seed)
    p, w = np.asarray(probabilities), np.asarray(weights, dtype=np.float64)
    at_least = at_most = 0
    for start in range(0, MONTE_CARLO_DRAWS, MONTE_CARLO_CHUNK):  # bounded memory whatever the trial count
        draws = generator.random((min(MONTE_CARLO_CHUNK, MONTE_CARLO_DRAWS - start), len(w))) < p
        values = draws.astype(np.float64) @ w
        at_least += int(np.sum(values >= observed - _TOLERANCE))
        at_most += int(np.sum(values <= observed + _TOLERANCE))
    # (count + 1) / (draws + 1): a Monte Carlo p-value that is itself valid (never 0).
    greater = (at_least + 1) / (MONTE_CARLO_DRAWS + 1)
    less = (at_most + 1) / (MONTE_CARLO_DRAWS + 1)
    worst = max(greater * (1 - greater), less * (1 - less))
    return greater, less, MONTE_CARLO_DRAWS, math.sqrt(worst / MONTE_CARLO_DRAWS)


def spread(values: Sequence[float]) -> tuple[float, float, float, float]:
    """(mean, sample standard deviation, min, max); the deviation is 0 for fewer than two values."""
    if not values:
        return math.nan, math.nan, math.nan, math.nan
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), sd, min(values), max(values)
