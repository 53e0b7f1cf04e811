"""Nothing accepted and ignored (issue 52 §1), calls while the model loads (§2), and the crash boundary.

* Every tool in ``tools/list`` and every method of the Python API refuses an argument it does not take, naming it,
  its nearest real argument when one is close, and the tool's arguments; a misspelt field inside an argument (an
  intervention's ``method``, a claim's ``numbers``) likewise.
* A call that arrives while the model loads waits for it, every tool alike (the ``waiting_for_model`` rule): the
  typical call of every tool sent first to a server whose loader is held answers once the load ends, and a tool that
  never touches the model (``get_figure``, ``job_status``, ``job_cancel``) answers while it is still held.
* A crash outside a tool's own boundary reaches the client named (the tool, the exception's type), never as the
  SDK's bare "Error executing tool X".
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_interp.app.api import NOT_METHODS, RESULT_TYPES, Session
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.errors import ToolCallError
from mcp_interp.host import ModelHost
from mcp_interp.mcp.server import build_server
from tests.features.test_sae import random_weights, write_sae
from tests.graphs.common import plt_weights, write_plt
from tests.helpers import EXPECTED_TOOLS, error_text
from tests.server.test_surface import typical_calls

pytestmark = pytest.mark.anyio

MADE_UP = "frobnicate_level"
CLEAN = ["when mary and john went to the store , john gave a drink to"]


async def test_every_tool_refuses_a_made_up_argument_naming_it_and_its_arguments(tiny_client: Client) -> None:
    tools = (await tiny_client.list_tools()).tools
    assert {tool.name for tool in tools} == EXPECTED_TOOLS
    for tool in tools:
        result = await tiny_client.call_tool(tool.name, {MADE_UP: 1})
        text = error_text(result)
        assert result.is_error, tool.name
        assert f"`{MADE_UP}` is not an argument of `{tool.name}`" in text, text
        arguments = list(tool.input_schema.get("properties", {}))
        if not arguments:
            assert "It takes no arguments." in text, text
            continue
        listed = text.split("Its arguments: ")[1].split(".\n")[0].rstrip(".")
        assert listed.split(", ") == arguments, (tool.name, listed)


@pytest.mark.parametrize(
    ("tool", "arguments", "says"),
    [
        (
            "logit_diff",
            {"prompts": CLEAN, "correct": "mary", "incorrect": "john", "metric": "prob_diff"},
            "`metric` is not an argument of `logit_diff`. Its arguments: prompts, correct, incorrect, intervention.",
        ),
        (
            "answer_rank",
            {"prompts": CLEAN, "correct": "mary", "positions_of_interest": 5},
            "`positions_of_interest` is not an argument of `answer_rank`.",
        ),
        (
            "logit_diff",
            {"prompt": CLEAN, "correct": "mary", "incorrect": "john"},
            "`prompt` is not an argument of `logit_diff`; did you mean `prompts`?",
        ),
        (
            "patch",
            {"clean_prompts": CLEAN, "corrupt_prompts": CLEAN, "component": "resid_pre", "layer": 1},
            "`layer` is not an argument of `patch`; did you mean `layers`?",
        ),
        (
            "kl",
            {"prompts": CLEAN, "intervention": {"ablate": ["L1H1"], "methd": "mean"}},
            "`intervention.methd` is not a field of `intervention`; did you mean `method`? Its fields: ablate, method,",
        ),
        (
            "export_investigation",
            {"format": "md", "claims": [{"claim": "x", "call": 1, "number": ["a"]}]},
            "`claims[0].number` is not a field of `claims[0]`; did you mean `numbers`? Its fields: claim, call,",
        ),
        (
            "logit_diff",
            {"prompts": CLEAN, "correct": {"any_of": ["mary"], "every": True}, "incorrect": "john"},
            "an object (field every: no such field)",
        ),
    ],
)
async def test_a_refusal_names_the_argument_and_the_nearest_one(
    tiny_client: Client, tool: str, arguments: dict[str, Any], says: str
) -> None:
    result = await tiny_client.call_tool(tool, arguments)
    assert result.is_error and says in error_text(result), error_text(result)


def test_every_method_of_the_python_api_refuses_a_made_up_argument(tiny: LoadedModel, tmp_path: Path) -> None:
    session = Session("tiny", host=ModelHost("tiny", tmp_path / "out", loader=lambda *_: tiny))
    try:
        methods = sorted(set(RESULT_TYPES) - NOT_METHODS)
        assert len(methods) == len(EXPECTED_TOOLS - NOT_METHODS)
        for name in methods:
            with pytest.raises(ToolCallError, match=f"`{MADE_UP}` is not an argument of `{name}`"):
                getattr(session, name)(**{MADE_UP: 1})
        with pytest.raises(ToolCallError, match="`metric` is not an argument of `logit_diff`"):
            session.logit_diff(prompts=CLEAN, correct="mary", incorrect="john", metric="prob_diff")
    finally:
        session.close()


async def test_every_tool_sent_first_while_the_model_loads_waits_and_answers(
    tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tool's typical call, sent first and all at once to a server whose load is held: none answers while it is
    held (each waits at the one rule, none reaches for a model that is not there), the model-free tools answer
    meanwhile, and once the load ends every call answers with a result that is not an error."""
    monkeypatch.setenv("MCP_INTERP_CACHE", str(tmp_path / "cache"))  # fit_lens writes its lens there
    held = threading.Event()

    def load(*_: Any) -> LoadedModel:
        held.wait(120)
        return tiny

    host = ModelHost("tiny", tmp_path / "out", loader=load)
    sae = write_sae(tmp_path / "sae", random_weights(32, seed=1), hook="blocks.1.hook_resid_post")
    transcoders = write_plt(tmp_path / "transcoders", plt_weights(3, 64, 32, seed=1))
    calls = typical_calls(tiny, sae, transcoders)
    results: dict[str, Any] = {}
    async with Client(build_server(host)) as client:

        async def call(name: str, arguments: dict[str, Any]) -> None:
            results[name] = await client.call_tool(name, arguments)

        async with anyio.create_task_group() as group:
            group.start_soon(release_at_the_latest, held)
            for name, arguments in calls.items():
                group.start_soon(call, name, arguments)
            await anyio.sleep(1.0)
            assert host.state == "loading" and results == {}, sorted(results)
            model_free = {
                "get_figure": {"uri": "figure://" + "0" * 32},
                "job_status": {"job": "job://" + "0" * 32},
                "job_cancel": {"job": "job://" + "0" * 32},
            }
            for name, arguments in model_free.items():
                with anyio.fail_after(10):
                    answer = await client.call_tool(name, arguments)
                said = error_text(answer).lower()
                assert "loading" not in said and re.search("stored here|not found|unknown|no job", said), said
            assert results == {}
            held.set()
    assert set(results) == set(calls)
    failed = {name: error_text(result) for name, result in results.items() if result.is_error}
    assert failed == {}


async def release_at_the_latest(held: threading.Event) -> None:
    """The held load ends after 60 s whatever happens, so a failing assertion cannot leave the loader waiting."""
    with anyio.move_on_after(60):
        while not held.is_set():
            await anyio.sleep(0.1)
    held.set()


async def test_a_crash_outside_a_tools_boundary_is_named_not_bare(
    tiny_session: ModelHost, caplog: pytest.LogCaptureFixture
) -> None:
    server = build_server(tiny_session)

    async def crashes_outside_the_boundary() -> str:
        raise AssertionError("secret detail of the crash")

    async def breaks_its_schema() -> Any:
        return {"value": "not a number"}

    server.add_tool(crashes_outside_the_boundary)
    breaks_its_schema.__annotations__["return"] = dict[str, float]
    server.add_tool(breaks_its_schema, structured_output=True)
    async with Client(server) as client:
        crashed = await client.call_tool("crashes_outside_the_boundary", {})
        broke = await client.call_tool("breaks_its_schema", {})
        after = await client.call_tool("tokenize", {"texts": ["mary"]})
    text = error_text(crashed)
    assert crashed.is_error and "Internal error in mcp-interp while running `crashes_outside_the_boundary`" in text
    assert "(AssertionError)" in text and "secret detail" not in text
    assert broke.is_error and "its result broke its own output schema at value" in error_text(broke)
    assert any("secret detail of the crash" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)
    assert not after.is_error
