"""Graph tools: ``attribution_graph`` (circuit tracing with transcoders: the local replacement model's feature graph,
pruned, stored as Neuronpedia JSON under ``graph://``) and ``graph_intervene`` (set or scale features and compare
the logits with what the graph predicts). The science is in ``core/graphs/``."""

from __future__ import annotations

import json
from typing import Annotated

from mcp.types import CallToolResult
from pydantic import Field

from mcp_interp.core.graphs import figures as graphs_figures
from mcp_interp.core.graphs.intervene import graph_intervene as measure_intervention
from mcp_interp.core.graphs.job import DEFAULT_MAX_FEATURE_NODES, AttributionGraphJob
from mcp_interp.mcp.toolkit import Family, ToolContext, Toolkit, tool_arguments
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.graphs import (
    AttributionGraphResult,
    FeatureIntervention,
    GraphInterveneMeasurement,
    GraphInterveneResult,
)

family = Family("graphs")

TranscodersArg = Annotated[
    str,
    Field(
        description="Transcoders in circuit-tracer's format for the loaded model: a local folder (config.yaml with "
        "model_kind transcoder_set | cross_layer_transcoder, feature_input_hook, feature_output_hook, plus "
        "layer_{i}.safetensors or W_enc_{i}/W_dec_{i}.safetensors) or a hub id ('org/repo', 'org/repo/subfolder') "
        "already in the local Hugging Face or circuit-tracer cache (the server never downloads)."
    ),
]
TargetsArg = Annotated[
    list[str] | None,
    Field(
        description="Output tokens to explain, each one token (mind the leading space, ' Paris'); default: the most "
        "probable next tokens until they cover 95 % of the probability, at most 10."
    ),
]


@family.tool(view="attribution-graph")
async def attribution_graph(
    prompt: Annotated[str, Field(description="One prompt; the graph explains its next-token prediction.")],
    transcoders: TranscodersArg,
    ctx: ToolContext,
    targets: TargetsArg = None,
    node_threshold: Annotated[
        float, Field(description="Keep the nodes holding this share of the total influence on the logits, 0..1.")
    ] = 0.8,
    edge_threshold: Annotated[
        float, Field(description="Then keep the edges holding this share of the total edge influence, 0..1.")
    ] = 0.98,
    max_feature_nodes: Annotated[
        int,
        Field(
            description="At most this many active features get their incoming edges computed (chosen by influence "
            "when more are active); time grows linearly with it."
        ),
    ] = DEFAULT_MAX_FEATURE_NODES,
    top_k: Annotated[
        int, Field(description="Top features (by influence) listed with per-token activations, 1..50.")
    ] = 10,
) -> Annotated[CallToolResult, AttributionGraphResult]:
    """Attribution graph (circuit tracing, Ameisen et al. 2025; circuit-tracer's algorithm): replace each MLP by its
    transcoder, freeze attention patterns and norm scales at the real forward, add error nodes so the replacement
    reproduces the model exactly, and compute the direct linear effect of every active feature, error node and
    input token on every other and on the target logits; prune by influence. Returns the scores
    (replacement_score, completeness_score), counts, the top features with per-token activations, the top nodes and
    edges, the replacement model's logit error, a figure, and the full pruned graph as Neuronpedia JSON
    (graph://…). Edges are direct effects: test a claim with graph_intervene."""
    arguments = tool_arguments(locals())
    kit = Toolkit.of(ctx)
    job, started = await kit.measured_job(ctx, lambda model: AttributionGraphJob(model=model, **arguments))
    measurement = job.result
    assert measurement is not None and job.graph_json is not None
    payload = json.dumps(job.graph_json, separators=(",", ":")).encode("utf-8")
    measurement.graph_uri, graph_link = kit.store("graph", payload, "attribution graph (Neuronpedia JSON)")
    title = f"attribution graph: {prompt[:60]!r} — {job.model.name}"
    measurement.figure_uri, figure_link = await kit.figure(
        title,
        graphs_figures.attribution_graph_figure,
        measurement.nodes,
        measurement.links,
        measurement.tokens,
        measurement.transcoders.n_layers,
        title,
    )
    result = kit.with_provenance(AttributionGraphResult, measurement, started)
    counts, top = result.counts, result.top_features[:3]
    summary = (
        f"attribution_graph: {counts.feature_nodes_kept} of {counts.features_in_graph} feature nodes, "
        f"{counts.error_nodes_kept} error nodes and {counts.edges_kept} edges kept; replacement_score "
        f"{result.replacement_score:.3f}, completeness_score {result.completeness_score:.3f}, "
        f"replacement_logit_error {result.replacement_logit_error:.1e}. Targets: "
        f"{', '.join(repr(t.token) for t in result.targets)}. Top features: "
        + "; ".join(f"L{f.layer} f{f.feature} at {f.token!r} (influence {f.influence:.3f})" for f in top)
        + f". Graph: {result.graph_uri}; figure: {result.figure_uri}"
    )
    return kit.finish(result, summary, [graph_link, figure_link])


@family.tool()
async def graph_intervene(
    prompt: Annotated[str, Field(description="The prompt of the graph being tested.")],
    transcoders: TranscodersArg,
    features: Annotated[
        list[FeatureIntervention],
        Field(
            description="Features to change: {layer, position, feature, value} (new activation; 0 removes it) or "
            "{layer, position, feature, scale} (× its activation); positions may be negative (−1 = last)."
        ),
    ],
    ctx: ToolContext,
    targets: TargetsArg = None,
    freeze_attention: Annotated[
        bool,
        Field(
            description="Freeze the attention patterns at the real run in the replacement and model runs (the "
            "direct run always freezes patterns, norms and MLPs)."
        ),
    ] = True,
) -> GraphInterveneResult:
    """Test what an attribution graph claims: set or scale transcoder features at given positions and report each
    target logit's change three ways — direct (patterns, norms and MLPs frozen: exactly what the graph's edges
    predict, which is reported beside it), in the replacement model (downstream features re-encode), and in the
    real model with the features' decoder change added (attention frozen or not, as asked)."""

    def measure(model: LoadedModel) -> GraphInterveneMeasurement:
        return measure_intervention(model, prompt, transcoders, features, targets, freeze_attention)

    return await Toolkit.of(ctx).run(ctx, GraphInterveneResult, measure)


@family.resource(
    "graph://{graph_id}",
    name="graph",
    description="An attribution graph from `attribution_graph`, pruned, in Neuronpedia's graph JSON (metadata, "
    "qParams, nodes, links) — it opens unchanged in Neuronpedia's graph viewer and circuit-tracer's local server.",
    mime_type="application/json",
)
def graph(graph_id: str, ctx: ToolContext) -> str:
    return Toolkit.of(ctx).read("graph", graph_id).decode("utf-8")
