"""Helpers shared by the MCP-level tests (in-process and stdio)."""

from __future__ import annotations

import sys
from typing import Any

import jsonschema
import torch
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, Tool

from mcp_interp.models import LoadedModel

EXPECTED_TOOLS = {
    "model_info",
    "tokenize",
    "logit_diff",
    "kl",
    "answer_rank",
    "ablate_head",
    "patch_heads",
    "get_figure",
    "logit_lens",
    "dla",
    "attention",
    "induction",
    "steer",
    "explain",
    "causal_swap_trial",
    "causal_swap_benchmark",
    "verify_artifact",
    "fit_lens",
}
WRITING_TOOLS = {"fit_lens"}  # writes its lens to the cache folder; every other tool is read-only

TINY_PROMPTS = [
    "When Mary and John went to the store, John gave a drink to",
    "When Tom and James went to the park, James gave a ball to",
]


def stdio_params(model: str, env: dict[str, str]) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "mcp_interp", "serve", "--model", model], env=env)


async def tools_by_name(client: Client) -> dict[str, Tool]:
    return {tool.name: tool for tool in (await client.list_tools()).tools}


def assert_valid_structured(tool: Tool, result: CallToolResult) -> dict[str, Any]:
    """The call succeeded and its structured content validates against the tool's outputSchema."""
    assert not result.is_error, result.content
    assert tool.output_schema is not None, f"{tool.name} has no outputSchema"
    assert result.structured_content is not None
    jsonschema.validate(result.structured_content, tool.output_schema)
    return result.structured_content


def error_text(result: CallToolResult) -> str:
    assert result.is_error, f"expected a tool error, got {result.structured_content}"
    return "\n".join(getattr(block, "text", "") for block in result.content)


TEMPLATE = "The capital of {arg} is the city of"
CONCEPTS = ["France", "Canada", "China", "Egypt"]


def top_word(model: LoadedModel, template: str, concept: str) -> str:
    ids = model.tokenizer(template.replace("{arg}", concept))["input_ids"]
    with torch.no_grad():
        logits = model.bridge(torch.tensor([ids]), return_type="logits")[0, -1]
    return str(model.tokenizer.decode([int(logits.argmax())])).strip()


def tiny_corpus(model: LoadedModel) -> dict[str, Any]:
    """One function the tiny model 'knows' (its own top-1s), one it does not, one with an unknown word."""
    return {
        "name": "tiny-capitals",
        "concepts": CONCEPTS,
        "functions": [
            {"name": "own", "template": TEMPLATE, "answers": {c: top_word(model, TEMPLATE, c) for c in CONCEPTS}},
            {"name": "wrong", "template": "the city of {arg} is", "answers": dict.fromkeys(CONCEPTS, "mary")},
            {
                "name": "unknown",
                "template": "when {arg} went to",
                "answers": {"France": "zzqx", "Canada": "john", "China": "tom", "Egypt": "mary"},
            },
        ],
    }
