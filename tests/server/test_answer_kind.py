"""Every tool that takes answers says which kind it scored (``answer_kind``), through a real MCP client on `tiny`.

DESIGN's convention: a multi-token answer is scored by its teacher-forced sequence log-probability and the result
says so. 'token': every answer is one token; 'sequence': some answer is several tokens; 'set': some answer is
{any_of: [...]}. The circuit tools read one token per answer (a longer one is refused): they report 'token', or 'set'
for a set of single tokens.
"""

from __future__ import annotations

from typing import Any

import pytest
from mcp import Client

from tests.helpers import assert_valid_structured, error_text, tools_by_name

pytestmark = pytest.mark.anyio

CLEAN = ["when mary and john went to the store , john gave a drink to"]
CORRUPT = ["when mary and john went to the store , mary gave a drink to"]
PAIR = {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT}
TWO_TOKENS = "mary john"  # the tiny tokenizer is word-level
A_SET = {"any_of": ["mary", "tom"]}

# One ordinary call per tool that takes answers, without them (they are added per case).
CALLS: dict[str, dict[str, Any]] = {
    "logit_diff": {"prompts": CLEAN},
    "answer_rank": {"prompts": CLEAN},
    "ablate": {"prompts": CLEAN, "targets": ["L1MLP", "L2H0"]},
    "ablate_head": {"prompts": CLEAN, "heads": "L1H1"},
    "patch_heads": PAIR,
    "patch": {**PAIR, "component": "resid_pre", "layers": [2]},
}
ONE_TOKEN_ONLY: dict[str, dict[str, Any]] = {
    "edge_attribution": PAIR,
    "path_patch": {**PAIR, "sender": "L0H1"},
    "circuit_faithfulness": {**PAIR, "top_k": 5, "random_circuits": 19},
    "find_circuit": {**PAIR, "random_circuits": 19},
}


def answers(tool: str, correct: Any, incorrect: Any) -> dict[str, Any]:
    if tool == "answer_rank":  # it ranks the correct answer only
        return {"correct": correct}
    return {"correct": correct, "incorrect": incorrect}


async def test_every_tool_taking_answers_reports_answer_kind_in_its_output_schema(tiny_client: Client) -> None:
    tools = await tools_by_name(tiny_client)
    taking = {name for name, tool in tools.items() if "correct" in tool.input_schema.get("properties", {})}
    assert taking == set(CALLS) | set(ONE_TOKEN_ONLY)  # the tools exercised below are all of them
    missing = [
        name for name in sorted(taking) if "answer_kind" not in (tools[name].output_schema or {}).get("properties", {})
    ]
    assert missing == []


@pytest.mark.parametrize("tool", sorted(CALLS))
@pytest.mark.parametrize(
    ("correct", "incorrect", "kind"),
    [("mary", "john", "token"), (TWO_TOKENS, "john", "sequence"), (A_SET, "john", "set")],
    ids=["one-token", "two-tokens", "set"],
)
async def test_results_say_which_kind_of_answer_they_scored(
    tiny_client: Client, tool: str, correct: Any, incorrect: Any, kind: str
) -> None:
    tools = await tools_by_name(tiny_client)
    call = await tiny_client.call_tool(tool, {**CALLS[tool], **answers(tool, correct, incorrect)})
    result = assert_valid_structured(tools[tool], call)
    assert result["answer_kind"] == kind


async def test_a_several_token_incorrect_answer_counts_too(tiny_client: Client) -> None:
    tools = await tools_by_name(tiny_client)
    call = await tiny_client.call_tool("patch_heads", {**PAIR, "correct": "mary", "incorrect": TWO_TOKENS})
    assert assert_valid_structured(tools["patch_heads"], call)["answer_kind"] == "sequence"


async def test_patching_with_kl_scores_no_answer(tiny_client: Client) -> None:
    tools = await tools_by_name(tiny_client)
    for tool in ("patch_heads", "patch"):
        call = await tiny_client.call_tool(tool, {**CALLS[tool], "metric": "kl"})
        assert assert_valid_structured(tools[tool], call)["answer_kind"] is None


@pytest.mark.parametrize("tool", sorted(ONE_TOKEN_ONLY))
async def test_circuit_tools_score_one_token_answers_and_refuse_longer_ones(tiny_client: Client, tool: str) -> None:
    tools = await tools_by_name(tiny_client)
    call = await tiny_client.call_tool(tool, {**ONE_TOKEN_ONLY[tool], "correct": "mary", "incorrect": "john"})
    assert assert_valid_structured(tools[tool], call)["answer_kind"] == "token"
    a_set = {**ONE_TOKEN_ONLY[tool], "correct": {"any_of": ["mary", "tom"]}, "incorrect": "john"}
    assert assert_valid_structured(tools[tool], await tiny_client.call_tool(tool, a_set))["answer_kind"] == "set"
    longer = await tiny_client.call_tool(tool, {**ONE_TOKEN_ONLY[tool], "correct": TWO_TOKENS, "incorrect": "john"})
    assert "exactly one token" in error_text(longer)


async def test_model_info_states_the_answer_rule_the_tools_follow(tiny_client: Client) -> None:
    """model_info's tokenization rule says what the tools accept (one token, a sequence, a set), and each of those
    is accepted by logit_diff with the kind the rule names — it no longer says answers "must be exactly one token"."""
    rule = (await tiny_client.call_tool("model_info", {})).structured_content["tokenization_rule"]
    assert "exactly one token" not in rule and "any_of" in rule and "'sequence'" in rule and "'set'" in rule
    for answer, kind in (("mary", "token"), (TWO_TOKENS, "sequence"), (A_SET, "set")):
        result = await tiny_client.call_tool("logit_diff", {"prompts": CLEAN, "correct": answer, "incorrect": "john"})
        assert not result.is_error and result.structured_content["answer_kind"] == kind, (answer, result.content)
