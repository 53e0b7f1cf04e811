"""Graph tools: ``attribution_graph`` (circuit tracing with transcoders: the local replacement model's feature graph,
pruned, stored as Neuronpedia JSON under ``graph://``) and ``graph_intervene`` (set or scale features and compare
the logits with what the graph predicts). The science is in ``core/graphs/``."""

from __future__ import annotations

import json
from typing import Annotated

from mcp.types import CallToolResult
from pydantic import Field, WithJsonSchema

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.graphs import figures as graphs_figures
from mcp_interp.core.graphs.intervene import graph_intervene as measure_intervention
from mcp_interp.core.graphs.job import DEFAULT_MAX_FEATURE_NODES, AttributionGraphJob
from mcp_interp.mcp.arguments import Background
from mcp_interp.mcp.family import Family
from mcp_interp.mcp.toolkit import ToolContext, Toolkit, tool_arguments
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
        description="circuit-tracer format (per-layer or cross-layer): a folder with config.yaml, or a hub id in the "
        "local cache (never downloaded)."
    ),
]
TargetsArg = Annotated[
    list[str] | None,
    Field(description="Output tokens (' Paris'); default: the top ones up to 95 % probability, ≤ 10."),
]


def pre_cap(cap: float | None) -> str:
    """What the summary says of a soft-capped model's logits (the result's ``logit_softcap``)."""
    return "" if cap is None else f" (pre-cap logits: the model caps them at {cap:g}·tanh(x/{cap:g}))"


@family.tool(view="attribution-graph", background=True)
async def attribution_graph(
    prompt: Annotated[str, Field(description="One prompt; the graph explains its next-token prediction.")],
    transcoders: TranscodersArg,
    ctx: ToolContext,
    targets: TargetsArg = None,
    node_threshold: Annotated[float, Field(description="Keep nodes holding this share of the influence, 0..1.")] = 0.8,
    edge_threshold: Annotated[float, Field(description="Then edges holding this share, 0..1.")] = 0.98,
    max_feature_nodes: Annotated[
        int, Field(description="Active features whose incoming edges are computed (by influence); time ∝ it.")
    ] = DEFAULT_MAX_FEATURE_NODES,
    top_k: Annotated[int, Field(description="Top features listed with per-token activations, 1..50.")] = 10,
    background: Background = False,
) -> Annotated[CallToolResult, AttributionGraphResult]:
    """Attribution graph (Ameisen et al. 2025): MLPs as transcoders, attention and norms frozen, error nodes keep
    it exact; direct effects between features, errors, tokens and target logits, pruned by influence; Neuronpedia
    JSON at graph://. Test claims with graph_intervene."""
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
        f"replacement_logit_error {result.replacement_logit_error:.1e}. Targets{pre_cap(result.logit_softcap)}: "
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
        WithJsonSchema({"type": "array", "items": {"type": "object"}}),  # by shape: the description names the keys
        Field(description="{layer, position (−1 = last), feature, value (0 removes it) or scale (× its activation)}."),
    ],
    ctx: ToolContext,
    targets: TargetsArg = None,
    freeze_attention: Annotated[
        bool, Field(description="Freeze attention patterns in the replacement and model runs (direct: always).")
    ] = True,
) -> Annotated[CallToolResult, GraphInterveneResult]:
    """Test an attribution graph: set or scale transcoder features; each target logit's change direct (all
    frozen: what the edges predict), in the replacement model, and in the real model."""

    def measure(model: LoadedModel) -> GraphInterveneMeasurement:
        return measure_intervention(model, prompt, transcoders, features, targets, freeze_attention)

    def summary(r: GraphInterveneResult) -> str:
        changes = "; ".join(
            f"{t.token!r} direct {t.direct:+.3f} (graph {t.predicted_direct:+.3f}), replacement {t.replacement:+.3f}, "
            f"model {t.model:+.3f}"
            for t in r.targets[:3]
        )
        error = f"max prediction error {r.max_prediction_error:.1e}"
        which = f"logit changes{pre_cap(r.logit_softcap)}"
        return f"graph_intervene on {len(r.interventions)} features, {which}: {changes}; {error}."

    return await Toolkit.of(ctx).run(ctx, GraphInterveneResult, measure, summary=summary)


@family.resource(
    "graph://{graph_id}",
    name="graph",
    description="An attribution graph from `attribution_graph`, pruned, in Neuronpedia's graph JSON (metadata, "
    "qParams, nodes, links) — it opens unchanged in Neuronpedia's graph viewer and circuit-tracer's local server.",
    mime_type="application/json",
)
def graph(graph_id: str, ctx: ToolContext) -> str:
    return Toolkit.of(ctx).read("graph", graph_id).decode("utf-8")
