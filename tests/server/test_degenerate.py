"""Degenerate inputs to every computing tool of the in-process server: identical clean and corrupt prompts, a single
prompt, equal correct and incorrect answers, a steering coefficient of 0, one-token texts, constant probe labels.

Each call either is a tool error that says what is degenerate, or returns a structured result that validates against
the tool's outputSchema, holds no non-finite number, and — where the numbers are 0 or undefined by construction — a
note that says so. The values asserted are known without the tools: a difference of a thing with itself is 0, a pair
of identical prompts gives identical clean and corrupt runs, adding 0 × a vector changes nothing.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcp_interp.core.engine.backend.model import LoadedModel
from tests.features.test_sae import random_weights, write_sae
from tests.helpers import TEMPLATE, assert_valid_structured, error_text, tools_by_name, top_word

pytestmark = pytest.mark.anyio

PROMPT = "when mary and john went to the store , john gave a drink to"
CORRUPT = "when mary and john went to the store , mary gave a drink to"
SAME_PAIR = {"clean_prompts": [PROMPT], "corrupt_prompts": [PROMPT], "correct": "mary", "incorrect": "john"}
NAMES = ["mary went", "john went", "tom went", "alice went", "kate went", "sam went"] * 4


def error(*words: str) -> dict[str, Any]:
    return {"error": words}


def result(*note_words: str) -> dict[str, Any]:
    """A structured result; when words are given, some note holds them all."""
    return {"note": note_words}


# case id → (tool, arguments, what must come back). "{sae}" is replaced by an SAE folder written for the test.
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "tokenize/one-token": ("tokenize", {"texts": ["mary"]}, result()),
    "logit_diff/equal-answers": (
        "logit_diff",
        {"prompts": [PROMPT], "correct": "mary", "incorrect": "mary"},
        result("same answer", "0 by construction"),
    ),
    "kl/no-component": ("kl", {"prompts": [PROMPT], "intervention": {"ablate": []}}, error("needs components")),
    "kl/one-token-prompt": ("kl", {"prompts": ["mary"], "intervention": {"ablate": ["L1H1"]}}, result()),
    "answer_rank/one-token-prompt": ("answer_rank", {"prompts": ["mary"], "correct": "mary"}, result()),
    "ablate_head/equal-answers": (
        "ablate_head",
        {"prompts": [PROMPT], "heads": "L1H1", "correct": "mary", "incorrect": "mary"},
        result("same answer", "0 by construction"),
    ),
    "ablate/equal-answers": (
        "ablate",
        {"prompts": [PROMPT], "targets": ["L1MLP"], "correct": "mary", "incorrect": "mary"},
        result("same answer", "0 by construction"),
    ),
    "loss/one-token-texts": ("loss", {"texts": ["mary", "john"]}, error("fewer than 2 tokens")),
    "patch_heads/identical-pair": ("patch_heads", SAME_PAIR, result("token-for-token identical", "undefined")),
    "patch_heads/equal-answers": (
        "patch_heads",
        {**SAME_PAIR, "corrupt_prompts": [CORRUPT], "incorrect": "mary"},
        result("gap", "+0.000"),
    ),
    "patch/identical-pair": (
        "patch",
        {**SAME_PAIR, "component": "resid_pre"},
        result("token-for-token identical", "undefined"),
    ),
    "edge_attribution/identical-pair": ("edge_attribution", SAME_PAIR, result("gap of 0", "0 by construction")),
    "path_patch/identical-pair": ("path_patch", {**SAME_PAIR, "sender": "L1H1"}, result("gap of 0", "undefined")),
    "circuit_faithfulness/identical-pair": (
        "circuit_faithfulness",
        {**SAME_PAIR, "top_k": 5},
        error("same logit difference clean and corrupt"),
    ),
    "find_circuit/identical-pair": ("find_circuit", {**SAME_PAIR, "top": 5}, error("same logit difference")),
    "probe/constant-labels": ("probe", {"texts": NAMES, "labels": [1] * len(NAMES)}, error("2 distinct values")),
    "sae/one-token": ("sae", {"text": "mary", "sae": "{sae}"}, result("1 token", "not defined")),
    "sae_features/one-token": ("sae_features", {"texts": ["mary"], "sae": "{sae}", "features": [1]}, result()),
    "logit_lens/one-token": ("logit_lens", {"prompt": "mary"}, result()),
    "dla/equal-answers": (
        "dla",
        {"prompt": PROMPT, "answer": "mary", "baseline": "mary"},
        result("same token", "0 by construction"),
    ),
    "attention/one-token": ("attention", {"prompt": "mary", "layer": 1, "head": 1}, result()),
    "induction/one-token-sequences": ("induction", {"seq_len": 1, "n_seqs": 1}, error("`seq_len`: got 1", "≥ 2")),
    "steer/coefficient-0": (
        "steer",
        {"prompt": PROMPT, "coefficient": 0.0, "positive": "happy", "negative": "sad", "max_new_tokens": 2},
        result("identical to the baseline"),
    ),
    "steer/positive-equals-negative": (
        "steer",
        {"prompt": PROMPT, "coefficient": 2.0, "positive": "happy", "negative": "happy", "max_new_tokens": 2},
        result("identical to the baseline"),
    ),
    "explain/equal-answers": (
        "explain",
        {"prompt": PROMPT, "answer": "mary", "baseline": "mary"},
        error("same token", "0 by construction"),
    ),
    "causal_swap_trial/same-concept": (
        "causal_swap_trial",
        {"template": TEMPLATE, "source": "France", "target": "France", "layer": 1, "lens": "logit"},
        error("same token", "two different concepts"),
    ),
    "fit_lens/one-token-text": ("fit_lens", {"texts": ["mary"]}, error("too short")),
    "verify_artifact/empty-object": ("verify_artifact", {"artifact_json": "{}"}, result()),
}


def non_finite(value: Any, path: str = "$") -> list[str]:
    """Where a float that is NaN or ±inf sits in a JSON value."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path]
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in non_finite(item, f"{path}.{key}")]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in non_finite(item, f"{path}[{i}]")]
    return []


def test_non_finite_finds_nan_and_infinity_anywhere() -> None:
    assert non_finite({"a": [1.0, {"b": math.nan}], "c": -math.inf, "d": None, "e": "nan", "f": 3}) == [
        "$.a[1].b",
        "$.c",
    ]


def fill(arguments: dict[str, Any], sae: str) -> dict[str, Any]:
    return {key: (sae if value == "{sae}" else value) for key, value in arguments.items()}


@pytest.fixture
def sae_folder(tmp_path: Path) -> str:
    return write_sae(tmp_path / "sae", random_weights(32, seed=1), hook="blocks.1.hook_resid_post")


@pytest.fixture
def cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MCP_INTERP_CACHE", str(tmp_path / "cache"))  # fit_lens would write its lens there
    return tmp_path / "cache"


@pytest.mark.parametrize("case", list(CASES))
async def test_a_degenerate_input_is_a_clear_error_or_a_sound_result(
    case: str, tiny: LoadedModel, tiny_client: Client, sae_folder: str, cache_folder: Path
) -> None:
    name, arguments, expected = CASES[case]
    if name == "causal_swap_trial":
        answer = top_word(tiny, TEMPLATE, "France")
        arguments = {**arguments, "source_answer": answer, "target_answer": answer}
    tools = await tools_by_name(tiny_client)
    outcome = await tiny_client.call_tool(name, fill(arguments, sae_folder))
    if "error" in expected:
        text = error_text(outcome)
        assert "Traceback" not in text and "internal error" not in text.lower(), text
        for word in expected["error"]:
            assert word in text, f"{case}: {word!r} not in {text!r}"
        return
    data = assert_valid_structured(tools[name], outcome)
    assert non_finite(data) == [], f"{case}: non-finite numbers at {non_finite(data)}"
    if expected["note"]:
        notes = data.get("notes") or []
        assert any(all(word in note for word in expected["note"]) for note in notes), (case, notes)


async def test_degenerate_results_hold_the_values_known_by_construction(tiny_client: Client) -> None:
    same = (await tiny_client.call_tool("logit_diff", CASES["logit_diff/equal-answers"][1])).structured_content
    assert same is not None and same["logit_diff"]["per_example"] == [0.0]

    dla = (await tiny_client.call_tool("dla", CASES["dla/equal-answers"][1])).structured_content
    assert dla is not None and dla["measured"] == 0.0 and dla["total"] == 0.0
    assert all(v == 0.0 for row in dla["heads"] for v in row) and all(v == 0.0 for v in dla["mlps"])

    for tool in ("patch_heads", "edge_attribution", "path_patch"):
        data = (await tiny_client.call_tool(tool, CASES[f"{tool}/identical-pair"][1])).structured_content
        assert data is not None
        clean = data.get("clean_logit_diff") or data["clean"]
        corrupt = data.get("corrupt_logit_diff") or data["corrupt"]
        assert clean == corrupt, tool  # one prompt run twice
    path = (await tiny_client.call_tool("path_patch", CASES["path_patch/identical-pair"][1])).structured_content
    assert path is not None and all(r["recovered"] is None for r in path["receivers"])
    edges = (await tiny_client.call_tool("edge_attribution", SAME_PAIR)).structured_content
    assert edges is not None and all(e["score"] == 0.0 for e in edges["edges"])

    steer = (await tiny_client.call_tool("steer", CASES["steer/coefficient-0"][1])).structured_content
    assert steer is not None and steer["vector_norm"] == 0.0 and steer["next_token_kl"] == 0.0
    assert steer["steered_text"] == steer["baseline_text"]
