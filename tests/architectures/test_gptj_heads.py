"""GPT-J's attention per head (``backend.gptj_heads``): TransformerLens 4.3 runs it as one module, without each head's
write or each head's own query/key/value input; inside ``edge_hooks`` the engine runs it head by head.

Every expected number here is built without that code: from the plain bridge (the HF ``GPTJAttention`` called whole)
and the HF modules' own weights — a head's write is its ``hook_z`` slice times its columns of ``out_proj``; a reader
that gets a change δ in its own input is the HF projection (``q_proj``, ``k_proj`` or ``v_proj``) rewritten for that
head's rows alone as W_h · ln_1(resid_pre + δ), every other head untouched; a frozen attention pattern is HF's own
attention function swapped for one that applies the clean pattern to the values.

Measured on the tiny GPT-J (2 layers, 4 heads): the heads' writes summed against the module's output ≤ 7.2e-7,
logits with and without the per-head path ≤ 1.3e-6, path patching against the run built by hand ≤ 3.6e-7 (q, k and v
receivers), the full and empty circuits 1 + 5.8e-7 and 8.1e-7, edge attribution into a head's own input against a
finite difference ≤ 6e-6, attribution-graph rows against HF's attention with the pattern frozen ≤ 2.4e-7 (0.10 with
GPT-J's attention run whole, as before), and a model offloaded to disk identical to the one in memory.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from mcp import Client

from mcp_interp.core.circuits.attribution import EdgeAttribution
from mcp_interp.core.engine.backend.bridge import edge_hooks
from mcp_interp.core.engine.backend.edits import Rewrite
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.engine.patching.pairs import Pairs, prepare_pairs
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.graphs.job import AttributionGraphJob
from mcp_interp.host import ModelHost
from mcp_interp.mcp.server import build_server
from tests.architectures.test_matrix import session_for  # noqa: F401  (the fixture)
from tests.graphs.common import PROMPT, frozen_readout, plt_weights, write_plt
from tests.helpers import IOI_CLEAN, IOI_CORRECT, IOI_CORRUPT, IOI_INCORRECT, assert_valid_structured, tools_by_name

N = len(IOI_CLEAN)  # 3 pairs
PAIRS = {
    "clean_prompts": IOI_CLEAN[:N], "corrupt_prompts": IOI_CORRUPT[:N],
    "correct": IOI_CORRECT[:N], "incorrect": IOI_INCORRECT[:N],
}  # fmt: skip
# Right-padded: three lengths in one batch.
TEXTS = ["when mary and john went to the store , john gave a drink to", "mary went to the", "the store"]


@pytest.fixture
def gptj(arch_model: Callable[[str], LoadedModel]) -> LoadedModel:
    return arch_model("gptj")


def capture(
    model: LoadedModel, ids: torch.Tensor, names: list[str], hooks: Sequence[tuple[str, Any]] = (), **kwargs: Any
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(logits, {name: value}) of one forward through the bridge with ``hooks``."""
    kept: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Callable[[torch.Tensor, Any], None]:
        return lambda value, hook: kept.__setitem__(name, value.detach().clone())

    with torch.no_grad(), model.bridge.hooks(fwd_hooks=[*hooks, *[(n, keep(n)) for n in names]]):
        logits = model.bridge(ids, **kwargs)
    return logits, kept


def sizes(model: LoadedModel) -> tuple[int, int, int]:
    cfg = model.bridge.cfg
    return int(cfg.n_heads), int(cfg.d_head), int(cfg.d_model)


@contextmanager
def projection_moved(model: LoadedModel, layer: int, kind: str, head: int, delta: torch.Tensor) -> Iterator[None]:
    """Block ``layer``'s ``kind`` projection (the bare HF ``q_proj``/``k_proj``/``v_proj``) gives head ``head`` its
    output for ln_1(resid_pre + delta), every other head its output for ln_1(resid_pre): the HF modules' own weights,
    without the project's code."""
    block = model.bridge.blocks[layer]
    norm = block.ln1.original_component  # the HF LayerNorm
    projection = getattr(block.attn, kind).original_component  # the HF Linear
    _, d_head, _ = sizes(model)
    rows = slice(head * d_head, (head + 1) * d_head)
    resid: list[torch.Tensor] = []

    def grab(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        resid.append(args[0] if args else kwargs["hidden_states"])

    def move(module: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        normed = norm((resid[-1].double() + delta).to(out.dtype))
        out[..., rows] = torch.nn.functional.linear(normed, projection.weight[rows])
        return out

    handles = [
        block.original_component.register_forward_pre_hook(grab, with_kwargs=True),
        projection.register_forward_hook(move),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def head_writes_by_hand(model: LoadedModel, ids: torch.Tensor, layer: int) -> torch.Tensor:
    """``[batch, seq, heads, d_model]``: each head's ``hook_z`` slice (the plain bridge) through its columns of the HF
    ``out_proj``, in float64."""
    n_heads, d_head, d_model = sizes(model)
    _, kept = capture(model, ids, [f"blocks.{layer}.attn.hook_z"])
    weight = model.bridge.blocks[layer].attn.o.original_component.weight.double().view(d_model, n_heads, d_head)
    return torch.einsum("bshe,dhe->bshd", kept[f"blocks.{layer}.attn.hook_z"].double(), weight)


def pairs_of(model: LoadedModel) -> Pairs:
    return prepare_pairs(model, IOI_CLEAN[:N], IOI_CORRUPT[:N], IOI_CORRECT[:N], IOI_INCORRECT[:N])


def metric(model: LoadedModel, pairs: Pairs, ids: torch.Tensor) -> torch.Tensor:
    """The pairs' logit difference at their answers, in a plain forward of ``ids`` (float64)."""
    with torch.no_grad():
        logits = model.bridge(ids)
    rows = torch.arange(N)
    return pairs.readout.from_logits(logits[rows, pairs.clean.answer_positions], rows).double()


def test_the_heads_add_up_to_the_modules_output_and_the_logits_are_the_models(gptj: LoadedModel) -> None:
    batch = encode(gptj.tokenizer, TEXTS)
    real = batch.attention_mask.bool()
    ids, mask = batch.input_ids, batch.attention_mask
    n_heads, _, _ = sizes(gptj)
    layers = range(gptj.bridge.cfg.n_layers)
    plain_names = [f"blocks.{layer}.{point}" for layer in layers for point in ("hook_attn_out", "hook_resid_pre")]
    plain_names += [f"blocks.{layer}.attn.hook_pattern" for layer in layers]
    plain, plain_acts = capture(gptj, ids, plain_names, attention_mask=mask)
    head_names = [f"blocks.{layer}.attn.hook_result" for layer in layers]
    head_names += [f"blocks.{layer}.hook_{kind}_input" for layer in layers for kind in "qkv"]
    head_names += [f"blocks.{layer}.attn.hook_pattern" for layer in layers]
    with edge_hooks(gptj.bridge):
        per_head, acts = capture(gptj, ids, head_names, attention_mask=mask)
    assert float((per_head - plain)[real].abs().max()) < 1e-5  # measured 1.3e-6
    for layer in layers:
        result = acts[f"blocks.{layer}.attn.hook_result"]
        assert result.shape == (*ids.shape, n_heads, gptj.bridge.cfg.d_model)
        module_output = plain_acts[f"blocks.{layer}.hook_attn_out"]  # the HF GPTJAttention's own output
        assert float((result.sum(dim=2) - module_output)[real].abs().max()) < 1e-5  # measured 7.2e-7
        resid = plain_acts[f"blocks.{layer}.hook_resid_pre"][:, :, None]
        for kind in "qkv":  # each head's own copy of the residual stream before ln_1
            copies = acts[f"blocks.{layer}.hook_{kind}_input"]
            assert copies.shape == result.shape
            assert float((copies - resid)[real].abs().max()) < 1e-5
        patterns = acts[f"blocks.{layer}.attn.hook_pattern"] - plain_acts[f"blocks.{layer}.attn.hook_pattern"]
        assert float(patterns.abs().max()) < 1e-6  # padded queries included: they attend to the real keys
    assert float(plain_acts["blocks.1.hook_attn_out"][real].abs().max()) > 0.1, "the outputs must not be ~0"
    # the model outside edge_hooks is TransformerLens' again: no per-head point fires, the flags are off
    assert not gptj.bridge.cfg.use_attn_result and not gptj.bridge.cfg.use_split_qkv_input
    again, _ = capture(gptj, ids, [], attention_mask=mask)
    assert torch.equal(again, plain)


@pytest.mark.parametrize(("kind", "head"), [("q", 2), ("k", 1), ("v", 3)])
def test_an_edit_to_one_heads_input_changes_that_head_alone(gptj: LoadedModel, kind: str, head: int) -> None:
    """δ added to head ``head``'s own ``kind`` input of layer 1 (TransformerLens' hook, the per-head path): layer 1's
    patterns and per-head outputs (``hook_z``) equal the plain model's with that head's projection rewritten by hand
    (a query or key edit moves that head's pattern alone; a value edit no pattern, that head's output alone)."""
    ids = encode(gptj.tokenizer, IOI_CLEAN[:2]).input_ids
    _, _, d_model = sizes(gptj)
    delta = torch.randn(d_model, generator=torch.Generator().manual_seed(7), dtype=torch.float64) * 2
    names = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern", "blocks.1.attn.hook_z"]

    def edit(value: torch.Tensor, hook: Any) -> torch.Tensor:
        value = value.clone()
        value[:, :, head] = (value[:, :, head].double() + delta).to(value.dtype)
        return value

    with edge_hooks(gptj.bridge):
        _, ours = capture(gptj, ids, names, hooks=[(f"blocks.1.hook_{kind}_input", edit)])
    _, plain = capture(gptj, ids, names)
    with projection_moved(gptj, 1, kind, head, delta):
        _, by_hand = capture(gptj, ids, names)
    for name in names:
        assert float((ours[name] - by_hand[name]).abs().max()) < 1e-5, name
    others = [h for h in range(4) if h != head]
    pattern, z = "blocks.1.attn.hook_pattern", "blocks.1.attn.hook_z"
    assert float((ours[pattern][:, others] - plain[pattern][:, others]).abs().max()) < 1e-6
    assert float((ours[z][:, :, others] - plain[z][:, :, others]).abs().max()) < 1e-5
    moved = (ours[pattern][:, head] - plain[pattern][:, head]).abs().max()
    assert float(moved) > 1e-2 if kind != "v" else float(moved) < 1e-6
    assert float((ours[z][:, :, head] - plain[z][:, :, head]).abs().max()) > 1e-2, "the edit must matter"
    assert torch.allclose(ours["blocks.0.attn.hook_pattern"], plain["blocks.0.attn.hook_pattern"], atol=1e-6)


def receiver_run(model: LoadedModel, pairs: Pairs, kind: str, head: int, delta: torch.Tensor) -> float:
    """The corrupt run with ``delta`` added to layer 1 head ``head``'s own ``kind`` input (by hand): the mean metric."""
    with projection_moved(model, 1, kind, head, delta):
        return float(metric(model, pairs, pairs.corrupt.input_ids).mean())


@pytest.mark.anyio
@pytest.mark.parametrize("component", ["q", "k", "v"])
async def test_path_patching_and_the_circuit_pins_through_the_tools(
    gptj: LoadedModel,
    component: str,
    session_for: Callable[[LoadedModel], ModelHost],  # noqa: F811
) -> None:
    async with Client(build_server(session_for(gptj))) as client:
        tools = await tools_by_name(client)

        async def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
            return assert_valid_structured(tools[name], await client.call_tool(name, args))

        path = await call("path_patch", {**PAIRS, "sender": "L0H0", "component": component})
        full = await call("circuit_faithfulness", {**PAIRS, "top_k": 10**6})
        empty = await call("circuit_faithfulness", {**PAIRS, "top_k": 0})
    pairs = pairs_of(gptj)
    delta = (
        head_writes_by_hand(gptj, pairs.clean.input_ids, 0) - head_writes_by_hand(gptj, pairs.corrupt.input_ids, 0)
    )[:, :, 0]  # L0H0's clean write minus its corrupt one
    by_hand = [receiver_run(gptj, pairs, component, h, delta) for h in range(4)]
    assert path["patched_logit_diff"][1] == pytest.approx(by_hand, abs=1e-5)  # measured ≤ 3.6e-7
    corrupt = float(metric(gptj, pairs, pairs.corrupt.input_ids).mean())
    assert max(abs(v - corrupt) for v in by_hand) > 1e-3, "the path must matter"
    assert [full["faithfulness"]["value"], empty["faithfulness"]["value"]] == pytest.approx([1.0, 0.0], abs=1e-4)


@pytest.mark.parametrize(("writer", "reader"), [("L0H1", "L1H0.q"), ("L0H1", "L1KV1.k"), ("L0H3", "L1KV2.v")])
def test_edge_attribution_of_a_head_reader_equals_a_finite_difference(
    gptj: LoadedModel, writer: str, reader: str
) -> None:
    """EAP's score of writer → a layer-1 head's own input: the derivative of the mean metric along that head's input
    moved by the writer's clean − corrupt write (by hand, both), by a central difference."""
    pairs = pairs_of(gptj)
    job = EdgeAttribution(
        backend=gptj.backend, clean=pairs.clean, corrupt=pairs.corrupt, metric=pairs.readout.from_logits
    )
    drain_steps(job)
    assert job.result is not None
    graph = job.result.graph
    scores = {(str(graph.writers[w]), str(graph.readers[r])): float(job.result.scores[w, r]) for w, r in graph.edges}
    layer, head = int(writer[1]), int(writer[3])
    delta = (
        head_writes_by_hand(gptj, pairs.clean.input_ids, layer)
        - head_writes_by_hand(gptj, pairs.corrupt.input_ids, layer)
    )[:, :, head]
    kind, index = reader[-1], int(reader.split(".")[0][-1])
    # float32 metrics: below this step the difference is rounding noise (ε = 5e-3 is off by 3e-5 on the key edge);
    # at it the three edges here agree to 6e-6 (q), 7e-7 (k), 2e-7 (v)
    eps = 2e-2
    up, down = (receiver_run(gptj, pairs, kind, index, sign * eps * delta) for sign in (1, -1))
    derivative = (up - down) / (2 * eps)
    assert scores[(writer, reader)] == pytest.approx(derivative, abs=1e-5)
    assert abs(derivative) > 1e-3, "pick an edge that matters"


def drain_steps(job: EdgeAttribution) -> None:
    for _ in job.steps():
        pass


@contextmanager
def hf_attention_frozen(patterns: dict[int, torch.Tensor]) -> Iterator[None]:
    """HF's own GPT-J attention function replaced by one that applies layer L's clean pattern to the values (what
    the replacement model's frozen attention is), so the HF module computes everything else itself."""
    from transformers.models.gptj import modeling_gptj

    original = modeling_gptj.eager_attention_forward

    def frozen(module: Any, query: Any, key: Any, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        pattern = patterns[module.layer_idx].to(value.dtype)
        return torch.matmul(pattern, value).transpose(1, 2).contiguous(), pattern

    modeling_gptj.eager_attention_forward = frozen
    try:
        yield
    finally:
        modeling_gptj.eager_attention_forward = original


def test_attribution_graph_rows_equal_autograd_through_hf_attention_with_the_pattern_frozen(
    gptj: LoadedModel, tmp_path: Any
) -> None:
    """The replacement model freezes every attention pattern; on GPT-J the engine's per-head path is what applies a
    frozen pattern (TransformerLens' own fires the pattern hook after the module used it). Here the pattern is frozen
    inside HF's module instead, and a graph row (a logit's and a layer-1 feature's edges from every source) is the
    gradient of that frozen model (``tests.graphs.common.frozen_readout``: norm scales and MLP writes frozen through
    the bridge's hooks)."""
    from mcp_interp.core.engine.dictionaries.transcoder_format import load_transcoders
    from mcp_interp.core.graphs.replacement import clean_run
    from tests.graphs.test_edges import additions, feature_writes, hand_errors, target_value

    cfg = gptj.bridge.cfg
    raw = plt_weights(cfg.n_layers, cfg.d_model, 32, seed=3)
    folder = write_plt(tmp_path / "transcoders", raw)
    job = AttributionGraphJob(model=gptj, prompt=PROMPT, transcoders=folder, max_feature_nodes=10_000, batch_size=32)
    drain(job)
    graph = job.graph
    tc = load_transcoders(job.transcoders, gptj)
    clean = clean_run(gptj, tc, torch.tensor([graph.token_ids]))
    replay = {"graph": graph, "clean": clean, "kind": "plt", "raw": raw, "tc": tc}
    replay["errors"] = hand_errors("plt", raw, clean.inputs, clean.outputs)
    replay["writes"] = feature_writes(replay)
    patterns = {layer: clean.frozen[f"blocks.{layer}.attn.hook_pattern"] for layer in range(cfg.n_layers)}
    n_sources = graph.n_nodes - len(graph.targets)
    layers = graph.active.layers[graph.selected]
    rows = [int(torch.nonzero(layers == 1)[0]), n_sources, n_sources + 1]  # a layer-1 feature, two logits
    for row in rows:
        scales = torch.zeros(n_sources, requires_grad=True)
        with hf_attention_frozen(patterns), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*hook_pattern returned a modified tensor.*")
            pre, logits = frozen_readout(gptj.bridge, tc, clean, graph.targets.vectors, additions(replay, scales))
        (gradient,) = torch.autograd.grad(target_value(replay, row, pre, logits), scales)
        assert torch.allclose(graph.adjacency[row, :n_sources], gradient, atol=2e-4, rtol=1e-4), row
        assert float(gradient.abs().max()) > 1e-2


def test_the_per_head_path_on_a_model_offloaded_to_disk_equals_the_one_in_memory(
    gptj: LoadedModel, arch_folder: Callable[[str], Any], tmp_path: Any
) -> None:
    """Every weight on disk (accelerate's placement ``{'': 'disk'}``): the per-head path reads the projections'
    weights outside their own forward, which the engine brings in for each attention call; a pattern edit runs the
    heads through the projections' own modules."""
    from mcp_interp.core.engine.backend.loader.load import load_model
    from mcp_interp.core.engine.backend.options import LoadOptions

    options = LoadOptions(device_map="auto", max_memory={"cpu": "60KB"}, offload_folder=str(tmp_path))
    offloaded = load_model(str(arch_folder("gptj")), options=options)
    assert offloaded.backend.placement() == {"": "disk"}
    ids = encode(gptj.tokenizer, IOI_CLEAN).input_ids
    names = [f"blocks.{layer}.{point}" for layer in (0, 1) for point in ("attn.hook_result", "hook_v_input")]

    def uniform(value: torch.Tensor) -> torch.Tensor:  # every query attends evenly to the keys it may see
        seen = (value > 0).to(value.dtype)
        return seen / seen.sum(-1, keepdim=True)

    runs = []
    for model in (gptj, offloaded):
        with edge_hooks(model.bridge):
            runs.append(capture(model, ids, names))
        with torch.no_grad():
            runs.append((model.backend.logits(ids, [Rewrite("blocks.1.attn.hook_pattern", uniform)]), {}))
    (heads, values), (edited, _), (heads_disk, values_disk), (edited_disk, _) = runs
    assert torch.equal(heads, heads_disk) and torch.equal(edited, edited_disk)
    assert all(torch.equal(values[name], values_disk[name]) for name in names)
    assert float((edited - heads).abs().max()) > 1e-2, "the pattern edit must reach the logits"
