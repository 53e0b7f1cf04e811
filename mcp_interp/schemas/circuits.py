"""Results of the circuits family: ``edge_attribution`` and ``path_patch``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mcp_interp.schemas.common import AnswerKind, Granularity, Measurement, Provenance, RankBy, Score

EdgeAttributionMethod = Literal["eap", "eap-ig"]  # eap: the gradient on the corrupt run; eap-ig: integrated
ReceiverInput = Literal["q", "k", "v"]  # a path's receiver: a query head's query, a key/value group's key or value
CircuitAblation = Literal["corrupt", "mean"]  # what an ablated edge carries: the corrupt write or the mean
ONE_TOKEN_ANSWERS = "'token', or 'set' when an answer is a set of single tokens (a longer answer is refused)."

NODE_NAMES = (
    "Writers: 'embed', a head 'L5H1', an MLP 'L5MLP'. Readers: a query input 'L5H1.q', the key or value input "
    "of a key/value group 'L5KV0.k' / 'L5KV0.v' (under grouped-query attention one group's input is shared by "
    "several query heads: see `kv_groups`), an MLP input 'L5MLP.in', 'logits'."
)


class EdgeScore(BaseModel):
    writer: str
    reader: str
    score: float = Field(
        description="Estimated change of the metric (logit difference) when this reader's input gets the writer's "
        "clean write instead of its corrupt one, summed over positions, mean over pairs; > 0 = toward clean."
    )
    per_example: list[float] | None = Field(default=None, description="The score of each pair (the top 10 edges).")
    exact: float | None = Field(
        default=None,
        description="Top 5 edges: the measured effect (corrupt run, this reader alone given the writer's clean write).",
    )


class NodeScore(BaseModel):
    node: str
    score: float = Field(description="Sum of the writer's edge scores: its node attribution.")


class EdgeAttributionMeasurement(Measurement):
    RANKED = ("edges", "nodes")

    method: EdgeAttributionMethod
    ig_steps: int = Field(description="Gradient runs averaged (1 for eap).")
    granularity: Granularity
    answer_kind: AnswerKind = Field(default="token", description=ONE_TOKEN_ANSWERS)
    approximate: bool = Field(default=True, description="Always true: attribution is a gradient estimate.")
    clean_logit_diff: Score
    corrupt_logit_diff: Score
    n_edges: int = Field(description="Edges in the graph.")
    n_writers: int
    n_readers: int
    kv_groups: list[str] = Field(description="Which query heads share each key/value group, e.g. 'L*KV0: H0-H2'.")
    edges: list[EdgeScore] = Field(description=f"Top edges by |score| (granularity 'edge'). {NODE_NAMES}")
    nodes: list[NodeScore] = Field(description="Every writer's total, sorted by |score|.")
    embed_total_vs_gap: float | None = Field(
        default=None,
        description="eap-ig: the embeddings' summed attribution minus the mean clean−corrupt gap; near 0 when "
        "ig_steps is enough (completeness of integrated gradients).",
    )
    figure_uri: str | None = Field(default=None, description="The top edges drawn by layer, figure://…")


class EdgeAttributionResult(Provenance, EdgeAttributionMeasurement):
    pass


class ReceiverScore(BaseModel):
    receiver: str = Field(description="'L9H3.q', 'L9KV1.k' / '.v' (a key/value group), or 'logits'.")
    patched_logit_diff: float = Field(description="Mean logit difference with the path into this receiver patched.")
    per_example_patched: list[float] = Field(description="The patched logit difference of each pair.")
    recovered: float | None = Field(
        description="(patched − corrupt) / (clean − corrupt): the fraction of the gap this one path restores."
    )


class PathPatchMeasurement(Measurement):
    sender: str
    component: ReceiverInput
    answer_kind: AnswerKind = Field(default="token", description=ONE_TOKEN_ANSWERS)
    clean_logit_diff: Score
    corrupt_logit_diff: Score
    patched_logit_diff: list[list[float | None]] = Field(
        description="[layer][head] (q) or [layer][key/value group] (k, v): the patched metric; None = not a receiver."
    )
    recovered: list[list[float | None]] = Field(description="Same layout: the recovered fraction.")
    receivers: list[ReceiverScore] = Field(description="Every receiver, sorted by |recovered|.")
    figure_uri: str | None = Field(default=None, description="Heatmap of the recovered fractions, figure://…")


class PathPatchResult(Provenance, PathPatchMeasurement):
    pass


class EdgeRef(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an input: a key it does not take is refused, never ignored
    writer: str = Field(description="'embed', 'L5H1' or 'L5MLP'.")
    reader: str = Field(description="'L9H3.q', 'L9KV1.k', 'L9KV1.v', 'L9MLP.in' or 'logits'.")
    score: float | None = Field(default=None, description="Ignored here (edge_attribution's score may be passed).")


class CurvePoint(BaseModel):
    k: int = Field(description="Edges in the circuit (the top k by attribution).")
    faithfulness: float | None = Field(description="Recovered fraction of the clean−corrupt gap, exact.")
    random_mean: float | None = Field(description="Mean of 5 random circuits of k from the top 4k.")


class CircuitBaseline(BaseModel):
    """Random circuits of the same size drawn from the top 4k edges (nodes) by the same ranking: a baseline that can
    match the circuit (uniformly random edges are almost never connected, so they score ≈ 0 whatever)."""

    draws: list[float] = Field(description="Each random circuit's faithfulness, in the order drawn.")
    mean: float
    draws_made: int = Field(description="Random circuits measured: drawn in batches until 10 score ≥ the circuit.")
    most_draws: int = Field(description="The cap on draws (random_circuits); the smallest p is 1/(cap + 1).")
    at_least_as_good: int = Field(description="Draws whose faithfulness is ≥ the circuit's.")
    p_value: float = Field(
        description="Sequential (Besag–Clifford): 10/draws_made if it stopped at 10 draws ≥ the circuit, else "
        "(1 + at_least_as_good)/(most_draws + 1). Valid under H0 'the ranking inside the pool is noise'."
    )
    p_floor: float = Field(description="Smallest reachable p; above 0.05 the verdict cannot resolve.")
    pool_size: int = Field(description="Distinct circuits drawable: C(pool, k) − 1 (never the circuit).")
    post_selection: bool = Field(description="Chosen on the pairs it is scored on: p given, no verdict.")
    pool: int = Field(description="The candidate pool's size (4k, at most everything).")
    overlap: float = Field(description="k / pool: the share of the pool a draw takes; above 0.25 it says little.")
    verdict: str


FAITHFULNESS = (
    "(m_circuit − m_corrupt) / (m_clean − m_corrupt), every edge outside the circuit ablated exactly: 1 = clean "
    "behaviour, 0 = the corrupt run's. value = ratio of means; per_example = each pair's ratio."
)


class CircuitFaithfulnessMeasurement(Measurement):
    ablation: CircuitAblation
    granularity: Granularity = Field(description="How top_k counts: edges or nodes.")
    answer_kind: AnswerKind = Field(default="token", description=ONE_TOKEN_ANSWERS)
    n_edges: int = Field(description="Edges in the circuit.")
    total_edges: int
    clean_logit_diff: Score
    corrupt_logit_diff: Score
    faithfulness: Score = Field(description=FAITHFULNESS)
    empty_circuit: float = Field(description="Faithfulness with every edge ablated (0 for 'corrupt').")
    held_out_pairs: list[int] = Field(description="With held_out: the pairs evaluated on (others ranked the edges).")
    baseline: CircuitBaseline
    curve: list[CurvePoint] = Field(default_factory=list, description="With top_k: faithfulness at other sizes.")
    figure_uri: str | None = None


class CircuitFaithfulnessResult(Provenance, CircuitFaithfulnessMeasurement):
    pass


class SearchStep(BaseModel):
    k: int
    faithfulness: float | None


class FindCircuitMeasurement(Measurement):
    RANKED = ("edges",)

    target: float
    granularity: Granularity
    rank_by: RankBy
    ablation: CircuitAblation
    answer_kind: AnswerKind = Field(default="token", description=ONE_TOKEN_ANSWERS)
    k: int = Field(description="Edges or nodes chosen: the smallest top-k reaching the target.")
    n_edges: int = Field(description="Edges in the circuit.")
    total_edges: int
    clean_logit_diff: Score
    corrupt_logit_diff: Score
    nodes: list[NodeScore] = Field(description="granularity 'node': the chosen heads and MLPs.")
    edges: list[EdgeScore] = Field(description="The circuit's edges by |attribution score| (all in circuit_uri).")
    faithfulness: Score = Field(description="On the selection pairs. " + FAITHFULNESS)
    held_out: Score | None = Field(description="The same on the held-out pairs (held_out > 0).")
    held_out_pairs: list[int]
    empty_circuit: float = Field(description="Faithfulness with every edge ablated (0 for 'corrupt').")
    baseline: CircuitBaseline = Field(description="On the held-out pairs when there are some.")
    search: list[SearchStep] = Field(description="Every k the bisection measured exactly, in order.")
    circuit_uri: str | None = Field(default=None, description="circuit://…: every edge, for circuit_faithfulness.")
    figure_uri: str | None = None


class FindCircuitResult(Provenance, FindCircuitMeasurement):
    pass
