"""Influence and pruning are circuit-tracer's: its ``test_small_graph`` fixture (``tests/test_graph.py``), whose node
influences are known in closed form, and the scores on graphs whose answer is known by construction."""

from __future__ import annotations

import pytest
import torch

from mcp_interp.core.graphs.pruning import (
    compute_influence,
    edge_influence,
    find_threshold,
    graph_scores,
    normalize_matrix,
    normalized_rows,
    partial_influences,
    prune_graph,
)


def small_graph() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """circuit-tracer's 12-node fixture: (adjacency, its node-pruned form, that form's expected edge influence)."""
    edges = torch.zeros(12, 12)
    for node in [1, 3, 6, 8]:
        edges[11, node] = 1 / 4
    for node in [0, 1, 6]:
        edges[3, node] = 1 / 12
    for node in [9, 10]:
        edges[1, node] = 1 / 6
    edges[0, 9] = 1 / 12
    adjacency = (edges > 0).float() * 10
    pruned = adjacency.clone()
    pruned[0, 9] = 0
    pruned[3, 0] = 0
    expected = torch.zeros(12, 12)
    for node in [1, 3, 6, 8]:
        expected[11, node] = 1 / 4
    for node in [1, 6]:
        expected[3, node] = 1 / 8
    for node in [9, 10]:
        expected[1, node] = 3 / 16
    return adjacency, pruned, expected


def test_circuit_tracers_small_graph() -> None:
    adjacency, pruned, expected = small_graph()
    weights = torch.zeros(12)
    weights[-1] = 1.0
    influence = compute_influence(normalize_matrix(adjacency), weights)
    assert torch.allclose(influence, torch.tensor([1 / 12, 1 / 3, 0, 1 / 4, 0, 0, 1 / 3, 0, 1 / 4, 1 / 4, 1 / 6, 0]))
    assert torch.allclose(edge_influence(pruned, weights), expected)


def test_prune_graph_on_the_small_graph() -> None:
    # 5 features (0–4), 2 layers × 2 positions of errors (5–8), 2 tokens (9, 10), 1 logit (11).
    adjacency, _, _ = small_graph()
    pruned = prune_graph(adjacency, torch.tensor([1.0]), n_features=5, n_tokens=2, node_threshold=0.8)
    # influences 1/12, 1/3, 0, 1/4, 0, 0, 1/3, 0, 1/4, 1/4, 1/6 (total 5/3): the top set reaching 0.8 of it is
    # {1, 6, 3, 8, 9} (sum 1.417 = 0.85), so node 0 (1/12) goes, and the always-kept tokens and logit stay
    assert pruned.node_mask.tolist() == [False, True, False, True, False, False, True, False, True, True, True, True]
    # cumulative share of 5/3 at or above each node (ties in either order): 1 and 6 hold 0.2 and 0.4, then 3, 8, 9
    # (1/4 each) 0.55, 0.7, 0.85, then 10 (1/6) 0.95 and 0 (1/12) 1.0
    cumulative = pruned.cumulative_scores.tolist()
    assert sorted(round(cumulative[n], 6) for n in (1, 6)) == [0.2, 0.4]
    assert sorted(round(cumulative[n], 6) for n in (3, 8, 9)) == [0.55, 0.7, 0.85]
    assert cumulative[10] == pytest.approx(0.95) and cumulative[0] == pytest.approx(1.0)
    kept = pruned.edge_mask
    assert not kept[0].any() and not kept[:, 0].any()  # the dropped node has no edges left
    assert kept[11, 1] and kept[3, 6] and kept[1, 9]


def test_find_threshold_keeps_the_smallest_top_set() -> None:
    scores = torch.tensor([0.5, 0.3, 0.15, 0.05])
    assert float(find_threshold(scores, 0.8)) == pytest.approx(0.3)  # 0.5 + 0.3 reaches 0.8
    assert float(find_threshold(scores, 0.81)) == pytest.approx(0.15)
    assert float(find_threshold(scores, 1.0)) == pytest.approx(0.05)


def test_scores_of_graphs_with_known_answers() -> None:
    # nodes: 1 feature, 1 layer × 1 position error, 1 token, 1 logit; the logit reads the feature (weight 3) and the
    # error (weight 1); the feature reads the token only. Token influence = 3/4, error influence = 1/4.
    adjacency = torch.zeros(4, 4)
    adjacency[3, 0], adjacency[3, 1], adjacency[0, 2] = 3.0, -1.0, 2.0
    replacement, completeness = graph_scores(adjacency, torch.tensor([1.0]), n_features=1, n_errors=1, n_tokens=1)
    assert replacement == pytest.approx(0.75)
    # non-error fraction: feature 1, error 1, token 1, logit 3/4; weights (influence + w): 3/4, 1/4, 3/4, 1
    assert completeness == pytest.approx((3 / 4 + 1 / 4 + 3 / 4 + 3 / 4) / (3 / 4 + 1 / 4 + 3 / 4 + 1))
    adjacency[3, 1] = 0.0  # no error on any path: both scores are 1
    assert graph_scores(adjacency, torch.tensor([1.0]), 1, 1, 1) == pytest.approx((1.0, 1.0))


def test_partial_influences_equal_the_full_influence_when_every_row_is_known() -> None:
    adjacency, _, _ = small_graph()
    weights = torch.zeros(12)
    weights[-1] = 1.0
    rows_with_inputs = [11, 0, 1, 3]  # logit row first, then the nodes with inputs
    partial = partial_influences(
        normalized_rows(adjacency[rows_with_inputs]), torch.tensor([1.0]), torch.tensor(rows_with_inputs)
    )
    assert torch.allclose(partial, compute_influence(normalize_matrix(adjacency), weights))


def circuit_tracers_find_threshold(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """circuit-tracer's ``find_threshold``, verbatim: every score sorted."""
    ordered = torch.sort(scores, descending=True).values
    cumulative = torch.cumsum(ordered, dim=0) / torch.sum(ordered)
    index = min(int(torch.searchsorted(cumulative, threshold).item()), len(cumulative) - 1)
    return ordered[index]


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.8, 0.98, 0.999999, 1.0])
def test_find_threshold_sorting_only_positive_scores_gives_circuit_tracers_answer(threshold: float) -> None:
    generator = torch.Generator().manual_seed(0)
    scores = torch.rand(400, generator=generator) ** 4
    scores[torch.rand(400, generator=generator) < 0.7] = 0.0  # most edge scores are 0 after node pruning
    for values in (scores, scores[scores > 0], torch.zeros(5)):
        assert float(find_threshold(values, threshold)) == float(circuit_tracers_find_threshold(values, threshold))
