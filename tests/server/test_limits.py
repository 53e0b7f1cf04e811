"""Request limits: refused before model work, with the limit and the flag that raises it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mcp import Client

import mcp_interp.state.limits as limits
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.components import parse_heads
from mcp_interp.core.readouts import info
from mcp_interp.core.readouts import predictions as readouts
from mcp_interp.errors import InputError
from tests.helpers import error_text


@pytest.fixture
def small_limits() -> Iterator[limits.Limits]:
    saved = limits.current()
    limits.configure(limits.Limits(max_prompts=4, max_tokens=16, max_heads=3, max_new_tokens=5))
    yield limits.current()
    limits.configure(saved)


def test_each_limit_names_itself_and_its_flag(tiny: LoadedModel, small_limits: limits.Limits) -> None:
    with pytest.raises(InputError, match=r"5 exceeds the server's limit of 4 \(max_prompts\).*--max-prompts"):
        readouts.logit_diff(tiny, ["mary"] * 5, "mary", "john")
    with pytest.raises(InputError, match=r"limit of 16 \(max_tokens\).*MCP_INTERP_MAX_TOKENS"):
        readouts.logit_diff(tiny, [" ".join(["mary"] * 20)], "mary", "john")
    with pytest.raises(InputError, match=r"max_tokens"):
        info.tokenize(tiny, ["x" * 100_000])
    with pytest.raises(InputError, match=r"max_heads.*--max-heads"):
        parse_heads(["L0H0", "L0H1", "L0H2", "L0H3"], 3, 4)
    assert len(readouts.logit_diff(tiny, ["mary"] * 4, "mary", "john").examples) == 4


@pytest.mark.anyio
async def test_limit_errors_reach_the_client_and_the_server_keeps_serving(
    tiny_client: Client, small_limits: limits.Limits
) -> None:
    big = await tiny_client.call_tool("logit_diff", {"prompts": ["mary"] * 50, "correct": "mary", "incorrect": "john"})
    assert "max_prompts" in error_text(big) and "--max-prompts" in error_text(big)
    steer = await tiny_client.call_tool(
        "steer",
        {"prompt": "mary", "positive": "a", "negative": "b", "layer": 0, "coefficient": 1.0, "max_new_tokens": 50},
    )
    assert "max_new_tokens" in error_text(steer)
    ok = await tiny_client.call_tool("tokenize", {"texts": ["mary"]})
    assert not ok.is_error


def test_env_configures_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_INTERP_MAX_PROMPTS", "7")
    assert limits.Limits.from_env().max_prompts == 7
    monkeypatch.setenv("MCP_INTERP_MAX_PROMPTS", "many")
    with pytest.raises(ValueError, match="MCP_INTERP_MAX_PROMPTS"):
        limits.Limits.from_env()
