"""Edge attribution (circuits family) on `tiny`: equal to TransformerLens' edge attribution on a
multi-head variant, and on the grouped-query `tiny` checked against TransformerLens' node scores, a
finite difference through one key/value group's input, and the completeness of integrated gradients."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
import torch
from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch

from mcp_interp.core.circuits.attribution import EdgeAttribution, EdgeScores
from mcp_interp.core.circuits.graph import build_graph
from mcp_interp.core.tokens import encode
from mcp_interp.models import LoadedModel, boot, build_tiny

CLEAN = ["when mary and john went to the store , john gave a drink to"]
CORRUPT = ["when mary and john went to the store , mary gave a drink to"]


@pytest.fixture(scope="module")
def multi_head() -> LoadedModel:
    hf_model, tokenizer = build_tiny(kv_heads=4)
    return boot("tiny-mha", "tiny", "tiny-mha", hf_model, tokenizer)


def run_eap(model: LoadedModel, ig_steps: int = 1, integrated: bool = False) -> EdgeScores:
    tok = model.tokenizer
    good, bad = tok.convert_tokens_to_ids("mary"), tok.convert_tokens_to_ids("john")

    def metric(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return (logits[:, good] - logits[:, bad]).to(torch.float64)

    job = EdgeAttribution(model.bridge, encode(tok, CLEAN), encode(tok, CORRUPT), metric, ig_steps, integrated)
    steps = list(job.steps())
    assert len(steps) == job.total_steps()
    assert job.result is not None
    return job.result


def tl_metric(model: LoadedModel) -> Any:
    tok = model.tokenizer
    good, bad = tok.convert_tokens_to_ids("mary"), tok.convert_tokens_to_ids("john")
    return lambda logits: logits[0, -1, good] - logits[0, -1, bad]


def tl_name(node: Any) -> str:
    if node.kind == "embed":
        return "embed"
    if node.kind == "attn_head_out":
        return f"L{node.layer}H{node.head}"
    if node.kind == "mlp_out":
        return f"L{node.layer}MLP"
    if node.kind == "logits":
        return "logits"
    if node.kind == "mlp_in":
        return f"L{node.layer}MLP.in"
    if node.kind == "q_input":
        return f"L{node.layer}H{node.head}.q"
    return f"L{node.layer}KV{node.head}.{node.kind[0]}"


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
async def test_edge_attribution_over_mcp_with_its_graph_figure(tiny_session: Any) -> None:
    import base64

    from mcp import Client

    from mcp_interp.mcp.server import build_server
    from tests.mcp_helpers import assert_valid_structured, error_text, png_text, tools_by_name

    arguments = {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT, "correct": "mary", "incorrect": "john"}
    async with Client(build_server(tiny_session)) as client:
        tools = await tools_by_name(client)
        result = assert_valid_structured(
            tools["edge_attribution"], await client.call_tool("edge_attribution", {**arguments, "top_k": 10})
        )
        figure = await client.read_resource(result["figure_uri"])
        ig = assert_valid_structured(
            tools["edge_attribution"],
            await client.call_tool("edge_attribution", {**arguments, "method": "eap-ig", "ig_steps": 4}),
        )
        bad_steps = await client.call_tool("edge_attribution", {**arguments, "method": "eap-ig", "ig_steps": 0})
        too_many = await client.call_tool("edge_attribution", {**arguments, "ig_steps": 10_000})
        unequal = await client.call_tool("edge_attribution", {**arguments, "corrupt_prompts": ["when mary went"]})
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


# --- path_patch ----------------------------------------------------------------------------------


def run_path(model: LoadedModel, sender: str, component: str = "q", receivers: Any = None) -> Any:
    from mcp_interp.core.circuits.path import PathPatchJob
    from mcp_interp.core.jobs import drain

    job = PathPatchJob(model, CLEAN * 2, CORRUPT * 2, "mary", "john", sender, receivers, component)
    drain(job)
    assert job.result is not None
    return job.result


@pytest.mark.parametrize("component", ["q", "k", "v"])
def test_path_patching_equals_transformer_lens_direct_path(multi_head: LoadedModel, component: str) -> None:
    from transformer_lens import patching

    ours = run_path(multi_head, "L0H1", component)
    for receiver in ours.receivers:
        assert len(receiver.per_example_patched) == 2
        assert sum(receiver.per_example_patched) / 2 == pytest.approx(receiver.patched_logit_diff)
    tok = multi_head.tokenizer
    clean_ids, corrupt_ids = encode(tok, CLEAN * 2).input_ids, encode(tok, CORRUPT * 2).input_ids
    good, bad = tok.convert_tokens_to_ids("mary"), tok.convert_tokens_to_ids("john")
    _, clean_cache = multi_head.bridge.run_with_cache(clean_ids)
    _, corrupt_cache = multi_head.bridge.run_with_cache(corrupt_ids)
    reference = patching.get_act_patch_direct_path(
        multi_head.bridge,
        corrupt_ids,
        clean_cache,
        corrupt_cache,
        lambda logits: (logits[:, -1, good] - logits[:, -1, bad]).mean(),
        0,
        1,
        component,  # type: ignore[arg-type]
        verbose=False,
    ).double()
    grid = torch.tensor([[v if v is not None else 0.0 for v in row] for row in ours.patched_logit_diff[1:]])
    assert (grid.double() - reference[1:]).abs().max().item() < 1e-4
    assert ours.patched_logit_diff[0] == [None] * 4  # not after the sender


def test_grouped_query_key_paths_are_per_group_and_match_a_loop(tiny: LoadedModel) -> None:
    ours = run_path(tiny, "L0H2", "k")
    assert len(ours.patched_logit_diff[1]) == 2  # two key/value groups
    tok = tiny.tokenizer
    clean_ids, corrupt_ids = encode(tok, CLEAN * 2).input_ids, encode(tok, CORRUPT * 2).input_ids
    good, bad = tok.convert_tokens_to_ids("mary"), tok.convert_tokens_to_ids("john")
    tiny.bridge.set_use_attn_result(True)
    tiny.bridge.set_use_split_qkv_input(True)
    try:
        _, clean_cache = tiny.bridge.run_with_cache(clean_ids)
        _, corrupt_cache = tiny.bridge.run_with_cache(corrupt_ids)
        delta = (clean_cache["blocks.0.attn.hook_result"] - corrupt_cache["blocks.0.attn.hook_result"])[:, :, 2]
        for layer in (1, 2):
            for group in (0, 1):

                def add(values: torch.Tensor, hook: object, group: int = group) -> torch.Tensor:
                    values = values.clone()
                    values[:, :, group] += delta
                    return values

                with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_k_input", add)]):
                    final = tiny.bridge(corrupt_ids)[:, -1].double()
                expected = float((final[:, good] - final[:, bad]).mean())
                assert ours.patched_logit_diff[layer][group] == pytest.approx(expected, abs=1e-5)
    finally:
        tiny.bridge.set_use_attn_result(False)
        tiny.bridge.set_use_split_qkv_input(False)


def test_an_mlp_path_to_the_logits_is_its_direct_effect(tiny: LoadedModel) -> None:
    ours = run_path(tiny, "L1MLP", receivers="logits")
    tok = tiny.tokenizer
    clean_ids, corrupt_ids = encode(tok, CLEAN * 2).input_ids, encode(tok, CORRUPT * 2).input_ids
    good, bad = tok.convert_tokens_to_ids("mary"), tok.convert_tokens_to_ids("john")
    _, clean_cache = tiny.bridge.run_with_cache(clean_ids)
    _, corrupt_cache = tiny.bridge.run_with_cache(corrupt_ids)
    delta = clean_cache["blocks.1.hook_mlp_out"] - corrupt_cache["blocks.1.hook_mlp_out"]

    def add(values: torch.Tensor, hook: object) -> torch.Tensor:
        return values + delta

    with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=[("blocks.2.hook_resid_post", add)]):
        final = tiny.bridge(corrupt_ids)[:, -1].double()
    assert ours.receivers[0].receiver == "logits"
    assert ours.receivers[0].patched_logit_diff == pytest.approx(
        float((final[:, good] - final[:, bad]).mean()), abs=1e-5
    )


def test_path_patch_bad_input_says_how_to_fix_it(tiny: LoadedModel) -> None:
    from mcp_interp.errors import InputError

    for sender, receivers, component, message in [
        ("L9H0", None, "q", "does not exist"),
        ("head 3", None, "q", "'L5H1' or an MLP"),
        ("L1H0", ["L0H2"], "q", "not after the sender"),
        ("L0H0", ["L1KV0"], "q", "key/value group"),
        ("L0H0", ["L1H9"], "q", "does not exist"),
        ("L0H0", None, "z", "'q', 'k' or 'v'"),
    ]:
        with pytest.raises(InputError, match=message):
            run_path(tiny, sender, component, receivers)
    # A query head named as a key receiver means its group.
    grouped = run_path(tiny, "L0H0", "k", ["L1H3", "L1KV1"])
    assert [r.receiver for r in grouped.receivers] == ["L1KV1.k"]


@pytest.mark.anyio
async def test_path_patch_over_mcp(tiny_session: Any) -> None:
    import base64

    from mcp import Client

    from mcp_interp.figures import heatmap_size, png_size
    from mcp_interp.mcp.server import build_server
    from tests.mcp_helpers import assert_valid_structured, error_text, tools_by_name

    arguments = {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT, "correct": "mary", "incorrect": "john"}
    async with Client(build_server(tiny_session)) as client:
        tools = await tools_by_name(client)
        result = assert_valid_structured(
            tools["path_patch"], await client.call_tool("path_patch", {**arguments, "sender": "L0H1", "component": "v"})
        )
        figure = await client.read_resource(result["figure_uri"])
        backwards = await client.call_tool("path_patch", {**arguments, "sender": "L2H0", "receivers": ["L1H0"]})
    assert png_size(base64.b64decode(figure.contents[0].blob)) == heatmap_size(3, 2)  # type: ignore[union-attr]
    assert [len(row) for row in result["recovered"]] == [2, 2, 2] and result["recovered"][0] == [None, None]
    assert len(result["receivers"]) == 4 and result["receivers"][0]["receiver"].endswith(".v")
    assert "not after the sender" in error_text(backwards)


# --- circuit_faithfulness ------------------------------------------------------------------------


def faithfulness_job(model: LoadedModel, **kwargs: Any) -> Any:
    from mcp_interp.core.circuits.faithfulness_job import CircuitFaithfulnessJob
    from mcp_interp.core.jobs import drain

    pairs_clean = [CLEAN[0], "when tom and james went to the park , james gave a ball to"]
    pairs_corrupt = [CORRUPT[0], "when tom and james went to the park , tom gave a ball to"]
    job = CircuitFaithfulnessJob(model, pairs_clean, pairs_corrupt, ["mary", "tom"], ["john", "james"], **kwargs)
    drain(job)
    assert job.result is not None
    return job.result


def test_faithfulness_sanity_pins_full_graph_one_empty_circuit_zero(tiny: LoadedModel) -> None:
    full = faithfulness_job(tiny, top_k=10**6)
    assert full.n_edges == full.total_edges == 190
    assert full.faithfulness.value == pytest.approx(1.0, abs=1e-4)
    assert full.faithfulness.per_example == pytest.approx([1.0, 1.0], abs=1e-4)
    empty = faithfulness_job(tiny, top_k=0)
    assert empty.n_edges == 0 and empty.faithfulness.value == pytest.approx(0.0, abs=1e-4)
    assert len(empty.random_baseline) == 5
    assert [p.k for p in full.curve] == [10, 25, 50, 100, 190]
    assert full.curve[-1].faithfulness == pytest.approx(1.0, abs=1e-4)


def test_faithfulness_equals_transformer_lens_on_a_multi_head_model(multi_head: LoadedModel) -> None:
    """TransformerLens' ablate-outside faithfulness on the same circuit, its edges at every position."""
    from transformer_lens.tools.analysis.attribution_patching import FaithfulnessConfig, Node, faithfulness

    eap = run_eap(multi_head)
    graph = eap.graph
    top = sorted(graph.edges, key=lambda e: -abs(float(eap.scores[e])))[:12]
    names = [{"writer": str(graph.writers[w]), "reader": str(graph.readers[r])} for w, r in top]
    from mcp_interp.core.circuits.faithfulness_job import CircuitFaithfulnessJob
    from mcp_interp.core.jobs import drain

    job = CircuitFaithfulnessJob(multi_head, CLEAN, CORRUPT, "mary", "john", edges=names)
    drain(job)
    assert job.result is not None
    seq = encode(multi_head.tokenizer, CLEAN).input_ids.shape[1]
    n_layers = multi_head.bridge.cfg.n_layers

    def node(kind: str, layer: int, index: int, position: int, writer: bool) -> Any:
        if writer:
            if kind == "embed":
                return Node("embed", position)
            return Node("attn_head_out", position, layer, index) if kind == "head" else Node("mlp_out", position, layer)
        if kind == "logits":
            return Node("logits", position, n_layers - 1)
        if kind == "mlp":
            return Node("mlp_in", position, layer)
        return Node(f"{kind}_input", position, layer, index)

    circuit = [
        (
            node(graph.writers[w].kind, graph.writers[w].layer, graph.writers[w].index, p, True),
            node(graph.readers[r].kind, graph.readers[r].layer, graph.readers[r].index, p, False),
        )
        for w, r in top
        for p in range(seq)
    ]
    tok = multi_head.tokenizer
    good, bad = tok.convert_tokens_to_ids("mary"), tok.convert_tokens_to_ids("john")
    reference = faithfulness(
        multi_head.bridge,
        encode(tok, CLEAN).input_ids,
        encode(tok, CORRUPT).input_ids,
        lambda logits: logits[0, -1, good] - logits[0, -1, bad],
        circuit,
        FaithfulnessConfig(ablation="corrupt"),
    )
    assert job.result.faithfulness.value == pytest.approx(float(reference.recovered), abs=1e-4)
    assert abs(job.result.faithfulness.value) > 0.0 and job.result.faithfulness.value != pytest.approx(1.0, abs=1e-3)


def test_faithfulness_bad_input(tiny: LoadedModel) -> None:
    from mcp_interp.errors import InputError

    for kwargs, message in [
        ({"edges": [{"writer": "L9H0", "reader": "logits"}]}, "Unknown writer"),
        ({"edges": [{"writer": "L0H0", "reader": "L0H1.q"}]}, "no edge L0H0 → L0H1.q"),
        ({"edges": [{"writer": "embed", "reader": "L0KV7.k"}]}, "Unknown reader"),
        ({"edges": [], "top_k": 3}, "either `edges`"),
        ({"top_k": 3, "random_circuits": 2}, "from 5 to 20"),
    ]:
        with pytest.raises(InputError, match=message):
            faithfulness_job(tiny, **kwargs)


@pytest.mark.anyio
async def test_circuit_faithfulness_over_mcp_with_its_curve(tiny_session: Any) -> None:
    import base64

    from mcp import Client

    from mcp_interp.mcp.server import build_server
    from tests.mcp_helpers import assert_valid_structured, png_text, tools_by_name

    arguments = {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT, "correct": "mary", "incorrect": "john"}
    async with Client(build_server(tiny_session)) as client:
        tools = await tools_by_name(client)
        result = assert_valid_structured(
            tools["circuit_faithfulness"], await client.call_tool("circuit_faithfulness", {**arguments, "top_k": 25})
        )
        figure = await client.read_resource(result["figure_uri"])
        explicit = assert_valid_structured(
            tools["circuit_faithfulness"],
            await client.call_tool(
                "circuit_faithfulness",
                {**arguments, "edges": [{"writer": "L2H1", "reader": "logits", "score": 0.3}], "random_circuits": 6},
            ),
        )
    assert result["n_edges"] == 25 and [p["k"] for p in result["curve"]] == [10, 25, 50, 100, 190]
    description = png_text(base64.b64decode(figure.contents[0].blob))["Description"]  # type: ignore[union-attr]
    assert "k=190: 1.0" in description
    assert explicit["n_edges"] == 1 and len(explicit["random_baseline"]) == 6 and explicit["curve"] == []


def test_find_circuit_returns_the_smallest_top_k_reaching_the_target(tiny: LoadedModel) -> None:
    """Bisection's answer k: its faithfulness reaches the target and k − 1 edges do not (checked here
    with circuit_faithfulness on the top k − 1 edges by the same attribution)."""
    from mcp_interp.core.circuits.faithfulness_job import FindCircuitJob
    from mcp_interp.core.jobs import drain

    clean = [CLEAN[0], "when tom and james went to the park , james gave a ball to"]
    corrupt = [CORRUPT[0], "when tom and james went to the park , tom gave a ball to"]
    job = FindCircuitJob(tiny, clean, corrupt, ["mary", "tom"], ["john", "james"], target=0.8)
    drain(job)
    found = job.result
    assert found is not None and 0 < found.n_edges < found.total_edges
    assert found.faithfulness.value >= 0.8
    below = faithfulness_job(tiny, top_k=found.n_edges - 1)
    assert below.faithfulness.value < 0.8
    assert [s.k for s in found.search] and all(0 < s.k < found.total_edges for s in found.search)
    assert len(found.random_baseline) == 5


@pytest.mark.anyio
async def test_find_circuit_over_mcp(tiny_session: Any) -> None:
    from mcp import Client

    from mcp_interp.mcp.server import build_server
    from tests.mcp_helpers import assert_valid_structured, error_text, tools_by_name

    arguments = {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT, "correct": "mary", "incorrect": "john"}
    async with Client(build_server(tiny_session)) as client:
        tools = await tools_by_name(client)
        found = assert_valid_structured(
            tools["find_circuit"], await client.call_tool("find_circuit", {**arguments, "target": 0.5})
        )
        bad = await client.call_tool("find_circuit", {**arguments, "target": 1.5})
    assert found["faithfulness"]["value"] >= 0.5 and len(found["edges"]) == found["n_edges"]
    assert found["figure_uri"].startswith("figure://")
    assert "(0, 1]" in error_text(bad)


# --- a known circuit: only one head moves information between positions -------------------------------


@pytest.fixture(scope="module")
def one_head_model() -> LoadedModel:
    """`tiny` with every head's output projection zeroed except L1H2's (amplified): attention is the only
    way information moves between positions, so the clean/corrupt difference (the name at position 9)
    reaches the answer position only through L1H2 — through its key/value group's inputs at position 9
    and its write at the answer."""
    hf_model, tokenizer = build_tiny()
    d_head = hf_model.config.head_dim
    with torch.no_grad():
        for layer, block in enumerate(hf_model.model.layers):
            weight = block.self_attn.o_proj.weight
            keep = weight[:, 2 * d_head : 3 * d_head].clone()
            weight.zero_()
            if layer == 1:
                weight[:, 2 * d_head : 3 * d_head] = 30 * keep
    return boot("tiny-one-head", "tiny", "tiny-one-head", hf_model, tokenizer)


def test_known_circuit_only_the_carrier_head_and_what_feeds_it_matter(one_head_model: LoadedModel) -> None:
    from mcp_interp.core.circuits.faithfulness_job import CircuitFaithfulnessJob
    from mcp_interp.core.jobs import drain

    eap = run_eap(one_head_model)
    graph = eap.graph
    assert abs(float((eap.clean_metric - eap.corrupt_metric).sum())) > 0.05, "the pair must differ"
    # Heads that write nothing have zero gradient at their query input: EAP gives those edges exactly 0.
    silent_q = [r for r, x in enumerate(graph.readers) if x.kind == "q" and str(x) != "L1H2.q"]
    assert float(eap.scores[:, silent_q].abs().max()) < 1e-9
    # Every edge out of a silent head is 0 too (its write is 0 in both runs).
    silent = [w for w, x in enumerate(graph.writers) if x.kind == "head" and str(x) != "L1H2"]
    assert float(eap.scores[silent].abs().max()) < 1e-9
    # The carrier's key/value group (group 1: heads 2-3) and its write are where the effect goes.
    carrier = next(w for w, x in enumerate(graph.writers) if str(x) == "L1H2")
    assert float(eap.scores[carrier].abs().sum()) > 1e-3

    def faithfulness_without(drop: set[tuple[int, int]]) -> float:
        kept = [{"writer": str(graph.writers[w]), "reader": str(graph.readers[r])} for w, r in graph.edges
                if (w, r) not in drop]  # fmt: skip
        job = CircuitFaithfulnessJob(one_head_model, CLEAN, CORRUPT, "mary", "john", edges=kept)
        drain(job)
        assert job.result is not None
        return job.result.faithfulness.value

    # Exact: ablating every edge into the silent heads' inputs changes nothing (faithfulness 1) …
    into_silent = {(w, r) for w, r in graph.edges if graph.readers[r].kind == "q" and r in silent_q}
    into_silent |= {
        (w, r) for w, r in graph.edges if graph.readers[r].kind in ("k", "v") and graph.readers[r].layer != 1
    }
    assert faithfulness_without(into_silent) == pytest.approx(1.0, abs=1e-4)
    # … while ablating the carrier's own out-edges removes the whole effect (faithfulness 0).
    out_of_carrier = {(w, r) for w, r in graph.edges if w == carrier}
    assert faithfulness_without(out_of_carrier) == pytest.approx(0.0, abs=1e-4)


def test_edge_scores_per_pair_average_to_the_scores_and_match_one_pair_runs(tiny: LoadedModel) -> None:
    from mcp_interp.core.circuits.pairs import prepare_pairs

    pairs_clean = [CLEAN[0], "when tom and james went to the park , james gave a ball to"]
    pairs_corrupt = [CORRUPT[0], "when tom and james went to the park , tom gave a ball to"]

    def eap(clean: list[str], corrupt: list[str], good: list[str], bad: list[str]) -> EdgeScores:
        pairs = prepare_pairs(tiny, clean, corrupt, good, bad)
        job = EdgeAttribution(tiny.bridge, pairs.clean, pairs.corrupt, pairs.readout.from_logits)
        list(job.steps())
        assert job.result is not None
        return job.result

    both = eap(pairs_clean, pairs_corrupt, ["mary", "tom"], ["john", "james"])
    second = eap(pairs_clean[1:], pairs_corrupt[1:], ["tom"], ["james"])
    assert torch.allclose(both.per_pair.mean(dim=0), both.scores)
    assert (both.per_pair[1] - second.scores).abs().max().item() < 1e-6


# --- a known circuit built by hand: a previous-token head feeding an induction head's key ---------------

INDUCTION_WORDS = ["when", "after", "then", "while", "and", "or", "but", "the", "a", "an"]
# "x A B y z A" → B. The corrupt prompt changes the first A, so nothing earlier matches the last token.
INDUCTION_CLEAN = ["the when after then while when", "a and or but an and", "an while the a when while"]
INDUCTION_CORRUPT = ["the but after then while when", "a when or but an and", "an then the a when while"]
INDUCTION_GOOD, INDUCTION_BAD = ["after", "or", "the"], ["then", "but", "a"]
# The only route from the changed token to the answer: its embedding is read by the previous-token head's
# value (at the next position), that head's write is read by the induction head's key, whose write is read
# by the unembedding.
INDUCTION_CHAIN = {("embed", "L0KV0.v"), ("L0H0", "L1KV0.k"), ("L1H0", "logits")}


@pytest.fixture(scope="module")
def induction_model() -> LoadedModel:
    """A 2-layer grouped-query Llama whose weights are written by hand (every other weight 0).

    Residual stream: dims 0-9 the token (one-hot over ``INDUCTION_WORDS``), 16-25 the previous token,
    32-41 the predicted token, 63 a constant 1. L0H0 (key/value group 0) is a previous-token head: its
    query and key read only the constant dim on RoPE's two fastest pairs, with the key rotated one
    position's angle so the score peaks at offset 1; its value copies the token into the previous-token
    dims. L1H0 (group 0) is an induction head: query = current token, key = previous token, on RoPE's
    slowest pairs (rope_theta 1e6, so content matches do not drift with distance); its value copies the
    attended token into the output dims, which the unembedding reads. MLPs and the other heads write 0.
    """
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from mcp_interp.models import tiny_tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir()))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="eager",  # type: ignore[call-arg]
    )
    model = LlamaForCausalLM(config).eval()
    d_head, token, previous, output, constant, amplitude = 16, 0, 16, 32, 63, 40.0
    content = [3, 4, 5, 6, 7, 11, 12, 13, 14, 15]  # RoPE pairs 3-7: angles ≤ 0.006 rad per position
    ids = [tokenizer.convert_tokens_to_ids(word) for word in INDUCTION_WORDS]
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        model.model.norm.weight.fill_(1.0)
        for block in model.model.layers:
            block.input_layernorm.weight.fill_(1.0)
            block.post_attention_layernorm.weight.fill_(1.0)
        embed = model.model.embed_tokens.weight
        embed[:, constant] = 1.0
        previous_head, induction_head = (block.self_attn for block in model.model.layers)
        for pair in (0, 1):
            angle = torch.tensor(1e6 ** (-2 * pair / d_head))
            previous_head.q_proj.weight[pair, constant] = amplitude
            previous_head.k_proj.weight[pair, constant] = amplitude * torch.cos(angle)
            previous_head.k_proj.weight[pair + d_head // 2, constant] = amplitude * torch.sin(angle)
        for i, (dim, word) in enumerate(zip(content, ids, strict=True)):
            embed[word, token + i] = 1.0
            previous_head.v_proj.weight[dim, token + i] = 1.0
            previous_head.o_proj.weight[previous + i, dim] = 1.0
            induction_head.q_proj.weight[dim, token + i] = amplitude
            induction_head.k_proj.weight[dim, previous + i] = amplitude
            induction_head.v_proj.weight[dim, token + i] = 1.0
            induction_head.o_proj.weight[output + i, dim] = 1.0
            model.lm_head.weight[word, output + i] = 10.0
    return boot("tiny-induction", "tiny", "tiny-induction", model, tokenizer)


def test_the_hand_built_induction_circuit_works(induction_model: LoadedModel) -> None:
    """The construction itself: L0H0 attends to the previous token, L1H0 to the token after the earlier
    copy of the current one, and the model predicts that token on the clean prompts only."""
    bridge, tok = induction_model.bridge, induction_model.tokenizer
    batch = encode(tok, INDUCTION_CLEAN)
    _, cache = bridge.run_with_cache(batch.input_ids)
    previous = cache["blocks.0.attn.hook_pattern"][:, 0]
    assert previous[:, 1:].argmax(-1).tolist() == [list(range(5))] * 3
    assert float(previous[:, 1:].max(-1).values.min()) > 0.99
    induction = cache["blocks.1.attn.hook_pattern"][:, 0, -1]  # last query
    assert induction.argmax(-1).tolist() == [2, 2, 2] and float(induction[:, 2].min()) > 0.99
    for prompts, expect_top in ((INDUCTION_CLEAN, True), (INDUCTION_CORRUPT, False)):
        logits = bridge(encode(tok, prompts).input_ids)[:, -1]
        top = [tok.convert_ids_to_tokens(int(i)) for i in logits.argmax(-1)]
        assert (top == INDUCTION_GOOD) is expect_top


def test_known_induction_circuit_is_found_confirmed_and_faithful(induction_model: LoadedModel) -> None:
    """EAP puts exactly the three edges of the chain on top, with the previous-token → induction key edge
    among them; exact path patching of L0H0 into the keys restores the whole gap at L1's group 0 and
    nothing at group 1; the three-edge circuit recovers ≈ 1 and the previous-token → key edge alone 0.

    Why not "the one edge alone recovers ≈ 1": faithfulness runs every edge outside the circuit on the
    corrupt prompt, so with only L0H0 → L1KV0.k kept, L0H0's own value input is the corrupt embedding
    and the induction head's write reaches the logits only through the ablated edge — the one edge then
    carries the corrupt run's value. The smallest faithful circuit is the whole path.
    """
    from mcp_interp.core.circuits.attribution import EdgeAttribution
    from mcp_interp.core.circuits.faithfulness_job import CircuitFaithfulnessJob
    from mcp_interp.core.circuits.pairs import prepare_pairs
    from mcp_interp.core.jobs import drain

    pairs = prepare_pairs(induction_model, INDUCTION_CLEAN, INDUCTION_CORRUPT, INDUCTION_GOOD, INDUCTION_BAD)
    job = EdgeAttribution(induction_model.bridge, pairs.clean, pairs.corrupt, pairs.readout.from_logits)
    drain_steps = list(job.steps())
    assert drain_steps and job.result is not None
    eap, graph = job.result, job.result.graph
    assert float((eap.clean_metric - eap.corrupt_metric).min()) > 5.0, "the construction must separate the runs"
    ranked = sorted(graph.edges, key=lambda e: -abs(float(eap.scores[e])))
    top3 = {(str(graph.writers[w]), str(graph.readers[r])) for w, r in ranked[:3]}
    assert top3 == INDUCTION_CHAIN
    fourth = abs(float(eap.scores[ranked[3]]))
    assert all(abs(float(eap.scores[e])) > 5 * fourth for e in ranked[:3])
    # The two upstream edges of a serial chain carry the same first-order effect (the value path is linear
    # once L0H0's attention is saturated), so "first" is a tie between them to 0.1 %; both dwarf the
    # measured gap (~18) because the gradient is taken at the corrupt run's flat attention — an estimate.
    key_edge = ([str(w) for w in graph.writers].index("L0H0"), [str(r) for r in graph.readers].index("L1KV0.k"))
    assert abs(float(eap.scores[key_edge])) == pytest.approx(abs(float(eap.scores[ranked[0]])), rel=1e-3)

    path = run_induction_path(induction_model)
    by_name = {r.receiver: r.recovered for r in path.receivers}
    assert by_name["L1KV0.k"] == pytest.approx(1.0, abs=0.02)
    assert by_name["L1KV1.k"] == pytest.approx(0.0, abs=1e-4)

    def faithfulness(edges: set[tuple[str, str]]) -> float:
        kept = [{"writer": w, "reader": r} for w, r in sorted(edges)]
        job = CircuitFaithfulnessJob(
            induction_model, INDUCTION_CLEAN, INDUCTION_CORRUPT, INDUCTION_GOOD, INDUCTION_BAD, edges=kept
        )
        drain(job)
        assert job.result is not None
        return job.result.faithfulness.value

    assert faithfulness(INDUCTION_CHAIN) == pytest.approx(1.0, abs=0.02)
    assert faithfulness({("L0H0", "L1KV0.k")}) == pytest.approx(0.0, abs=0.02)
    for missing in INDUCTION_CHAIN:
        assert faithfulness(INDUCTION_CHAIN - {missing}) == pytest.approx(0.0, abs=0.02)


def run_induction_path(model: LoadedModel) -> Any:
    from mcp_interp.core.circuits.path import PathPatchJob
    from mcp_interp.core.jobs import drain

    job = PathPatchJob(model, INDUCTION_CLEAN, INDUCTION_CORRUPT, INDUCTION_GOOD, INDUCTION_BAD, "L0H0", None, "k")
    drain(job)
    assert job.result is not None
    return job.result


def test_eap_ig_flags_a_transition_its_steps_miss(induction_model: LoadedModel) -> None:
    """The induction head's attention flips within α < 0.05 of the corrupt end (its key scores are
    amplitude² ≈ 1600 × α), so every IG point α = k/5 sits past the switch where the key gradient is 0:
    the upstream edges get almost no attribution and the embeddings' total falls far short of the gap.
    The result must say so (embed_total_vs_gap and its note) instead of presenting a complete-looking graph."""
    from mcp_interp.core.circuits.job import EdgeAttributionJob
    from mcp_interp.core.jobs import drain

    job = EdgeAttributionJob(
        induction_model, INDUCTION_CLEAN, INDUCTION_CORRUPT, INDUCTION_GOOD, INDUCTION_BAD, method="eap-ig", ig_steps=5
    )
    drain(job)
    assert job.result is not None
    gap = job.result.clean_logit_diff.value - job.result.corrupt_logit_diff.value
    assert gap > 15
    assert job.result.embed_total_vs_gap is not None and job.result.embed_total_vs_gap < -0.5 * gap
    assert any("more steps are needed" in note for note in job.result.notes)
    assert job.result.edges[0].writer == "L1H0" and job.result.edges[0].reader == "logits"
