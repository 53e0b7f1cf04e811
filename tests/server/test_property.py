"""Property test: every tool, driven through a real MCP client with generated arguments (wrong
types, empty lists, huge numbers, unicode, NaN, unknown keys, and well-formed values mixed in),
returns either a result valid against its outputSchema or a tool error — and the server still
answers a valid call afterwards."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio.from_thread
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client

import mcp_interp.state.limits as limits
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.host import ModelHost
from mcp_interp.mcp.server import build_server
from tests.helpers import EXPECTED_TOOLS

WORDS = ["mary", "john", "when", "went", "to", "the", "store", "gave", "a", "drink", ",", "tom"]
TRIED: dict[str, int] = {}
SUCCEEDED: dict[str, int] = {}

chaos = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | st.sampled_from(
        [
            "L0H0",
            "L9H9",
            "L-1H0",
            "all",
            "last",
            "denoise",
            "noise",
            "exact",
            "zero",
            "mean",
            "resample",
            "figure://" + "0" * 32,
            "figure://../../etc/passwd",
            " mary",
            "mary john",
            "\u202e\u0000",
        ]
    ),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
sentence = st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map(" ".join)
plausible = {
    "prompts": st.lists(sentence, min_size=1, max_size=3),
    "texts": st.lists(sentence, min_size=0, max_size=3),
    "clean_prompts": st.lists(sentence, min_size=1, max_size=2),
    "corrupt_prompts": st.lists(sentence, min_size=1, max_size=2),
    "compare_prompts": st.lists(sentence, min_size=1, max_size=3),
    "prompt": sentence,
    "corrupt": sentence,
    "correct": st.sampled_from(["mary", "john", " mary", "mary john", ""]),
    "incorrect": st.sampled_from(["john", "tom", "zzzz"]),
    "answer": st.sampled_from(["mary", "john", "nope nope"]),
    "baseline": st.sampled_from(["john", "tom"]),
    "heads": st.sampled_from([["L0H0"], "L2H3", [{"layer": 1, "head": 1}], ["L7H0"], []]),
    "layer": st.integers(-2, 5),
    "head": st.integers(-1, 5),
    "seq_len": st.integers(-1, 40),
    "n_seqs": st.integers(0, 4),
    "top_k": st.integers(-1, 60),
    "max_new_tokens": st.integers(-1, 8),
    "coefficient": st.floats(allow_nan=True, width=32),
    "template": st.sampled_from(["the capital of {arg} is the city of", "no slot", "{arg} {arg}", "when {arg} went"]),
    "source": st.sampled_from(["france", "canada", "zzqx", ""]),
    "target": st.sampled_from(["canada", "france", "mary"]),
    "source_answer": st.sampled_from([".", "six", "paris", "mary john"]),
    "target_answer": st.sampled_from(["six", ".", "ottawa"]),
    "layers": st.lists(st.integers(-1, 3), max_size=3),
    "control_seeds": st.lists(st.integers(-1, 2**40), max_size=3),
    "corpus": st.sampled_from(["countries", "nope", {"name": "c", "concepts": ["france"], "functions": []}]),
    "artifact_json": st.sampled_from(["{}", '{"schema": "mcp-interp/causal-swap-benchmark", "schema_version": 1}']),
    "max_prompts": st.integers(-1, 3),
}


def arguments(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    keys = list(schema.get("properties", {}))
    value_for = {k: (plausible[k] | chaos) if k in plausible else chaos for k in keys}
    chosen = st.fixed_dictionaries({}, optional={k: v for k, v in value_for.items()})
    extra = st.dictionaries(st.text(min_size=1, max_size=6), chaos, max_size=1)
    return st.tuples(chosen, extra).map(lambda pair: {**pair[1], **pair[0]})


@pytest.fixture(scope="module")
def served(tiny: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, dict[str, Any]]]:
    saved = limits.current()
    cache = pytest.MonkeyPatch()
    cache.setenv("MCP_INTERP_CACHE", str(tmp_path_factory.mktemp("cache")))  # fit_lens writes its lens there
    limits.configure(limits.Limits(max_prompts=6, max_tokens=40, max_heads=16, max_new_tokens=6))
    out: Path = tmp_path_factory.mktemp("property")
    session = ModelHost("tiny", out, loader=lambda name, device, dtype: tiny)
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(Client(build_server(session))) as client,
    ):
        tools = {t.name: t for t in portal.call(client.list_tools).tools}
        yield portal, client, tools
    limits.configure(saved)
    cache.undo()
    total = sum(TRIED.values())
    print(f"\nproperty test: {total} generated calls, {sum(SUCCEEDED.values())} succeeded; per tool {TRIED}")


TOOLS = sorted(EXPECTED_TOOLS)


@pytest.mark.parametrize("tool", TOOLS)
def test_generated_calls_return_valid_results_or_tool_errors(
    served: tuple[Any, Any, dict[str, Any]], tool: str
) -> None:
    portal, client, tools = served
    schema = tools[tool].input_schema

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(arguments(schema))
    def check(args: dict[str, Any]) -> None:
        TRIED[tool] = TRIED.get(tool, 0) + 1
        result = portal.call(client.call_tool, tool, args)
        if result.is_error:
            text = " ".join(getattr(block, "text", "") for block in result.content)
            assert text.strip(), "a tool error must say what was wrong"
            assert "Traceback" not in text
            return
        assert result.structured_content is not None
        SUCCEEDED[tool] = SUCCEEDED.get(tool, 0) + 1
        jsonschema.validate(result.structured_content, tools[tool].output_schema)
        for value in _numbers(result.structured_content):
            assert not math.isnan(value) or tool in ("patch_heads", "explain")

    check()
    ok = portal.call(
        client.call_tool, "logit_diff", {"prompts": ["when mary went to"], "correct": "mary", "incorrect": "john"}
    )
    assert not ok.is_error, "the server must keep serving after bad input"


def _numbers(value: Any) -> Iterator[float]:
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v)
