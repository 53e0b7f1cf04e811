"""Control-token selection on small synthetic dictionaries with hand-computed picks."""

from __future__ import annotations

import pytest
import torch

from mcp_interp.core.swap.controls import control_pool, distances_from, draw_control


def line_dictionary() -> torch.Tensor:
    """Atoms on a line: ‖v_t − v_0‖ = |x_t|, so distances are readable by eye."""
    xs = [0.0, 2.0, 1.9, 2.15, 2.3, -2.05, 5.0, 1.7, 2.0]
    return torch.tensor([[x, 0.0] for x in xs])


def test_pool_is_exactly_the_tokens_within_tolerance() -> None:
    dictionary = line_dictionary()
    # source 0, target 1 (distance 2.0); tolerance 0.1 → |d − 2| ≤ 0.2 → ids 2 (1.9), 3 (2.15), 5 (2.05), 8 (2.0)
    pool = control_pool(dictionary, source_id=0, target_id=1, excluded=[], tolerance=0.1)
    assert pool.candidates.tolist() == [2, 3, 5, 8]
    assert pool.reference_distance == 2.0
    # Excluding answers / support removes them; the source and target are never candidates.
    pool = control_pool(dictionary, 0, 1, excluded=[8, 3], tolerance=0.1)
    assert pool.candidates.tolist() == [2, 5]
    # Tolerance 0: only an exact distance match (id 8), and nothing once that is excluded.
    assert control_pool(dictionary, 0, 1, [], 0.0).candidates.tolist() == [8]
    empty = control_pool(dictionary, 0, 1, [8], 0.0)
    assert empty.candidates.numel() == 0
    assert empty.nearest_ratio == pytest.approx(0.025)  # id 5: |2.05 − 2| / 2
    with pytest.raises(ValueError):
        draw_control(empty, 0)


def test_draw_is_uniform_by_a_seeded_cpu_generator() -> None:
    dictionary = line_dictionary()
    pool = control_pool(dictionary, 0, 1, [], 0.1)
    for seed in range(10):
        expected_index = int(torch.randint(4, (1,), generator=torch.Generator().manual_seed(seed)))
        assert draw_control(pool, seed) == [2, 3, 5, 8][expected_index]
        assert draw_control(pool, seed) == draw_control(pool, seed)
    picks = {draw_control(pool, seed) for seed in range(200)}
    assert picks == {2, 3, 5, 8}


def test_draw_ignores_the_global_rng_and_the_dictionary_device_and_dtype() -> None:
    dictionary = line_dictionary()
    pool = control_pool(dictionary, 0, 1, [], 0.1)
    torch.manual_seed(123)
    first = [draw_control(pool, s) for s in range(5)]
    torch.manual_seed(456)
    torch.rand(1000)
    assert [draw_control(pool, s) for s in range(5)] == first
    as_double = control_pool(dictionary.to(torch.float64), 0, 1, [], 0.1)
    assert as_double.candidates.tolist() == pool.candidates.tolist()


def test_distances_are_float64_euclidean() -> None:
    dictionary = torch.tensor([[3.0, 4.0], [0.0, 0.0], [6.0, 8.0]])
    distances = distances_from(dictionary, 1)
    assert distances.dtype == torch.float64 and distances.tolist() == [5.0, 0.0, 10.0]
