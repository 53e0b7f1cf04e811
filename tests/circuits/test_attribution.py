"""Edge attribution (EAP, EAP-IG) on `tiny`: equal to TransformerLens' edge attribution on a
multi-head variant; on the grouped-query `tiny` checked against TransformerLens' node scores, a finite
difference through one key/value group's input, and the completeness of integrated gradients."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from mcp import Client
from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch

from mcp_interp.core.circuits.attribution import EdgeAttribution, EdgeScores
from mcp_interp.core.circuits.edge_graph import build_graph
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.tokens import encode
from tests.circuits.common import CLEAN, CORRUPT, run_eap, tl_metric, tl_name


def test_graph_shape_under_grouped_query_attention() -> None:
    graph = build_graph(n_layers=3, n_heads=4, n_kv_heads=2)
    assert len(graph.writers) == 1 + 3 * 4 + 3
    assert len(graph.readers) == 3 * (4 + 2 + 2 + 1) + 1  # q per head, k and v per group, MLP; logits
    # Writers upstream of layer l's attention: embed + 5 per earlier layer; of its MLP: + its 4 heads.
    per_layer = [(4 + 2 + 2) * (1 + 5 * layer) + (1 + 5 * layer + 4) for layer in range(3)]
    assert len(graph.edges) == sum(per_layer) + (1 + 5 * 3)
    assert graph.heads_of_group(1) == [2, 3]


def test_edge_scores_equal_transformer_lens_on_a_multi_head_model(multi_head: LoadedModel) -> None:
    ours = run_eap(multi_head)
    tl = attribution_patch(
        multi_head.bridge,
        encode(multi_head.tokenizer, CLEAN).input_ids,
        encode(multi_head.tokenizer, CORRUPT).input_ids,
        tl_metric(multi_head),
        EdgeAttributionConfig(granularity="edge"),
    )
    summed: dict[tuple[str, str], float] = defaultdict(float)  # TransformerLens scores each position
    for (writer, reader), value in tl.edge_scores.items():
        summed[(tl_name(writer), tl_name(reader))] += value
    graph = ours.graph
    mine = {(str(graph.writers[w]), str(graph.readers[r])): float(ours.scores[w, r]) for w, r in graph.edges}
    assert set(mine) == set(summed)
    assert max(abs(mine[key] - summed[key]) for key in mine) < 1e-4
    assert max(abs(v) for v in mine.values()) > 0.05, "the scores must not all be ~0"


def test_grouped_query_writer_totals_equal_transformer_lens_node_scores(tiny: LoadedModel) -> None:
    """Σ over a writer's edges = its node attribution (the gradient at a write is the sum of the
    gradients of the inputs it feeds); TransformerLens scores nodes on grouped-query models."""
    ours = run_eap(tiny)
    tl = attribution_patch(
        tiny.bridge,
        encode(tiny.tokenizer, CLEAN).input_ids,
        encode(tiny.tokenizer, CORRUPT).input_ids,
        tl_metric(tiny),
        EdgeAttributionConfig(granularity="node"),
    )
    nodes: dict[str, float] = defaultdict(float)
    for node, value in tl.node_scores.items():
        nodes[tl_name(node)] += value
    totals = ours.scores.sum(dim=1)
    for i, writer in enumerate(ours.graph.writers):
        assert float(totals[i]) == pytest.approx(nodes[str(writer)], abs=1e-4), str(writer)


def test_a_key_group_edge_equals_a_finite_difference_through_that_input_alone(tiny: LoadedModel) -> None:
    """Writer L0H1 → reader L1KV0.k: add ε·(clean − corrupt write of L0H1) to the key input of group 0
    at layer 1 only (every other reader unchanged) and differentiate the metric numerically."""
    ours = run_eap(tiny)
    graph = ours.graph
    w = next(i for i, x in enumerate(graph.writers) if str(x) == "L0H1")
    r = next(i for i, x in enumerate(graph.readers) if str(x) == "L1KV0.k")
    tok = tiny.tokenizer
    good, bad = tok.convert_tokens_to_ids("mary"), tok.convert_tokens_to_ids("john")
    clean_ids, corrupt_ids = encode(tok, CLEAN).input_ids, encode(tok, CORRUPT).input_ids
    tiny.bridge.set_use_attn_result(True)
    tiny.bridge.set_use_split_qkv_input(True)
    try:
        _, clean_cache = tiny.bridge.run_with_cache(clean_ids)
        _, corrupt_cache = tiny.bridge.run_with_cache(corrupt_ids)
        delta = (clean_cache["blocks.0.attn.hook_result"] - corrupt_cache["blocks.0.attn.hook_result"])[:, :, 1]

        def metric(scale: float) -> float:
            def nudge(values: torch.Tensor, hook: object) -> torch.Tensor:
                values = values.clone()
                values[:, :, 0] += scale * delta
                return values

            with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=[("blocks.1.attn.hook_k_input", nudge)]):
                logits = tiny.bridge(corrupt_ids)[0, -1].double()
            return float(logits[good] - logits[bad])

        eps = 1e-3
        derivative = (metric(eps) - metric(-eps)) / (2 * eps)
    finally:
        tiny.bridge.set_use_attn_result(False)
        tiny.bridge.set_use_split_qkv_input(False)
    assert float(ours.scores[w, r]) == pytest.approx(derivative, abs=2e-4)
    assert abs(derivative) > 1e-3, "pick an edge that matters"


def test_integrated_gradients_attribute_the_whole_gap_to_the_embeddings(tiny: LoadedModel) -> None:
    """Completeness: the model is a function of its input embeddings, and the embeddings' summed edge
    attribution under EAP-IG is a Riemann sum of ∫ ∇m · Δe dα = m(clean) − m(corrupt)."""
    ig = run_eap(tiny, ig_steps=48, integrated=True)
    gap = float((ig.clean_metric - ig.corrupt_metric).sum())
    embed_total = float(ig.scores[0].sum())
    assert embed_total == pytest.approx(gap, rel=0.03)
    eap = run_eap(tiny)
    assert abs(float(eap.scores[0].sum()) - gap) > abs(embed_total - gap), "IG must be the better estimate here"


def test_model_flags_are_restored(tiny: LoadedModel) -> None:
    run_eap(tiny)
    cfg = tiny.bridge.cfg
    assert (cfg.use_attn_result, cfg.use_split_qkv_input, cfg.use_hook_mlp_in) == (False, False, False)


@pytest.mark.anyio
async def test_edge_attribution_over_mcp_with_its_graph_figure(tiny_client: Client) -> None:
    import base64

    from tests.helpers import assert_valid_structured, error_text, png_text, tools_by_name

    arguments = {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT, "correct": "mary", "incorrect": "john"}
    tools = await tools_by_name(tiny_client)
    result = assert_valid_structured(
        tools["edge_attribution"], await tiny_client.call_tool("edge_attribution", {**arguments, "top_k": 10})
    )
    figure = await tiny_client.read_resource(result["figure_uri"])
    ig = assert_valid_structured(
        tools["edge_attribution"],
        await tiny_client.call_tool("edge_attribution", {**arguments, "method": "eap-ig", "ig_steps": 4}),
    )
    bad_steps = await tiny_client.call_tool("edge_attribution", {**arguments, "method": "eap-ig", "ig_steps": 0})
    too_many = await tiny_client.call_tool("edge_attribution", {**arguments, "ig_steps": 10_000})
    unequal = await tiny_client.call_tool("edge_attribution", {**arguments, "corrupt_prompts": ["when mary went"]})
    assert len(result["edges"]) == 10 and result["n_edges"] == 190 and result["n_readers"] == 28  # see the shape test
    scores = [abs(e["score"]) for e in result["edges"]]
    assert scores == sorted(scores, reverse=True)
    assert result["kv_groups"] == ["L*KV0: H0-H1", "L*KV1: H2-H3"]
    assert all(e["per_example"] == pytest.approx([e["score"]]) for e in result["edges"])  # one pair
    description = png_text(base64.b64decode(figure.contents[0].blob))["Description"]  # type: ignore[union-attr]
    top = result["edges"][0]
    assert (
        f"{top['writer']} → {top['reader'].rsplit('.', 1)[0] if '.' in top['reader'] else top['reader']}" in description
    )
    assert ig["ig_steps"] == 4 and ig["embed_total_vs_gap"] is not None
    assert "1 to 64" in error_text(bad_steps) and "1 to 64" in error_text(too_many)
    assert "same number of tokens" in error_text(unequal)


def test_edge_scores_per_pair_average_to_the_scores_and_match_one_pair_runs(tiny: LoadedModel) -> None:
    from mcp_interp.core.engine.patching.pairs import prepare_pairs

    pairs_clean = [CLEAN[0], "when tom and james went to the park , james gave a ball to"]
    pairs_corrupt = [CORRUPT[0], "when tom and james went to the park , tom gave a ball to"]

    def eap(clean: list[str], corrupt: list[str], good: list[str], bad: list[str]) -> EdgeScores:
        pairs = prepare_pairs(tiny, clean, corrupt, good, bad)
        job = EdgeAttribution(
            backend=tiny.backend, clean=pairs.clean, corrupt=pairs.corrupt, metric=pairs.readout.from_logits
        )
        list(job.steps())
        assert job.result is not None
        return job.result

    both = eap(pairs_clean, pairs_corrupt, ["mary", "tom"], ["john", "james"])
    second = eap(pairs_clean[1:], pairs_corrupt[1:], ["tom"], ["james"])
    assert torch.allclose(both.per_pair.mean(dim=0), both.scores)
    assert (both.per_pair[1] - second.scores).abs().max().item() < 1e-6
