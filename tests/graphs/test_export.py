"""The stored graph is Neuronpedia's graph JSON: it validates against circuit-tracer's own pydantic models (vendored
in ``graph_models.py``) and Neuronpedia's published JSON schema, and says what the graph says: every link's weight is
the adjacency entry of its two nodes, feature ids are Cantor-paired (layer, feature), logit clerps carry the targets'
probabilities, influences are the cumulative scores."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.graphs.job import AttributionGraphJob
from tests.graphs import graph_models
from tests.graphs.common import PROMPT, plt_weights, write_plt

SCHEMA = json.loads((Path(__file__).parent / "neuronpedia_graph-schema.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def exported(tiny: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> tuple[AttributionGraphJob, dict[str, Any]]:
    folder = write_plt(tmp_path_factory.mktemp("export"), plt_weights(3, 64, 48, seed=11, threshold=True))
    job = AttributionGraphJob(model=tiny, prompt=PROMPT, transcoders=folder, max_feature_nodes=300)
    drain(job)
    assert job.graph_json is not None
    return job, json.loads(json.dumps(job.graph_json))  # as stored: through JSON


def uncantor(z: int) -> tuple[int, int]:
    w = int(((8 * z + 1) ** 0.5 - 1) // 2)
    y = z - w * (w + 1) // 2
    return w - y, y


def test_validates_against_circuit_tracers_models_and_neuronpedias_schema(exported: tuple[Any, dict[str, Any]]) -> None:
    _, document = exported
    jsonschema.validate(document, SCHEMA)
    model = graph_models.Model.model_validate(document)
    assert len(model.nodes) == len(document["nodes"]) and len(model.links) == len(document["links"]) > 0
    for node, raw in zip(model.nodes, document["nodes"], strict=True):
        assert node.model_dump() == raw  # every field as circuit-tracer writes it, nothing extra or missing
    broken = json.loads(json.dumps(document))
    del broken["nodes"][0]["clerp"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCHEMA)
    broken["nodes"][0]["ctx_idx"] = "first"
    with pytest.raises(ValidationError):
        graph_models.Model.model_validate(broken)


def test_nodes_and_links_say_what_the_graph_says(exported: tuple[Any, dict[str, Any]]) -> None:
    job, document = exported
    graph, pruned = job.graph, job.pruned
    ids = [node["node_id"] for node in document["nodes"]]
    assert len(ids) == len(set(ids))  # Neuronpedia keys nodes by id
    index = {graph.describe(n)["node_id"]: n for n in range(graph.n_nodes)}
    assert all(link["source"] in ids and link["target"] in ids for link in document["links"])
    for link in document["links"]:
        t, s = index[link["target"]], index[link["source"]]
        assert link["weight"] == pytest.approx(float(graph.adjacency[t, s]), rel=1e-6)
        assert bool(pruned.edge_mask[t, s]) and bool(pruned.node_mask[t]) and bool(pruned.node_mask[s])
    kinds = {"cross layer transcoder": 0, "mlp reconstruction error": 0, "embedding": 0, "logit": 0}
    for node in document["nodes"]:
        kinds[node["feature_type"]] += 1
        n = index[node["node_id"]]
        if node["feature_type"] == "cross layer transcoder":
            layer, feature = uncantor(node["feature"])
            assert (str(layer), feature) == (node["layer"], graph.describe(n)["feature"])
            assert node["influence"] == pytest.approx(float(pruned.cumulative_scores[n]))
        if node["feature_type"] == "mlp reconstruction error":
            assert re.fullmatch(rf"{node['layer']}_-1_{node['ctx_idx']}", node["node_id"])
    assert kinds["embedding"] == len(graph.tokens) and kinds["logit"] == len(graph.targets)
    assert min(kinds.values()) > 0
    logits = [node for node in document["nodes"] if node["feature_type"] == "logit"]
    for node, token, probability in zip(logits, graph.targets.tokens, graph.targets.probabilities, strict=True):
        assert node["clerp"] == f'Output "{token}" (p={float(probability):.3f})' and node["layer"] == "4"
    assert [node["is_target_logit"] for node in logits] == [True] + [False] * (len(logits) - 1)
    metadata = document["metadata"]
    assert metadata["prompt_tokens"] == graph.tokens and metadata["prompt"] == PROMPT
    assert metadata["node_threshold"] == 0.8 and metadata["pruning_settings"]["edge_threshold"] == 0.98
    assert metadata["generation_settings"]["max_feature_nodes"] == 300 and metadata["schema_version"] == 1
