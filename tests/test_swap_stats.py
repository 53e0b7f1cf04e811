"""Model-free checks of the causal-swap statistics against hand computations and scipy."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from mcp_interp.core.swap import stats as swap_stats


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


def test_clopper_pearson_pinned_and_against_beta_quantiles() -> None:
    low, high = swap_stats.clopper_pearson(0, 6)
    assert low == 0.0 and round(high, 4) == 0.4593
    assert math.isclose(high, 1 - 0.025 ** (1 / 6))  # closed form when k = 0
    low, high = swap_stats.clopper_pearson(6, 6)
    assert high == 1.0 and math.isclose(low, 0.025 ** (1 / 6))
    for k, n in [(1, 10), (5, 10), (37, 120)]:
        low, high = swap_stats.clopper_pearson(k, n)
        assert math.isclose(low, stats.beta.ppf(0.025, k, n - k + 1))
        assert math.isclose(high, stats.beta.ppf(0.975, k + 1, n - k))
        assert low < k / n < high
    assert swap_stats.clopper_pearson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        swap_stats.clopper_pearson(3, 2)


def test_sign_test_matches_a_hand_count() -> None:
    real = [True, True, True, False, True, False, True]
    controls = [
        [False, False],  # +1   real better
        [True, False],  # +0.5 real better
        [True, True],  # 0    tie
        [True, False],  # -0.5 control better
        [False, False],  # +1   real better
        [False, False],  # 0    tie
        [False, True],  # +0.5 real better
    ]
    test = swap_stats.sign_test(real, controls)
    assert (test.real_better, test.control_better, test.ties) == (4, 1, 2)
    # Two-sided exact binomial, 4 of 5 at p = 1/2: (1 + 5 + 5 + 1) / 32 = 0.375.
    assert math.isclose(test.p_value, 12 / 32)


def test_one_seed_sign_test_is_exact_mcnemar() -> None:
    real = [True] * 7 + [False] * 3
    control = [[False]] * 6 + [[True]] * 1 + [[False]] * 3
    test = swap_stats.sign_test(real, control)
    assert (test.real_better, test.control_better) == (6, 0)
    assert math.isclose(test.p_value, 2 / 2**6)  # McNemar exact: b = 6, c = 0
    assert swap_stats.sign_test([], []).p_value == 1.0


def test_rate_and_spread() -> None:
    r = swap_stats.rate([True, False, False, True])
    assert (r.successes, r.n, r.rate) == (2, 4, 0.5)
    assert (r.low, r.high) == swap_stats.clopper_pearson(2, 4)
    assert swap_stats.rate([]).rate is None
    mean, sd, low, high = swap_stats.spread([0.2, 0.4, 0.6])
    assert math.isclose(mean, 0.4) and math.isclose(sd, 0.2) and (low, high) == (0.2, 0.6)
    assert swap_stats.spread([0.3])[1] == 0.0


def test_prompt_clustered_sign_test_counts_prompts_not_trials() -> None:
    real = [True, True, False, False, True]
    controls = [[False, False], [True, False], [True, False], [False, False], [True, True]]
    clusters = ["a", "a", "b", "b", "c"]
    # a: 1 − 1/4 > 0; b: 0 − 1/4 < 0; c: 1 − 1 = 0 → one each way, one tie, p = 1.
    test = swap_stats.by_cluster(real, controls, clusters)
    assert (test.real_better, test.control_better, test.ties, test.p_value) == (1, 1, 1, 1.0)
    # Many winning trials from one prompt are one piece of evidence at the prompt level.
    one_prompt = swap_stats.by_cluster([True] * 20, [[False]] * 20, ["a"] * 20)
    assert (one_prompt.real_better, one_prompt.p_value) == (1, 1.0)
    assert swap_stats.sign_test([True] * 20, [[False]] * 20).p_value == 2 / 2**20
    five = swap_stats.by_cluster([True] * 5, [[False]] * 5, list("abcde"))
    assert math.isclose(five.p_value, 2 / 32)
