"""The server through a real MCP client, in-process, on the `tiny` model."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from mcp import Client

from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.host import ModelHost
from mcp_interp.mcp.server import build_server
from tests.helpers import (
    EXPECTED_TOOLS,
    TINY_PROMPTS,
    WRITING_TOOLS,
    assert_valid_structured,
    error_text,
    tools_by_name,
)

pytestmark = pytest.mark.anyio


async def test_every_tool_has_output_schema_and_read_only_annotations(tiny_client: Client) -> None:
    tools = await tools_by_name(tiny_client)
    assert set(tools) == EXPECTED_TOOLS
    for tool in tools.values():
        assert tool.output_schema is not None, tool.name
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint is (tool.name not in WRITING_TOOLS)
        assert tool.annotations.destructive_hint is False
        # score_explanation draws a new quiz each call and refuses to score one twice: the one tool not idempotent.
        assert tool.annotations.idempotent_hint is (tool.name != "score_explanation")
        assert tool.annotations.open_world_hint is False


async def test_structured_results_validate_and_match_core(tiny_client: Client, tiny: LoadedModel) -> None:
    tools = await tools_by_name(tiny_client)
    calls = {
        "model_info": {},
        "tokenize": {"texts": TINY_PROMPTS},
        "logit_diff": {"prompts": TINY_PROMPTS, "correct": " mary", "incorrect": [" john", " tom"]},
        "kl": {"prompts": TINY_PROMPTS[:1], "compare_prompts": [TINY_PROMPTS[0].replace(", John", ", Mary")]},
        "answer_rank": {"prompts": TINY_PROMPTS, "correct": "mary"},
    }
    results = {
        name: assert_valid_structured(tools[name], await tiny_client.call_tool(name, args))
        for name, args in calls.items()
    }

    info = results["model_info"]
    assert (info["n_layers"], info["n_heads"], info["n_kv_heads"], info["d_model"]) == (3, 4, 2, 64)
    assert info["source"] == "tiny" and info["prepends_bos"] is False
    for result in results.values():
        assert result["model"]["fingerprint"] == tiny.fingerprint
        assert len(result["run_id"]) == 32 and result["elapsed_s"] >= 0
    assert results["tokenize"]["texts"][0]["ids"] == tiny.tokenizer(TINY_PROMPTS[0]).input_ids
    # logit_diff over MCP equals the bridge computed here directly.
    mary, john, tom = (tiny.tokenizer.convert_tokens_to_ids(w) for w in ("mary", "john", "tom"))
    with torch.no_grad():
        direct = [tiny.bridge(tiny.tokenizer(p, return_tensors="pt").input_ids)[0, -1] for p in TINY_PROMPTS]
    expected = [float(direct[0][mary] - direct[0][john]), float(direct[1][mary] - direct[1][tom])]
    assert results["logit_diff"]["logit_diff"]["per_example"] == pytest.approx(expected, abs=1e-5)
    assert results["answer_rank"]["rank"]["per_example"] == [float((d > d[mary]).sum()) for d in direct]


async def test_bad_input_is_a_tool_error_and_server_keeps_serving(tiny_client: Client) -> None:
    multi = await tiny_client.call_tool(  # edge attribution reads one answer token; the metric tools take sequences
        "edge_attribution",
        {
            "clean_prompts": TINY_PROMPTS,
            "corrupt_prompts": TINY_PROMPTS,
            "correct": "mary john",
            "incorrect": "tom",
        },
    )
    assert "2 tokens" in error_text(multi) and "exactly one token" in error_text(multi)
    sequence = await tiny_client.call_tool(
        "logit_diff", {"prompts": TINY_PROMPTS, "correct": "mary john", "incorrect": "tom"}
    )
    assert sequence.structured_content is not None
    assert sequence.structured_content["answer_kind"] == "sequence"
    unequal = await tiny_client.call_tool("kl", {"prompts": ["a b c"], "compare_prompts": ["a b"]})
    assert "same number of tokens" in error_text(unequal) and "pair 0" in error_text(unequal)
    wrong_type = await tiny_client.call_tool("tokenize", {"texts": 5})
    assert "texts" in error_text(wrong_type)
    unknown = await tiny_client.call_tool("no_such_tool", {})
    assert unknown.is_error
    ok = await tiny_client.call_tool("logit_diff", {"prompts": TINY_PROMPTS, "correct": "mary", "incorrect": "john"})
    assert not ok.is_error


async def test_unknown_figure_ids_are_not_found(tiny_client: Client) -> None:
    templates = (await tiny_client.list_resource_templates()).resource_templates
    assert sorted(t.uri_template for t in templates) == [
        "artifact://{artifact_id}",
        "circuit://{circuit_id}",
        "direction://{direction_id}",
        "explanation://{explanation_id}",
        "figure://{figure_id}",
        "graph://{graph_id}",
        "job://{job_id}",
        "ledger://{page}",
        "notebook://{notebook_id}",
        "quiz://{quiz_id}",
        "report://{report_id}",
        "result://{result_id}",
        "script://{script_id}",
    ]
    for kind in ("figure", "report", "artifact", "direction", "graph"):
        for bad in ["0" * 32, "../../etc/passwd", "x" * 5000]:
            with pytest.raises(Exception, match=r"(?i)not found|no (figure|report|artifact|direction|graph)|unknown"):
                await tiny_client.read_resource(f"{kind}://{bad}")


async def test_figure_resource_reads_back_stored_bytes(tiny_session: ModelHost, tiny_client: Client) -> None:
    stored = tiny_session.store.put("figure", b"\x89PNG\r\n\x1a\nfake-but-bytes")
    result = await tiny_client.read_resource(stored.uri)
    import base64

    assert base64.b64decode(result.contents[0].blob) == b"\x89PNG\r\n\x1a\nfake-but-bytes"


async def test_loading_does_not_block_initialize_and_calls_wait_with_progress(tmp_path: Path) -> None:
    delay = 2.0

    def slow_loader(name: str, device: str, dtype: str) -> LoadedModel:
        time.sleep(delay)  # a slow disk or a first-time GGUF conversion
        return load_model(name, device, dtype)

    session = ModelHost("tiny", tmp_path / "out", loader=slow_loader)
    progress: list[str | None] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    started = time.perf_counter()
    async with Client(build_server(session)) as client:
        await client.list_tools()
        listed_after = time.perf_counter() - started
        assert session.state == "loading"
        result = await client.call_tool("model_info", {}, progress_callback=on_progress)
    assert listed_after < delay / 2, f"tools/list waited {listed_after:.2f} s for the model"
    assert not result.is_error
    assert progress and all(m and "waiting for model tiny" in m for m in progress)


async def test_load_failure_is_a_tool_error_with_a_fix(tmp_path: Path) -> None:
    session = ModelHost("definitely/not-a-model-here", tmp_path / "out")
    async with Client(build_server(session)) as client:
        result = await client.call_tool("model_info", {})
        text = error_text(result)
        assert "smollm2-135m" in text and "local" in text
        again = await client.call_tool("tokenize", {"texts": ["x"]})
        assert again.is_error


async def test_json_text_puts_the_structured_result_in_the_last_text_block(tiny_session: ModelHost) -> None:
    """``serve --json-text`` (Inspect's MCP tools show a model only the text): the last text block parses to exactly
    the structured content, after the short summary; an error stays an error with no JSON appended."""
    async with Client(build_server(tiny_session, json_text=True)) as client:
        result = await client.call_tool("answer_rank", {"prompts": TINY_PROMPTS, "correct": "mary"})
        assert not result.is_error and len(result.content) >= 2
        assert json.loads(result.content[-1].text) == result.structured_content
        assert result.structured_content["examples"][0]["prompt"] == TINY_PROMPTS[0]
        refused = await client.call_tool("answer_rank", {"prompts": TINY_PROMPTS})
        assert refused.is_error and all("{" not in block.text[:1] for block in refused.content)
    async with Client(build_server(tiny_session)) as client:
        plain = await client.call_tool("answer_rank", {"prompts": TINY_PROMPTS, "correct": "mary"})
        assert all(not block.text.startswith("{") for block in plain.content)
