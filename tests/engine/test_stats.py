"""The shared verdict statistics: hand-computed values, and seeded model-free simulations of each test's size under
its null (≤ 0.06 at α = 0.05) and its power — including the dependence real data has (a token effect shared by
every trial of a prompt)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mcp_interp.core.engine.numbers import stats
from mcp_interp.errors import InputError

ALPHA = 0.05


def test_rank_test_by_hand() -> None:
    test = stats.rank_test(2.0, [1.0, 3.0, -2.5])
    assert (test.at_least_as_extreme, test.p_value) == (2, 3 / 4)  # |3| and |−2.5| are ≥ |2|
    assert stats.rank_test(2.0, [1.0, 3.0, -2.5], "greater").p_value == 2 / 4
    assert stats.rank_test(2.0, [1.0, 3.0, -2.5], "less").p_value == 3 / 4
    assert stats.rank_test(5.0, [0.1] * 5).p_value == pytest.approx(1 / 6)  # beating all 5 is only p = 1/6
    assert stats.rank_test(1.0, [1.0, 0.0]).p_value == 2 / 3  # a tie counts against the real effect
    assert "indistinguishable" in stats.versus_random(stats.rank_test(1.0, [2.0] * 20))
    assert stats.versus_random(stats.rank_test(9.0, [1.0] * 20)).startswith("beats 20")


def test_check_draws_refuses_counts_that_cannot_reach_significance() -> None:
    stats.check_draws(20)
    stats.check_draws(100)
    for bad in (5, 18, 101, True):
        with pytest.raises(InputError, match="19 to 100"):
            stats.check_draws(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("distribution", ["normal", "cauchy", "discrete"])
def test_rank_test_size_under_exchangeability(distribution: str) -> None:
    """Real and random effects from one distribution (heavy tails and ties included): rejections ≤ α."""
    rng = np.random.default_rng(11)
    draw = {
        "normal": lambda size: rng.normal(size=size),
        "cauchy": lambda size: rng.standard_cauchy(size=size),
        "discrete": lambda size: rng.integers(-2, 3, size=size).astype(float),
    }[distribution]
    rejections = 0
    reps = 4000
    for _ in range(reps):
        values = draw(21)
        rejections += stats.rank_test(values[0], values[1:]).p_value <= ALPHA
    assert rejections / reps <= 0.06


def test_rank_test_power() -> None:
    """A real effect 4 standard deviations out is found with 20 draws in most runs (and never with 5)."""
    rng = np.random.default_rng(12)
    found = sum(stats.rank_test(4.0 + rng.normal(), rng.normal(size=20)).p_value <= ALPHA for _ in range(2000))
    assert found / 2000 >= 0.8
    assert all(stats.rank_test(100.0, rng.normal(size=5)).p_value > ALPHA for _ in range(10))


def test_relabel_test_exact_by_hand() -> None:
    """Two clusters of (real, control): the four relabellings give statistics ±1.5 ± 0.5 (each cluster's
    a_real − a_control, halved by the mean over 2 clusters), so the observed 2.0 is the largest: p_greater = 1/4."""
    test = stats.relabel_test([[2.0, 0.0], [1.0, 0.0]])
    assert test.method == "exact"
    assert test.statistic == pytest.approx(1.5)
    assert test.p_greater == pytest.approx(1 / 4)
    assert test.p_less == pytest.approx(1.0)
    assert test.p_value == pytest.approx(0.5)
    assert (test.real_mean, test.control_mean, test.real_above) == (1.5, 0.0, 2)


def test_relabel_test_exact_matches_enumeration() -> None:
    """Against a brute-force enumeration written independently (every choice of real column per cluster)."""
    rng = np.random.default_rng(3)
    arms = [rng.normal(size=k) for k in (3, 4, 2, 3)]
    observed = np.mean([a[0] - np.delete(a, 0).mean() for a in arms])
    null = [
        np.mean([a[j] - np.delete(a, j).mean() for a, j in zip(arms, choice, strict=True)])
        for choice in itertools.product(*(range(len(a)) for a in arms))
    ]
    test = stats.relabel_test(arms)
    assert test.statistic == pytest.approx(observed)
    assert test.p_greater == pytest.approx(np.mean(np.asarray(null) >= observed - 1e-12))
    assert test.p_less == pytest.approx(np.mean(np.asarray(null) <= observed + 1e-12))


def test_relabel_test_monte_carlo_agrees_with_exact() -> None:
    rng = np.random.default_rng(4)
    arms = [rng.normal(size=6) + (0.4 if i % 2 else 0) * np.eye(6)[0] for i in range(6)]  # 6^6 = 46656: exact
    exact = stats.relabel_test(arms)
    original = stats.EXACT_ENUMERATION_LIMIT
    try:
        stats.EXACT_ENUMERATION_LIMIT = 10
        sampled = stats.relabel_test(arms, seed=1, draws=20_000)
    finally:
        stats.EXACT_ENUMERATION_LIMIT = original
    assert (exact.method, sampled.method) == ("exact", "monte_carlo")
    assert sampled.p_greater == pytest.approx(exact.p_greater, abs=0.015)


def token_effect_clusters(
    rng: np.random.Generator, prompts: int, trials: int, controls: int, sigma: float, effect: float, outcome: str
) -> list[np.ndarray]:
    """The causal-swap null with a per-token effect: every arm of a prompt is one token (the real target or one
    control token per seed, fixed across the prompt's trials at its layers) whose effect N(−2, σ²) on the logit scale
    is shared by all of the prompt's trials, plus independent per-trial noise. ``effect`` is added to the real arm
    (0 = H0). ``outcome``: the per-trial margin gain, or a strict success (gain > 0); arms are summarised per prompt
    by their mean over trials."""
    tokens = rng.normal(-2.0, sigma, size=(prompts, 1 + controls))
    tokens[:, 0] += effect
    gains = tokens[:, None, :] + rng.normal(size=(prompts, trials, 1 + controls))
    values = gains if outcome == "margin" else (gains > 0).astype(float)
    return list(values.mean(axis=1))


@pytest.mark.parametrize("sigma", [0.0, 0.5, 1.5])
@pytest.mark.parametrize("outcome", ["margin", "success"])
def test_relabel_test_size_under_shared_token_effects(sigma: float, outcome: str) -> None:
    """Size ≤ 0.06 at α = 0.05 under the token-effect null (σ ∈ {0, 0.5, 1.5}) that broke the per-trial tests:
    12 prompts × 6 layers, 5 controls (6^12 relabellings: the Monte Carlo path)."""
    rng = np.random.default_rng(int(sigma * 10) + (0 if outcome == "margin" else 100))
    reps = 600
    rejected = 0
    for rep in range(reps):
        arms = token_effect_clusters(rng, 12, 6, 5, sigma, 0.0, outcome)
        rejected += stats.relabel_test(arms, seed=rep, draws=999).p_value <= ALPHA
    assert rejected / reps <= 0.06


@pytest.mark.parametrize("outcome", ["margin", "success"])
def test_relabel_test_power(outcome: str) -> None:
    """A real edit 1 logit better than its controls on every prompt (σ = 0.5): found in most benchmarks."""
    rng = np.random.default_rng(21)
    reps = 300
    found = sum(
        stats.relabel_test(token_effect_clusters(rng, 12, 6, 5, 0.5, 1.0, outcome), seed=rep, draws=999).p_greater
        <= ALPHA
        for rep in range(reps)
    )
    assert found / reps >= 0.8


def test_per_trial_relabelling_is_invalid_under_token_effects() -> None:
    """Why relabelling is per cluster: relabelling each trial independently (the real label drawn anew at every
    layer of a prompt) rejects far more often than α under the σ = 1.5 token-effect null — the failure reported
    against the old exchangeable-arm test."""
    rng = np.random.default_rng(5)
    reps = 300
    rejected = 0
    for rep in range(reps):
        tokens = rng.normal(-2.0, 1.5, size=(12, 6))
        gains = tokens[:, None, :] + rng.normal(size=(12, 6, 6))
        per_trial = list(gains.reshape(72, 6))  # every trial its own cluster
        rejected += stats.relabel_test(per_trial, seed=rep, draws=999).p_value <= ALPHA
    assert rejected / reps > 0.2


def test_mean_interval_coverage_and_hand_value() -> None:
    interval = stats.mean_interval([1.0, 2.0, 3.0])
    assert interval.mean == 2.0
    assert interval.high - 2.0 == pytest.approx(4.302652729911275 * 1.0 / np.sqrt(3))  # t(0.975, 2) · s/√n
    assert stats.mean_interval([4.0]) == stats.MeanInterval(4.0, 4.0, 4.0, 1)
    rng = np.random.default_rng(6)
    covered = 0
    for _ in range(3000):
        i = stats.mean_interval(rng.normal(size=10))
        covered += i.low <= 0.0 <= i.high
    assert 0.935 <= covered / 3000 <= 0.965  # nominal 95 % (exact for normal data; ±2 binomial SE of 3000 draws)
