"""MCP Apps views in a real browser: Debian's Chromium driven by Playwright, each view loaded in a sandboxed
iframe behind the official host-side ``AppBridge`` of ``@modelcontextprotocol/ext-apps`` (bundled from the pinned
``web/`` packages), fed a real tool result obtained from the server over stdio.

Each test asserts that the view initialises, that it draws one cell per layer × head (or layer × position, query ×
key, …) of the structured result, that hovering a given cell shows that cell's number from the result, that clicks
become the expected ``tools/call`` requests, that nothing is logged as an error and that no request leaves the
page. Screenshots go to ``test-output/views/`` (``MCP_INTERP_VIEW_SCREENSHOTS`` overrides), light and dark.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_interp.corpora import ioi_pairs
from mcp_interp.mcp.views import MIME_TYPE, VIEWS, view_html
from tests.helpers import stdio_params

ROOT = Path(__file__).resolve().parents[2]
CLEAN = ["when mary and john went to the store , john gave a drink to"] * 2
CORRUPT = ["when mary and john went to the store , mary gave a drink to"] * 2
PAIR = {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT, "correct": "mary", "incorrect": "john"}
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "patch_heads": ("patch_heads", PAIR),
    "induction": ("induction", {"seq_len": 6, "n_seqs": 2}),
    "patch": ("patch", {**PAIR, "component": "resid_pre"}),
    "attention": ("attention", {"prompt": CLEAN[0], "layer": 1, "head": 2}),
    "attention_other": ("attention", {"prompt": CLEAN[0], "layer": 2, "head": 0}),
    "logit_lens": ("logit_lens", {"prompt": CLEAN[0], "target": "mary", "top_k": 5}),
    "edge_attribution": ("edge_attribution", {**PAIR, "top_k": 30}),
    "find_circuit": ("find_circuit", {**PAIR, "target": 0.5, "top": 200}),  # every edge, for the slider
}


def chromium() -> str:
    path = os.environ.get("MCP_INTERP_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise RuntimeError("No Chromium: install Debian's (apt-get install chromium); ./run test does it as root.")
    return path


@pytest.fixture(scope="module")
def host_script(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The test host's script: the official AppBridge, bundled from the pinned packages in web/."""
    out = tmp_path_factory.mktemp("host") / "host.js"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build_views.py"), "--host", str(out)], check=True)
    return out.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every tool result the views draw, the tool list and the ui:// resources, from one stdio session on tiny."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MCP_INTERP_OUTPUT": str(tmp_path_factory.mktemp("out"))}
    return collect_in_thread("tiny", env, CALLS)


def collect_in_thread(model: str, env: dict[str, str], calls: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """``collect`` on its own event loop in a worker thread: Playwright's sync API keeps a loop running on this one."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(anyio.run, collect, model, env, calls).result()


async def collect(model: str, env: dict[str, str], calls: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {"results": {}, "resources": {}, "stored": {}}
    async with Client(stdio_params(model, env), read_timeout_seconds=300) as client:
        out["tools"] = {tool.name: tool.model_dump(by_alias=True) for tool in (await client.list_tools()).tools}
        for key, (tool, arguments) in calls.items():
            result = await client.call_tool(tool, arguments)
            assert not result.is_error, result.content
            out["results"][key] = (arguments, result.model_dump(by_alias=True, mode="json", exclude_none=True))
            uri = (result.structured_content or {}).get("result_uri")
            if uri is not None:  # the complete result, which a view reads through the host (patch's grids)
                read = await client.read_resource(uri)
                out["stored"][uri] = [
                    c.model_dump(by_alias=True, mode="json", exclude_none=True) for c in read.contents
                ]
        for view in VIEWS:
            read = await client.read_resource(f"ui://mcp-interp/{view}")
            out["resources"][view] = read.contents[0].model_dump(by_alias=True)
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        yield launched
        launched.close()


class Hosted:
    """One view in the test host: the page, the view's frame, what it logged and requested."""

    def __init__(self, page: Any, errors: list[str], requests: list[str]) -> None:
        self.page, self.errors, self.requests = page, errors, requests
        self.frame = page.frame_locator("#view")

    def tip_after_hovering(self, selector: str) -> str:
        self.frame.locator(selector).first.hover()
        tip = self.frame.locator("#tip")
        tip.wait_for(state="visible")
        return str(tip.inner_text())

    def tip_after_edge_hover(self, selector: str) -> str:
        """Move the mouse onto a point of an SVG path where the path itself is on top (nodes are drawn over
        edges, and a curved stroke misses its bounding box's centre): sample the path until the element under
        the point belongs to it, then move the real mouse there (page coordinates = iframe offset + point)."""
        point = self.frame.locator(selector).first.evaluate(
            """p => {
                const r = p.getBoundingClientRect(), b = p.getBBox(), n = p.getTotalLength();
                for (let i = 1; i < 20; i++) {
                    const m = p.getPointAtLength(n * i / 20), x = r.left + m.x - b.x, y = r.top + m.y - b.y;
                    const hit = document.elementFromPoint(x, y);
                    if (hit && hit.closest("[data-edge]") === p.closest("[data-edge]")) return {x, y};
                }
                return null;
            }"""
        )
        assert point is not None, f"no hoverable point on {selector}"
        box = self.page.locator("#view").bounding_box()
        self.page.mouse.move(box["x"] + point["x"], box["y"] + point["y"])
        tip = self.frame.locator("#tip")
        tip.wait_for(state="visible")
        return str(tip.inner_text())

    def tool_calls(self) -> list[dict[str, Any]]:
        return list(self.page.evaluate("window.toolCalls"))

    def check_clean(self) -> None:
        assert self.errors == [], self.errors
        assert self.requests == [], f"requests left the page: {self.requests}"

    def screenshot(self, name: str) -> None:
        folder = Path(os.environ.get("MCP_INTERP_VIEW_SCREENSHOTS", ROOT / "test-output" / "views"))
        folder.mkdir(parents=True, exist_ok=True)
        self.page.locator("#view").screenshot(path=str(folder / f"{name}.png"))


def host(
    browser: Any,
    host_script: str,
    view: str,
    arguments: dict[str, Any],
    result: dict[str, Any],
    theme: str = "light",
    replies: dict[str, Any] | None = None,
    stored: dict[str, Any] | None = None,
) -> Hosted:
    page = browser.new_page(viewport={"width": 900, "height": 700})
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on(
        "request",
        lambda request: requests.append(request.url) if not request.url.startswith(("about:", "data:")) else None,
    )
    page.set_content(
        '<!doctype html><html><body style="margin:0">'
        '<iframe id="view" sandbox="allow-scripts" style="width:100%;border:0;height:600px"></iframe>'
        f"<script>{host_script}</script></body></html>"
    )
    page.evaluate(
        "([html, args, result, theme, replies, stored]) => { window.VIEW_HTML = html; window.TOOL_ARGS = args; "
        "window.TOOL_RESULT = result; window.THEME = theme; window.TOOL_REPLIES = replies; "
        "window.RESOURCES = stored; return window.startHost(); }",
        [view_html(view), arguments, result, theme, replies or {}, stored or {}],
    )
    page.wait_for_function("window.hostReady === true")
    hosted = Hosted(page, errors, requests)
    hosted.frame.locator("body[data-ready=true]").wait_for()
    return hosted


def fmt(value: float) -> str:
    """The views' number format (sign, 3 decimals)."""
    return f"{value:+.3f}"


# --- the server side of the extension ---------------------------------------------------------------


def test_linked_tools_and_ui_resources_over_stdio(served: dict[str, Any]) -> None:
    linked = {name: tool["_meta"]["ui"]["resourceUri"] for name, tool in served["tools"].items() if tool.get("_meta")}
    assert linked == {
        "patch_heads": "ui://mcp-interp/heads-heatmap",
        "induction": "ui://mcp-interp/heads-heatmap",
        "patch": "ui://mcp-interp/layer-position",
        "attention": "ui://mcp-interp/attention",
        "logit_lens": "ui://mcp-interp/logit-lens",
        "edge_attribution": "ui://mcp-interp/circuit-graph",
        "find_circuit": "ui://mcp-interp/circuit-graph",
        "attribution_graph": "ui://mcp-interp/attribution-graph",
    }
    for name in linked:
        assert served["tools"][name]["_meta"]["ui/resourceUri"] == linked[name]  # the older flat key too
    for view, content in served["resources"].items():
        assert content["mimeType"] == MIME_TYPE
        html = content["text"]
        assert html == view_html(view) and html.startswith("<!doctype html>")
        assert len(html.encode("utf-8")) < 300_000
        assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html  # nothing fetched


def test_committed_views_are_built_from_their_sources() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_views.py"), "--check"], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()


# --- each view in the browser -------------------------------------------------------------------------


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_heads_heatmap_hover_and_click_to_attention(
    browser: Any, host_script: str, served: dict[str, Any], theme: str
) -> None:
    arguments, result = served["results"]["patch_heads"]
    _, attention = served["results"]["attention"]
    stored = served["stored"]
    hosted = host(browser, host_script, "heads-heatmap", arguments, result, theme, {"attention": attention}, stored)
    uri = result["structuredContent"]["result_uri"]
    complete = json.loads(stored[uri][0]["text"])  # full precision and the patched values, read through the host
    scores = complete["scores"]
    assert hosted.page.evaluate("window.resourceReads") == [uri]
    assert hosted.frame.locator("[data-cell]").count() == len(scores) * len(scores[0]) == 3 * 4
    tip = hosted.tip_after_hovering('[data-cell="L1H2"]')
    assert f"score {fmt(scores[1][2])}" in tip
    assert f"patched logit diff {fmt(complete['patched_logit_diff'][1][2])}" in tip
    hosted.frame.locator('[data-cell="L1H2"]').click()
    hosted.frame.locator("#detail [data-cell]").first.wait_for()
    assert hosted.tool_calls()[-1]["name"] == "attention"
    assert hosted.tool_calls()[-1]["arguments"] == {"prompt": CLEAN[0], "layer": 1, "head": 2}
    n = len(attention["structuredContent"]["tokens"])
    assert hosted.frame.locator("#detail [data-cell]").count() == n * n
    hosted.screenshot(f"heads-heatmap-{theme}")
    hosted.check_clean()


def test_heads_heatmap_for_induction_scores(browser: Any, host_script: str, served: dict[str, Any]) -> None:
    arguments, result = served["results"]["induction"]
    hosted = host(browser, host_script, "heads-heatmap", arguments, result)
    scores = result["structuredContent"]["scores"]
    assert hosted.frame.locator("[data-cell]").count() == 12
    assert f"induction score {scores[2][3]:.3f}" in hosted.tip_after_hovering('[data-cell="L2H3"]')
    hosted.check_clean()


def test_layer_position_map(browser: Any, host_script: str, served: dict[str, Any]) -> None:
    arguments, result = served["results"]["patch"]
    hosted = host(browser, host_script, "layer-position", arguments, result, stored=served["stored"])
    uri = result["structuredContent"]["result_uri"]
    content = json.loads(served["stored"][uri][0]["text"])  # the grids, which the view read through the host
    assert hosted.page.evaluate("window.resourceReads") == [uri]
    n_positions = len(content["tokens"])
    assert hosted.frame.locator("[data-cell]").count() == len(content["scores"]) * n_positions == 3 * n_positions
    tip = hosted.tip_after_hovering('[data-cell="L2P9"]')  # the token where the pair differs
    assert f"score {fmt(content['scores'][2][9])}" in tip and 'clean "john" / corrupt "mary"' in tip
    hosted.screenshot("layer-position")
    hosted.check_clean()


def test_attention_pattern_and_head_selector(browser: Any, host_script: str, served: dict[str, Any]) -> None:
    arguments, result = served["results"]["attention"]
    _, other = served["results"]["attention_other"]
    hosted = host(browser, host_script, "attention", arguments, result, replies={"attention": other})
    content = result["structuredContent"]
    n = len(content["tokens"])
    assert hosted.frame.locator("[data-cell]").count() == n * n
    assert f"weight {content['pattern'][13][9]:.4f}" in hosted.tip_after_hovering('[data-cell="q13k9"]')
    hosted.frame.locator("#layer").fill("2")
    hosted.frame.locator("#head").fill("0")
    hosted.frame.locator("#show").click()
    hosted.frame.get_by_text("Attention of L2H0").wait_for()
    assert hosted.tool_calls()[-1]["arguments"] == {"prompt": CLEAN[0], "layer": 2, "head": 0}
    assert f"weight {other['structuredContent']['pattern'][13][9]:.4f}" in hosted.tip_after_hovering(
        '[data-cell="q13k9"]'
    )
    hosted.screenshot("attention")
    hosted.check_clean()


def test_logit_lens_table(browser: Any, host_script: str, served: dict[str, Any]) -> None:
    arguments, result = served["results"]["logit_lens"]
    hosted = host(browser, host_script, "logit-lens", arguments, result)
    content = result["structuredContent"]
    assert hosted.frame.locator("tbody tr").count() == len(content["layers"]) == 4  # embed + 3 blocks
    assert [row["layer"] for row in content["layers"]] == [-1, 0, 1, 2]  # integers; the view names −1 'embed'
    assert hosted.frame.locator("tbody tr th").all_inner_texts() == ["embed", "0", "1", "2"]
    assert hosted.frame.locator("td[data-cell]:not([data-cell^=rank])").count() == 4 * 5
    highlighted = sum(1 for layer in content["layers"] for t in layer["top"] if t["id"] == content["target_id"])
    assert hosted.frame.locator("td.target").count() == highlighted
    last = content["layers"][-1]
    tip = hosted.tip_after_hovering(f'[data-cell="rank-{last["layer"]}"]')
    assert f"rank {last['target_rank']}" in tip and f"P = {last['target_prob']:.4f}" in tip
    hosted.screenshot("logit-lens")
    hosted.check_clean()


def test_circuit_graph_slider_and_faithfulness(browser: Any, host_script: str, served: dict[str, Any]) -> None:
    arguments, result = served["results"]["find_circuit"]
    content = result["structuredContent"]
    hosted = host(browser, host_script, "circuit-graph", arguments, result)
    n = len(content["edges"])
    shown = min(n, 50)
    assert hosted.frame.locator("[data-edge]").count() == shown
    top = max(content["edges"], key=lambda e: abs(e["score"]))
    tip = hosted.tip_after_edge_hover(f'[data-edge="{top["writer"]}->{top["reader"]}"] path.edge')
    assert f"score {fmt(top['score'])}" in tip
    slider = hosted.frame.locator("#k")
    slider.evaluate("(el, k) => { el.value = String(k); el.dispatchEvent(new Event('input')); }", content["n_edges"])
    assert hosted.frame.locator("[data-edge]").count() == content["n_edges"]
    assert f"exact faithfulness at k = {content['n_edges']}: {content['faithfulness']['value']:.3f}" in str(
        hosted.frame.locator("#faithfulness").inner_text()
    )
    hosted.screenshot("circuit-graph")
    hosted.check_clean()


def test_circuit_graph_of_edge_attribution(browser: Any, host_script: str, served: dict[str, Any]) -> None:
    arguments, result = served["results"]["edge_attribution"]
    hosted = host(browser, host_script, "circuit-graph", arguments, result, theme="dark")
    assert hosted.frame.locator("[data-edge]").count() == len(result["structuredContent"]["edges"]) == 30
    assert "not measured" in str(hosted.frame.locator("#faithfulness").inner_text())
    hosted.check_clean()


@pytest.mark.embedded
def test_heads_heatmap_on_the_embedded_model(browser: Any, host_script: str, tmp_path: Path) -> None:
    pairs = ioi_pairs()[:2]
    arguments = {
        "clean_prompts": [p.clean for p in pairs],
        "corrupt_prompts": [p.corrupt for p in pairs],
        "correct": [p.correct for p in pairs],
        "incorrect": [p.incorrect for p in pairs],
        "method": "attribution",
    }
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MCP_INTERP_OUTPUT": str(tmp_path / "out")}
    served = collect_in_thread("smollm2-135m", env, {"patch_heads": ("patch_heads", arguments)})
    _, result = served["results"]["patch_heads"]
    hosted = host(browser, host_script, "heads-heatmap", arguments, result, stored=served["stored"])
    scores = json.loads(served["stored"][result["structuredContent"]["result_uri"]][0]["text"])["scores"]
    assert hosted.frame.locator("[data-cell]").count() == 30 * 9 == len(scores) * len(scores[0])
    assert f"score {fmt(scores[23][3])}" in hosted.tip_after_hovering('[data-cell="L23H3"]')
    hosted.screenshot("heads-heatmap-smollm2")
    hosted.check_clean()
    assert json.dumps(result).count("L23H3") >= 1
