"""The graphs family over MCP (in-process client on `tiny`): results validate against their output schemas and stay
under 16 KB, the stored graph:// is Neuronpedia JSON holding the same graph, the figure is stored, and bad input is a
tool error that says what was wrong."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from mcp import Client

from tests.graphs.common import PROMPT, plt_weights, write_plt
from tests.graphs.test_export import SCHEMA
from tests.helpers import assert_valid_structured, error_text, tools_by_name

pytestmark = pytest.mark.anyio
MAX_STRUCTURED_BYTES = 16 * 1024


async def test_attribution_graph_and_graph_intervene_over_mcp(tiny_client: Client, tmp_path: Path) -> None:
    folder = write_plt(tmp_path / "tc", plt_weights(3, 64, 48, seed=21, threshold=True))
    tools = await tools_by_name(tiny_client)
    called = await tiny_client.call_tool("attribution_graph", {"prompt": PROMPT, "transcoders": folder})
    graph = assert_valid_structured(tools["attribution_graph"], called)
    assert len(json.dumps(graph, separators=(",", ":"))) < MAX_STRUCTURED_BYTES  # as sent
    assert graph["replacement_logit_error"] <= 1e-3 and 0 <= graph["replacement_score"] <= 1
    assert graph["counts"]["token_nodes"] == len(PROMPT.split()) and graph["counts"]["feature_nodes_kept"] > 0
    stored = await tiny_client.read_resource(graph["graph_uri"])
    assert stored.contents[0].mime_type == "application/json"
    document = json.loads(stored.contents[0].text)
    jsonschema.validate(document, SCHEMA)
    ids = {node["node_id"] for node in document["nodes"]}
    assert {n["node_id"] for n in graph["nodes"]} <= ids  # the listed nodes are the stored graph's
    links = {(link["source"], link["target"]): link["weight"] for link in document["links"]}
    for link in graph["links"]:
        assert link["weight"] == pytest.approx(links[(link["source"], link["target"])], rel=1e-5)
    assert len(document["links"]) == graph["counts"]["edges_kept"]
    figure = await tiny_client.read_resource(graph["figure_uri"])
    assert figure.contents[0].mime_type == "image/png"
    top = graph["top_features"][0]
    change = {"layer": top["layer"], "position": top["position"], "feature": top["feature"], "scale": 0.0}
    intervened = assert_valid_structured(
        tools["graph_intervene"],
        await tiny_client.call_tool("graph_intervene", {"prompt": PROMPT, "transcoders": folder, "features": [change]}),
    )
    assert intervened["interventions"][0]["new_activation"] == 0.0
    assert intervened["interventions"][0]["clean_activation"] == pytest.approx(top["activation"], rel=1e-5)
    assert [run["name"] for run in intervened["runs"]] == ["direct", "replacement", "model"]
    assert intervened["max_prediction_error"] < 1e-4
    first = intervened["targets"][0]
    # zeroing the top feature moves the top logit directly by minus its edge to it
    assert first["predicted_direct"] == pytest.approx(-top["direct_logit_effect"], rel=1e-4, abs=1e-6)


async def test_bad_input_is_a_tool_error_that_says_why(tiny_client: Client, tmp_path: Path) -> None:
    folder = write_plt(tmp_path / "tc", plt_weights(3, 64, 16))
    two_layers = write_plt(tmp_path / "two", plt_weights(2, 64, 16))
    cases = [
        ({"prompt": PROMPT, "transcoders": str(tmp_path / "none")}, "is not a folder on this machine"),
        ({"prompt": PROMPT, "transcoders": two_layers}, "2 layers of transcoders, but the loaded model"),
        ({"prompt": PROMPT, "transcoders": "someone/not-cached"}, "not in this machine's Hugging Face cache"),
        ({"prompt": PROMPT, "transcoders": folder, "node_threshold": 1.5}, "`node_threshold` is a share"),
        ({"prompt": PROMPT, "transcoders": folder, "max_feature_nodes": -1}, "`max_feature_nodes` must be"),
        ({"prompt": PROMPT, "transcoders": folder, "targets": ["mary john"]}, "answers must be exactly one token"),
        ({"prompt": "", "transcoders": folder}, "non-empty string"),
    ]
    for arguments, message in cases:
        assert message in error_text(await tiny_client.call_tool("attribution_graph", arguments)), message
    bad_feature = {"layer": 0, "position": 99, "feature": 0, "value": 1.0}
    outside = await tiny_client.call_tool(
        "graph_intervene", {"prompt": PROMPT, "transcoders": folder, "features": [bad_feature]}
    )
    assert "position 99 is outside the prompt's positions" in error_text(outside)
    both = {"layer": 0, "position": 1, "feature": 0, "value": 1.0, "scale": 2.0}
    twice = await tiny_client.call_tool(
        "graph_intervene", {"prompt": PROMPT, "transcoders": folder, "features": [both]}
    )
    assert "exactly one of `value`" in error_text(twice)


async def test_the_trace_prediction_prompt(tiny_client: Client) -> None:
    rendered = await tiny_client.get_prompt(
        "trace-prediction", {"prompt": "The capital of France is", "transcoders": "/tc"}
    )
    text = rendered.messages[0].content.text  # type: ignore[union-attr]
    assert "Prompt: 'The capital of France is'" in text and "Transcoders: /tc" in text
    assert "replacement_score" in text and "predicted_direct" in text and "freeze_attention" in text
