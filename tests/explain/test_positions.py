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
    (move,) = where.moves(RESID, ATTN, TOKENS, differing=[1, 2, 3])
    assert (move.from_position, move.to_position, move.layer, move.to_position_differs) == (2, 5, 4, False)
    assert (move.attention_layer, move.attention_fraction) == (3, 0.7)
    sentence = where.move_finding(move)
    assert sentence.startswith("Information moves from position 2 to 5") and "through attention" in sentence
    assert "by the input of layer 4" in sentence and "layer 3's attn_out at ' in' recovers +0.70" in sentence


def test_a_new_top_position_whose_own_token_differs_is_not_called_a_move() -> None:
    (move,) = where.moves(RESID, ATTN, TOKENS, differing=[2, 5])
    assert move.to_position_differs
    sentence = where.move_finding(move)
    assert "need not be information moving" in sentence and "Information moves" not in sentence


def test_no_move_backwards_and_none_for_a_near_tie_that_flips_back() -> None:
    backwards = [[0.0, 0.9], [0.0, 0.8], [0.7, 0.1], [0.8, 0.0]]  # position 1 then 0: information cannot flow back
    assert where.dominant_positions(backwards) == [1, 1, 0, 0]
    assert where.moves(backwards, None, ["a", "b"], differing=[]) == []
    tie = [[0.5, 0.0, 0.0], [0.45, 0.46, 0.0], [0.5, 0.4, 0.0], [0.0, 0.0, 0.9], [0.0, 0.0, 0.9]]
    (move,) = where.moves(tie, None, ["a", "b", "c"], differing=[])  # the one-layer flip to 1 is no move
    assert (move.from_position, move.to_position, move.layer) == (0, 2, 3)
    last = [[0.9, 0.0], [0.0, 0.9]]  # a change at the last layer has no second layer to stay for: still a move
    assert [(m.from_position, m.to_position) for m in where.moves(last, None, ["a", "b"], differing=[])] == [(0, 1)]


def test_an_attention_layer_recovering_less_than_the_floor_is_not_named() -> None:
    attn = [[None, 0.05], [None, 0.8], [None, 0.0]]  # 0.8 is at the move's own layer: not before it
    (move,) = where.moves([[0.9, 0.0], [0.0, 0.9], [0.0, 0.9]], attn, ["a", "b"], differing=[])
    assert (move.attention_layer, move.attention_fraction) == (None, None)
    assert "no single earlier attn_out there recovers 10% of the gap" in where.move_finding(move)


def test_the_schema_states_the_thresholds_the_reading_uses() -> None:
    from mcp_interp.schemas.explain import ExplainMeasurement, Move

    fields, move = ExplainMeasurement.model_fields, Move.model_fields
    assert f"≥ {where.CARRIES}" in str(fields["carriers"].description)
    assert f"up to {where.MAX_MAPPED} positions" in str(fields["attn_out_map"].description)
    assert f"reaches {where.MAPPED}" in str(fields["attn_out_map"].description)
    assert f"≥ {where.DOMINATES}" in str(move["layer"].description)
    assert f"staying for {where.STAYS} layers" in str(move["layer"].description)
    assert f"≥ {where.ATTENDS}" in str(move["attention_layer"].description)


def test_no_dominant_position_below_the_threshold_and_no_move_across_a_gap_to_the_same_position() -> None:
    grid = [[0.5, 0.0], [0.2, 0.1], [0.6, 0.0]]
    assert where.dominant_positions(grid) == [0, None, 0]
    assert where.moves(grid, None, ["a", "b"], differing=[]) == []


def test_mapped_positions_are_the_strongest_few_above_the_floor() -> None:
    assert where.mapped_positions(RESID) == [1, 2, 3, 5]
    many = [[0.5, 0.4, 0.3, 0.2, 0.15, 0.05]]
    # MAX_MAPPED = 4 of the five at ≥ 0.1, by fraction, and the answer position (the last), which the last layer's
    # blocks write and no resid_pre cell shows
    assert where.mapped_positions(many) == [0, 1, 2, 3, 5]
    assert where.mapped_positions([[0.0, 0.05, 0.0]]) == []  # nothing reaches the floor: nothing is mapped


def test_no_carrier_is_said_in_words() -> None:
    assert "spread over positions" in where.carrier_finding([])


def test_the_logit_lens_embedding_row_is_named_in_words() -> None:
    from mcp_interp.core.explain.findings import layer_words

    words = (layer_words(-1), layer_words(0), layer_words(27))
    assert words == ("the embedding (before layer 0)", "layer 0", "layer 27")
