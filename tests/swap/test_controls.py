"""Control-token selection on small synthetic dictionaries with hand-computed picks."""

from __future__ import annotations

import hashlib

import pytest
import torch

from mcp_interp.core.swap.controls import SharedPool, control_pool, distances_from, draw_control, draw_controls


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
        draw_control(empty.candidates, 0)


def test_draw_is_uniform_by_a_seeded_cpu_generator() -> None:
    dictionary = line_dictionary()
    pool = control_pool(dictionary, 0, 1, [], 0.1)
    for seed in range(10):
        expected_index = int(torch.randint(4, (1,), generator=torch.Generator().manual_seed(seed)))
        assert draw_control(pool.candidates, seed) == [2, 3, 5, 8][expected_index]
        assert draw_control(pool.candidates, seed) == draw_control(pool.candidates, seed)
    picks = {draw_control(pool.candidates, seed) for seed in range(200)}
    assert picks == {2, 3, 5, 8}


def test_draw_ignores_the_global_rng_and_the_dictionary_device_and_dtype() -> None:
    dictionary = line_dictionary()
    pool = control_pool(dictionary, 0, 1, [], 0.1)
    torch.manual_seed(123)
    first = [draw_control(pool.candidates, s) for s in range(5)]
    torch.manual_seed(456)
    torch.rand(1000)
    assert [draw_control(pool.candidates, s) for s in range(5)] == first
    as_double = control_pool(dictionary.to(torch.float64), 0, 1, [], 0.1)
    assert as_double.candidates.tolist() == pool.candidates.tolist()


def test_distances_are_float64_euclidean() -> None:
    dictionary = torch.tensor([[3.0, 4.0], [0.0, 0.0], [6.0, 8.0]])
    distances = distances_from(dictionary, 1)
    assert distances.dtype == torch.float64 and distances.tolist() == [5.0, 0.0, 10.0]


def test_a_swaps_controls_are_distinct_tokens_one_per_seed() -> None:
    """Seeds whose first draws collide: the later seed draws again from its own generator, so the controls of one
    swap are distinct tokens (two equal control columns would not be exchangeable with the real one)."""
    candidates = torch.tensor([2, 3, 5, 8])
    swap = "f/a→b"

    def seeded(seed: int) -> int:  # the documented (seed, swap) seed, by hand: sha256 of "seed\0swap", 8 bytes mod 2^63
        return int.from_bytes(hashlib.sha256(f"{seed}\x00{swap}".encode()).digest()[:8], "big") % 2**63

    first = {s: draw_control(candidates, seeded(s)) for s in range(12)}
    a, b = next((a, b) for a in first for b in first if a < b and first[a] == first[b])
    drawn = draw_controls(candidates, [a, b], swap)
    assert drawn[0] == first[a] and drawn[1] != drawn[0]
    generator = torch.Generator().manual_seed(seeded(b))  # seed b's own stream, by hand: the first draw not taken
    stream = [int(candidates[int(torch.randint(4, (1,), generator=generator))]) for _ in range(50)]
    assert drawn[1] == next(t for t in stream if t != drawn[0])
    assert sorted(draw_controls(candidates, [0, 1, 2, 3], swap)) == [2, 3, 5, 8]
    with pytest.raises(ValueError, match="4 candidate"):
        draw_controls(candidates, [0, 1, 2, 3, 4], swap)


def test_each_swap_draws_its_own_controls() -> None:
    """The same seeds and the same pool, two swaps: different tokens (seeded by (seed, swap)), where seeding by the
    seed alone gave both swaps the same five — a token shared by two targets' tests."""
    candidates = torch.arange(100, 400)
    one, two = draw_controls(candidates, range(5), "f/a→b"), draw_controls(candidates, range(5), "f/a→c")
    assert one != two and len(set(one) & set(two)) <= 1
    assert draw_controls(candidates, range(5), "f/a→b") == one


def test_the_shared_pool_is_the_tokens_matched_at_every_layer() -> None:
    """Two layers' dictionaries in which different tokens match the target's displacement: only the tokens matched
    at both stay (worked out by eye from the line distances)."""
    layer_a = line_dictionary()  # source 0, target 1 at 2.0; tolerance 0.1 → ids 2, 3, 5, 8
    xs_b = [0.0, 4.0, 3.7, 0.5, 4.3, 4.1, 4.0, 9.0, 4.2]  # target at 4.0; |d − 4| ≤ 0.4 → ids 2, 4, 5, 6, 8
    layer_b = torch.tensor([[x, 0.0] for x in xs_b])
    shared = SharedPool()
    assert shared.size == 0 and shared.candidates is None
    shared.add(3, control_pool(layer_a, 0, 1, [], 0.1))
    shared.add(7, control_pool(layer_b, 0, 1, [8], 0.1))  # id 8 excluded at layer 7 only (e.g. active there)
    assert shared.candidates is not None and shared.candidates.tolist() == [2, 5]
    assert shared.layer_sizes == {3: 4, 7: 4} and shared.size == 2
    shared.exclude([5, 40])  # a corpus word, and an id not in the pool
    assert shared.candidates.tolist() == [2] and shared.size == 1
