"""Circuit tools: ``edge_attribution`` (EAP / EAP-IG over the writer → reader graph, grouped-query aware),
``path_patch`` (the exact effect of one path), ``circuit_faithfulness`` and ``find_circuit``."""

from __future__ import annotations

from typing import Annotated, Literal

from mcp.types import CallToolResult, ResourceLink
from pydantic import Field

from mcp_interp import figures
from mcp_interp.core.circuits import figures as circuits_figures
from mcp_interp.core.circuits.attribution import EdgeScores
from mcp_interp.core.circuits.faithfulness_job import CircuitFaithfulnessJob, FindCircuitJob
from mcp_interp.core.circuits.job import EdgeAttributionJob, graph_figure_data
from mcp_interp.core.circuits.path import PathPatchJob
from mcp_interp.mcp.arguments import (
    Answers,
    CleanPrompts,
    CorruptPrompts,
)
from mcp_interp.mcp.toolkit import Family, ToolContext, Toolkit, tool_arguments
from mcp_interp.schemas.circuits import (
    CircuitFaithfulnessResult,
    EdgeAttributionResult,
    EdgeRef,
    FindCircuitResult,
    PathPatchResult,
)

family = Family("circuits")


async def graph_figure(kit: Toolkit, scores: EdgeScores, k: int, title: str) -> tuple[str, ResourceLink]:
    """The top ``k`` edges of ``scores`` as a layered graph figure."""
    nodes, edges, columns = graph_figure_data(scores, k)
    return await kit.figure(title, circuits_figures.layered_graph, nodes, edges, title, columns)


@family.tool(view="circuit-graph")
async def edge_attribution(
    clean_prompts: CleanPrompts,
    corrupt_prompts: CorruptPrompts,
    correct: Answers,
    incorrect: Answers,
    ctx: ToolContext,
    method: Annotated[
        Literal["eap", "eap-ig"],
        Field(
            description="eap: gradient on the corrupt run (one backward); eap-ig: gradients averaged over ig_steps "
            "runs whose embeddings move from corrupt to clean (integrated gradients; better where the model is "
            "non-linear, ig_steps × the cost)."
        ),
    ] = "eap",
    ig_steps: Annotated[int, Field(description="eap-ig: points on the corrupt → clean path (1 to 64).")] = 5,
    top_k: Annotated[int, Field(description="Edges to return and draw, by |score|.")] = 50,
    granularity: Annotated[
        Literal["edge", "node"], Field(description="edge: the top edges and every writer's total; node: totals only.")
    ] = "edge",
) -> Annotated[CallToolResult, EdgeAttributionResult]:
    """Edge attribution patching: for every edge writer → reader of the residual-stream graph (writers:
    embeddings, each head, each MLP; readers: each head's query input, each key/value group's key and value
    input, each MLP input, the logits), the first-order estimate of how much the logit difference moves
    when the reader gets the writer's clean write instead of its corrupt one. Returns the top edges, every
    writer's total and a layered graph figure. An estimate: verify cited edges exactly."""
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
    return kit.finish(result, summary, [link])


@family.tool()
async def path_patch(
    clean_prompts: CleanPrompts,
    corrupt_prompts: CorruptPrompts,
    correct: Answers,
    incorrect: Answers,
    sender: Annotated[str, Field(description="The writer: a head 'L5H1' or an MLP 'L5MLP'.")],
    ctx: ToolContext,
    receivers: Annotated[
        str | list[str] | None,
        Field(
            description="Omitted: every later query head (q) or key/value group (k, v); 'logits': the final residual "
            "stream; or names 'L9H3' / 'L9KV1' (for k/v a query head means its key/value group)."
        ),
    ] = None,
    component: Annotated[
        Literal["q", "k", "v"], Field(description="Which input of a receiving head: query, key or value.")
    ] = "q",
) -> Annotated[CallToolResult, PathPatchResult]:
    """Exact direct path patching of the edge sender → receiver: the sender's clean-minus-corrupt write is
    added to that receiver's own input only (every other reader still sees the corrupt write), in the
    corrupt run; the logit difference says what that one path carries. Under grouped-query attention key
    and value receivers are key/value groups. Returns the [layer][head or group] grid of patched values,
    the recovered fractions, the receivers sorted, and a heatmap."""
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
    summary = (
        f"path_patch {sender} → {component}: clean {result.clean_logit_diff.value:+.3f}, corrupt "
        f"{result.corrupt_logit_diff.value:+.3f}; top paths by recovered fraction: {top}. Heatmap: {result.figure_uri}"
    )
    return kit.finish(result, summary, [link])


@family.tool()
async def circuit_faithfulness(
    clean_prompts: CleanPrompts,
    corrupt_prompts: CorruptPrompts,
    correct: Answers,
    incorrect: Answers,
    ctx: ToolContext,
    edges: Annotated[
        list[EdgeRef] | None,
        Field(description="The circuit: edges {writer, reader} as edge_attribution returns them (score ignored)."),
    ] = None,
    top_k: Annotated[
        int | None,
        Field(description="Instead of edges: the top k edges by attribution (0 = the empty circuit); adds a curve."),
    ] = None,
    ablation: Annotated[
        Literal["corrupt", "mean"],
        Field(description="What an ablated edge carries: the corrupt run's write, or the clean writes' mean."),
    ] = "corrupt",
    random_circuits: Annotated[int, Field(description="Random circuits of the same size (5 to 20), seeded.")] = 5,
    seed: Annotated[int, Field(description="Seed of the random circuits.")] = 0,
) -> Annotated[CallToolResult, CircuitFaithfulnessResult]:
    """Exact faithfulness of a circuit: the model run on the clean prompts with every edge outside the
    circuit ablated (each reader's input rebuilt exactly), as the recovered fraction of the clean−corrupt
    logit-difference gap (1 = the circuit reproduces the clean behaviour, 0 = the corrupt one), per example,
    next to random circuits of the same size; with top_k, a curve of faithfulness against k and a figure."""
    arguments = tool_arguments(locals())
    kit = Toolkit.of(ctx)
    job, started = await kit.measured_job(
        ctx,
        lambda model: CircuitFaithfulnessJob(model=model, **arguments),
    )
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
    random_mean = "n/a" if result.random_mean is None else f"{result.random_mean:+.3f}"
    summary = (
        f"circuit_faithfulness: {result.n_edges} of {result.total_edges} edges kept, faithfulness "
        f"{result.faithfulness.value:+.3f} (random circuits of the same size: {random_mean})."
    )
    return kit.finish(result, summary, links)


@family.tool(view="circuit-graph")
async def find_circuit(
    clean_prompts: CleanPrompts,
    corrupt_prompts: CorruptPrompts,
    correct: Answers,
    incorrect: Answers,
    ctx: ToolContext,
    target: Annotated[float, Field(description="Faithfulness to reach, a recovered fraction in (0, 1].")] = 0.8,
    ablation: Annotated[
        Literal["corrupt", "mean"],
        Field(description="What an ablated edge carries: the corrupt run's write, or the clean writes' mean."),
    ] = "corrupt",
    random_circuits: Annotated[int, Field(description="Random circuits of the same size (5 to 20), seeded.")] = 5,
    seed: Annotated[int, Field(description="Seed of the random circuits.")] = 0,
) -> Annotated[CallToolResult, FindCircuitResult]:
    """Find a circuit: edge attribution, then the smallest top-k set of edges whose exact faithfulness (every
    other edge ablated in real forwards) reaches `target`, by bisection over k. Returns the circuit's edges,
    its faithfulness per example, random circuits of the same size, every k measured, and a graph figure."""
    arguments = tool_arguments(locals())
    kit = Toolkit.of(ctx)
    job, started = await kit.measured_job(
        ctx,
        lambda model: FindCircuitJob(model=model, **arguments),
    )
    assert job.result is not None and job.scores is not None
    title = f"find_circuit (faithfulness ≥ {target}): {job.model.name}, top edges"
    job.result.figure_uri, link = await graph_figure(kit, job.scores, min(50, job.result.n_edges), title)
    result = kit.with_provenance(FindCircuitResult, job.result, started)
    random_mean = "n/a" if result.random_mean is None else f"{result.random_mean:+.3f}"
    summary = (
        f"find_circuit: {result.n_edges} of {result.total_edges} edges reach faithfulness "
        f"{result.faithfulness.value:+.3f} (target {target}; random circuits of that size: {random_mean}). "
        f"Graph: {result.figure_uri}"
    )
    return kit.finish(result, summary, [link])
