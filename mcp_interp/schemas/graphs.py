"""Results of the graphs family: ``attribution_graph`` and ``graph_intervene``.

An attribution graph explains one next-token prediction with a *local replacement model*: each MLP replaced
by a transcoder (sparse features that read the MLP's input and write its output), the attention patterns and
norm scales frozen at their values in the real forward, and one *error node* per layer and position holding
what the transcoder misses, so the replacement reproduces the model exactly. Nodes: active features, error
nodes, input tokens (embeddings), target logits. An edge source → target is the source's direct linear effect
on the target's pre-activation (a feature) or demeaned logit (logit − mean logit), under those freezes. On a
model that soft-caps its logits (``logit_softcap``, Gemma-2) the logits meant are the pre-cap ones.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mcp_interp.schemas.common import Measurement, Provenance

NodeKind = Literal["feature", "error", "token", "logit"]
LOGIT_SOFTCAP = (
    "None: uncapped. c: logits soft-capped (y = c·tanh(x/c)); logits here are pre-cap x (explained exactly), "
    "probabilities after the cap."
)

TranscoderKind = Literal["transcoder_set", "cross_layer_transcoder"]
"""One transcoder per layer, or cross-layer transcoders (each layer's features write to every later MLP)."""


class TranscoderInfo(BaseModel):
    """Which transcoders produced the features, as read from their files."""

    source: str = Field(description="The `transcoders` argument as given (a folder or a hub id).")
    folder: str = Field(description="Where the files were read (the folder, or its place in a local cache).")
    scan: str = Field(description="circuit-tracer's identifier of the set (hub reference or folder).")
    kind: TranscoderKind = Field(
        description="transcoder_set: one transcoder per layer, each writing to its own layer; "
        "cross_layer_transcoder: a layer-l feature writes to every layer from l on."
    )
    activation: Literal["relu", "jumprelu", "topk"] = Field(
        description="relu: a = max(pre, 0); jumprelu: a = pre where pre > the feature's threshold, else 0; "
        "topk: the k largest pre-activations per token kept, the rest 0."
    )
    n_layers: int = Field(description="Layers with a transcoder (= the model's layers).")
    d_transcoder: int = Field(description="Features per layer; feature ids are 0..d_transcoder-1.")
    feature_input_hook: str = Field(description="What each transcoder reads, circuit-tracer's name (e.g. mlp.hook_in).")
    feature_output_hook: str = Field(description="What it writes, circuit-tracer's name (e.g. hook_mlp_out).")
    skip_connection: bool = Field(description="Whether the transcoders have a linear skip path (W_skip).")


class LogitTarget(BaseModel):
    token: str = Field(description="The output token (leading space shown, ' Paris').")
    token_id: int
    probability: float = Field(
        description="Its next-token probability in the real model, 0..1; its weight in influence."
    )
    logit: float = Field(description="Its raw logit (pre-cap if `logit_softcap`).")


class NodeCounts(BaseModel):
    features_active: int = Field(description="Active (non-zero) transcoder features at positions with nodes.")
    features_in_graph: int = Field(
        description="Active features whose incoming edges were computed (at most max_feature_nodes, chosen by "
        "influence when there are more): the graph's feature nodes before pruning."
    )
    feature_nodes_kept: int = Field(description="Feature nodes left after pruning.")
    error_nodes: int = Field(description="Error nodes before pruning (layers × positions with nodes).")
    error_nodes_kept: int
    token_nodes: int = Field(description="Input-token nodes (always kept).")
    logit_nodes: int = Field(description="Target-logit nodes (always kept).")
    edges_nonzero: int = Field(description="Non-zero edges of the unpruned graph.")
    edges_kept: int = Field(description="Edges left after pruning, both ends kept (the links of graph://).")


class GraphNode(BaseModel):
    """One node of the pruned graph, as drawn by the view (the complete list is in graph://)."""

    node_id: str = Field(
        description="Neuronpedia's node id: '{layer}_{feature}_{position}' (feature), '{layer}_-1_{position}' "
        "(error), 'E_{token_id}_{position}' (token), '{n_layers+1}_{token_id}_{position}' (logit)."
    )
    kind: NodeKind
    layer: int | None = Field(description="Layer (features and errors); None for tokens and logits.")
    position: int = Field(description="Token position, 0-based (logits: the last position).")
    feature: int | None = Field(default=None, description="Feature id within its layer (features only).")
    activation: float | None = Field(default=None, description="The feature's activation (features only).")
    influence: float = Field(
        description="Share of the total influence on the target logits (probability-weighted) flowing through this "
        "node along all paths, 0..1 (logits: 0)."
    )
    cumulative: float = Field(
        description="Share of the total influence held by the nodes ranked at or above this one, 0..1: small = "
        "important; a node survives the node threshold τ roughly when cumulative ≤ τ (the view's slider)."
    )
    label: str = Field(description="The token at this position (features, errors, tokens) or the output token.")


class GraphLink(BaseModel):
    source: str = Field(description="Source node_id.")
    target: str = Field(description="Target node_id.")
    weight: float = Field(
        description="Direct effect: the change of the target's pre-activation (a feature) or demeaned logit (a logit) "
        "caused by the source's activation (or error vector, or embedding), all else frozen; signed."
    )


class TopFeature(BaseModel):
    node_id: str
    layer: int
    position: int
    token: str = Field(description="The token at the feature's position.")
    feature: int
    activation: float = Field(description="Its activation at that position.")
    influence: float = Field(description="Its share of the total influence on the target logits, 0..1.")
    direct_logit_effect: float = Field(
        description="Its edge to the top target logit: the change of that demeaned logit its activation causes "
        "directly (signed)."
    )
    activations: list[float] = Field(
        description="The feature's activation at every position of the prompt (0 where it is off), in order."
    )


class GraphTiming(BaseModel):
    forward_s: float = Field(description="Seconds in forward passes (the real one, the frozen batched one, the check).")
    backward_s: float = Field(description="Seconds in backward passes and their contraction into edge rows.")
    pruning_s: float = Field(description="Seconds in influence, pruning and the scores.")
    total_s: float = Field(description="Wall time of the whole graph, seconds.")


class AttributionGraphMeasurement(Measurement):
    prompt: str
    tokens: list[str] = Field(description="The prompt's tokens as the model read them (this server's tokenization).")
    transcoders: TranscoderInfo
    targets: list[LogitTarget] = Field(description="The logit nodes, most probable first.")
    logit_softcap: float | None = Field(description=LOGIT_SOFTCAP)
    targets_probability: float = Field(description="Their summed next-token probability, 0..1.")
    first_node_position: int = Field(
        description="0, or 1 when the first token is a special token (BOS): it then has no feature or error nodes."
    )
    node_threshold: float = Field(description="Nodes kept: the top ones holding this share of the total influence.")
    edge_threshold: float = Field(description="Edges kept: the top ones holding this share of the edge influence.")
    max_feature_nodes: int = Field(description="At most this many features get their incoming edges computed.")
    counts: NodeCounts
    replacement_score: float = Field(
        description="Share of the end-to-end influence from the input tokens to the logits that passes through "
        "features only rather than error nodes, 0..1 (1: the transcoders explain everything)."
    )
    completeness_score: float = Field(
        description="Influence-weighted mean fraction of each node's input that comes from features and tokens "
        "rather than error nodes, 0..1 (partial credit for mostly-explained nodes)."
    )
    kept_influence: float = Field(
        description="Share of the total node influence held by the nodes kept after pruning, 0..1."
    )
    replacement_logit_error: float = Field(
        description="max over the vocabulary of |logit of the replacement model (transcoders re-encoding their "
        "inputs, error nodes added, patterns and norm scales frozen) − logit of the real model| at the last "
        "position (pre-cap if `logit_softcap`): 0 up to float rounding when the replacement is exact (≤ 1e-3 in "
        "float32)."
    )
    top_features: list[TopFeature] = Field(description="The features with the largest influence, largest first.")
    nodes: list[GraphNode] = Field(
        description="The pruned graph's most influential nodes (with the tokens and logits they connect to), for the "
        "view; the complete graph is graph_uri."
    )
    links: list[GraphLink] = Field(
        description="The most influential edges among `nodes` (by edge influence); the complete list is graph_uri."
    )
    timing: GraphTiming
    graph_uri: str | None = Field(
        default=None,
        description="graph://… : the pruned graph in Neuronpedia's graph JSON (metadata, qParams, nodes, links), "
        "which Neuronpedia's and circuit-tracer's viewers open unchanged.",
    )
    figure_uri: str | None = Field(default=None, description="figure://… : the pruned graph drawn layer × position.")


class AttributionGraphResult(Provenance, AttributionGraphMeasurement):
    pass


class FeatureIntervention(BaseModel):
    """Set (``value``) or scale (``scale``) one feature's activation at one position."""

    model_config = ConfigDict(extra="forbid")  # an input: a key it does not take is refused, never ignored

    layer: int = Field(description="The feature's layer, 0-based.")
    position: int = Field(description="Token position, 0-based; negative counts from the end (−1 = last).")
    feature: int = Field(description="Feature id within the layer, 0..d_transcoder-1.")
    value: float | None = Field(default=None, description="The new activation (0 removes the feature).")
    scale: float | None = Field(
        default=None, description="Instead of value: multiply the feature's activation in the real run by this."
    )


class InterventionApplied(BaseModel):
    layer: int
    position: int
    token: str = Field(description="The token at that position.")
    feature: int
    clean_activation: float = Field(description="The feature's activation in the real run (0 if off).")
    new_activation: float


class TargetChange(BaseModel):
    token: str
    token_id: int
    clean_logit: float
    clean_probability: float
    predicted_direct: float = Field(
        description="The graph's prediction: Σ over the intervened features of their edges to this logit × "
        "(new − clean activation) / clean activation — the change of the demeaned logit through direct paths."
    )
    direct: float = Field(
        description="Measured change of the demeaned logit with the attention patterns, norm scales and every MLP "
        "write frozen (only the intervened features' decoder change flows, linearly): equals predicted_direct up to "
        "float rounding."
    )
    replacement: float = Field(
        description="Measured change of the demeaned logit in the replacement model: transcoders re-encode their "
        "changed inputs (downstream features respond through their activation function), error nodes held fixed."
    )
    model: float = Field(
        description="Measured change of the demeaned logit in the real model with the feature's decoder change added "
        "to its MLP write (downstream MLPs are the real ones)."
    )
    model_probability: float = Field(description="The token's probability in that real-model run, 0..1.")


InterventionRunName = Literal["direct", "replacement", "model"]


class InterventionRun(BaseModel):
    name: InterventionRunName
    attention_frozen: bool = Field(description="Attention patterns held at their values in the real run.")
    norm_scales_frozen: bool = Field(description="Norm denominators held at their values in the real run.")
    mlps: str = Field(description="What the MLPs write in this run.")
    top_token: str = Field(description="The most probable next token in this run.")
    kl_from_clean: float = Field(description="KL(real run ‖ this run) of the next-token distribution, nats, ≥ 0.")


class GraphInterveneMeasurement(Measurement):
    prompt: str
    tokens: list[str]
    transcoders: TranscoderInfo
    interventions: list[InterventionApplied]
    freeze_attention: bool = Field(description="Whether the replacement and model runs froze the attention patterns.")
    runs: list[InterventionRun]
    targets: list[TargetChange] = Field(description="Every target logit, most probable first.")
    logit_softcap: float | None = Field(description=LOGIT_SOFTCAP)
    max_prediction_error: float = Field(
        description="max over the targets of |direct − predicted_direct|: how exactly the graph's edges predict "
        "the frozen (linear) intervention; float rounding only (≲ 1e-4)."
    )


class GraphInterveneResult(Provenance, GraphInterveneMeasurement):
    pass
