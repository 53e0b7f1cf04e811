"""Model-free checks of the causal-swap statistics against hand computations and scipy."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
import torch
from scipy import stats

from mcp_interp.core.engine import stats as engine_stats
from mcp_interp.core.swap import stats as swap_stats
from mcp_interp.core.swap.summary import summarize
from mcp_interp.schemas.swap import AnswerScore, ControlDraw, TrialRecord


def test_score_answer_rank_margin_and_ties() -> None:
    logits = torch.tensor([1.0, 3.0, 2.0, 3.0, -1.0])
    tied = swap_stats.score_answer(logits, 1)
    # Token 3 ties token 1 for first: rank 0 (ties optimistic), margin 0, so not a strict top-1.
    assert (tied.rank, tied.margin, tied.strict_top1, tied.top_token) == (0, 0.0, False, 1)
    second = swap_stats.score_answer(logits, 2)
    assert (second.rank, second.margin, second.strict_top1) == (2, -1.0, False)
    logits[3] = 2.5
    top = swap_stats.score_answer(logits, 1)
    assert (top.rank, top.margin, top.strict_top1) == (0, 0.5, True)
    last = swap_stats.score_answer(logits, 4)
    assert last.rank == 4 and last.margin == -4.0


def test_clopper_pearson_equals_scipy_binomtest_exact_interval() -> None:
    for k, n in [(0, 6), (6, 6), (1, 10), (5, 10), (37, 120), (0, 1)]:
        reference = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        low, high = engine_stats.clopper_pearson(k, n)
        assert math.isclose(low, reference.low, abs_tol=1e-12) and math.isclose(high, reference.high, abs_tol=1e-12)
    assert round(engine_stats.clopper_pearson(0, 6)[1], 4) == 0.4593  # 1 − 0.025^(1/6), by hand
    assert engine_stats.clopper_pearson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        engine_stats.clopper_pearson(3, 2)


def test_mcnemar_counts_discordant_pairs() -> None:
    real = [True] * 7 + [False] * 3
    control = [False] * 6 + [True] * 1 + [False] * 2 + [True]
    test = engine_stats.mcnemar(real, control)
    assert (test.real_better, test.control_better, test.ties) == (6, 1, 3)
    assert math.isclose(test.p_value, 2 * (1 + 7) / 2**7)  # two-sided exact binomial, 6 of 7 at ½: by hand
    assert engine_stats.mcnemar([], []).p_value == 1.0


def brute_force_null(arms: list[list[bool]]) -> dict[int, float]:
    """P(T = t) when each trial's real label sits on a uniformly random arm: by enumerating every labelling."""
    counts: dict[int, float] = {}
    total = math.prod(len(a) for a in arms)
    for labelling in itertools.product(*[range(len(a)) for a in arms]):
        t = sum(a[i] for a, i in zip(arms, labelling, strict=True))
        counts[t] = counts.get(t, 0.0) + 1 / total
    return counts


def test_exchangeable_test_equals_enumeration_of_every_labelling() -> None:
    real = [True, True, False, True, False, True]
    controls = [[False, False], [True, False], [True, True], [False, True], [False, False], [True, True]]
    arms = [[r, *c] for r, c in zip(real, controls, strict=True)]
    null = brute_force_null(arms)
    observed = sum(real)
    test = swap_stats.exchangeable_test(real, controls)
    greater = sum(p for t, p in null.items() if t >= observed)
    less = sum(p for t, p in null.items() if t <= observed)
    assert test.real_successes == 4
    assert math.isclose(test.expected, 1 / 3 + 2 / 3 + 2 / 3 + 2 / 3 + 0 + 1)  # Σ s_i / (m + 1), by hand
    assert test.informative_trials == 4  # trials 5 (no success) and 6 (all succeed) are fixed under H0
    assert math.isclose(test.p_real_better, greater, rel_tol=1e-9)
    assert math.isclose(test.p_control_better, less, rel_tol=1e-9)
    assert math.isclose(test.p_value, min(1.0, 2 * min(greater, less)), rel_tol=1e-9)
    assert swap_stats.exchangeable_test([], []).p_value == 1.0


def prompt_statistic(real: list[bool], controls: list[list[bool]], clusters: list[str]) -> float:
    """Mean over prompts of the mean over their trials of real − mean(controls), written out directly."""
    by_prompt: dict[str, list[float]] = {}
    for r, c, cluster in zip(real, controls, clusters, strict=True):
        by_prompt.setdefault(cluster, []).append(r - sum(c) / len(c))
    return sum(sum(d) / len(d) for d in by_prompt.values()) / len(by_prompt)


def test_prompt_level_test_equals_enumeration_of_every_labelling() -> None:
    real = [True, True, False, False, True, True]
    controls = [[False, False], [True, False], [True, False], [False, False], [True, True], [False, True]]
    clusters = ["a", "a", "b", "b", "c", "c"]
    observed = prompt_statistic(real, controls, clusters)
    arms = [[r, *c] for r, c in zip(real, controls, strict=True)]
    greater = less = 0.0
    mean = 0.0
    total = math.prod(len(a) for a in arms)
    for labelling in itertools.product(*[range(len(a)) for a in arms]):
        relabelled_real = [a[i] for a, i in zip(arms, labelling, strict=True)]
        relabelled_controls = [a[:i] + a[i + 1 :] for a, i in zip(arms, labelling, strict=True)]
        value = prompt_statistic(relabelled_real, relabelled_controls, clusters)
        mean += value / total
        greater += (value >= observed - 1e-12) / total
        less += (value <= observed + 1e-12) / total
    test = swap_stats.prompt_level_test(real, controls, clusters)
    assert test.method == "exact" and test.monte_carlo_draws == 0
    assert math.isclose(test.statistic, observed, abs_tol=1e-12)
    assert math.isclose(test.null_mean, mean, abs_tol=1e-12)
    assert math.isclose(test.p_real_better, greater, rel_tol=1e-9)
    assert math.isclose(test.p_control_better, less, rel_tol=1e-9)
    # a: (1 − ½ + 1 − ½)/2 = ½ > 0; b: (−½ + 0)/2 < 0; c: (1 − 1 + 1 − ½)/2 > 0.
    assert (test.real_better, test.control_better, test.ties) == (2, 1, 0)


def test_prompt_level_monte_carlo_agrees_with_the_exact_null(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    real = [rng.random() < 0.5 for _ in range(40)]
    controls = [[rng.random() < 0.3 for _ in range(3)] for _ in range(40)]
    clusters = [f"p{rng.randrange(7)}" for _ in range(40)]
    exact = swap_stats.prompt_level_test(real, controls, clusters)
    monkeypatch.setattr(swap_stats, "EXACT_SUPPORT_LIMIT", 10)
    sampled = swap_stats.prompt_level_test(real, controls, clusters, seed=5)
    assert exact.method == "exact" and sampled.method == "monte_carlo"
    assert sampled.monte_carlo_draws == swap_stats.MONTE_CARLO_DRAWS and sampled.monte_carlo_se > 0
    assert abs(sampled.p_real_better - exact.p_real_better) < 4 * sampled.monte_carlo_se + 1e-5
    assert abs(sampled.p_control_better - exact.p_control_better) < 4 * sampled.monte_carlo_se + 1e-5


def old_sign_test_p(real: np.ndarray, controls: np.ndarray) -> float:
    """The statistic this project reported before: sign of real − mean(controls), binomial against ½."""
    d = real - controls.mean(axis=1)
    better, worse = int((d > 0).sum()), int((d < 0).sum())
    return 1.0 if better + worse == 0 else float(stats.binomtest(better, better + worse, 0.5).pvalue)


def rejection_rates(p_real: float, p_control: float, m: int, reps: int, seed: int) -> tuple[float, float]:
    """Rejection rates at α = 0.05 over ``reps`` simulated benchmarks of 100 trials: (exchangeable test, old test)."""
    rng = np.random.default_rng(seed)
    new = old = 0
    for _ in range(reps):
        real = rng.random(100) < p_real
        controls = rng.random((100, m)) < p_control
        new += swap_stats.exchangeable_test(real.tolist(), controls.tolist()).p_value < 0.05
        old += old_sign_test_p(real, controls) < 0.05
    return new / reps, old / reps


@pytest.mark.parametrize("m", [1, 5])
def test_exchangeable_test_holds_its_size_under_the_null_and_has_power(m: int) -> None:
    # H0: the real edit is one more control (same success probability p), 100 trials, 1000 seeded benchmarks.
    sizes = {p: rejection_rates(p, p, m, reps=1000, seed=int(100 * p) + m) for p in (0.05, 0.3, 0.5, 0.7, 0.9)}
    assert all(new <= 0.06 for new, _ in sizes.values()), sizes
    power, _ = rejection_rates(0.3, 0.1, m, reps=1000, seed=7 + m)
    assert power >= 0.9, power
    if_old = max(old for _, old in sizes.values())
    # The sign test of real − mean(controls) this replaces: exact when m = 1, far too liberal when m > 1.
    assert (if_old <= 0.06) == (m == 1), sizes


def test_prompt_level_test_holds_its_size_with_prompt_effects_and_has_power() -> None:
    rng = np.random.default_rng(11)
    clusters = [f"prompt{j}" for j in range(10) for _ in range(10)]
    rejected_null = rejected_effect = 0
    reps = 300
    for _ in range(reps):
        base = np.repeat(rng.beta(1, 3, size=10), 10)  # each prompt has its own success rate
        controls = rng.random((100, 5)) < base[:, None]
        null_real = rng.random(100) < base
        effect_real = rng.random(100) < np.clip(base + 0.3, 0, 1)
        rejected_null += swap_stats.prompt_level_test(null_real.tolist(), controls.tolist(), clusters).p_value < 0.05
        rejected_effect += (
            swap_stats.prompt_level_test(effect_real.tolist(), controls.tolist(), clusters).p_value < 0.05
        )
    assert rejected_null / reps <= 0.06
    assert rejected_effect / reps >= 0.9


def test_rate_and_spread() -> None:
    r = engine_stats.rate([True, False, False, True])
    assert (r.successes, r.n, r.rate) == (2, 4, 0.5)
    assert (r.low, r.high) == engine_stats.clopper_pearson(2, 4)
    assert engine_stats.rate([]).rate is None
    mean, sd, low, high = swap_stats.spread([0.2, 0.4, 0.6])
    assert math.isclose(mean, 0.4) and math.isclose(sd, 0.2) and (low, high) == (0.2, 0.6)
    assert swap_stats.spread([0.3])[1] == 0.0


def record(function: str, source: str, layer: int, real: bool | None, controls: list[bool]) -> TrialRecord:
    """A hand-built trial: ``real`` None means skipped (source inactive); scores carry only what summarize reads."""

    def score(top1: bool) -> AnswerScore:
        return AnswerScore(
            token=" x",
            token_id=1,
            logit=0.0,
            rank=0 if top1 else 3,
            margin=1.0 if top1 else -1.0,
            top1=top1,
            top_token=" x",
        )

    executed = real is not None
    return TrialRecord(
        function=function,
        source=source,
        target="T",
        layer=layer,
        prompt=f"{function} of {source}",
        position=3,
        position_token=" x",
        status="executed" if executed else "skipped_source_inactive",
        real=score(real) if executed else None,
        controls=[
            ControlDraw(seed=s, token=" c", token_id=2, displacement=1.0, edit_norm=1.0, score=score(c))
            for s, c in enumerate(controls)
        ]
        if executed
        else [],
    )


def test_summarize_counts_constructed_trials_by_hand() -> None:
    trials = [
        record("capital", "France", 0, True, [False, False]),
        record("capital", "France", 1, True, [True, False]),
        record("capital", "Japan", 0, False, [False, True]),
        record("language", "Italy", 1, False, [False, False]),
        record("language", "Italy", 0, None, []),
    ]
    summary = summarize(trials, layers=[0, 1], seeds=[0, 1], excluded=7)
    assert summary.status_counts == {"executed": 4, "skipped_source_inactive": 1, "skipped_no_control_token": 0}
    assert (summary.real.successes, summary.real.n, summary.real.n_independent_prompts) == (2, 4, 3)
    assert (summary.control.successes, summary.control.n) == (2, 8)
    assert [(s.seed, s.rate.successes, s.rate.n) for s in summary.control_by_seed] == [(0, 1, 4), (1, 1, 4)]
    # McNemar per seed, (real, control) per trial — seed 0: (T,F) (T,T) (F,F) (F,F); seed 1: (T,F) (T,F) (F,T) (F,F).
    assert [(t.real_only, t.control_only) for t in summary.paired.per_seed] == [(1, 0), (2, 1)]
    # Exchangeable-arm null: s/3 per trial = 1/3, 2/3, 1/3, 0 → E[T] = 4/3; observed T = 2.
    assert summary.paired.real_successes == 2
    assert math.isclose(summary.paired.expected_real_successes, 4 / 3)
    assert summary.paired.informative_trials == 3
    assert [(row.layer, row.executed, row.skipped_source_inactive) for row in summary.by_layer] == [
        (0, 2, 1),
        (1, 2, 0),
    ]
    assert summary.layers_executed == [0, 1]
    assert summary.real_success_prompts == ["capital/France"]
    assert (summary.excluded_trials, summary.n_independent_prompts) == (7, 3)
    # by prompt: France (1 − ¼ + 1 − ½)/2 > 0, Japan 0 − ½ < 0, Italy 0 − 0 = 0.
    assert (summary.paired.by_prompt.real_better, summary.paired.by_prompt.control_better) == (1, 1)
    assert summary.paired.by_prompt.ties == 1


def test_score_sequence_is_strict_top1_at_every_step() -> None:
    from mcp_interp.core.swap.stats import score_answer, score_sequence

    steps = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 4.0, 1.0], [1.0, 2.0, 2.0, 0.0]], dtype=torch.float64)
    both = score_sequence(steps[:2], [1, 0])  # top-1 at both steps, margins 1 and 1
    assert both.strict_top1 and both.margin == 1.0 and both.rank == 0 and both.logit == 3.0
    fails = score_sequence(steps[:2], [1, 2])  # the second token is beaten by token 0 by 1
    assert not fails.strict_top1 and fails.margin == -1.0 and fails.top_token == 0 and fails.rank == 0
    tie = score_sequence(steps, [1, 0, 2])  # a tie for first at the last step is not a success
    assert tie.margin == 0.0 and not tie.strict_top1 and tie.top_token in (1, 2)
    one = score_sequence(steps[:1], [3])
    assert one == score_answer(steps[0], 3)
