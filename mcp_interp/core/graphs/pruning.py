"""Influence, pruning and the graph's scores, as circuit-tracer computes them (``circuit_tracer/graph.py``,
MIT licence, Copyright (c) 2024 Michael Hanna and Mateusz Piotrowski; ported to keep its numbers).

The adjacency matrix A is square over the nodes, **rows = targets, columns = sources**, in circuit-tracer's
order: selected features, error nodes (layer-major), input tokens, logits. Every quantity here works on
|A| with each row normalised to sum 1 (Ā: the share of a target's incoming direct effect that each source
carries), so signs cancel nowhere:

* *logit weights* w: zero except the logit nodes, which carry their probabilities (so the top logit counts most);
* *node influence* = w Ā + w Ā² + … (finite: the graph is a DAG, Ā nilpotent) — how much of the logits'
  weighted input flows through a node along all paths, ≥ 0; summed over the error and token nodes it is
  the total weight Σ w (every path ends at a token or an error node);
* *edge influence* [t, s] = Ā[t, s] · (influence of t + w_t) on the graph restricted to the kept nodes;
* *replacement score* = token influence / (token + error influence) in [0, 1]: the share of the end-to-end
  influence that reaches the logits from the input through features only (1 = no error node on any path);
* *completeness score* in [0, 1]: the influence-weighted mean over nodes of the fraction of each node's
  input that does not come from error nodes (partial credit for mostly-explained nodes).

Pruning keeps the nodes whose influence is in the top share ``node_threshold`` of the total (tokens and
logits always), then the edges in the top share ``edge_threshold`` of the total edge influence, then drops
feature and error nodes left without an outgoing edge and features without an incoming one, until nothing
changes. A node's *cumulative score* is the share of the total influence held by the nodes ranked at or
above it (small = important; a node is kept at threshold τ roughly when its score ≤ τ) — what Neuronpedia's
pruning slider reads as ``influence``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_ITERATIONS = 1000


def normalize_matrix(matrix: torch.Tensor) -> torch.Tensor:
    """|A| with each row divided by its sum (rows summing to 0 stay 0)."""
    normalized = matrix.abs()
    return normalized / normalized.sum(dim=1, keepdim=True).clamp(min=1e-10)


def compute_influence(matrix: torch.Tensor, weights: torch.Tensor, max_iter: int = MAX_ITERATIONS) -> torch.Tensor:
    """w A + w A² + … for a nilpotent A (a DAG), by repeated products until the term vanishes."""
    current = weights @ matrix
    influence = current.clone()
    for _ in range(max_iter):
        if not current.any():
            return influence
        current = current @ matrix
        influence += current
    raise RuntimeError(f"influence did not converge in {max_iter} steps: the graph has a cycle")


def find_threshold(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """The score of the smallest top set of ``scores`` (≥ 0) whose sum reaches ``threshold`` of the total.

    circuit-tracer sorts every score; only the positive ones can move the cumulative sum, so they alone are sorted
    (most edge scores are 0 once the node threshold has dropped most nodes) and the answer is the same: where the
    positives never reach ``threshold`` (float rounding at 1.0), circuit-tracer's index runs into the zeros (or the
    last score)."""
    flat = scores.flatten()
    positive = flat[flat > 0]
    if positive.numel() == 0:
        return flat.max()
    ordered = torch.sort(positive, descending=True).values
    cumulative = torch.cumsum(ordered, dim=0) / torch.sum(ordered)
    index = int(torch.searchsorted(cumulative, threshold).item())
    if index < len(ordered):
        return ordered[index]
    return ordered[-1] if positive.numel() == flat.numel() else torch.zeros((), dtype=flat.dtype)


def edge_influence(matrix: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[t, s] = Ā[t, s] · (influence of t + w_t): the share of the logits' weighted input through each edge."""
    normalized = normalize_matrix(matrix)
    return normalized * (compute_influence(normalized, weights) + weights)[:, None]


@dataclass(frozen=True)
class Pruned:
    """Which nodes and edges survive, and every node's influence and cumulative score (see the module)."""

    node_mask: torch.Tensor  # [N] bool
    edge_mask: torch.Tensor  # [N, N] bool, [target, source]
    node_influence: torch.Tensor  # [N] ≥ 0, logit nodes 0
    cumulative_scores: torch.Tensor  # [N] in (0, 1]
    edge_scores: torch.Tensor  # [N, N] ≥ 0: each edge's influence on the graph restricted to the kept nodes


def logit_weights(n_nodes: int, probabilities: torch.Tensor) -> torch.Tensor:
    weights = torch.zeros(n_nodes, device=probabilities.device)
    weights[n_nodes - len(probabilities) :] = probabilities
    return weights


def prune_graph(
    adjacency: torch.Tensor,
    probabilities: torch.Tensor,
    n_features: int,
    n_tokens: int,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
) -> Pruned:
    """circuit-tracer's ``prune_graph`` on a square adjacency in its node order."""
    n_logits = len(probabilities)
    weights = logit_weights(adjacency.shape[0], probabilities)
    node_influence = compute_influence(normalize_matrix(adjacency), weights)
    node_mask = node_influence >= find_threshold(node_influence, node_threshold)
    node_mask[-n_logits - n_tokens :] = True
    pruned = adjacency.clone()
    pruned[~node_mask] = 0
    pruned[:, ~node_mask] = 0
    edge_scores = edge_influence(pruned, weights)
    edge_mask = edge_scores >= find_threshold(edge_scores, edge_threshold)
    inner = slice(0, adjacency.shape[0] - n_logits - n_tokens)  # feature and error nodes

    def drop_dangling() -> None:
        node_mask[inner] &= edge_mask[:, inner].any(0)  # feature and error nodes need an outgoing edge
        node_mask[:n_features] &= edge_mask[:n_features].any(1)  # features need an incoming edge

    before = node_mask.clone()
    drop_dangling()
    while not torch.equal(node_mask, before):  # at most n_layers + 1 rounds
        before = node_mask.clone()
        edge_mask[~node_mask] = False
        edge_mask[:, ~node_mask] = False
        drop_dangling()
    ordered, order = torch.sort(node_influence, descending=True)
    cumulative = torch.zeros_like(node_influence)
    cumulative[order] = torch.cumsum(ordered, dim=0) / torch.sum(ordered)
    return Pruned(node_mask, edge_mask, node_influence, cumulative, edge_scores)


def graph_scores(
    adjacency: torch.Tensor, probabilities: torch.Tensor, n_features: int, n_errors: int, n_tokens: int
) -> tuple[float, float]:
    """(replacement score, completeness score) of the unpruned graph (see the module docstring)."""
    weights = logit_weights(adjacency.shape[0], probabilities)
    normalized = normalize_matrix(adjacency)
    influence = compute_influence(normalized, weights)
    errors = slice(n_features, n_features + n_errors)
    tokens = slice(n_features + n_errors, n_features + n_errors + n_tokens)
    token_influence, error_influence = influence[tokens].sum(), influence[errors].sum()
    replacement = token_influence / (token_influence + error_influence)
    non_error = 1 - normalized[:, errors].sum(dim=-1)
    output = influence + weights
    completeness = (non_error * output).sum() / output.sum()
    return float(replacement), float(completeness)


def normalized_rows(rows: torch.Tensor) -> torch.Tensor:
    """|rows| with each row divided by its sum (circuit-tracer's clamp at 1e-8), for ``partial_influences``."""
    normalized = rows.abs()
    return normalized / normalized.sum(dim=1, keepdim=True).clamp(min=1e-8)


def partial_influences(
    normalized: torch.Tensor, probabilities: torch.Tensor, row_nodes: torch.Tensor, max_iter: int = 128
) -> torch.Tensor:
    """circuit-tracer's ``compute_partial_influences``: node influence from the rows computed so far, to rank which
    features to compute next when not every feature gets a row. ``normalized`` ``[r, N]`` are those rows through
    ``normalized_rows`` (row i holds node ``row_nodes[i]``'s incoming edges; logit rows first)."""
    influence = torch.zeros(normalized.shape[1], device=normalized.device)
    product = torch.zeros(normalized.shape[1], device=normalized.device)
    product[-len(probabilities) :] = probabilities
    for _ in range(max_iter):
        product = product[row_nodes] @ normalized
        if not product.any():
            return influence
        influence += product
    raise RuntimeError("partial influences did not converge")
