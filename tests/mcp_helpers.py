"""Helpers shared by the MCP-level tests (in-process and stdio)."""

from __future__ import annotations

import sys
from typing import Any

import jsonschema
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, Tool

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
