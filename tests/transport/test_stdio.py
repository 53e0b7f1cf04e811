"""End to end over a real stdio subprocess (`python -m mcp_interp serve --model tiny`)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from mcp import Client

from mcp_interp.core.engine.backend.model import LoadedModel
from tests.helpers import (
    EXPECTED_TOOLS,
    TINY_PROMPTS,
    assert_valid_structured,
    error_text,
    png_text,
    stdio_params,
    tiny_corpus,
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


async def test_stdio_patch_heatmap_reads_back_as_a_labelled_png(tmp_path: Path) -> None:
    clean = ["when mary and john went to the store , john gave a drink to"]
    corrupt = ["when mary and john went to the store , mary gave a drink to"]
    arguments = {"clean_prompts": clean, "corrupt_prompts": corrupt, "component": "attn_out", "metric": "kl"}
    async with Client(stdio_params("tiny", child_env(tmp_path)), read_timeout_seconds=120) as client:
        tools = await tools_by_name(client)
        result = assert_valid_structured(tools["patch"], await client.call_tool("patch", arguments))
        resource = await client.read_resource(result["figure_uri"])
    png = base64.b64decode(resource.contents[0].blob)  # type: ignore[union-attr]
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and resource.contents[0].mime_type == "image/png"
    assert "john/mary@9 | gave@10 | a@11 | drink@12 | to@13" in png_text(png)["Description"]
    assert result["clean"]["value"] == 0.0 and result["corrupt"]["value"] > 0  # KL(clean‖clean) = 0


async def test_stdio_causal_swap_benchmark_artifact_round_trip(tmp_path: Path, tiny: LoadedModel) -> None:
    """A benchmark over stdio: progress arrives, the artifact is readable as a resource, lies in the server's
    output folder, verifies, and a one-trial edit of it is named by verify_artifact."""
    env = {**child_env(tmp_path), "MCP_INTERP_CACHE": str(tmp_path / "cache")}
    progress: list[str] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async with Client(stdio_params("tiny", env), read_timeout_seconds=120) as client:
        tools = await tools_by_name(client)
        out = assert_valid_structured(
            tools["causal_swap_benchmark"],
            await client.call_tool(
                "causal_swap_benchmark",
                {"corpus": tiny_corpus(tiny), "layers": [1], "position": "concept", "control_seeds": [0, 1]},
                progress_callback=on_progress,
            ),
        )
        text = (await client.read_resource(out["artifact_uri"])).contents[0].text
        document = json.loads(text)
        document["results"]["trials"][-1]["layer"] = 0
        verdicts = [
            (await client.call_tool("verify_artifact", {"artifact_json": payload})).structured_content
            for payload in (text, json.dumps(document))
        ]
    assert Path(out["artifact_path"]).is_relative_to(tmp_path / "out")
    assert Path(out["artifact_path"]).read_text(encoding="utf-8") == text
    steps = [m for m in progress if not m.startswith("waiting for model")]
    # No lens is cached in this fresh cache: the default Jacobian lens is fitted first (8 texts, then the save).
    fitting = [m for m in steps if "fitting one first" in m]
    assert len(fitting) == 8 + 1 and steps[: len(fitting)] == fitting
    trials = steps[len(fitting) :]
    assert len(trials) == 1 + 3 * 12 and trials[0].startswith("baselines")
    assert out["lens"]["kind"] == "jacobian"
    assert document["protocol"]["settings"]["position"] == "concept"
    assert verdicts[0]["valid"] is True
    assert verdicts[1]["valid"] is False and verdicts[1]["altered"] == ["results", "results.trials"]
