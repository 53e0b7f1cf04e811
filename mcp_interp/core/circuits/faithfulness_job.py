"""The measurements behind ``circuit_faithfulness`` (a circuit's exact faithfulness, judged against random
circuits of the same size, and for top-k circuits its curve against k) and ``find_circuit``."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mcp_interp.core import metrics
from mcp_interp.core.bridge import edge_hooks
from mcp_interp.core.circuits.attribution import EdgeAttribution, EdgeScores, graph_of
from mcp_interp.core.circuits.faithfulness import ablated_metric, replacement_values
from mcp_interp.core.circuits.graph import Graph
from mcp_interp.core.jobs import Job
from mcp_interp.core.patching import LogitDiffReadout
from mcp_interp.core.tokens import encode, resolve_answers, validate_pairs
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.circuits import (
    CircuitFaithfulnessMeasurement,
    CurvePoint,
    EdgeScore,
    FindCircuitMeasurement,
    SearchStep,
)

CURVE = (10, 25, 50, 100, 200)
MAX_RANDOM = 20


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


@dataclass
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
        return 2 + sizes * (1 + self.random_circuits)

    def _sizes(self, total: int) -> list[int]:
        assert self.top_k is not None
        return sorted({min(k, total) for k in (*CURVE, self.top_k)})

    def steps(self) -> Iterator[str]:
        if (self.edges is None) == (self.top_k is None):
            raise InputError("Pass either `edges` (a circuit) or `top_k` (the top k edges by attribution), not both.")
        if self.top_k is not None and self.top_k < 0:
            raise InputError("`top_k` must be ≥ 0 (0 is the empty circuit).")
        if not 5 <= self.random_circuits <= MAX_RANDOM:
            raise InputError(f"`random_circuits` must be from 5 to {MAX_RANDOM}: fewer cannot judge a number.")
        tokenizer, bridge = self.model.tokenizer, self.model.bridge
        validate_pairs(tokenizer, self.clean_prompts, self.corrupt_prompts, ("clean_prompts", "corrupt_prompts"))
        clean = encode(tokenizer, self.clean_prompts, self.model.device)
        corrupt = encode(tokenizer, self.corrupt_prompts, self.model.device)
        n = len(clean.texts)
        readout = LogitDiffReadout(
            bridge,
            torch.tensor(resolve_answers(tokenizer, self.correct, n, "correct")),
            torch.tensor(resolve_answers(tokenizer, self.incorrect, n, "incorrect")),
        )
        graph = graph_of(bridge)
        ranked: list[tuple[int, int]] = []
        if self.top_k is not None:
            attribution = EdgeAttribution(bridge, clean, corrupt, readout.from_logits)
            yield from attribution.steps()
            assert attribution.result is not None
            scores = attribution.result.scores
            ranked = sorted(graph.edges, key=lambda e: -abs(float(scores[e])))
            circuit = set(ranked[: self.top_k])
        else:
            assert self.edges is not None
            circuit = circuit_from_names(graph, self.edges)
        generator = random.Random(self.seed)
        with edge_hooks(bridge):
            replacement = replacement_values(bridge, graph, clean, corrupt, self.ablation)
            rows = torch.arange(n)
            with torch.no_grad():
                clean_m = readout.from_logits(bridge(clean.input_ids)[rows, clean.answer_positions], rows)
                corrupt_m = readout.from_logits(bridge(corrupt.input_ids)[rows, corrupt.answer_positions], rows)

            def measure(edges: set[tuple[int, int]]) -> torch.Tensor:
                return ablated_metric(bridge, graph, clean, edges, replacement, readout.from_logits)

            def randoms(size: int) -> list[torch.Tensor]:
                return [measure(set(generator.sample(graph.edges, size))) for _ in range(self.random_circuits)]

            main = measure(circuit)
            baseline = randoms(len(circuit))
            yield f"circuit of {len(circuit)} edges and {self.random_circuits} random ones"
            curve = []
            if self.top_k is not None:
                for k in self._sizes(len(graph.edges)):
                    if k == len(circuit):
                        value, rand = main, baseline
                    else:
                        value, rand = measure(set(ranked[:k])), randoms(k)
                    curve.append(self._point(k, value, rand, clean_m, corrupt_m))
                    yield f"curve: k = {k}"
        fraction = metrics.recovered_fraction(main, clean_m, corrupt_m)
        random_values = [_finite(metrics.recovered_fraction(r, clean_m, corrupt_m).value) for r in baseline]
        finite = [v for v in random_values if v is not None]
        notes = [
            f"Exact: {len(graph.edges) - len(circuit)} of {len(graph.edges)} edges ablated ({self.ablation}) in real "
            "forwards; compare the faithfulness with the random circuits of the same size before citing it."
        ]
        if abs(float((clean_m - corrupt_m).mean())) < 0.5:
            notes.append("The clean−corrupt gap is small (< 0.5): fractions of it are unstable.")
        self.result = CircuitFaithfulnessMeasurement(
            ablation=self.ablation,  # type: ignore[arg-type]
            n_edges=len(circuit),
            total_edges=len(graph.edges),
            clean_logit_diff=metrics.score_of(clean_m),
            corrupt_logit_diff=metrics.score_of(corrupt_m),
            faithfulness=fraction,
            random_baseline=random_values,
            random_mean=sum(finite) / len(finite) if finite else None,
            curve=curve,
            notes=notes,
        )

    @staticmethod
    def _point(
        k: int, value: torch.Tensor, rand: list[torch.Tensor], clean_m: torch.Tensor, corrupt_m: torch.Tensor
    ) -> CurvePoint:
        randoms = [_finite(metrics.recovered_fraction(r, clean_m, corrupt_m).value) for r in rand]
        finite = [v for v in randoms if v is not None]
        return CurvePoint(
            k=k,
            faithfulness=_finite(metrics.recovered_fraction(value, clean_m, corrupt_m).value),
            random_mean=sum(finite) / len(finite) if finite else None,
        )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


MAX_RETURNED_EDGES = 2000


@dataclass
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
        if not 0 < self.target <= 1:
            raise InputError(f"`target` is a recovered fraction in (0, 1], got {self.target!r}; 0.8 is usual.")
        if not 5 <= self.random_circuits <= MAX_RANDOM:
            raise InputError(f"`random_circuits` must be from 5 to {MAX_RANDOM}: fewer cannot judge a number.")
        tokenizer, bridge = self.model.tokenizer, self.model.bridge
        validate_pairs(tokenizer, self.clean_prompts, self.corrupt_prompts, ("clean_prompts", "corrupt_prompts"))
        clean = encode(tokenizer, self.clean_prompts, self.model.device)
        corrupt = encode(tokenizer, self.corrupt_prompts, self.model.device)
        n = len(clean.texts)
        readout = LogitDiffReadout(
            bridge,
            torch.tensor(resolve_answers(tokenizer, self.correct, n, "correct")),
            torch.tensor(resolve_answers(tokenizer, self.incorrect, n, "incorrect")),
        )
        attribution = EdgeAttribution(bridge, clean, corrupt, readout.from_logits)
        yield from attribution.steps()
        assert attribution.result is not None
        self.scores = attribution.result
        graph, scores = attribution.result.graph, attribution.result.scores
        ranked = sorted(graph.edges, key=lambda e: -abs(float(scores[e])))
        with edge_hooks(bridge):
            replacement = replacement_values(bridge, graph, clean, corrupt, self.ablation)
            rows = torch.arange(n)
            with torch.no_grad():
                clean_m = readout.from_logits(bridge(clean.input_ids)[rows, clean.answer_positions], rows)
                corrupt_m = readout.from_logits(bridge(corrupt.input_ids)[rows, corrupt.answer_positions], rows)

            def measure(k: int) -> tuple[torch.Tensor, float]:
                values = ablated_metric(bridge, graph, clean, set(ranked[:k]), replacement, readout.from_logits)
                return values, metrics.recovered_fraction(values, clean_m, corrupt_m).value

            low, high = 0, len(ranked)  # the full graph recovers 1 ≥ target by construction
            search: list[SearchStep] = []
            best = None
            while high - low > 1:
                middle = (low + high) // 2
                values, fraction = measure(middle)
                search.append(SearchStep(k=middle, faithfulness=_finite(fraction)))
                if fraction >= self.target:
                    high, best = middle, values
                else:
                    low = middle
                yield f"bisection: k = {middle}, faithfulness {fraction:+.3f}"
            if best is None:
                best, _ = measure(high)
            generator = random.Random(self.seed)
            baseline = [
                _finite(
                    metrics.recovered_fraction(
                        ablated_metric(bridge, graph, clean, set(generator.sample(graph.edges, high)), replacement,
                                       readout.from_logits), clean_m, corrupt_m).value
                )
                for _ in range(self.random_circuits)
            ]  # fmt: skip
            yield f"{self.random_circuits} random circuits of {high} edges"
        finite = [v for v in baseline if v is not None]
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
            clean_logit_diff=metrics.score_of(clean_m),
            corrupt_logit_diff=metrics.score_of(corrupt_m),
            edges=[
                EdgeScore(writer=str(graph.writers[w]), reader=str(graph.readers[r]), score=float(scores[w, r]))
                for w, r in circuit[:MAX_RETURNED_EDGES]
            ],
            faithfulness=metrics.recovered_fraction(best, clean_m, corrupt_m),
            random_baseline=baseline,
            random_mean=sum(finite) / len(finite) if finite else None,
            search=search,
            notes=notes,
        )
