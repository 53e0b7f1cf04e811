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
ranking inside the pool carries no information" the chosen circuit is one more random k-subset; the draws never
repeat it (a redraw would be a tie), so the sequential rank test (alternative "greater": draws ≥ real count against
it) is exact when the ranking was made on other pairs than those it is scored on — on the same pairs the circuit was
chosen for its score there, and the p is post-selection.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import ClassVar, Generic, TypeVar

import torch

from mcp_interp.core.circuits.edge_graph import Graph
from mcp_interp.core.engine.numbers import stats
from mcp_interp.errors import InputError, require_choice
from mcp_interp.schemas.common import Granularity, RankBy

POOL_FACTOR = 4  # the candidate pool of a k-circuit: the top POOL_FACTOR · k items by the same ranking
Edge = tuple[int, int]  # (writer index, reader index)
Item = TypeVar("Item", Edge, int)  # what a ranking orders: edges, or writer indices (nodes)


@dataclass(frozen=True)
class Ranking(ABC, Generic[Item]):
    """Items (edges or writer nodes) best first, and how a prefix of them becomes a circuit's edges."""

    granularity: ClassVar[Granularity]
    items: list[Item]
    graph: Graph

    @abstractmethod
    def circuit(self, chosen: Sequence[Item]) -> set[Edge]:
        """The edges of a circuit made of ``chosen`` items."""

    def top(self, k: int) -> set[Edge]:
        return self.circuit(self.items[:k])

    def pool(self, k: int) -> list[Item]:
        """The candidates a random k-circuit is drawn from: the top POOL_FACTOR · k items (at least k)."""
        return self.items[: max(k, min(len(self.items), POOL_FACTOR * k))]

    def random_circuits(self, k: int, count: int, seed: int) -> list[set[Edge]]:
        """``count`` random circuits of k items from the pool (seeded; each a uniform k-subset)."""
        return list(islice(self.draw_circuits(k, seed), count))

    def draw_circuits(self, k: int, seed: int) -> Iterator[set[Edge]]:
        """Random circuits of k items from the pool, one after another for as long as they are wanted (the same
        seeded sequence as ``random_circuits``: its first n are this iterator's first n) — never the top k itself,
        never the same set twice, all of them in a random order when there are fewer than ``stats.ENUMERATE_BELOW``
        (``stats.DistinctSets``; ``other_circuits`` counts them)."""
        pool = self.pool(k)
        sets = stats.DistinctSets([stats.Slot(tuple(range(len(pool))), tuple(range(k)))], seed)
        while chosen := sets.take(1):
            yield self.circuit([pool[i] for i in chosen[0][0]])

    def other_circuits(self, k: int) -> int:
        """How many distinct k-subsets of the pool differ from the top k: C(pool, k) − 1."""
        return math.comb(len(self.pool(k)), k) - 1


class EdgeRanking(Ranking[Edge]):
    """Edges (writer, reader), best first; a circuit is the chosen edges."""

    granularity = "edge"

    def circuit(self, chosen: Sequence[Edge]) -> set[Edge]:
        return set(chosen)


class NodeRanking(Ranking[int]):
    """Writers (heads and MLPs; not the embeddings), best first; a circuit is every edge out of them."""

    granularity = "node"

    def circuit(self, chosen: Sequence[int]) -> set[Edge]:
        return node_circuit(self.graph, chosen)


def check_choice(granularity: Granularity, rank_by: RankBy) -> None:
    require_choice("granularity", granularity, Granularity)
    require_choice("rank_by", rank_by, RankBy, " 'abs' ranks by |score|, 'signed' by score, largest first.")


def rank(graph: Graph, scores: torch.Tensor, granularity: Granularity, rank_by: RankBy) -> EdgeRanking | NodeRanking:
    """Edges by their score, or writers (heads, MLPs; not the embeddings) by their summed edge scores."""
    check_choice(granularity, rank_by)

    def key(value: float) -> float:
        return -abs(value) if rank_by == "abs" else -value

    if granularity == "edge":
        return EdgeRanking(sorted(graph.edges, key=lambda e: key(float(scores[e]))), graph)
    totals = scores.sum(dim=1)
    writers = sorted(range(1, len(graph.writers)), key=lambda w: key(float(totals[w])))
    return NodeRanking(writers, graph)


def node_circuit(graph: Graph, writers: Sequence[int]) -> set[Edge]:
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
