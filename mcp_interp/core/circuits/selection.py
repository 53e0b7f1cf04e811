"""Choosing circuits from attribution scores, and the random circuits a chosen one is judged against.

A circuit is a set of edges (writer index, reader index) of the ``Graph``. It is chosen at one of two granularities:

* **edges** — the top k edges by attribution;
* **nodes** — the top k writers (heads and MLPs) by their total attribution, the circuit being every edge out of a
  chosen writer or out of the embeddings (which are always kept): ablating a node ablates everything it writes.
  "Which 8 heads" is usually the first question.

Ranked by ``abs`` (|score|, the default) or ``signed`` (score, largest first): top-|score| includes edges that push
the metric the wrong way, which lower a circuit's faithfulness.

**The baseline.** Uniformly random circuits of k edges out of tens of thousands are almost never connected from the
embeddings to the logits, so they score ≈ 0 at every k and any circuit "beats" them — a baseline that cannot fail.
Here the random circuits are drawn from the same *candidate pool* the chosen circuit comes from: random k-subsets
of the top 4k edges (or nodes) by the same ranking. They are made of edges attribution also rates highly, so they are
often connected and often faithful; a circuit beats them only if *which* k it picked matters. Under H0 "the
ranking inside the pool carries no information" the chosen circuit is one more random k-subset, so
``stats.rank_test`` (alternative "greater": draws ≥ real count against it) gives an exact p-value.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mcp_interp.core.circuits.edge_graph import Graph
from mcp_interp.errors import InputError

POOL_FACTOR = 4  # the candidate pool of a k-circuit: the top POOL_FACTOR · k items by the same ranking
RANK_BY = ("abs", "signed")
GRANULARITIES = ("edge", "node")


@dataclass(frozen=True)
class Ranking:
    """Items (edges or writer nodes) best first, and how a prefix of them becomes a circuit's edges."""

    granularity: str
    items: list[tuple[int, int]] | list[int]  # edges (writer, reader) or writer indices
    graph: Graph

    def circuit(self, chosen: Sequence[tuple[int, int]] | Sequence[int]) -> set[tuple[int, int]]:
        """The edges of a circuit made of ``chosen`` items."""
        if self.granularity == "edge":
            return set(chosen)  # type: ignore[arg-type]
        return node_circuit(self.graph, chosen)  # type: ignore[arg-type]

    def top(self, k: int) -> set[tuple[int, int]]:
        return self.circuit(self.items[:k])

    def pool(self, k: int) -> list[tuple[int, int]] | list[int]:
        """The candidates a random k-circuit is drawn from: the top POOL_FACTOR · k items (at least k)."""
        return self.items[: max(k, min(len(self.items), POOL_FACTOR * k))]

    def random_circuits(self, k: int, count: int, seed: int) -> list[set[tuple[int, int]]]:
        """``count`` random circuits of k items from the pool (seeded; each a uniform k-subset)."""
        generator = random.Random(seed)
        pool = self.pool(k)
        return [self.circuit(generator.sample(pool, k)) for _ in range(count)]  # type: ignore[arg-type]


def check_choice(granularity: str, rank_by: str) -> None:
    if granularity not in GRANULARITIES:
        raise InputError(f"`granularity` must be 'edge' or 'node', got {granularity!r}.")
    if rank_by not in RANK_BY:
        raise InputError(f"`rank_by` must be 'abs' (|score|) or 'signed' (score, largest first), got {rank_by!r}.")


def rank(graph: Graph, scores: torch.Tensor, granularity: str, rank_by: str) -> Ranking:
    """Edges by their score, or writers (heads, MLPs; not the embeddings) by their summed edge scores."""
    check_choice(granularity, rank_by)

    def key(value: float) -> float:
        return -abs(value) if rank_by == "abs" else -value

    if granularity == "edge":
        return Ranking("edge", sorted(graph.edges, key=lambda e: key(float(scores[e]))), graph)
    totals = scores.sum(dim=1)
    writers = sorted(range(1, len(graph.writers)), key=lambda w: key(float(totals[w])))
    return Ranking("node", writers, graph)


def node_circuit(graph: Graph, writers: Sequence[int]) -> set[tuple[int, int]]:
    """Every edge out of the embeddings (writer 0) or out of one of ``writers``."""
    kept = {0, *writers}
    return {(w, r) for w, r in graph.edges if w in kept}


def held_out_split(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Pairs to select a circuit on and pairs to evaluate it on (seeded, disjoint): ``fraction`` of the n pairs,
    rounded, at least one on each side. ``fraction == 0``: every pair selects and nothing is held out."""
    if not 0 <= fraction < 1:
        raise InputError(f"`held_out` is the fraction of pairs held out for evaluation, in [0, 1), got {fraction!r}.")
    if fraction == 0:
        return list(range(n)), []
    held = round(fraction * n)
    if n < 2 or not 1 <= held <= n - 1:
        raise InputError(
            f"`held_out` = {fraction} of {n} pairs leaves no pair on one side: give at least 2 pairs and a fraction "
            "that holds out at least one and keeps at least one (0.5 is usual)."
        )
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return sorted(order[held:]), sorted(order[:held])
