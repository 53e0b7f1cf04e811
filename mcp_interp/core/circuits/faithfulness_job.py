"""The measurements behind ``circuit_faithfulness`` (a circuit's exact faithfulness, judged against random circuits
that can match it, and for top-k circuits its curve against k) and ``find_circuit`` (the smallest top-k circuit
reaching a target, at edge or node granularity, selected on some pairs and evaluated on others).

Numbers here are recovered fractions of the clean−corrupt gap, (m_circuit − m_corrupt) / (m_clean − m_corrupt):
1 = the circuit alone reproduces the clean behaviour, 0 = the corrupt run's. ``empty_circuit`` is the fraction with
every edge ablated: 0 by construction with ``ablation='corrupt'``, not with ``'mean'`` (the mean-ablated model is
not the corrupt run), so it is reported for every result.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import torch

from mcp_interp.core.circuits.attribution import EdgeAttribution, EdgeScores, graph_of
from mcp_interp.core.circuits.edge_graph import Graph
from mcp_interp.core.circuits.faithfulness import CHUNK_SECONDS, Ablator, untested_note
from mcp_interp.core.circuits.job import edge_score
from mcp_interp.core.circuits.selection import EdgeRanking, NodeRanking, check_choice, held_out_split, rank
from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import PAUSE, Job, Pause, Progress, per_step
from mcp_interp.core.engine.numbers import metrics, stats
from mcp_interp.core.engine.numbers.scores import TOP_WITH_EXAMPLES, finite, gap_is_small
from mcp_interp.core.engine.patching.pairs import Pairs, pair_answer_kind, subset_pairs
from mcp_interp.errors import InputError
from mcp_interp.schemas.circuits import (
    CircuitAblation,
    CircuitBaseline,
    CircuitFaithfulnessMeasurement,
    CurvePoint,
    FindCircuitMeasurement,
    NodeScore,
    SearchStep,
)
from mcp_interp.schemas.common import Granularity, PairMetric, RankBy

CURVE = (10, 25, 50, 100, 200)
ATTRIBUTION_STEPS = 3  # edge attribution's progress messages (clean run, corrupt run, one gradient)

# The most random circuits a baseline draws by default: 100, not the 200 of cheaper baselines, because each draw is an
# exact edge-ablated run over every pair (≈ 5 s on SmolLM2's 8 IOI pairs on a 2-core CPU): p can reach 1/101.
CIRCUIT_DRAWS = 100
PARTIAL_EDGES = 500  # a cancelled find_circuit names the edges of its best circuit so far up to this many


def circuit_from_names(graph: Graph, edges: Sequence[Any]) -> set[tuple[int, int]]:
    """Edge indices from ``{writer, reader}`` names (or ``[writer, reader]``); unknown names and non-edges are errors
    that say why."""
    return set(edges_from_names(graph, edges))


def edges_from_names(graph: Graph, edges: Sequence[Any]) -> list[tuple[int, int]]:
    """``circuit_from_names`` in the order given (a stored ranking's order)."""
    writers = {str(w): i for i, w in enumerate(graph.writers)}
    readers = {str(r): i for i, r in enumerate(graph.readers)}
    existing = set(graph.edges)
    circuit = []
    for edge in edges:
        if hasattr(edge, "writer"):
            writer, reader = edge.writer, edge.reader
        elif isinstance(edge, list | tuple) and len(edge) == 2:
            writer, reader = edge
        else:
            writer, reader = edge["writer"], edge["reader"]
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
        circuit.append(pair)
    return circuit


@dataclass(frozen=True)
class StoredChoice:
    """How a stored circuit (a ``circuit://`` from find_circuit) was chosen, so that re-evaluating it judges it as it
    was found: its granularity, its k (edges or nodes) and its candidate pool in ranked order, by name (node names
    'L5H1' / 'L5MLP', or [writer, reader] edges). The circuit is the pool's first k items."""

    granularity: Granularity
    k: int
    pool: list[Any]

    def ranking(self, graph: Graph, circuit: set[tuple[int, int]]) -> EdgeRanking | NodeRanking:
        """The stored pool as a ranking of this graph, checked to choose ``circuit`` as its top k."""
        check_choice(self.granularity, "abs")
        ranking: EdgeRanking | NodeRanking
        if self.granularity == "node":
            writers = {str(w): i for i, w in enumerate(graph.writers)}
            unknown = [name for name in self.pool if name not in writers or writers[name] == 0]
            if unknown:
                raise InputError(f"The stored circuit's pool names {unknown[0]!r}, not a head or MLP of this model.")
            ranking = NodeRanking([writers[name] for name in self.pool], graph)
        else:
            ranking = EdgeRanking(edges_from_names(graph, self.pool), graph)
        if not 0 <= self.k <= len(ranking.items) or ranking.top(self.k) != circuit:
            raise InputError(
                "The stored circuit's edges are not the top k of its stored pool: the circuit:// is damaged."
            )
        return ranking


def pool_names(graph: Graph, items: Sequence[Any]) -> list[Any]:
    """A ranking's items by name, in order: node names, or [writer, reader] edges."""
    return [
        str(graph.writers[i]) if isinstance(i, int) else [str(graph.writers[i[0]]), str(graph.readers[i[1]])]
        for i in items
    ]


def edge_names(graph: Graph, circuit: set[tuple[int, int]]) -> list[list[str]]:
    """A circuit's edges by name, [writer, reader], in the graph's order (what a ``circuit://`` stores)."""
    return [[str(graph.writers[w]), str(graph.readers[r])] for w, r in sorted(circuit)]


def attribute(model: LoadedModel, pairs: Pairs) -> Iterator[str | EdgeScores]:
    """Edge attribution's progress messages, then its scores."""
    attribution = EdgeAttribution(
        backend=model.backend, clean=pairs.clean, corrupt=pairs.corrupt, metric=pairs.readout.from_logits
    )
    yield from attribution.steps()
    assert attribution.result is not None
    yield attribution.result


@dataclass
class Pace:
    """Where a job stands for its in-step progress: ``base`` steps done before the stage, ``total`` steps in all; a
    message is due once ``CHUNK_SECONDS`` passed since the last one (so a quick run yields nothing extra)."""

    base: float
    total: float
    last: float = field(default_factory=time.perf_counter)

    def due(self) -> bool:
        return time.perf_counter() - self.last >= CHUNK_SECONDS

    def reset(self) -> None:
        self.last = time.perf_counter()

    def at(self, done: float, message: str) -> Progress:
        self.reset()
        return Progress(message, self.base + done, self.total)


def measured(
    ablator: Ablator, circuit: set[tuple[int, int]], pace: Pace, done: float, what: str
) -> Generator[Progress, None, torch.Tensor]:
    """``ablator.run_chunked(circuit)`` saying after each chunk how far it is (``done`` steps before it)."""
    runs = ablator.run_chunked(circuit)
    while True:
        try:
            pairs, n = next(runs)
        except StopIteration as finished:
            pace.reset()
            values: torch.Tensor = finished.value
            return values
        yield pace.at(done + pairs / n, f"{what}: pairs {pairs}/{n}")


def baseline_batches(most: int) -> int:
    """The most progress steps ``judged`` yields: one per batch of draws."""
    return -(-most // stats.BATCH)


def judged(
    ablator: Ablator,
    ranking: EdgeRanking | NodeRanking,
    size: int,
    real: float,
    most: int,
    seed: int,
    post_selection: bool = False,
    pace: Pace | None = None,
    drawn: list[float] | None = None,
) -> Generator[str | Progress | Pause, None, CircuitBaseline]:
    """Random circuits of ``size`` items from the ranking's candidate pool, never the circuit itself, drawn in batches
    (one progress step each, so a job stops between batches) until ``stats.STOP_AFTER`` of them score at least the
    real one or ``most`` (at most every other circuit the pool holds) are drawn; the real one's sequential rank test
    among them (Besag–Clifford, ``stats.sequential_rank_test``). ``post_selection``: the circuit was chosen on the
    pairs it is scored on, so its p is reported without a verdict. With ``pace``, a batch that takes longer than
    ``CHUNK_SECONDS`` also says how far it is (``Progress``), draw by draw and chunk by chunk; ``drawn`` (when given)
    is filled as draws are made, for a cancelled job's ``partial``."""
    others = ranking.other_circuits(size)
    cap = min(most, others)
    floor = stats.rank_floor(most, others)
    pool = len(ranking.pool(size))
    unit = "edges" if ranking.granularity == "edge" else "nodes"
    what = f"random {size}-{unit[:-1]} circuits from the top {pool}"
    if cap < 1:
        test = stats.RankTest(real, (), 0, 1.0, "greater")
    else:
        stream = ranking.draw_circuits(size, seed)
        h, batch = min(stats.STOP_AFTER, cap), min(stats.BATCH, cap)
        values: list[float] = drawn if drawn is not None else []
        batches = 0
        while len(values) < cap and sum(v >= real for v in values) < h:
            wanted = min(batch, cap - len(values))
            for draw in range(wanted):
                runs = ablator.run_chunked(next(stream))
                while True:
                    try:
                        done, n = next(runs)
                    except StopIteration as finished:
                        values.append(ablator.recovered(finished.value).value)
                        break
                    if pace is not None:
                        yield pace.at(batches + (draw + done / n) / wanted, f"random circuits: draw "
                                      f"{len(values) + 1}, pairs {done}/{n}")  # fmt: skip
                if pace is not None and draw + 1 < wanted and pace.due():
                    message = f"random circuits: {len(values)} drawn (at most {cap})"
                    yield pace.at(batches + (draw + 1) / wanted, message)
                elif draw + 1 < wanted:
                    yield PAUSE  # others get the model between draws, not only between batches
            batches += 1
            if pace is not None:
                pace.reset()
            yield f"random circuits: {len(values)} drawn (at most {cap})"
        supply = iter(values)  # the engine's test replays the same draws batch by batch and applies its stopping rule
        test = stats.sequential_rank_test(
            real, lambda k: list(islice(supply, k)), "greater", h=h, n_max=cap, batch=batch
        )
    draws = list(test.draws)
    if post_selection:
        verdict = (
            f"post-selection p = {test.p_value:.3g} against {test.n} {what}, no verdict: the circuit was chosen on "
            f"the pairs it is scored on (with ≥ {MIN_HELD_OUT_PAIRS} pairs, hold some out: held_out > 0)"
        )
    else:
        verdict = "the circuit " + stats.versus_random("circuit_faithfulness", test, what, floor)
    return CircuitBaseline(
        draws=draws,
        mean=sum(draws) / len(draws) if draws else 0.0,
        draws_made=test.n,
        most_draws=most,
        at_least_as_good=test.at_least_as_extreme,
        p_value=test.p_value,
        p_floor=floor,
        pool_size=others,
        post_selection=post_selection,
        pool=pool,
        overlap=size / pool if pool else 0.0,
        verdict=verdict,
    )


MIN_HELD_OUT_PAIRS = 4  # pairs from which a selected circuit is scored on held-out pairs by default (half of them)


def held_out_fraction(held_out: float | None, n_pairs: int) -> float:
    """``held_out``, or by default 0.5 when there are at least ``MIN_HELD_OUT_PAIRS`` pairs (else 0: too few to split,
    and the p is post-selection). A circuit chosen and scored on the same pairs rejected a true null 8.8 % of the time
    at α = 0.05 (issue 41's audit); held out, within its interval of 0.05 (docs/calibration.md)."""
    if held_out is not None:
        return held_out
    return 0.5 if n_pairs >= MIN_HELD_OUT_PAIRS else 0.0


def overlap_note(baseline: CircuitBaseline, size: int, granularity: Granularity) -> list[str]:
    """When k is more than a quarter of the pool, the random circuits share most of the circuit's items (at k = pool
    every draw is the circuit itself): say that their verdict says little."""
    if not baseline.pool or size <= baseline.pool / 4:
        return []
    unit = "edges" if granularity == "edge" else "nodes"
    return [
        f"The random circuits take {size} of a pool of only {baseline.pool} {unit} (k/pool = {baseline.overlap:.2f} > "
        f"0.25; the pool is the top 4k, capped by the graph): each shares on average {size * size / baseline.pool:.1f} "
        f"of its {size} {unit} with the circuit (every one at k = pool), so the draws overlap the circuit heavily and "
        "the baseline says little either way."
    ]


def empty_note(ablation: str, faithfulness: float, empty: float) -> list[str]:
    if ablation != "mean" or abs(empty) < 1e-9 or abs(1 - empty) < 1e-9:
        return []
    return [
        f"With mean ablation the empty circuit scores {empty:+.3f}, not 0: the zero point is the corrupt run, not "
        f"the mean-ablated model. Measured from the empty circuit, (faithfulness − empty) / (1 − empty) = "
        f"{(faithfulness - empty) / (1 - empty):+.3f}."
    ]


@dataclass(kw_only=True)
class CircuitFaithfulnessJob(Job[CircuitFaithfulnessMeasurement]):
    """A circuit given by its edges (or a stored ``circuit://``'s), or the top k by attribution (with a curve), scored
    exactly and against random circuits from the candidate pool of its size."""

    model: LoadedModel
    clean_prompts: Sequence[str]
    corrupt_prompts: Sequence[str]
    correct: Any
    incorrect: Any
    metric: PairMetric = "logit_diff"
    edges: Sequence[Any] | None = None
    top_k: int | None = None
    granularity: Granularity = "edge"
    rank_by: RankBy = "abs"
    ablation: CircuitAblation = "corrupt"
    held_out: float | None = None  # default: 0.5 with top_k and ≥ 4 pairs (``held_out_fraction``), else 0
    random_circuits: int = CIRCUIT_DRAWS  # the most random circuits drawn (sequentially)
    seed: int = 0
    stored: StoredChoice | None = (
        None  # with ``edges`` from a circuit://: how it was chosen (its pool is the baseline's)
    )
    caller_notes: list[str] = field(default_factory=list)
    result: CircuitFaithfulnessMeasurement | None = field(default=None, init=False)
    so_far: dict[str, Any] = field(default_factory=dict, init=False)  # what is known so far (``partial``)
    drawn: list[float] = field(default_factory=list, init=False)

    def partial(self) -> dict[str, Any] | None:
        """What a cancelled run had measured: the circuit's faithfulness and the random circuits drawn so far."""
        if not self.so_far:
            return None
        return {**self.so_far, "random_drawn": len(self.drawn), "random_values": [round(v, 4) for v in self.drawn]}

    def total_steps(self) -> int:
        sizes = len(self._sizes(10**9)) if self.top_k is not None else 0
        batches = baseline_batches(self.random_circuits) if isinstance(self.random_circuits, int) else 1
        return ATTRIBUTION_STEPS + 2 + batches + sizes

    def _sizes(self, total: int) -> list[int]:
        assert self.top_k is not None
        return sorted({min(k, total) for k in (*CURVE, self.top_k)})

    def steps(self) -> Iterator[str | Progress | Pause]:
        require(self.model.backend, "circuit_faithfulness")
        if (self.edges is None) == (self.top_k is None):
            raise InputError(
                "Pass one of `edges`, `circuit` (a circuit:// from find_circuit) or `top_k` (the top k by attribution)."
            )
        if self.top_k is not None and self.top_k < 0:
            raise InputError("`top_k` must be ≥ 0 (0 is the empty circuit).")
        check_choice(self.granularity, self.rank_by)
        stats.check_most_draws(self.random_circuits, "random_circuits")
        if self.stored is not None and self.edges is None:
            raise InputError("A stored choice (granularity, k, pool) comes with the stored circuit's `edges`.")
        if self.edges is not None and self.held_out:
            raise InputError(
                "`held_out` splits the pairs into those a circuit is selected on and those it is evaluated on: it "
                "applies to `top_k`. A given circuit was not selected on these pairs; it is evaluated on all of them."
            )
        n = len(self.clean_prompts)
        share = held_out_fraction(self.held_out, n) if self.top_k is not None else (self.held_out or 0.0)
        selecting, evaluating = held_out_split(n, share, self.seed)
        pairs = self._pairs(selecting)
        evaluation = self._pairs(evaluating) if evaluating else pairs
        graph = graph_of(self.model.backend)
        ranking: EdgeRanking | NodeRanking
        granularity: Granularity
        if self.stored is not None:  # judged as find_circuit judged it: its granularity, k and pool, no attribution
            assert self.edges is not None
            circuit = circuit_from_names(graph, self.edges)
            ranking, size = self.stored.ranking(graph, circuit), self.stored.k
            granularity = self.stored.granularity
        else:
            scores: EdgeScores | None = None
            for step in attribute(self.model, pairs):
                if isinstance(step, str):
                    yield step
                else:
                    scores = step
            assert scores is not None
            ranking = rank(graph, scores.scores, self.granularity, self.rank_by)
            if self.top_k is not None:
                circuit, size = ranking.top(self.top_k), min(self.top_k, len(ranking.items))
                granularity = self.granularity
            else:
                assert self.edges is not None
                circuit = circuit_from_names(graph, self.edges)
                ranking = rank(graph, scores.scores, "edge", self.rank_by)  # a given circuit is a set of edges
                size, granularity = len(circuit), "edge"

        def exact() -> Generator[
            str | Progress | Pause, None, tuple[Ablator, Any, float, CircuitBaseline, list[CurvePoint]]
        ]:
            ablator = Ablator(self.model.backend, graph, evaluation, self.ablation)
            before = 0 if self.stored is not None else ATTRIBUTION_STEPS
            pace = Pace(before, self.total_steps())
            fraction = ablator.recovered((yield from measured(ablator, circuit, pace, 0, "the circuit")))
            self.so_far = {"n_edges": len(circuit), "faithfulness": finite(fraction.value)}
            empty = ablator.recovered((yield from measured(ablator, set(), pace, 0.5, "the empty circuit"))).value
            self.so_far["empty_circuit"] = finite(empty)
            yield f"circuit of {len(circuit)} edges and the empty one"
            chosen_here = self.top_k is not None and not evaluating  # ranked and scored on the same pairs
            pace = Pace(before + 1, self.total_steps())
            baseline = yield from judged(
                ablator, ranking, size, fraction.value, self.random_circuits, self.seed, chosen_here, pace, self.drawn
            )
            curve = []
            if self.top_k is not None:
                pace = Pace(before + 1 + baseline_batches(self.random_circuits), self.total_steps())
                for point, k in enumerate(self._sizes(len(ranking.items))):
                    runs = [ranking.top(k), *ranking.random_circuits(k, 5, self.seed)]
                    fractions = []
                    for n, run in enumerate(runs):  # six exact runs: say how far when they take long
                        values = yield from measured(ablator, run, pace, point + n / len(runs), f"curve: k = {k}")
                        fractions.append(ablator.recovered(values).value)
                        if n + 1 < len(runs) and pace.due():
                            yield pace.at(point + (n + 1) / len(runs), f"curve: k = {k}, run {n + 1}/{len(runs)}")
                        elif n + 1 < len(runs):
                            yield PAUSE
                    value, randoms = fractions[0], fractions[1:]
                    mean = sum(randoms) / len(randoms) if randoms else value  # k = pool: the circuit is the only one
                    curve.append(CurvePoint(k=k, faithfulness=finite(value), random_mean=mean))
                    yield f"curve: k = {k}"
            return ablator, fraction, empty, baseline, curve

        # Edge points entered per step (``per_step``): between steps the model is at rest for others' calls.
        ablator, fraction, empty, baseline, curve = yield from per_step(self.model.backend.edge_points, exact())
        yield "done"
        notes = [
            f"Exact: {len(graph.edges) - len(circuit)} of {len(graph.edges)} edges ablated ({self.ablation}) in real "
            f"forwards. {baseline.verdict}.",
            *self.caller_notes,
        ]
        if self.stored is not None:
            notes.append(
                f"A stored circuit of k = {size} {granularity}s: judged as find_circuit judged it, against random "
                f"{size}-{granularity} circuits from its stored pool of the top {baseline.pool} (ranked on the pairs "
                "it was found on)."
            )
        notes.extend(overlap_note(baseline, size, granularity))
        if evaluating:
            notes.append(
                f"Selected on {len(selecting)} pairs, evaluated on {len(evaluating)} held-out pairs (seed {self.seed})."
            )
        elif self.top_k is not None:
            notes.append(
                "The top-k edges were ranked and scored on the same pairs, so the p is post-selection and gives no "
                f"verdict: with ≥ {MIN_HELD_OUT_PAIRS} pairs, pass held_out > 0 (0.5 by default) to evaluate on pairs "
                "not used for the ranking."
            )
        notes.extend(empty_note(self.ablation, fraction.value, empty))
        notes.extend(small_gap_note(ablator))
        notes.extend(untested_note(ablator))
        notes.extend(ablator.pairs.notes)
        self.result = CircuitFaithfulnessMeasurement(
            answer_kind=pair_answer_kind(self.correct, self.incorrect),
            ablation=self.ablation,
            granularity=granularity,
            n_edges=len(circuit),
            total_edges=len(graph.edges),
            clean_logit_diff=metrics.score_of(ablator.clean_m),
            corrupt_logit_diff=metrics.score_of(ablator.corrupt_m),
            faithfulness=fraction,
            empty_circuit=empty,
            held_out_pairs=evaluating,
            baseline=baseline,
            curve=curve,
            notes=notes,
        )

    def _pairs(self, indices: Sequence[int]) -> Pairs:
        return subset_pairs(
            self.model, self.clean_prompts, self.corrupt_prompts, self.correct, self.incorrect, indices, self.metric
        )


def small_gap_note(ablator: Ablator) -> list[str]:
    gap = float((ablator.clean_m - ablator.corrupt_m).mean())
    if gap_is_small(ablator.pairs.metric, gap):
        return [f"The clean−corrupt gap of {ablator.pairs.metric} is small ({gap:+.3f}): fractions of it are unstable."]
    return []


@dataclass(kw_only=True)
class FindCircuitJob(Job[FindCircuitMeasurement]):
    """Edge attribution, then the smallest top-k circuit (k edges, or k nodes) whose exact faithfulness reaches
    ``target``, by bisection over k (each step one exact ablated forward), on the selection pairs; then its
    faithfulness on the held-out pairs and its rank among random circuits from its candidate pool. Bisection assumes
    faithfulness grows with k; ``search`` lists every measured k so a reader can see where it did not."""

    model: LoadedModel
    clean_prompts: Sequence[str]
    corrupt_prompts: Sequence[str]
    correct: Any
    incorrect: Any
    metric: PairMetric = "logit_diff"
    target: float = 0.8
    granularity: Granularity = "edge"
    rank_by: RankBy = "abs"
    ablation: CircuitAblation = "corrupt"
    held_out: float | None = None  # default: 0.5 with ≥ 4 pairs (``held_out_fraction``), else 0 (post-selection)
    random_circuits: int = CIRCUIT_DRAWS  # the most random circuits drawn (sequentially)
    seed: int = 0
    result: FindCircuitMeasurement | None = field(default=None, init=False)
    scores: EdgeScores | None = field(default=None, init=False)
    circuit: set[tuple[int, int]] | None = field(default=None, init=False)
    graph: Graph | None = field(default=None, init=False)
    choice: StoredChoice | None = field(default=None, init=False)  # what a circuit:// keeps to be judged again alike
    search: list[SearchStep] = field(default_factory=list, init=False)  # every k measured so far
    found: tuple[int, float | None] | None = field(default=None, init=False)  # smallest k reaching the target
    drawn: list[float] = field(default_factory=list, init=False)

    def partial(self) -> dict[str, Any] | None:
        """What a cancelled search had: every k measured, the smallest reaching the target with its faithfulness and
        (for up to ``PARTIAL_EDGES``) its edges, and the random circuits drawn so far."""
        if not self.search:
            return None
        out: dict[str, Any] = {
            "stage": "baseline" if self.circuit is not None else "bisection",
            "target": self.target,
            "search": [step.model_dump() for step in self.search],
            "best_k": None,
            "best_faithfulness": None,
        }
        if self.found is not None and self._ranking is not None and self.graph is not None:
            k, value = self.found
            edges = self._ranking.top(k)
            out.update(best_k=k, best_faithfulness=value, best_n_edges=len(edges))
            if len(edges) <= PARTIAL_EDGES:
                out["best_edges"] = edge_names(self.graph, edges)
        if self.drawn:
            out["random_drawn"] = len(self.drawn)
        return out

    _ranking: EdgeRanking | NodeRanking | None = field(default=None, init=False, repr=False)

    def total_steps(self) -> int:
        graph = self.graph or graph_of(self.model.backend)
        items = len(graph.edges) if self.granularity == "edge" else len(graph.writers) - 1
        bisection = max(0, (items - 1).bit_length())  # steps while high − low > 1, from (0, items)
        batches = baseline_batches(self.random_circuits) if isinstance(self.random_circuits, int) else 1
        return ATTRIBUTION_STEPS + bisection + batches + 1

    def steps(self) -> Iterator[str | Progress | Pause]:
        require(self.model.backend, "find_circuit")
        if not 0 < self.target <= 1:
            raise InputError(f"`target` is a recovered fraction in (0, 1], got {self.target!r}; 0.8 is usual.")
        check_choice(self.granularity, self.rank_by)
        stats.check_most_draws(self.random_circuits, "random_circuits")
        n = len(self.clean_prompts)
        selecting, evaluating = held_out_split(n, held_out_fraction(self.held_out, n), self.seed)
        pairs = self._pairs(selecting)
        for step in attribute(self.model, pairs):
            if isinstance(step, str):
                yield step
            else:
                self.scores = step
        assert self.scores is not None
        graph = self.graph = self.scores.graph
        ranking = self._ranking = rank(graph, self.scores.scores, self.granularity, self.rank_by)
        total = self.total_steps()

        def exact() -> Generator[str | Progress | Pause, None, tuple[int, Any, Any, float, CircuitBaseline, Ablator]]:
            ablator = Ablator(self.model.backend, graph, pairs, self.ablation)
            low, high = 0, len(ranking.items)  # every item = the full graph, which recovers 1 ≥ target
            search = self.search
            best = None
            pace = Pace(ATTRIBUTION_STEPS, total)
            while high - low > 1:
                middle = (low + high) // 2
                what = f"bisection: k = {middle}"
                values = yield from measured(ablator, ranking.top(middle), pace, len(search), what)
                fraction = ablator.recovered(values)
                search.append(SearchStep(k=middle, faithfulness=finite(fraction.value)))
                if fraction.value >= self.target:
                    high, best = middle, fraction
                    self.found = (middle, finite(fraction.value))
                else:
                    low = middle
                yield f"bisection: k = {middle}, faithfulness {fraction.value:+.3f}"
            circuit = self.circuit = ranking.top(high)
            self.choice = StoredChoice(self.granularity, high, pool_names(graph, ranking.pool(high)))
            done = len(search)
            if best is None:
                best = ablator.recovered((yield from measured(ablator, circuit, pace, done, "the circuit")))
            empty = ablator.recovered((yield from measured(ablator, set(), pace, done, "the empty circuit"))).value
            evaluator = ablator
            held: Any = None
            if evaluating:
                evaluator = Ablator(self.model.backend, graph, self._pairs(evaluating), self.ablation)
                held = evaluator.recovered((yield from measured(evaluator, circuit, pace, done, "held-out pairs")))
            judged_value = best.value if held is None else held.value
            pace = Pace(ATTRIBUTION_STEPS + len(search), total)
            baseline = yield from judged(
                evaluator,
                ranking,
                high,
                judged_value,
                self.random_circuits,
                self.seed,
                not evaluating,
                pace,
                self.drawn,
            )
            return high, best, held, empty, baseline, ablator

        # Edge points entered per step (``per_step``): between steps the model is at rest for others' calls.
        high, best, held, empty, baseline, ablator = yield from per_step(self.model.backend.edge_points, exact())
        yield "done"
        self.result = self._measurement(ranking, high, best, held, empty, baseline, self.search, ablator, evaluating)

    def _measurement(
        self,
        ranking: EdgeRanking | NodeRanking,
        k: int,
        best: Any,
        held: Any,
        empty: float,
        baseline: CircuitBaseline,
        search: list[SearchStep],
        ablator: Ablator,
        evaluating: list[int],
    ) -> FindCircuitMeasurement:
        assert self.scores is not None and self.circuit is not None
        graph, scores = self.scores.graph, self.scores
        unit = "edges" if self.granularity == "edge" else "nodes (heads and MLPs; the embeddings always kept)"
        notes = [
            f"The smallest top-k circuit reaching faithfulness {self.target} has k = {k} of {len(ranking.items)} "
            f"{unit}, {len(self.circuit)} edges (bisection over k, each step exact). Bisection assumes faithfulness "
            f"grows with k: check `search`. {baseline.verdict}.",
        ]
        if held is not None:
            notes.append(
                f"Selected on {self.n_selecting(evaluating)} pairs; on the {len(evaluating)} held-out pairs it "
                f"recovers {held.value:+.3f} (the random baseline is measured there too)."
            )
        else:
            notes.append(
                f"Selected and scored on the same pairs ({len(self.clean_prompts)} pairs; held out by default from "
                f"{MIN_HELD_OUT_PAIRS}): the p is post-selection and gives no verdict."
            )
        notes.extend(overlap_note(baseline, k, self.granularity))
        notes.extend(empty_note(self.ablation, best.value, empty))
        notes.extend(small_gap_note(ablator))
        notes.extend(untested_note(ablator))
        notes.extend(ablator.pairs.notes)
        edges = sorted(self.circuit, key=lambda e: -abs(float(scores.scores[e])))
        totals = scores.scores.sum(dim=1)
        nodes = (
            [NodeScore(node=str(graph.writers[w]), score=float(totals[w])) for w in ranking.items[:k]]
            if isinstance(ranking, NodeRanking)
            else []
        )
        return FindCircuitMeasurement(
            answer_kind=pair_answer_kind(self.correct, self.incorrect),
            target=self.target,
            granularity=self.granularity,
            rank_by=self.rank_by,
            ablation=self.ablation,
            k=k,
            n_edges=len(self.circuit),
            total_edges=len(graph.edges),
            clean_logit_diff=metrics.score_of(ablator.clean_m),
            corrupt_logit_diff=metrics.score_of(ablator.corrupt_m),
            nodes=nodes,
            edges=[edge_score(scores, w, r, rank < TOP_WITH_EXAMPLES) for rank, (w, r) in enumerate(edges)],
            faithfulness=best,
            held_out=held,
            held_out_pairs=evaluating,
            empty_circuit=empty,
            baseline=baseline,
            search=search,
            notes=notes,
        )

    def n_selecting(self, evaluating: list[int]) -> int:
        return len(self.clean_prompts) - len(evaluating)

    def _pairs(self, indices: Sequence[int]) -> Pairs:
        return subset_pairs(
            self.model, self.clean_prompts, self.corrupt_prompts, self.correct, self.incorrect, indices, self.metric
        )
