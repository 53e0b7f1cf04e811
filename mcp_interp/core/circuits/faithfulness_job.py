"""The measurements behind ``circuit_faithfulness`` (a circuit's exact faithfulness, judged against random
circuits of the same size, and for top-k circuits its curve against k) and ``find_circuit``."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from mcp_interp.core.circuits.attribution import EdgeAttribution, EdgeScores, graph_of
from mcp_interp.core.circuits.faithfulness import Ablator
from mcp_interp.core.circuits.graph import Graph
from mcp_interp.core.circuits.job import edge_score
from mcp_interp.core.engine import metrics
from mcp_interp.core.engine.bridge import edge_hooks
from mcp_interp.core.engine.capabilities import require
from mcp_interp.core.engine.jobs import Job
from mcp_interp.core.engine.pairs import Pairs, prepare_pairs
from mcp_interp.core.engine.scores import TOP_WITH_EXAMPLES, finite
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.circuits import (
    CircuitFaithfulnessMeasurement,
    CurvePoint,
    FindCircuitMeasurement,
    SearchStep,
)

CURVE = (10, 25, 50, 100, 200)
MAX_RANDOM = 20
MAX_RETURNED_EDGES = 2000


def circuit_from_names(graph: Graph, edges: Sequence[Any]) -> set[tuple[int, int]]:
    """Edge indices from ``{writer, reader}`` names; unknown names and non-edges are errors that say why."""
    writers = {str(w): i for i, w in enumerate(graph.writers)}
    readers = {str(r): i for i, r in enumerate(graph.readers)}
    existing = set(graph.edges)
    circuit = set()
    for edge in edges:
        writer, reader = (edge.writer, edge.reader) if hasattr(edge, "writer") else (edge["writer"], edge["reader"])
        if writer not in writers:
            raise InputError(f"Unknown writer {writer!r}: writers are 'embed', heads 'L5H1' and MLPs 'L5MLP'.")
        if reader not in readers:
            raise InputError(
                f"Unknown reader {reader!r}: readers are 'L5H1.q', key/value groups 'L5KV0.k' / 'L5KV0.v', "
                "'L5MLP.in' and 'logits' (edge_attribution lists them)."
            )
        pair = (writers[writer], readers[reader])
        if pair not in existing:
            raise InputError(f"There is no edge {writer} → {reader}: a writer only feeds readers downstream of it.")
        circuit.add(pair)
    return circuit


def check_random_circuits(count: int) -> None:
    if not 5 <= count <= MAX_RANDOM:
        raise InputError(f"`random_circuits` must be from 5 to {MAX_RANDOM}: fewer cannot judge a number.")


def ranked_edges(model: LoadedModel, pairs: Pairs) -> Iterator[str | tuple[EdgeScores, list[tuple[int, int]]]]:
    """Edge attribution's steps, then (its scores, the edges sorted by |score|)."""
    attribution = EdgeAttribution(
        bridge=model.bridge, clean=pairs.clean, corrupt=pairs.corrupt, metric=pairs.readout.from_logits
    )
    yield from attribution.steps()
    assert attribution.result is not None
    scores = attribution.result.scores
    yield attribution.result, sorted(attribution.result.graph.edges, key=lambda e: -abs(float(scores[e])))


def _mean(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None]
    return sum(finite) / len(finite) if finite else None


@dataclass(kw_only=True)
class CircuitFaithfulnessJob(Job[CircuitFaithfulnessMeasurement]):
    model: LoadedModel
    clean_prompts: Sequence[str]
    corrupt_prompts: Sequence[str]
    correct: Any
    incorrect: Any
    edges: Sequence[Any] | None = None
    top_k: int | None = None
    ablation: str = "corrupt"
    random_circuits: int = 5
    seed: int = 0
    result: CircuitFaithfulnessMeasurement | None = field(default=None, init=False)

    def total_steps(self) -> int:
        sizes = len(self._sizes(10**9)) if self.top_k is not None else 1
        return 3 + sizes

    def _sizes(self, total: int) -> list[int]:
        assert self.top_k is not None
        return sorted({min(k, total) for k in (*CURVE, self.top_k)})

    def steps(self) -> Iterator[str]:
        require(self.model.bridge, "circuit_faithfulness")
        if (self.edges is None) == (self.top_k is None):
            raise InputError("Pass either `edges` (a circuit) or `top_k` (the top k edges by attribution), not both.")
        if self.top_k is not None and self.top_k < 0:
            raise InputError("`top_k` must be ≥ 0 (0 is the empty circuit).")
        check_random_circuits(self.random_circuits)
        pairs = prepare_pairs(self.model, self.clean_prompts, self.corrupt_prompts, self.correct, self.incorrect)
        graph = graph_of(self.model.bridge)
        ranked: list[tuple[int, int]] = []
        if self.top_k is not None:
            for step in ranked_edges(self.model, pairs):
                if isinstance(step, str):
                    yield step
                else:
                    ranked = step[1]
            circuit = set(ranked[: self.top_k])
        else:
            assert self.edges is not None
            circuit = circuit_from_names(graph, self.edges)
        generator = random.Random(self.seed)
        with edge_hooks(self.model.bridge):
            ablator = Ablator(self.model.bridge, graph, pairs, self.ablation)
            fraction = ablator.recovered(ablator.run(circuit))
            baseline = ablator.random_fractions(len(circuit), generator, self.random_circuits)
            yield f"circuit of {len(circuit)} edges and {self.random_circuits} random ones"
            curve = []
            if self.top_k is not None:
                for k in self._sizes(len(graph.edges)):
                    if k == len(circuit):
                        value, randoms = fraction.value, baseline
                    else:
                        value = ablator.recovered(ablator.run(set(ranked[:k]))).value
                        randoms = ablator.random_fractions(k, generator, self.random_circuits)
                    curve.append(CurvePoint(k=k, faithfulness=finite(value), random_mean=_mean(randoms)))
                    yield f"curve: k = {k}"
        notes = [
            f"Exact: {len(graph.edges) - len(circuit)} of {len(graph.edges)} edges ablated ({self.ablation}) in real "
            "forwards; compare the faithfulness with the random circuits of the same size before citing it."
        ]
        if abs(float((ablator.clean_m - ablator.corrupt_m).mean())) < 0.5:
            notes.append("The clean−corrupt gap is small (< 0.5): fractions of it are unstable.")
        self.result = CircuitFaithfulnessMeasurement(
            ablation=self.ablation,  # type: ignore[arg-type]
            n_edges=len(circuit),
            total_edges=len(graph.edges),
            clean_logit_diff=metrics.score_of(ablator.clean_m),
            corrupt_logit_diff=metrics.score_of(ablator.corrupt_m),
            faithfulness=fraction,
            random_baseline=baseline,
            random_mean=_mean(baseline),
            curve=curve,
            notes=notes,
        )


@dataclass(kw_only=True)
class FindCircuitJob(Job[FindCircuitMeasurement]):
    """Edge attribution, then the smallest top-k circuit whose exact faithfulness reaches ``target``, by
    bisection over k (each step one exact ablated forward). Bisection assumes faithfulness grows with k;
    ``search`` lists every measured k so a reader can see where it did not."""

    model: LoadedModel
    clean_prompts: Sequence[str]
    corrupt_prompts: Sequence[str]
    correct: Any
    incorrect: Any
    target: float = 0.8
    ablation: str = "corrupt"
    random_circuits: int = 5
    seed: int = 0
    result: FindCircuitMeasurement | None = field(default=None, init=False)
    scores: EdgeScores | None = field(default=None, init=False)

    def total_steps(self) -> int:
        return 3 + 18 + 1

    def steps(self) -> Iterator[str]:
        require(self.model.bridge, "find_circuit")
        if not 0 < self.target <= 1:
            raise InputError(f"`target` is a recovered fraction in (0, 1], got {self.target!r}; 0.8 is usual.")
        check_random_circuits(self.random_circuits)
        pairs = prepare_pairs(self.model, self.clean_prompts, self.corrupt_prompts, self.correct, self.incorrect)
        ranked: list[tuple[int, int]] = []
        for step in ranked_edges(self.model, pairs):
            if isinstance(step, str):
                yield step
            else:
                self.scores, ranked = step
        assert self.scores is not None
        graph = self.scores.graph
        with edge_hooks(self.model.bridge):
            ablator = Ablator(self.model.bridge, graph, pairs, self.ablation)
            low, high = 0, len(ranked)  # the full graph recovers 1 ≥ target by construction
            search: list[SearchStep] = []
            best = None
            while high - low > 1:
                middle = (low + high) // 2
                fraction = ablator.recovered(ablator.run(set(ranked[:middle])))
                search.append(SearchStep(k=middle, faithfulness=finite(fraction.value)))
                if fraction.value >= self.target:
                    high, best = middle, fraction
                else:
                    low = middle
                yield f"bisection: k = {middle}, faithfulness {fraction.value:+.3f}"
            if best is None:
                best = ablator.recovered(ablator.run(set(ranked[:high])))
            baseline = ablator.random_fractions(high, random.Random(self.seed), self.random_circuits)
            yield f"{self.random_circuits} random circuits of {high} edges"
        circuit = ranked[:high]
        notes = [
            f"The smallest top-k circuit reaching faithfulness {self.target} has {high} of {len(ranked)} edges "
            "(bisection over k, each step exact). Bisection assumes faithfulness grows with k: check `search`.",
        ]
        if len(circuit) > MAX_RETURNED_EDGES:
            notes.append(f"Only the top {MAX_RETURNED_EDGES} of the circuit's {len(circuit)} edges are listed.")
        self.result = FindCircuitMeasurement(
            target=self.target,
            ablation=self.ablation,  # type: ignore[arg-type]
            n_edges=len(circuit),
            total_edges=len(ranked),
            clean_logit_diff=metrics.score_of(ablator.clean_m),
            corrupt_logit_diff=metrics.score_of(ablator.corrupt_m),
            edges=[
                edge_score(self.scores, w, r, rank < TOP_WITH_EXAMPLES)
                for rank, (w, r) in enumerate(circuit[:MAX_RETURNED_EDGES])
            ],
            faithfulness=best,
            random_baseline=baseline,
            random_mean=_mean(baseline),
            search=search,
            notes=notes,
        )
