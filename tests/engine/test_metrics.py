"""Metrics against hand computations on fixed logits (no model involved)."""

from __future__ import annotations

import math

import pytest
import torch

from mcp_interp.core.engine.numbers import metrics
from mcp_interp.core.engine.text.tokens import answer_positions

LOGITS = torch.tensor(
    [
        [2.0, 1.0, 0.0, -1.0],
        [0.5, 3.0, 3.0, 1.0],  # tokens 1 and 2 tied at the top
        [1.0, 1.0, 1.0, 1.0],  # uniform
    ]
)


def log_softmax_row(row: list[float]) -> list[float]:
    norm = math.log(sum(math.exp(x) for x in row))
    return [x - norm for x in row]


def test_logit_diff_hand_computed() -> None:
    score = metrics.logit_difference(LOGITS, [0, 1, 3], [1, 3, 0])
    assert score.per_example == [2.0 - 1.0, 3.0 - 1.0, 0.0]
    assert score.value == pytest.approx((1.0 + 2.0 + 0.0) / 3)


def test_logprob_and_loss_hand_computed() -> None:
    ids = [0, 2, 3]
    expected = [log_softmax_row(LOGITS[i].tolist())[ids[i]] for i in range(3)]
    score = metrics.answer_logprob(LOGITS, ids)
    assert score.per_example == pytest.approx(expected, abs=1e-12)
    assert score.per_example[2] == pytest.approx(math.log(0.25))
    loss = metrics.answer_logprob(LOGITS, ids, as_loss=True)
    assert loss.per_example == pytest.approx([-v for v in expected])
    assert loss.value == pytest.approx(-score.value)


def test_rank_counts_strictly_greater_with_optimistic_ties() -> None:
    # row 0: answer 2 has tokens 0 and 1 above it; row 1: tie at the top -> both rank 0;
    # row 2: all tied -> rank 0.
    assert metrics.answer_ranks(LOGITS, [2, 1, 3]).per_example == [2.0, 0.0, 0.0]
    assert metrics.answer_ranks(LOGITS, [3, 2, 0]).per_example == [3.0, 0.0, 0.0]
    assert metrics.answer_ranks(LOGITS, [0, 0, 0]).per_example == [0.0, 3.0, 0.0]


def test_kl_hand_computed_and_zero_for_identical() -> None:
    p_logits = LOGITS[:1]
    q_logits = LOGITS[2:3]
    log_p = log_softmax_row(p_logits[0].tolist())
    expected = sum(math.exp(lp) * (lp - math.log(0.25)) for lp in log_p)
    assert metrics.kl_divergence(p_logits, q_logits).value == pytest.approx(expected, rel=1e-12)
    assert metrics.kl_divergence(LOGITS, LOGITS).per_example == [0.0, 0.0, 0.0]
    # KL is not symmetric: the reverse direction is a different number.
    reverse = sum(0.25 * (math.log(0.25) - lp) for lp in log_p)
    assert metrics.kl_divergence(q_logits, p_logits).value == pytest.approx(reverse, rel=1e-12)
    assert reverse != pytest.approx(expected)


def test_recovered_fraction_endpoints_and_midpoint() -> None:
    clean, corrupt = [4.0, 2.0], [-2.0, 0.0]
    assert metrics.recovered_fraction(clean, clean, corrupt).per_example == [1.0, 1.0]
    assert metrics.recovered_fraction(corrupt, clean, corrupt).per_example == [0.0, 0.0]
    half = metrics.recovered_fraction([1.0, 1.0], clean, corrupt)
    assert half.per_example == [0.5, 0.5]
    # value is the ratio of means: (1 - (-1)) / (3 - (-1))
    assert half.value == pytest.approx(0.5)
    mixed = metrics.recovered_fraction([4.0, 0.0], clean, corrupt)
    assert mixed.per_example == [1.0, 0.0]
    assert mixed.value == pytest.approx((2.0 - (-1.0)) / (3.0 - (-1.0)))


def test_recovered_fraction_nan_where_gap_is_zero() -> None:
    score = metrics.recovered_fraction([1.0, 1.0], [2.0, 3.0], [2.0, 1.0])
    assert math.isnan(score.per_example[0])
    assert score.per_example[1] == 0.0


def test_answer_positions_right_and_left_padding() -> None:
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    assert answer_positions(right).tolist() == [2, 4, 0]
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert answer_positions(left).tolist() == [3, 3]
    with pytest.raises(ValueError):
        answer_positions(torch.tensor([[0, 0]]))


def test_answer_logits_read_at_answer_positions_not_last_column() -> None:
    logits = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    picked = metrics.at_answer_positions(logits, torch.tensor([0, 2]))
    assert picked.tolist() == [logits[0, 0].tolist(), logits[1, 2].tolist()]
