"""`explain` end to end through a real stdio client, and its numbers against the single tools."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import pytest
from mcp import Client
from mcp.types import ResourceLink

from mcp_interp.figures import png_size
from mcp_interp.mcp.server import build_server
from mcp_interp.session import Session
from tests.mcp_helpers import assert_valid_structured, stdio_params, tools_by_name

pytestmark = pytest.mark.anyio

PROMPT = "when mary and john went to the store , john gave a drink to"
CORRUPT = "when mary and john went to the store , mary gave a drink to"


async def test_explain_over_stdio_report_figures_and_agreement(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MCP_INTERP_OUTPUT": str(tmp_path / "out")}
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with Client(stdio_params("tiny", env), read_timeout_seconds=300) as client:
        tools = await tools_by_name(client)
        call = await client.call_tool(
            "explain",
            {"prompt": PROMPT, "answer": "mary", "baseline": "john", "corrupt": CORRUPT, "top_k": 3},
            progress_callback=on_progress,
        )
        explained = assert_valid_structured(tools["explain"], call)
        report = (await client.read_resource(explained["report_uri"])).contents[0].text
        pngs = {}
        for uri in explained["figure_uris"]:
            blob = (await client.read_resource(uri)).contents[0].blob
            pngs[uri] = base64.b64decode(blob)
        single = {
            "ld": await client.call_tool("logit_diff", {"prompts": [PROMPT], "correct": "mary", "incorrect": "john"}),
            "dla": await client.call_tool("dla", {"prompt": PROMPT, "answer": "mary", "baseline": "john", "top_k": 3}),
            "lens": await client.call_tool("logit_lens", {"prompt": PROMPT, "target": "mary"}),
            "patch": await client.call_tool(
                "patch_heads",
                {"clean_prompts": [PROMPT], "corrupt_prompts": [CORRUPT], "correct": "mary", "incorrect": "john"},
            ),
        }
    single = {
        k: assert_valid_structured(
            tools[{"ld": "logit_diff", "dla": "dla", "lens": "logit_lens", "patch": "patch_heads"}[k]], v
        )
        for k, v in single.items()
    }
    # Same numbers as the single tools.
    assert explained["logit_diff"] == pytest.approx(single["ld"]["logit_diff"]["value"], abs=1e-9)
    assert explained["top_dla"] == single["dla"]["top"]
    assert explained["answer_prob"] == pytest.approx(single["lens"]["final_prob"], abs=1e-12)
    assert explained["forms_at_layer"] == single["lens"]["first_top1_layer"]
    patch_scores = {h["head"]: h["score"] for h in single["patch"]["heads"]}
    for head in explained["causal_heads"]:
        assert head["recovered_fraction"] == pytest.approx(patch_scores[head["head"]], abs=1e-9)
    # The report is Markdown that cites the real numbers and links every figure.
    assert report.startswith("# Why does the model say")
    assert f"{explained['logit_diff']:+.4f}" in report
    for contribution in explained["top_dla"]:
        assert f"| {contribution['component']} | {contribution['value']:+.4f} |" in report
    assert set(re.findall(r"figure://[0-9a-f]{32}", report)) == set(explained["figure_uris"])
    links = [b for b in call.content if isinstance(b, ResourceLink)]
    assert {str(link.uri) for link in links} == set(explained["figure_uris"]) | {explained["report_uri"]}
    for png in pngs.values():
        width, height = png_size(png)
        assert width > 100 and height > 100
    assert len(pngs) == 3 + 3  # lens, DLA, patching heatmap, and attention of the top 3 heads
    assert progress == sorted(progress) and progress[-1] == 3 + 3  # 3 stages + one per layer of `tiny`
    assert set(explained["stage_seconds"]) == {"logit_lens", "dla", "patch_heads", "attention", "figures"}


async def test_prompts_are_listed_and_rendered(tiny_session: Session) -> None:
    async with Client(build_server(tiny_session)) as client:
        names = {p.name for p in (await client.list_prompts()).prompts}
        rendered = await client.get_prompt(
            "explain-prediction", {"prompt": "When Mary and John went", "answer": " Mary", "baseline": " John"}
        )
        claim = await client.get_prompt("test-causal-claim", {"claim": "L9H3 moves names"})
    assert names == {"explain-prediction", "find-circuit", "test-causal-claim"}
    text = rendered.messages[0].content.text
    assert "When Mary and John went" in text and "' Mary'" in text and "leading space" in text
    assert "rank saturates" in text.lower() or "Rank saturates" in text
    assert "L9H3 moves names" in claim.messages[0].content.text
