"""Circuit tools: ``edge_attribution`` (EAP / EAP-IG over the writer → reader graph, grouped-query aware)."""

from __future__ import annotations

import time
from typing import Annotated, Literal

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import Field

from mcp_interp import figures
from mcp_interp.core.circuits.job import EdgeAttributionJob, graph_figure_data
from mcp_interp.mcp.arguments import Answers
from mcp_interp.mcp.toolkit import Family, Toolkit
from mcp_interp.schemas.circuits import EdgeAttributionResult

family = Family("circuits")


@family.tool()
async def edge_attribution(
    clean_prompts: Annotated[list[str], Field(description="Prompts where the model shows the behaviour.")],
    corrupt_prompts: Annotated[
        list[str], Field(description="Minimal-pair partners, one per clean prompt, same token length.")
    ],
    correct: Answers,
    incorrect: Answers,
    ctx: Context,
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
    kit = Toolkit.of(ctx)
    model = await kit.model(ctx)
    started = time.perf_counter()
    job = EdgeAttributionJob(
        model, clean_prompts, corrupt_prompts, correct, incorrect, method, ig_steps, top_k, granularity
    )
    await kit.run_job(ctx, job)
    assert job.result is not None and job.scores is not None
    title = f"edge_attribution {method}: {model.name}"
    nodes, edges, columns = graph_figure_data(job.scores, top_k)
    job.result.figure_uri, link = await kit.figure(title, figures.layered_graph, nodes, edges, title, columns)
    result = kit.with_provenance(EdgeAttributionResult, job.result, started)
    top = "; ".join(f"{e.writer} → {e.reader} {e.score:+.3f}" for e in result.edges[:5])
    summary = (
        f"edge_attribution ({method}): {result.n_edges} edges; clean logit diff {result.clean_logit_diff.value:+.3f}, "
        f"corrupt {result.corrupt_logit_diff.value:+.3f}. Top edges: {top or 'see nodes'}. Graph: {result.figure_uri}"
    )
    return kit.finish(result, summary, [link])
