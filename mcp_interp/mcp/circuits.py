"""Circuit tools: ``edge_attribution`` (EAP / EAP-IG over the writer → reader graph, grouped-query aware),
``path_patch`` (the exact effect of one path), ``circuit_faithfulness`` and ``find_circuit``."""

from __future__ import annotations

import json
from typing import Annotated

from mcp.types import CallToolResult, ResourceLink
from pydantic import Field

import mcp_interp.figures as figures
from mcp_interp.core.circuits import figures as circuits_figures
from mcp_interp.core.circuits.attribution import EdgeScores
from mcp_interp.core.circuits.faithfulness_job import (
    CIRCUIT_DRAWS,
    CircuitFaithfulnessJob,
    FindCircuitJob,
    StoredChoice,
    edge_names,
)
from mcp_interp.core.circuits.job import EdgeAttributionJob, graph_figure_data
from mcp_interp.core.circuits.path import PathPatchJob
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.errors import InputError
from mcp_interp.mcp.arguments import (
    Answers,
    Background,
    CleanPrompts,
    CorruptPrompts,
    OtherSequenceAnswers,
    PairMetricArgument,
    Top,
)
from mcp_interp.mcp.family import Family
from mcp_interp.mcp.toolkit import ToolContext, Toolkit, tool_arguments
from mcp_interp.schemas.circuits import (
    CircuitAblation,
    CircuitFaithfulnessResult,
    EdgeAttributionMethod,
    EdgeAttributionResult,
    EdgeRef,
    FindCircuitResult,
    PathPatchResult,
    ReceiverInput,
)
from mcp_interp.schemas.common import Granularity, RankBy

family = Family("circuits")


async def graph_figure(kit: Toolkit, scores: EdgeScores, k: int, title: str) -> tuple[str, ResourceLink]:
    """The top ``k`` edges of ``scores`` as a layered graph figure."""
    nodes, edges, columns = graph_figure_data(scores, k)
    return await kit.figure(title, circuits_figures.layered_graph, nodes, edges, title, columns)


@family.tool(view="circuit-graph", background=True)
async def edge_attribution(
    clean_prompts: CleanPrompts,
    corrupt_prompts: CorruptPrompts,
    correct: Answers,
    incorrect: OtherSequenceAnswers,
    ctx: ToolContext,
    method: Annotated[
        EdgeAttributionMethod,
        Field(description="eap: the gradient on the corrupt run; eap-ig: integrated over `ig_steps` (× the cost)."),
    ] = "eap",
    ig_steps: Annotated[int, Field(description="1 to 64.")] = 5,
    top_k: Annotated[int, Field(description="Edges listed and drawn, by |score|.")] = 50,
    granularity: Annotated[Granularity, Field(description="node: writers' totals only.")] = "edge",
    metric: PairMetricArgument = "logit_diff",
    background: Background = False,
) -> Annotated[CallToolResult, EdgeAttributionResult]:
    """Edge attribution patching (an estimate) over the residual-stream graph (embeddings, heads, MLPs → each
    head's q, each key/value group's k and v, each MLP, the logits): top edges, writers' totals, a graph."""
    arguments = tool_arguments(locals())
    kit = Toolkit.of(ctx)
    job, started = await kit.measured_job(
        ctx,
        lambda model: EdgeAttributionJob(model=model, **arguments),
    )
    assert job.result is not None and job.scores is not None
    title = f"edge_attribution {method}: {job.model.name}"
    job.result.figure_uri, link = await graph_figure(kit, job.scores, top_k, title)
    result = kit.with_provenance(EdgeAttributionResult, job.result, started)
    top = "; ".join(f"{e.writer} → {e.reader} {e.score:+.3f}" for e in result.edges[:5])
    summary = (
        f"edge_attribution ({method}): {result.n_edges} edges; clean logit diff {result.clean_logit_diff.value:+.3f}, "
        f"corrupt {result.corrupt_logit_diff.value:+.3f}. Top edges: {top or 'see nodes'}. Graph: {result.figure_uri}"
    )
    return kit.finish(result, summary, [link], top=top_k)


@family.tool()
async def path_patch(
    clean_prompts: CleanPrompts,
    corrupt_prompts: CorruptPrompts,
    correct: Answers,
    incorrect: OtherSequenceAnswers,
    sender: Annotated[str, Field(description="A head 'L5H1' or an MLP 'L5MLP'.")],
    ctx: ToolContext,
    receivers: Annotated[
        str | list[str] | None,
        Field(description="Default: every later head (q) or key/value group (k, v); 'logits'; or 'L9H3' / 'L9KV1'."),
    ] = None,
    component: Annotated[
        ReceiverInput, Field(description="The receiver's input: 'q' (query), 'k' (key) or 'v' (value).")
    ] = "q",
    metric: PairMetricArgument = "logit_diff",
) -> Annotated[CallToolResult, PathPatchResult]:
    """Exact direct path patching: the sender's clean − corrupt write added to one receiver's input only, in the
    corrupt run; the recovered fraction per receiver and a heatmap."""
    arguments = tool_arguments(locals())
    kit = Toolkit.of(ctx)
    job, started = await kit.measured_job(
        ctx,
        lambda model: PathPatchJob(model=model, **arguments),
    )
    assert job.result is not None
    title = f"path_patch {sender} → {component}: recovered fraction, {job.model.name}"
    job.result.figure_uri, link = await kit.figure(
        title, figures.layer_head_heatmap, job.result.recovered, title, "recovered fraction"
    )
    result = kit.with_provenance(PathPatchResult, job.result, started)
    top = "; ".join(f"{r.receiver} {r.recovered:+.3f}" for r in result.receivers[:5] if r.recovered is not None)
    top = top or "none (every fraction is undefined: see the notes)"
    summary = (
        f"path_patch {sender} → {component}: clean {result.clean_logit_diff.value:+.3f}, corrupt "
        f"{result.corrupt_logit_diff.value:+.3f}; top paths by recovered fraction: {top}. Heatmap: {result.figure_uri}"
    )
    return kit.finish(result, summary, [link])


CircuitAblationArgument = Annotated[
    CircuitAblation, Field(description="An ablated edge carries the corrupt write or the mean.")
]
GranularityArgument = Annotated[Granularity, Field(description="node: k heads/MLPs, all their edges.")]
RankByArgument = Annotated[RankBy, Field(description="By |score| or signed score.")]
HeldOut = Annotated[
    float | None, Field(ge=0, lt=1, description="Fraction of pairs held out to score on (seeded); default 0.5 if ≥ 4.")
]
RandomCircuits = Annotated[
    int,
    Field(
        ge=19, le=1000, description="Most random circuits from the top 4k, drawn until 10 match it, for the p-value."
    ),
]
OLD_CIRCUIT_NOTE = (
    "This circuit:// was stored before circuits kept how they were chosen: it is judged as a set of edges, against "
    "random edge circuits from the top 4k edges by attribution on these pairs, whatever granularity found it. Run "
    "find_circuit again to store its granularity and pool."
)


def stored_circuit(kit: Toolkit, uri: str) -> tuple[list[list[str]], StoredChoice | None]:
    """The edges of a ``circuit://`` (from find_circuit) by name, and how it was chosen (None for a payload stored
    before that was kept); other handles are input errors."""
    kind, _, entry = uri.partition("://")
    if kind != "circuit" or not entry:
        raise InputError(f"`circuit` must be a circuit:// URI from find_circuit, got {uri[:80]!r}.")
    data = json.loads(kit.read_entry("circuit", entry))
    if data.get("model") != kit.host.model_ref().fingerprint:
        raise InputError(
            "This circuit was found on other weights (its model fingerprint differs): run find_circuit on this model."
        )
    edges = [list(edge) for edge in data["edges"]]
    if "pool" not in data:
        return edges, None
    return edges, StoredChoice(granularity=data["granularity"], k=int(data["k"]), pool=data["pool"])


@family.tool(background=True)
async def circuit_faithfulness(
    clean_prompts: CleanPrompts,
    corrupt_prompts: CorruptPrompts,
    correct: Answers,
    incorrect: OtherSequenceAnswers,
    ctx: ToolContext,
    edges: Annotated[
        list[EdgeRef] | None,
        Field(description="Edges {writer, reader} as edge_attribution names them."),
    ] = None,
    circuit: Annotated[str | None, Field(description="Or a circuit:// from find_circuit.")] = None,
    top_k: Annotated[int | None, Field(description="Or the top k by attribution, with a curve over k.")] = None,
    granularity: GranularityArgument = "edge",
    rank_by: RankByArgument = "abs",
    ablation: CircuitAblationArgument = "corrupt",
    held_out: HeldOut = None,
    random_circuits: RandomCircuits = CIRCUIT_DRAWS,
    seed: int = 0,
    metric: PairMetricArgument = "logit_diff",
    background: Background = False,
) -> Annotated[CallToolResult, CircuitFaithfulnessResult]:
    """A circuit's exact faithfulness: every edge outside it ablated, as the fraction of the clean−corrupt gap
    recovered (1 = clean behaviour), ranked among random circuits of its size from the top 4k (p-value)."""
    arguments = tool_arguments(locals())
    kit = Toolkit.of(ctx)
    del arguments["circuit"]

    def make_job(model: LoadedModel) -> CircuitFaithfulnessJob:  # inside the job's error boundary
        if circuit is not None:
            if edges is not None:
                raise InputError("Pass `edges` or `circuit`, not both.")
            arguments["edges"], arguments["stored"] = stored_circuit(kit, circuit)
            if arguments["stored"] is None:
                arguments["caller_notes"] = [OLD_CIRCUIT_NOTE]
        return CircuitFaithfulnessJob(model=model, **arguments)

    job, started = await kit.measured_job(ctx, make_job)
    assert job.result is not None
    links = []
    if job.result.curve:
        curve = job.result.curve
        title = f"circuit faithfulness against k ({ablation}): {job.model.name}"
        job.result.figure_uri, link = await kit.figure(
            title,
            circuits_figures.faithfulness_curve,
            [p.k for p in curve],
            [p.faithfulness for p in curve],
            [p.random_mean for p in curve],
            title,
        )
        links.append(link)
    result = kit.with_provenance(CircuitFaithfulnessResult, job.result, started)
    summary = (
        f"circuit_faithfulness: {result.n_edges} of {result.total_edges} edges kept, faithfulness "
        f"{result.faithfulness.value:+.3f} (empty circuit {result.empty_circuit:+.3f}); {result.baseline.verdict}."
    )
    return kit.finish(result, summary, links)


@family.tool(view="circuit-graph", background=True)
async def find_circuit(
    clean_prompts: CleanPrompts,
    corrupt_prompts: CorruptPrompts,
    correct: Answers,
    incorrect: OtherSequenceAnswers,
    ctx: ToolContext,
    target: Annotated[float, Field(description="Faithfulness to reach, in (0, 1].")] = 0.8,
    granularity: GranularityArgument = "edge",
    rank_by: RankByArgument = "abs",
    ablation: CircuitAblationArgument = "corrupt",
    held_out: HeldOut = None,
    random_circuits: RandomCircuits = CIRCUIT_DRAWS,
    seed: int = 0,
    top: Top = 20,
    metric: PairMetricArgument = "logit_diff",
    background: Background = False,
) -> Annotated[CallToolResult, FindCircuitResult]:
    """Attribution, then the smallest top-k circuit (edges or nodes) whose exact faithfulness reaches `target`
    (bisection, every step exact), scored on held-out pairs and against random circuits; circuit:// holds every edge."""
    arguments = tool_arguments(locals())
    kit = Toolkit.of(ctx)
    job, started = await kit.measured_job(
        ctx,
        lambda model: FindCircuitJob(model=model, **arguments),
    )
    assert job.result is not None and job.scores is not None and job.circuit is not None and job.graph is not None
    assert job.choice is not None
    stored = {
        "model": kit.host.model_ref().fingerprint,
        "granularity": granularity,
        "k": job.choice.k,
        "nodes": [n.node for n in job.result.nodes],
        "edges": edge_names(job.graph, job.circuit),
        "pool": job.choice.pool,  # ranked on the selection pairs: the baseline circuit_faithfulness re-draws from
        "rank_by": rank_by,
        "ablation": ablation,
        "faithfulness": job.result.faithfulness.value,
        "selection_pairs": [i for i in range(len(clean_prompts)) if i not in set(job.result.held_out_pairs)],
    }
    job.result.circuit_uri, circuit_link = kit.store("circuit", json.dumps(stored).encode(), "circuit")
    title = f"find_circuit (faithfulness ≥ {target}): {job.model.name}, top edges"
    job.result.figure_uri, link = await graph_figure(kit, job.scores, min(50, job.result.n_edges), title)
    result = kit.with_provenance(FindCircuitResult, job.result, started)
    held = "" if result.held_out is None else f", held-out pairs {result.held_out.value:+.3f}"
    unit = "edges" if granularity == "edge" else "nodes"
    summary = (
        f"find_circuit: {result.k} {unit} ({result.n_edges} of {result.total_edges} edges) reach faithfulness "
        f"{result.faithfulness.value:+.3f}{held} (target {target}); {result.baseline.verdict}. Circuit: "
        f"{result.circuit_uri}; graph: {result.figure_uri}"
    )
    return kit.finish(result, summary, [circuit_link, link], top=top)
