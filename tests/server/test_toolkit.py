"""The adapters' one error boundary and family registration, through a real in-process MCP client."""

from __future__ import annotations

import logging

import pytest
from mcp import Client
from mcp.server.mcpserver import Context
from pydantic import ValidationError

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.errors import InputError
from mcp_interp.host import ModelHost
from mcp_interp.mcp.argument_errors import argument_error
from mcp_interp.mcp.family import Family
from mcp_interp.mcp.server import FAMILIES, build_server
from mcp_interp.mcp.toolkit import Toolkit
from tests.helpers import error_text

pytestmark = pytest.mark.anyio


def raise_bug(model: LoadedModel) -> None:
    raise RuntimeError("secret internal detail")


def raise_input_error(model: LoadedModel) -> None:
    raise InputError("`heads` must name a head such as 'L9H3'.")


async def test_errors_become_tool_errors_and_the_server_keeps_serving(
    tiny_session: ModelHost, caplog: pytest.LogCaptureFixture
) -> None:
    server = build_server(tiny_session)
    probe = Family("probe")

    @probe.tool()
    async def bug(ctx: Context) -> str:
        kit = Toolkit.of(ctx)
        await kit.call(raise_bug, await kit.model(ctx))
        return "unreachable"

    @probe.tool()
    async def bad_input(ctx: Context) -> str:
        kit = Toolkit.of(ctx)
        await kit.call(raise_input_error, await kit.model(ctx))
        return "unreachable"

    probe.register(server)
    stored = tiny_session.store.put("figure", b"\x89PNG kept")
    with caplog.at_level(logging.ERROR, logger="mcp_interp.mcp.toolkit"):
        async with Client(server) as client:
            crashed = await client.call_tool("bug", {})
            refused = await client.call_tool("bad_input", {})
            after = await client.call_tool("tokenize", {"texts": ["mary"]})
    crash_text = crashed.content[0].text
    assert crashed.is_error and "Internal error in mcp-interp (RuntimeError)" in crash_text
    assert "secret internal detail" not in crash_text  # the caller gets a short message ...
    logged = [r for r in caplog.records if r.exc_info is not None]
    assert logged and "secret internal detail" in str(logged[0].exc_info[1])  # ... the log gets the traceback
    assert refused.is_error and refused.content[0].text.endswith("`heads` must name a head such as 'L9H3'.")
    assert not after.is_error and after.structured_content["texts"][0]["tokens"] == ["mary"]
    assert tiny_session.store.get("figure", stored.id) == b"\x89PNG kept"


async def test_every_tool_is_declared_by_exactly_one_family(tiny_client: Client) -> None:
    listed = [tool.name for tool in (await tiny_client.list_tools()).tools]
    declared = [fn.__name__ for family in FAMILIES for fn in family.tools]
    assert sorted(listed) == sorted(declared)
    assert len(set(declared)) == len(declared)


PAIR = {"clean_prompts": ["mary went"], "corrupt_prompts": ["john went"], "correct": "mary", "incorrect": "john"}


@pytest.mark.parametrize(
    ("tool", "arguments", "field", "given", "accepted"),
    [
        ("path_patch", {**PAIR, "sender": "L1H1", "component": "query"}, "component", "'query'", ["'q'", "'k'", "'v'"]),
        ("patch", {**PAIR, "component": "resid"}, "component", "'resid'", ["'resid_pre'", "'mlp_neurons'"]),
        ("patch_heads", {**PAIR, "metric": "logitdiff"}, "metric", "'logitdiff'", ["'logit_diff'", "'kl'"]),
        (
            "kl",
            {"prompts": ["mary"], "intervention": {"ablate": ["L1H1"], "positions": "first"}},
            "intervention.positions",
            "'first'",
            ["'all'", "'last'", "a list"],
        ),
        ("patch_heads", {**PAIR, "top": 0}, "top", "got 0", ["≥ 1"]),
        ("logit_diff", {"prompts": ["mary"], "correct": 5, "incorrect": "john"}, "correct", "got 5", ["a string"]),
    ],
)
async def test_an_invalid_argument_is_told_in_what_to_pass(
    tiny_client: Client, tool: str, arguments: dict[str, object], field: str, given: str, accepted: list[str]
) -> None:
    text = error_text(await tiny_client.call_tool(tool, arguments))
    assert f"`{field}`" in text and given in text, text
    for value in accepted:
        assert value in text, (value, text)
    for pydantic_words in ("errors.pydantic.dev", "validation error for", "Input should be", "type=", "Arguments"):
        assert pydantic_words not in text, text


async def test_every_tools_enum_arguments_list_their_choices_when_wrong(tiny_client: Client) -> None:
    """Every tool, every argument published with an enum: a wrong value is answered with all its accepted values
    (the translation sits in front of every tool, not in one family's adapter)."""
    checked = 0
    for tool in (await tiny_client.list_tools()).tools:
        for name, schema in tool.input_schema.get("properties", {}).items():
            choices = schema.get("enum")
            if not choices:
                continue
            text = error_text(await tiny_client.call_tool(tool.name, {name: "no-such-choice"}))
            assert f"`{name}`: got 'no-such-choice'" in text, (tool.name, text)
            assert all(repr(choice) in text for choice in choices), (tool.name, name, choices, text)
            assert "errors.pydantic.dev" not in text and "Input should be" not in text, text
            for required in set(tool.input_schema.get("required", [])) - {name}:  # the missing ones are named too
                assert f"`{required}` is required" in text, (tool.name, required, text)
            checked += 1
    assert checked >= 15, checked


@pytest.mark.parametrize(
    ("tool", "arguments", "line"),
    [
        (  # str | set | list of them: the list branch fails at an element, and is named with where
            "edge_attribution",
            {**PAIR, "correct": ["mary", 5]},
            "- `correct`: got ['mary', 5]; accepted: a string, an object or a list of strings or objects"
            " (item [1] is not a string or an object) — One token or {any_of: [tokens]}, for all prompts or one per"
            " prompt.",
        ),
        (
            "ablate_head",
            {"prompts": ["mary"], "heads": ["L1H1", 3]},
            "- `heads`: got ['L1H1', 3]; accepted: a string or a list of strings (item [1] is not a string)"
            " — 'L9H3' or a list, ablated together.",
        ),
        (  # a union whose element branch is itself a union (answers of any length)
            "logit_diff",
            {"prompts": ["mary"], "correct": ["mary", 5], "incorrect": "john"},
            "- `correct`: got ['mary', 5]; accepted: a string, an object or a list of strings or objects"
            " (item [1] is not a string or an object) — One answer for all prompts or one per prompt: a string"
            " (any length) or {any_of: [...]}.",
        ),
        (  # two bad elements of one list: the whole list as given, both places named
            "patch",
            {**PAIR, "component": "resid_pre", "positions": ["a", "b"]},
            "- `positions`: got ['a', 'b']; accepted: a list (items [0], [1] are not integers)"
            " — Default: every position.",
        ),
        (  # an argument described once in the server's instructions: the accepted shapes, no description
            "ablate_head",
            {"prompts": ["mary"], "heads": "L1H1", "positions": ["a", "b"]},
            "- `positions`: got ['a', 'b']; accepted: 'all' or 'last' or a list of integers"
            " (items [0], [1] are not integers).",
        ),
    ],
)
async def test_an_error_inside_a_value_names_its_branch_and_shows_the_value_given(
    tiny_client: Client, tool: str, arguments: dict[str, object], line: str
) -> None:
    text = error_text(await tiny_client.call_tool(tool, arguments))
    assert line in text.splitlines(), text


def test_an_error_with_no_location_is_told_as_the_arguments() -> None:
    """A check of the arguments together (pydantic locates it nowhere) is told at `arguments`, never at ``."""
    error = ValidationError.from_exception_data(
        "probe", [{"type": "value_error", "loc": (), "input": {"a": 1}, "ctx": {"error": ValueError("pass `b` too")}}]
    )
    text = argument_error("probe", error, {}, {"a": 1})
    expected = "- `arguments`: got {'a': 1}; accepted: pass `b` too."
    assert text == f"Error executing tool probe: invalid arguments.\n{expected}"
