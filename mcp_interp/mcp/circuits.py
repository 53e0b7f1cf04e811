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
    Background,
    CleanPrompts,
    CorruptPrompts,
    Top,
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


@family.tool(view="circuit-graph", background=True)
async def edge_attribution(
    clean_prompts: CleanPrompts,
    corrupt_prompts: CorruptPrompts,
    correct: Answers,
    incorrect: Answers,
    ctx: ToolContext,
    method: Annotated[
        Literal["eap", "eap-ig"],
        Field(description="eap: the gradient on the corrupt run; eap-ig: integrated over `ig_steps` (× the cost)."),
    ] = "eap",
    ig_steps: Annotated[int, Field(description="1 to 64.")] = 5,
    top_k: Annotated[int, Field(description="Edges listed and drawn, by |score|.")] = 50,
    granularity: Annotated[Literal["edge", "node"], Field(description="node: writers' totals only.")] = "edge",
    background: Background = False,
) -> Annotated[CallToolResult, EdgeAttributionResult]:
    """Edge attribution patching over the residual-stream graph (embeddings, heads, MLPs → each head's q, each
    key/value group's k and v, each MLP, the logits): the top edges, writers' totals, a graph. An estimate."""
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
    incorrect: Answers,
    sender: Annotated[str, Field(description="A head 'L5H1' or an MLP 'L5MLP'.")],
    ctx: ToolContext,
    receivers: Annotated[
        str | list[str] | None,
        Field(description="Default: every later head (q) or key/value group (k, v); 'logits'; or 'L9H3' / 'L9KV1'."),
    ] = None,
    component: Annotated[Literal["q", "k", "v"], Field(description="The receiving input.")] = "q",
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
    summary = (
        f"path_patch {sender} → {component}: clean {result.clean_logit_diff.value:+.3f}, corrupt "
        f"{result.corrupt_logit_diff.value:+.3f}; top paths by recovered fraction: {top}. Heatmap: {result.figure_uri}"
    )
    return kit.finish(result, summary, [link])


@family.tool(background=True)
async def circuit_faithfulness(
    clean_prompts: CleanPrompts,
    corrupt_prompts: CorruptPrompts,
    correct: Answers,
    incorrect: Answers,
    ctx: ToolContext,
    edges: Annotated[
        list[EdgeRef] | None,
        Field(description="Edges {writer, reader} as edge_attribution names them."),
    ] = None,
    top_k: Annotated[
        int | None,
        Field(description="Instead of edges: the top k by attribution, with a curve over k."),
    ] = None,
    ablation: Annotated[
        Literal["corrupt", "mean"],
        Field(description="What an ablated edge carries: the corrupt write, or the clean writes' mean."),
    ] = "corrupt",
    random_circuits: Annotated[int, Field(description="Random circuits of the same size (5 to 20).")] = 5,
    seed: int = 0,
    background: Background = False,
) -> Annotated[CallToolResult, CircuitFaithfulnessResult]:
    """A circuit's exact faithfulness: every edge outside it ablated, as the fraction of the clean−corrupt gap
    recovered (1 = clean behaviour), next to random circuits of the same size."""
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


@family.tool(view="circuit-graph", background=True)
async def find_circuit(
    clean_prompts: CleanPrompts,
    corrupt_prompts: CorruptPrompts,
    correct: Answers,
    incorrect: Answers,
    ctx: ToolContext,
    target: Annotated[float, Field(description="Faithfulness to reach, in (0, 1].")] = 0.8,
    ablation: Annotated[
        Literal["corrupt", "mean"],
        Field(description="What an ablated edge carries: the corrupt write, or the clean writes' mean."),
    ] = "corrupt",
    random_circuits: Annotated[int, Field(description="Random circuits of the same size (5 to 20).")] = 5,
    seed: int = 0,
    top: Top = 20,
    background: Background = False,
) -> Annotated[CallToolResult, FindCircuitResult]:
    """Attribution, then the smallest top-k circuit whose exact faithfulness reaches `target` (bisection, every
    step exact), its random baseline, every k measured, a graph."""
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
    return kit.finish(result, summary, [link], top=top)
