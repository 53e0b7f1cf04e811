"""Reading the layer × position maps: known-answer grids whose carriers, moves and mapped positions are set by hand."""

from __future__ import annotations

from mcp_interp.core.explain import positions as where

TOKENS = ["The", " E", "iffel", " Tower", " is", " in"]
# 6 layers × 6 positions. Position 2 carries the gap at layers 0–3, position 5 from layer 4 on; position 3 a little
# (0.25, 0.22) at layers 1–2; position 1 only 0.12 once (mapped, never a carrier); None = not patched.
RESID = [
    [0.0, 0.05, 0.9, 0.1, 0.0, 0.0],
    [0.0, 0.12, 0.8, 0.25, 0.0, 0.0],
    [0.0, 0.0, 0.7, 0.22, 0.0, 0.05],
    [0.0, 0.0, 0.6, 0.0, 0.0, 0.15],
    [0.0, 0.0, 0.05, 0.0, 0.0, 0.85],
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.95],
]
ATTN = [
    [None, None, 0.1, None, None, 0.0],
    [None, None, 0.0, None, None, 0.1],
    [None, None, 0.0, None, None, 0.2],
    [None, None, 0.0, None, None, 0.7],
    [None, None, 0.0, None, None, 0.9],  # at the move's own layer: not before it, so not the block that moved it
    [None, None, 0.0, None, None, 0.0],
]


def test_carriers_are_the_runs_at_or_above_the_threshold() -> None:
    runs = where.carriers(RESID, TOKENS)
    found = [(r.position, r.from_layer, r.to_layer, r.min_fraction, r.max_fraction) for r in runs]
    assert found == [(5, 4, 5, 0.85, 0.95), (2, 0, 3, 0.6, 0.9), (3, 1, 2, 0.22, 0.25)]
    assert [r.token for r in runs] == [" in", "iffel", " Tower"]


def test_a_run_broken_by_a_weak_layer_is_two_runs() -> None:
    grid = [[0.5], [0.1], [0.4]]
    assert [(r.from_layer, r.to_layer) for r in where.carriers(grid, ["x"])] == [(0, 0), (2, 2)]


def test_the_move_is_where_the_dominant_position_changes_and_names_the_earlier_attention() -> None:
    assert where.dominant_positions(RESID) == [2, 2, 2, 2, 5, 5]
    (move,) = where.moves(RESID, ATTN, TOKENS)
    assert (move.from_position, move.to_position, move.layer) == (2, 5, 4)
    assert (move.attention_layer, move.attention_fraction) == (3, 0.7)
    assert "layer 3's attn_out at ' in' recovers +0.70" in where.move_finding(move)


def test_no_dominant_position_below_the_threshold_and_no_move_across_a_gap_to_the_same_position() -> None:
    grid = [[0.5, 0.0], [0.2, 0.1], [0.6, 0.0]]
    assert where.dominant_positions(grid) == [0, None, 0]
    assert where.moves(grid, None, ["a", "b"]) == []


def test_mapped_positions_are_the_strongest_few_above_the_floor() -> None:
    assert where.mapped_positions(RESID) == [1, 2, 3, 5]
    many = [[0.5, 0.4, 0.3, 0.2, 0.15, 0.05]]
    assert where.mapped_positions(many) == [0, 1, 2, 3]  # MAX_MAPPED = 4 of the five at ≥ 0.1, by fraction


def test_no_carrier_is_said_in_words() -> None:
    assert "spread over positions" in where.carrier_finding([])


def test_the_logit_lens_embedding_row_is_named_in_words() -> None:
    from mcp_interp.core.explain.findings import layer_words

    words = (layer_words(-1), layer_words(0), layer_words(27))
    assert words == ("the embedding (before layer 0)", "layer 0", "layer 27")
