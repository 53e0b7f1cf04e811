"""End to end over a real stdio subprocess (`python -m mcp_interp serve --model tiny`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mcp import Client

from mcp_interp.models import LoadedModel
from tests.mcp_helpers import (
    EXPECTED_TOOLS,
    TINY_PROMPTS,
    assert_valid_structured,
    error_text,
    stdio_params,
    tools_by_name,
)

pytestmark = pytest.mark.anyio


def child_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "MCP_INTERP_OUTPUT": str(tmp_path / "out")}


async def test_stdio_session_lists_schemas_and_answers(tmp_path: Path, tiny: LoadedModel) -> None:
    async with Client(stdio_params("tiny", child_env(tmp_path)), read_timeout_seconds=120) as client:
        tools = await tools_by_name(client)
        assert set(tools) == EXPECTED_TOOLS
        assert all(tool.output_schema is not None for tool in tools.values())
        info = assert_valid_structured(tools["model_info"], await client.call_tool("model_info", {}))
        result = assert_valid_structured(
            tools["logit_diff"],
            await client.call_tool("logit_diff", {"prompts": TINY_PROMPTS, "correct": "mary", "incorrect": "john"}),
        )
        bad = await client.call_tool("answer_rank", {"prompts": TINY_PROMPTS, "correct": "not-a-word-in-vocab xyz"})
        assert "tokens" in error_text(bad)
        rank = assert_valid_structured(
            tools["answer_rank"], await client.call_tool("answer_rank", {"prompts": TINY_PROMPTS, "correct": "mary"})
        )
    # The child built the same seeded weights as this process.
    assert info["fingerprint"] == tiny.fingerprint
    assert result["model"]["fingerprint"] == tiny.fingerprint
    assert len(result["logit_diff"]["per_example"]) == 2
    assert len(rank["examples"]) == 2
