"""A computed attribution graph: its nodes in circuit-tracer's order, its adjacency, and Neuronpedia's JSON.

Node order (circuit-tracer's ``Graph``): the selected features (in (layer, position, feature) order), the error
nodes (layer 0 positions 0..T−1, layer 1, …), the input tokens (positions 0..T−1), the target logits. The
adjacency is square, rows = targets, columns = sources; error and token rows are 0 (they have no inputs), and
so are logit columns.

``neuronpedia_json`` writes the pruned graph in the format of circuit-tracer's ``create_graph_files``
(``frontend/graph_models.py``: ``metadata``, ``qParams``, ``nodes``, ``links``), which Neuronpedia's graph viewer
and circuit-tracer's local server open unchanged: feature node ids ``{layer}_{feature}_{position}`` with
``feature`` Cantor-paired (``schema_version`` 1), error nodes ``{layer}_-1_{position}`` (upstream's fix of the
old ``0_{layer}_{position}``, which collided with feature ids), tokens ``E_{token_id}_{position}``, logits
``{n_layers+1}_{token_id}_{T−1}`` with the clerp ``Output "{token}" (p=…)`` the frontend parses; ``influence`` is
the cumulative score the viewer's pruning slider reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from mcp_interp.core.graphs.pruning import Pruned
from mcp_interp.core.graphs.replacement import ActiveFeatures
from mcp_interp.core.graphs.targets import LogitTargets
from mcp_interp.version import __version__


@dataclass
class AttributionGraph:
    """The unpruned graph of one prompt (see the module docstring for the node order)."""

    prompt: str
    token_ids: list[int]
    tokens: list[str]
    n_layers: int
    active: ActiveFeatures  # every active feature; ``selected`` are the graph's feature nodes
    selected: torch.Tensor  # [n_features] long, indices into ``active``
    adjacency: torch.Tensor  # [N, N] float32, rows = targets, columns = sources
    targets: LogitTargets

    @property
    def n_features(self) -> int:
        return int(self.selected.numel())

    @property
    def n_positions(self) -> int:
        return len(self.token_ids)

    @property
    def n_errors(self) -> int:
        return self.n_layers * self.n_positions

    @property
    def n_nodes(self) -> int:
        return self.n_features + self.n_errors + self.n_positions + len(self.targets)

    def kind(self, node: int) -> str:
        if node < self.n_features:
            return "feature"
        if node < self.n_features + self.n_errors:
            return "error"
        return "token" if node < self.n_features + self.n_errors + self.n_positions else "logit"

    def describe(self, node: int) -> dict[str, Any]:
        """What node ``node`` is: kind, layer, position, feature, activation, Neuronpedia id, label (its token)."""
        kind = self.kind(node)
        if kind == "feature":
            i = int(self.selected[node])
            layer, position = int(self.active.layers[i]), int(self.active.positions[i])
            feature = int(self.active.features[i])
            return {
                "kind": kind, "layer": layer, "position": position, "feature": feature,
                "activation": float(self.active.values[i]), "node_id": f"{layer}_{feature}_{position}",
                "label": self.tokens[position],
            }  # fmt: skip
        if kind == "error":
            layer, position = divmod(node - self.n_features, self.n_positions)
            return {"kind": kind, "layer": layer, "position": position, "node_id": f"{layer}_-1_{position}",
                    "label": self.tokens[position]}  # fmt: skip
        if kind == "token":
            position = node - self.n_features - self.n_errors
            return {"kind": kind, "layer": None, "position": position,
                    "node_id": f"E_{self.token_ids[position]}_{position}", "label": self.tokens[position]}  # fmt: skip
        k = node - (self.n_nodes - len(self.targets))
        token_id = self.targets.ids[k]
        return {"kind": kind, "layer": None, "position": self.n_positions - 1, "token_id": token_id,
                "node_id": f"{self.n_layers + 1}_{token_id}_{self.n_positions - 1}", "label": self.targets.tokens[k],
                "probability": float(self.targets.probabilities[k])}  # fmt: skip


def cantor(x: int, y: int) -> int:
    """Cantor's pairing, as Neuronpedia's ``feature`` of a transcoder node (``schema_version`` 1)."""
    return (x + y) * (x + y + 1) // 2 + y


def neuronpedia_json(
    graph: AttributionGraph, pruned: Pruned, slug: str, scan: str, settings: dict[str, Any], source: str
) -> dict[str, Any]:
    """The pruned graph as Neuronpedia's graph JSON (circuit-tracer's ``create_graph_files``)."""
    kept = torch.nonzero(pruned.node_mask).flatten().tolist()
    kept_set = set(kept)
    nodes: dict[int, dict[str, Any]] = {}
    first_logit = graph.n_nodes - len(graph.targets)
    for node in kept:
        info = graph.describe(node)
        influence = float(pruned.cumulative_scores[node])
        base = {"token_prob": 0.0, "is_target_logit": False, "run_idx": 0, "reverse_ctx_idx": 0, "clerp": ""}
        if info["kind"] == "feature":
            layer, feature, position = info["layer"], info["feature"], info["position"]
            entry = {**base, "feature": cantor(layer, feature), "layer": str(layer), "ctx_idx": position,
                     "feature_type": "cross layer transcoder", "jsNodeId": f"{layer}_{feature}-0",
                     "influence": influence, "activation": info["activation"]}  # fmt: skip
        elif info["kind"] == "error":
            layer, position = info["layer"], info["position"]
            entry = {**base, "feature": -1, "layer": str(layer), "ctx_idx": position,
                     "feature_type": "mlp reconstruction error", "jsNodeId": f"{layer}_{position}-0",
                     "influence": influence, "activation": None}  # fmt: skip
        elif info["kind"] == "token":
            position = info["position"]
            entry = {**base, "feature": position, "layer": "E", "ctx_idx": position, "feature_type": "embedding",
                     "jsNodeId": f"E_{graph.token_ids[position]}-{position}", "influence": influence,
                     "activation": None}  # fmt: skip
        else:
            probability = info["probability"]
            entry = {**base, "feature": info["token_id"], "layer": str(graph.n_layers + 1),
                     "ctx_idx": info["position"], "feature_type": "logit", "token_prob": probability,
                     "is_target_logit": node == first_logit, "jsNodeId": f"L_{info['token_id']}-{info['position']}",
                     "clerp": f'Output "{info["label"]}" (p={probability:.3f})', "influence": None,
                     "activation": None}  # fmt: skip
        nodes[node] = {"node_id": info["node_id"], **entry}
    targets, sources = torch.nonzero(pruned.edge_mask, as_tuple=True)
    links: list[dict[str, Any]] = []
    linked: set[int] = set()
    for t, s in zip(targets.tolist(), sources.tolist(), strict=True):
        if t in kept_set and s in kept_set:
            links.append({"source": nodes[s]["node_id"], "target": nodes[t]["node_id"],
                          "weight": float(graph.adjacency[t, s])})  # fmt: skip
            linked.update((s, t))
    used = [nodes[n] for n in kept if n in linked or graph.kind(n) in ("token", "logit")]
    return {
        "metadata": {
            "slug": slug,
            "scan": scan,
            "transcoder_list": [],
            "prompt_tokens": graph.tokens,
            "prompt": graph.prompt,
            "node_threshold": settings["node_threshold"],
            "schema_version": 1,
            "info": {
                "creator_name": "mcp-interp",
                "source_urls": [source],
                "transcoder_set": source,
                "generator": {"name": "mcp-interp attribution_graph", "version": __version__},
                "create_time_ms": int(time.time() * 1000),
            },
            "generation_settings": {
                "max_n_logits": settings["max_n_logits"],
                "desired_logit_prob": settings["desired_logit_prob"],
                "batch_size": settings["batch_size"],
                "max_feature_nodes": settings["max_feature_nodes"],
            },
            "pruning_settings": {
                "node_threshold": settings["node_threshold"],
                "edge_threshold": settings["edge_threshold"],
            },
        },
        "qParams": {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""},
        "nodes": used,
        "links": links,
    }
