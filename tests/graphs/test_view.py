"""The attribution-graph view in a real browser (Debian's Chromium + Playwright, the official AppBridge as host, as
in ``tests/server/test_views.py``), fed real results of ``attribution_graph`` and ``graph_intervene`` from the server
over stdio on `tiny`: the nodes drawn are the result's nodes within the pruning threshold, hovering a feature shows
its activation and influence, the slider changes what is drawn, clicking a feature pins it, and "zero the pinned
features" sends the ``graph_intervene`` call that tests it and shows the reply's numbers."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.graphs.common import PROMPT, plt_weights, write_plt
from tests.server.test_views import browser, collect_in_thread, host, host_script  # noqa: F401 (fixtures)


def fmt(value: float) -> str:
    return f"{value:+.3f}"


@pytest.fixture(scope="module")
def graph_served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = write_plt(tmp_path_factory.mktemp("view-tc"), plt_weights(3, 64, 48, seed=21, threshold=True))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MCP_INTERP_OUTPUT": str(tmp_path_factory.mktemp("view-out"))}
    arguments = {"prompt": PROMPT, "transcoders": folder}
    served = collect_in_thread("tiny", env, {"graph": ("attribution_graph", arguments)})
    _, result = served["results"]["graph"]
    content = result["structuredContent"]
    top = next(n for n in content["nodes"] if n["kind"] == "feature")
    change = {"layer": top["layer"], "position": top["position"], "feature": top["feature"], "value": 0}
    intervene_args = {**arguments, "features": [change], "targets": [t["token"] for t in content["targets"]]}
    replies = collect_in_thread("tiny", env, {"intervene": ("graph_intervene", intervene_args)})
    return {"arguments": arguments, "result": result, "top": top, "intervene_args": intervene_args,
            "reply": replies["results"]["intervene"][1]}  # fmt: skip


def shown(content: dict[str, Any], threshold: float) -> list[dict[str, Any]]:
    return [n for n in content["nodes"] if n["kind"] in ("token", "logit") or n["cumulative"] <= threshold]


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_attribution_graph_view(browser: Any, host_script: str, graph_served: dict[str, Any], theme: str) -> None:  # noqa: F811
    result, reply = graph_served["result"], graph_served["reply"]
    content = result["structuredContent"]
    hosted = host(
        browser, host_script, "attribution-graph", graph_served["arguments"], result, theme, {"graph_intervene": reply}
    )
    nodes = shown(content, content["node_threshold"])
    assert hosted.frame.locator("[data-node]").count() == len(nodes) > len(content["tokens"])
    ids = {n["node_id"] for n in nodes}
    links = [link for link in content["links"] if link["source"] in ids and link["target"] in ids]
    assert hosted.frame.locator("[data-edge]").count() == len(links) > 0
    top = graph_served["top"]
    tip = hosted.tip_after_hovering(f'[data-node="{top["node_id"]}"] circle')
    assert f"L{top['layer']} feature {top['feature']}" in tip
    assert f"activation {top['activation']:.3f}" in tip and f"influence {top['influence']:.4f}" in tip
    slider = hosted.frame.locator("#threshold")
    slider.evaluate("(el) => { el.value = '1'; el.dispatchEvent(new Event('input')); }")
    assert hosted.frame.locator("[data-node]").count() == len(content["nodes"])
    slider.evaluate("(el) => { el.value = '0.1'; el.dispatchEvent(new Event('input')); }")
    assert hosted.frame.locator("[data-node]").count() == len(shown(content, 0.1))
    slider.evaluate(
        "(el, v) => { el.value = String(v); el.dispatchEvent(new Event('input')); }", content["node_threshold"]
    )
    assert hosted.frame.locator("#zero").is_disabled()
    hosted.frame.locator(f'[data-node="{top["node_id"]}"] circle').click()
    assert hosted.frame.locator(f'[data-pin="{top["node_id"]}"]').count() == 1
    hosted.frame.locator("#zero").click()
    hosted.frame.locator("#detail tbody tr").first.wait_for()
    assert hosted.tool_calls()[-1] == {"name": "graph_intervene", "arguments": graph_served["intervene_args"]}
    targets = reply["structuredContent"]["targets"]
    assert hosted.frame.locator("#detail tbody tr").count() == len(targets)
    first_row = hosted.frame.locator("#detail tbody tr").first.inner_text()
    assert fmt(targets[0]["predicted_direct"]) in first_row and fmt(targets[0]["model"]) in first_row
    hosted.screenshot(f"attribution-graph-{theme}")
    hosted.check_clean()
