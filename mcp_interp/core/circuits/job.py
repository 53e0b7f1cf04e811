"""The measurement behind ``edge_attribution``: the job around ``core.circuits.attribution``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from mcp_interp.core.circuits.attribution import EdgeAttribution, EdgeScores
from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import Job
from mcp_interp.core.engine.numbers import metrics
from mcp_interp.core.engine.numbers.scores import TOP_WITH_EXAMPLES
from mcp_interp.core.engine.patching.pairs import pair_answer_kind, prepare_pairs
from mcp_interp.errors import InputError, require_choice
from mcp_interp.schemas.circuits import EdgeAttributionMeasurement, EdgeAttributionMethod, EdgeScore, NodeScore
from mcp_interp.schemas.common import Granularity, PairMetric

MAX_IG_STEPS = 64


def edge_score(result: EdgeScores, w: int, r: int, with_examples: bool = False) -> EdgeScore:
    """One edge by name, with its score per pair when asked."""
    graph = result.graph
    per_example = [float(v) for v in result.per_pair[:, w, r]] if with_examples else None
    return EdgeScore(
        writer=str(graph.writers[w]), reader=str(graph.readers[r]), score=float(result.scores[w, r]),
        per_example=per_example,
    )  # fmt: skip


MAX_EDGES = 2000  # edges one edge_attribution call lists
EXACT_CHECKED = 5  # top edges whose exact effect is measured next to their score


@dataclass(kw_only=True)
class EdgeAttributionJob(Job[EdgeAttributionMeasurement]):
    model: LoadedModel
    clean_prompts: Sequence[str]
    corrupt_prompts: Sequence[str]
    correct: Any
    incorrect: Any
    metric: PairMetric = "logit_diff"
    method: EdgeAttributionMethod = "eap"
    ig_steps: int = 5
    top_k: int = 50
    granularity: Granularity = "edge"
    result: EdgeAttributionMeasurement | None = field(default=None, init=False)
    scores: EdgeScores | None = field(default=None, init=False)

    def _check(self) -> None:
        require_choice("method", self.method, EdgeAttributionMethod)
        require_choice("granularity", self.granularity, Granularity)
        if not isinstance(self.ig_steps, int) or not 1 <= self.ig_steps <= MAX_IG_STEPS:
            raise InputError(
                f"`ig_steps` must be an integer from 1 to {MAX_IG_STEPS} (each step is one forward and backward), "
                f"got {self.ig_steps!r}; 5 to 20 is usual."
            )
        if not isinstance(self.top_k, int) or not 1 <= self.top_k <= MAX_EDGES:
            raise InputError(f"`top_k` must be an integer from 1 to {MAX_EDGES}, got {self.top_k!r}.")

    def total_steps(self) -> int:
        return 3 + (self.ig_steps if self.method == "eap-ig" else 1)

    def steps(self) -> Iterator[str]:
        require(self.model.backend, "edge_attribution")
        self._check()
        pairs = prepare_pairs(
            self.model, self.clean_prompts, self.corrupt_prompts, self.correct, self.incorrect, self.metric
        )
        integrated = self.method == "eap-ig"
        steps = self.ig_steps if integrated else 1
        run = EdgeAttribution(
            backend=self.model.backend,
            clean=pairs.clean,
            corrupt=pairs.corrupt,
            metric=pairs.readout.from_logits,
            ig_steps=steps,
            integrated=integrated,
        )
        yield from run.steps()
        assert run.result is not None
        scores = self.scores = run.result
        ranked = sorted(scores.graph.edges, key=lambda e: -abs(float(scores.scores[e])))
        checked = ranked[: min(EXACT_CHECKED, self.top_k)] if self.granularity == "edge" else []
        exact = [float(v) for v in run.exact_effects(checked).mean(dim=1)] if checked else []
        yield f"{len(checked)} top edges measured exactly"
        self.result = self._measurement(run.result, integrated, ranked, exact, run.normed_layers, pairs.notes)

    def _measurement(
        self,
        result: EdgeScores,
        integrated: bool,
        ranked: list[tuple[int, int]],
        exact: list[float],
        normed_layers: list[int],
        metric_notes: list[str],
    ) -> EdgeAttributionMeasurement:
        graph, scores = result.graph, result.scores
        edges = [
            edge_score(result, w, r, with_examples=rank < TOP_WITH_EXAMPLES)
            for rank, (w, r) in enumerate(ranked[: self.top_k])
        ] if self.granularity == "edge" else []  # fmt: skip
        for edge, value in zip(edges, exact, strict=False):
            edge.exact = value
        totals = scores.sum(dim=1)
        nodes = sorted(
            (NodeScore(node=str(w), score=float(totals[i])) for i, w in enumerate(graph.writers)),
            key=lambda node: -abs(node.score),
        )
        gap = float((result.clean_metric - result.corrupt_metric).mean())
        notes = [
            "Edge attribution is a first-order (gradient) estimate, not a measurement: verify the edges you cite "
            "with exact path patching or a faithfulness test.",
            *metric_notes,
        ]
        if exact:
            errors = [abs(edge.score - value) for edge, value in zip(edges, exact, strict=False)]
            worst = max(range(len(errors)), key=errors.__getitem__)
            notes.append(
                f"Checked: the top {len(exact)} edges' exact effects (field `exact`) against their scores: largest "
                f"error {errors[worst]:.3g} ({edges[worst].writer} → {edges[worst].reader}: score "
                f"{edges[worst].score:+.3g}, exact {exact[worst]:+.3g})."
            )
        if normed_layers:
            notes.append(
                f"Post-norm blocks (layers {normed_layers[0]}–{normed_layers[-1]}): a head reaches the residual stream "
                "through its layer's post-attention norm, linearised here with the norm's scale frozen at the run "
                "the gradient is taken on (as DLA and circuit-tracer do); `exact` recomputes the norm."
            )
        if gap == 0:
            notes.append(
                "Clean and corrupt give the same logit difference (a gap of 0; identical pairs do): every edge's "
                "score is 0 by construction, not evidence that no edge matters. Choose pairs whose corrupt prompt "
                "changes the answer."
            )
        if graph.n_kv_heads != graph.n_heads:
            notes.append(
                f"Grouped-query attention: {graph.n_heads} query heads share {graph.n_kv_heads} key/value groups, so "
                "a key or value reader ('L5KV0.k') is one group's input, shared by its heads (see kv_groups)."
            )
        embed_gap = None
        if integrated:
            embed = float(totals[0])
            embed_gap = embed - gap
            notes.append(
                f"EAP-IG with {self.ig_steps} steps: the embeddings' total attribution is {embed:+.3f} for a mean "
                f"clean−corrupt gap of {gap:+.3f}; a large difference means more steps are needed."
            )
        per = graph.n_heads // graph.n_kv_heads
        return EdgeAttributionMeasurement(
            answer_kind=pair_answer_kind(self.correct, self.incorrect),
            method=self.method,
            ig_steps=self.ig_steps if integrated else 1,
            granularity=self.granularity,
            clean_logit_diff=metrics.score_of(result.clean_metric),
            corrupt_logit_diff=metrics.score_of(result.corrupt_metric),
            n_edges=len(graph.edges),
            n_writers=len(graph.writers),
            n_readers=len(graph.readers),
            kv_groups=[f"L*KV{g}: H{g * per}-H{(g + 1) * per - 1}" for g in range(graph.n_kv_heads)],
            edges=edges,
            nodes=nodes,
            embed_total_vs_gap=embed_gap,
            notes=notes,
        )


def graph_figure_data(
    result: EdgeScores, top_k: int
) -> tuple[list[tuple[str, float, float]], list[tuple[str, str, float, str]], int]:
    """Nodes (name, x, y) and edges (writer, reader node, score, reader input) of the top ``top_k`` edges
    for ``circuits_figures.layered_graph``; readers are drawn as their head, key/value group, MLP or the logits."""
    graph, scores = result.graph, result.scores
    n_heads, n_layers = graph.n_heads, max(r.layer for r in graph.readers) + 1
    top = sorted(graph.edges, key=lambda e: -abs(float(scores[e])))[:top_k]
    nodes: dict[str, tuple[float, float]] = {}
    edges = []
    for w, r in top:
        writer, reader = graph.writers[w], graph.readers[r]
        nodes[str(writer)] = writer.place(n_heads)
        nodes[reader.component()] = reader.place(n_heads, n_layers)
        label = "" if reader.kind == "logits" else ("in" if reader.kind == "mlp" else reader.kind)
        edges.append((str(writer), reader.component(), float(scores[w, r]), label))
    return [(name, x, y) for name, (x, y) in nodes.items()], edges, 2 * n_layers + 2
