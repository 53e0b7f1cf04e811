"""The known-answer eval's scoring (``core.known.agent_score``), on hand-computed cases."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mcp_interp.core.known.agent_score import (
    RUNNER,
    Claims,
    candidate_inputs,
    held_out,
    parse_claims,
    read_runner_output,
    runner_input,
    same_value,
    score_components,
    score_function,
    seen_inputs,
    truth_components,
)


def test_truth_is_every_head_and_mlp_computing_a_node_without_the_embeddings() -> None:
    nodes = [{"components": ["embed"]}, {"components": ["L0H0", "L0MLP"]}, {"components": ["L1H1"]}, {}]
    assert truth_components(nodes) == {"L0H0", "L0MLP", "L1H1"}


def test_claims_are_normalized_and_names_outside_the_model_kept_as_unknown() -> None:
    claims = parse_claims(["l0h1", "L1 MLP", "L1ATTN", {"layer": 0, "head": 0}, {"layer": 1}, "L2H0", "L0H3",
                           "attention"], n_layers=2, n_heads=2)  # fmt: skip
    assert claims.components == {"L0H1", "L1MLP", "L1H0", "L1H1", "L0H0"}
    assert claims.unknown == ["L2H0", "L0H3", "attention"]


def test_component_scores_by_hand() -> None:
    truth = {"L0H0", "L0MLP", "L1H0"}
    # 2 right, 1 wrong, 1 unknown: precision 2/4, recall 2/3, F1 = 2·(1/2)(2/3)/(1/2+2/3) = 4/7, IoU = 2/(4+1) (the
    # union: L0H0 L0MLP L1H0 L1H1, and the unknown name)
    score = score_components(Claims({"L0H0", "L0MLP", "L1H1"}, ["L9H9"]), truth)
    assert score.precision == pytest.approx(0.5)
    assert score.recall == pytest.approx(2 / 3)
    assert score.f1 == pytest.approx(4 / 7)
    assert score.iou == pytest.approx(2 / 5)
    exact = score_components(Claims(set(truth), []), truth)
    assert (exact.precision, exact.recall, exact.f1, exact.iou) == (1.0, 1.0, 1.0, 1.0)
    empty = score_components(Claims(set(), []), truth)
    assert (empty.precision, empty.recall, empty.f1, empty.iou) == (0.0, 0.0, 0.0, 0.0)


def test_seen_inputs_are_every_string_of_input_values_in_the_arguments() -> None:
    arguments = [
        {"prompts": ["BOS 1 2 3", "0 0"], "correct": "1"},
        {"clean": "3 3 3 3 3 3", "corrupt": "1 x"},  # too long; not input values
        {"nested": [{"text": "2"}]},
    ]
    assert seen_inputs(arguments, ["0", "1", "2", "3"], "BOS", 5) == {("1", "2", "3"), ("0", "0"), ("1",), ("2",)}


def test_candidates_are_distinct_deterministic_and_exhaust_a_small_space() -> None:
    pool = candidate_inputs(["a", "b"], 2, 100, seed=3)
    assert sorted(pool) == sorted([("a",), ("b",), ("a", "a"), ("a", "b"), ("b", "a"), ("b", "b")])
    assert candidate_inputs(["0", "1", "2"], 5, 50, seed=1) == candidate_inputs(["0", "1", "2"], 5, 50, seed=1)
    assert len(set(candidate_inputs(["0", "1", "2"], 5, 50, seed=1))) == 50
    cases = [{"input": list(c), "expected": []} for c in pool]
    assert [tuple(c["input"]) for c in held_out(cases, {("a",), ("b", "b")}, 3)] == [
        c for c in pool if c not in {("a",), ("b", "b")}
    ][:3]


def test_values_match_as_strings_or_numbers() -> None:
    assert same_value("1", "1") and same_value(1, "1") and same_value(1.0, "1") and same_value(0.5, "0.5")
    assert not same_value(None, "1") and not same_value("a", "b") and not same_value(2, "1")
    assert not same_value(True, "1")  # a bool is not the number 1 here
    assert same_value(True, "True")


def test_function_agreement_counts_defined_positions_only() -> None:
    cases = [
        {"input": ["1", "2"], "expected": ["1", "2"]},
        {"input": ["3"], "expected": [None]},  # undefined everywhere: not scored
        {"input": ["1", "1", "3"], "expected": ["2", None, "3"]},
        {"input": ["0", "0"], "expected": ["0", "0"]},
    ]
    outputs = [["1", "0"], ["9"], [2, "x", 3.0], None]
    score = score_function(cases, outputs)
    # first: 1 of 2; third: 2 of 2 (the None position is not scored); fourth raised: 0 of 2
    assert score.n_inputs == 3
    assert score.agreement == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert score.exact == pytest.approx(1 / 3)
    assert [f["input"] for f in score.failures] == [["1", "2"], ["0", "0"]]
    wrong_length = score_function(cases[:1], [["1"]])
    assert wrong_length.agreement == 0.0


def run(source: str, inputs: list[list[str]]) -> tuple[list, str | None]:
    cases = [{"input": x, "expected": []} for x in inputs]
    done = subprocess.run([sys.executable, "-c", RUNNER], input=runner_input(source, cases), capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    return read_runner_output(done.stdout, len(inputs))


def test_the_runner_runs_the_submission_and_isolates_each_inputs_failure() -> None:
    source = "def f(tokens):\n    if tokens == ['0']:\n        raise ValueError\n    return sorted(tokens)\n"
    assert run(source, [["2", "1"], ["0"], ["3"]]) == ([["1", "2"], None, ["3"]], None)
    outputs, why = run("def g(tokens):\n    return tokens\n", [["1"], ["2"]])
    assert outputs == [None, None] and why is not None and "KeyError" in why
    outputs, why = run("def f(tokens) return", [["1"]])
    assert outputs == [None] and why is not None and "SyntaxError" in why


def test_a_submission_that_loops_prints_or_exits_gets_a_score_not_a_crash() -> None:
    looping = "def f(tokens):\n    while tokens == ['1']:\n        pass\n    return tokens\n"
    assert run(looping, [["1"], ["2"]]) == ([None, ["2"]], None)
    printing = "print('{\"outputs\": []}')\ndef f(tokens):\n    print('hello', tokens)\n    return tokens\n"
    assert run(printing, [["1", "2"]]) == ([["1", "2"]], None)
    exiting = "import sys\ndef f(tokens):\n    sys.exit(3)\n"
    assert run(exiting, [["1"]]) == ([None], None)
    not_a_list = "def f(tokens):\n    return 'abc'\n"
    assert run(not_a_list, [["1"]]) == ([None], None)
    loops_at_definition = "while True:\n    pass\n"
    outputs, why = run(loops_at_definition, [["1"]])
    assert outputs == [None] and why is not None and "TimeoutError" in why
