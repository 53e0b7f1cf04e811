"""What a graph result lists: the transcoders, node counts, the top features, the nodes and links the view draws.

The structured result stays small (≤ 16 KB for a typical prompt): the top features by influence with their
activation at every position, the most influential nodes of the pruned graph and the most influential edges
among them; the complete pruned graph is stored as Neuronpedia JSON (``graph://``). Numbers listed here are
rounded to 6 significant digits (the stored graph keeps float32).
"""

from __future__ import annotations

import math

import torch

from mcp_interp.core.engine.dictionaries.transcoders import Transcoders
from mcp_interp.core.graphs.neuronpedia import AttributionGraph
from mcp_interp.core.graphs.pruning import Pruned
from mcp_interp.schemas.graphs import GraphLink, GraphNode, NodeCounts, TopFeature, TranscoderInfo

VIEW_NODES = 24  # feature and error nodes listed for the view (plus the tokens and logits they connect to)
VIEW_LINKS = 40


def significant(value: float, digits: int = 6) -> float:
    """``value`` rounded to ``digits`` significant digits (0 stays 0)."""
    if value == 0 or not math.isfinite(value):
        return float(value)
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def transcoder_info(tc: Transcoders) -> TranscoderInfo:
    return TranscoderInfo(
        source=tc.source,
        folder=tc.folder,
        scan=tc.scan,
        kind=tc.kind,
        activation=tc.activation,
        n_layers=tc.n_layers,
        d_transcoder=tc.d_transcoder,
        feature_input_hook=tc.feature_input_hook,
        feature_output_hook=tc.feature_output_hook,
        skip_connection=tc.has_skip,
    )


def influence_shares(pruned: Pruned) -> torch.Tensor:
    """Each node's influence as a share of the total, 0..1."""
    total = float(pruned.node_influence.sum())
    return pruned.node_influence / total if total > 0 else pruned.node_influence


def counts(graph: AttributionGraph, pruned: Pruned) -> NodeCounts:
    mask, nf = pruned.node_mask, graph.n_features
    kept_edges = pruned.edge_mask & mask[:, None] & mask[None, :]
    return NodeCounts(
        features_active=graph.active.n,
        features_in_graph=nf,
        feature_nodes_kept=int(mask[:nf].sum()),
        error_nodes=graph.n_errors,
        error_nodes_kept=int(mask[nf : nf + graph.n_errors].sum()),
        token_nodes=graph.n_positions,
        logit_nodes=len(graph.targets),
        edges_nonzero=int((graph.adjacency != 0).sum()),
        edges_kept=int(kept_edges.sum()),
    )


def top_features(graph: AttributionGraph, pruned: Pruned, k: int) -> list[TopFeature]:
    """The ``k`` feature nodes with the largest influence, with their activation at every position."""
    shares = influence_shares(pruned)[: graph.n_features]
    top_logit = graph.n_nodes - len(graph.targets)
    out = []
    for node in torch.argsort(shares, descending=True)[:k].tolist():
        info = graph.describe(node)
        per_position = graph.active.activations[info["layer"], :, info["feature"]]
        out.append(
            TopFeature(
                node_id=info["node_id"],
                layer=info["layer"],
                position=info["position"],
                token=info["label"],
                feature=info["feature"],
                activation=significant(info["activation"]),
                influence=significant(float(shares[node])),
                direct_logit_effect=significant(float(graph.adjacency[top_logit, node])),
                activations=[significant(float(v)) for v in per_position],
            )
        )
    return out


def view_graph(
    graph: AttributionGraph, pruned: Pruned, max_nodes: int = VIEW_NODES, max_links: int = VIEW_LINKS
) -> tuple[list[GraphNode], list[GraphLink]]:
    """The pruned graph's ``max_nodes`` most influential feature and error nodes, every logit, the tokens linked
    to them, and the ``max_links`` most influential kept edges among those nodes."""
    shares = influence_shares(pruned)
    mask = pruned.node_mask
    inner = graph.n_features + graph.n_errors
    candidates = [n for n in torch.argsort(shares[:inner], descending=True).tolist() if mask[n]][:max_nodes]
    logits = list(range(graph.n_nodes - len(graph.targets), graph.n_nodes))
    chosen = set(candidates) | set(logits)
    edges = pruned.edge_mask & mask[:, None] & mask[None, :]
    tokens = range(inner, inner + graph.n_positions)
    chosen |= {t for t in tokens if bool(edges[sorted(chosen), t].any())}
    index = torch.tensor(sorted(chosen))
    sub = torch.where(edges[index][:, index], pruned.edge_scores[index][:, index], torch.zeros(()))
    order = torch.argsort(sub.flatten(), descending=True)[:max_links]
    order = order[sub.flatten()[order] > 0]
    links = []
    for flat in order.tolist():
        t, s = (int(index[i]) for i in divmod(flat, len(index)))
        links.append(
            GraphLink(
                source=graph.describe(s)["node_id"],
                target=graph.describe(t)["node_id"],
                weight=significant(float(graph.adjacency[t, s])),
            )
        )
    nodes = []
    for node in sorted(chosen, key=lambda n: (-float(shares[n]), n)):
        info = graph.describe(node)
        activation = info.get("activation")
        nodes.append(
            GraphNode(
                node_id=info["node_id"],
                kind=info["kind"],
                layer=info["layer"],
                position=info["position"],
                feature=info.get("feature"),
                activation=None if activation is None else significant(activation),
                influence=significant(float(shares[node])),
                cumulative=significant(float(pruned.cumulative_scores[node])),
                label=info["label"],
            )
        )
    return nodes, links
