"""The architecture matrix: every tool once on each tiny architecture, through an in-process MCP client.

Each architecture of ``builders.MATRIX`` is a random model saved as a local HF folder and loaded the way a
user's ``--model <folder>`` is. On each, every tool the server lists is called; a tool (or option) the
architecture cannot support must be a tool error naming the missing feature — exactly where ``model_info``'s
``capabilities`` say so, and those are checked against a table written here from what each architecture is.
The exact tools are compared with TransformerLens' own ``patching`` functions cell by cell (heads over all
positions, heads by position, resid_pre / attn_out / mlp_out, the direct path where TransformerLens accepts
the model), and the readouts with the bridge's logits computed here.

A sequential (GPT-2) and a parallel-residual (Phi) architecture also run on the ``inspect`` backend
(TransformerLens' RemoteBridge on Inspect's HF provider): every tool there runs or is refused naming what the
engine lacks, and what runs equals TransformerLens on the local model to the same tolerance.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from mcp import Client
from mcp.types import CallToolResult, Tool
from transformer_lens import patching as tl_patching

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.host import ModelHost
from mcp_interp.mcp.server import build_server
from tests.architectures.builders import MATRIX, PARALLEL, POST_NORM
from tests.features.test_sae import random_weights, write_sae
from tests.graphs.common import plt_weights, write_plt
from tests.helpers import (
    EXPECTED_TOOLS,
    IOI_CLEAN,
    IOI_CORRECT,
    IOI_CORRUPT,
    IOI_INCORRECT,
    assert_valid_structured,
    complete_result,
    tiny_corpus,
    tools_by_name,
)

pytestmark = pytest.mark.anyio

CLEAN, CORRUPT, GOOD, BAD = IOI_CLEAN[:2], IOI_CORRUPT[:2], IOI_CORRECT[:2], IOI_INCORRECT[:2]
PAIRS = {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT, "correct": GOOD, "incorrect": BAD}
TOLERANCE = 1e-4  # the issue's bar against TransformerLens; measured ≤ 5.4e-7 on every architecture

EDGE_TOOLS = [("edge_attribution", None), ("path_patch", None), ("circuit_faithfulness", None), ("find_circuit", None)]
RESID_MID = [("patch", "component='resid_mid'"), ("sae", "an SAE on blocks.L.hook_resid_mid")]
NEURONS = [
    ("patch", "component='mlp_neurons'"),
    ("ablate", "neuron targets 'L1N0,3'"),
    ("sae", "an SAE on blocks.L.mlp.hook_post"),
    ("feature_examples", "neuron features 'L1N0'"),
]
MID, MLP = (
    "a residual stream between attention and MLP (resid_mid)",
    "MLP neurons",
)
GRAPHS = [("attribution_graph", None)]
TRANSCODERS = "transcoder features {transcoders, layer, features}"


# What a RemoteBridge engine lacks (its driver runs whole forwards from tokens with set/add/scale/suppress edits).
GRADIENTS, WEIGHTS, EDGE_POINTS = (
    "gradients (a backward pass)",
    "the model's weights (unembedding, norms, projections)",
    "per-head writes and per-reader inputs (hook_result, split q/k/v inputs)",
)
LOCAL_EDITS, LENS, NEURON_POINT, MID_WRITES, BLOCK_CALLS = (
    "edits that only a local model runs in one pass",
    "TransformerLens' Jacobian-lens tools (they run the local bridge)",
    "the MLP neurons' point (mlp.hook_post)",
    "writes to resid_mid",
    "single block calls",
)
SWAP = [("causal_swap_trial", None)]
REMOTE_CASES = [("gpt2", "inspect"), ("phi", "inspect")]
CASES = [(arch, "transformers") for arch in MATRIX] + REMOTE_CASES


def expected_missing(arch: str, backend: str = "transformers") -> dict[tuple[str, str | None], str]:
    """(first tool, option) → the feature this architecture (or the engine running it) lacks, from what each is (see
    ``builders``); an architecture's gap is named before the engine's."""
    missing: dict[tuple[str, str | None], str] = {}
    if backend != "transformers":
        missing |= {("logit_lens", None): WEIGHTS, ("dla", None): WEIGHTS, ("explain", None): WEIGHTS}
        missing |= {("edge_attribution", None): GRADIENTS, ("find_circuit", None): GRADIENTS}
        missing |= {("path_patch", None): EDGE_POINTS, ("circuit_faithfulness", None): EDGE_POINTS}
        missing |= dict.fromkeys(GRAPHS, GRADIENTS) | dict.fromkeys(SWAP, LENS)
        missing |= {("patch", "method='attribution'"): GRADIENTS, ("ablate", TRANSCODERS): LOCAL_EDITS}
        missing |= {("patch", "noise corruption"): BLOCK_CALLS}  # noise is added inside the embedding's block call
        missing |= dict.fromkeys(NEURONS, NEURON_POINT) | dict.fromkeys(RESID_MID, MID_WRITES)
    if arch in PARALLEL:
        missing |= dict.fromkeys(RESID_MID, MID)
    if arch == "qwen3_moe":
        missing |= dict.fromkeys(NEURONS, MLP)
    return missing


class Caller:
    """Calls tools, records which were called, and checks each result against ``model_info``'s capabilities."""

    def __init__(self, client: Client, tools: dict[str, Tool], capabilities: list[dict[str, Any]]) -> None:
        self.client, self.tools, self.called = client, tools, set()
        self.missing = {(tool, c["option"]): c for c in capabilities if not c["available"] for tool in c["tools"]}

    async def ok(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        self.called.add(name)
        return assert_valid_structured(self.tools[name], await self.client.call_tool(name, args))

    async def complete(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """``ok``, then the complete result behind it (patch's and patch_heads' grids are only in result://)."""
        return await complete_result(self.client, await self.ok(name, args))

    async def depends(self, name: str, option: str | None, args: dict[str, Any]) -> CallToolResult:
        """A call whose availability ``model_info`` states: refused naming the feature exactly when it says so."""
        self.called.add(name)
        result = await self.client.call_tool(name, args)
        entry = self.missing.get((name, option))
        refused = entry is not None
        text = "\n".join(getattr(block, "text", "") for block in result.content)
        assert result.is_error is refused, (name, option, text[:300])
        assert refused or schema_valid(self.tools[name], result), (name, option)
        assert not refused or (entry["missing_feature"] in text and entry["reason"][:60] in text), text
        return result


def schema_valid(tool: Tool, result: CallToolResult) -> bool:
    return tool.output_schema is not None and jsonschema.Draft202012Validator(tool.output_schema).is_valid(
        result.structured_content
    )


def tl_metric(model: LoadedModel) -> Callable[[torch.Tensor], torch.Tensor]:
    """Mean over the pairs of logit(correct) − logit(incorrect) at the last token (the pairs have one length)."""
    tok = model.tokenizer
    good = torch.tensor([tok.convert_tokens_to_ids(w) for w in GOOD])
    bad = torch.tensor([tok.convert_tokens_to_ids(w) for w in BAD])
    rows = torch.arange(len(GOOD))
    return lambda logits: (logits[rows, -1, good] - logits[rows, -1, bad]).double().mean()


def max_diff(ours: Any, reference: torch.Tensor) -> float:
    return float((torch.tensor(ours, dtype=torch.float64) - reference.double()).abs().max())


def one_pixel_png() -> bytes:
    """A valid 1×1 grey PNG, built from the chunk layout."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00\x80")) + chunk(b"IEND", b"")
    )


class UnrenderedSession(ModelHost):
    """A ModelHost whose figures are one stored pixel. Rendering (matplotlib, ~0.3–0.7 s a figure here) does not
    depend on the architecture and is tested on `tiny`; skipping it keeps the matrix to a few minutes. Everything
    up to the figure — the measurement, its result, storing and linking the figure — runs as in a real session."""

    async def render(self, fn: Callable[..., bytes], *args: Any, **kwargs: Any) -> bytes:
        return one_pixel_png()


@pytest.fixture
def session_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[LoadedModel], ModelHost]:
    monkeypatch.setenv("MCP_INTERP_CACHE", str(tmp_path / "cache"))  # fit_lens writes its lens there
    return lambda model: UnrenderedSession(model.name, tmp_path / "out", loader=lambda name, device, dtype: model)


@pytest.mark.parametrize(("arch", "backend"), CASES, ids=[f"{a}-{b}" if b != "transformers" else a for a, b in CASES])
async def test_every_tool_runs_or_refuses_naming_the_feature(
    arch: str,
    backend: str,
    arch_model: Callable[[str], LoadedModel],
    remote_arch_model: Callable[[str, str], LoadedModel],
    session_for: Callable[[LoadedModel], ModelHost],
    tmp_path: Path,
) -> None:
    model = arch_model(arch)  # the local model: the references are computed on it
    served = model if backend == "transformers" else remote_arch_model(arch, backend)
    async with Client(build_server(session_for(served))) as client:
        tools = await tools_by_name(client)
        info = assert_valid_structured(tools["model_info"], await client.call_tool("model_info", {}))
        assert info["source"] == "local" and info["prepends_bos"] is False  # the word-level tokenizer adds no BOS
        assert info["backend"] == backend and info["fingerprint"] == model.fingerprint  # the same weights
        block = info["block"]
        assert block["parallel_attn_mlp"] is (arch in PARALLEL)
        assert block["attention_post_norm"] is (arch in POST_NORM)
        assert block["mixture_of_experts"] is (arch == "qwen3_moe")
        assert block["final_logit_softcap"] == (30.0 if arch == "gemma2" else None)
        missing = {
            (c["tools"][0], c["option"]): c["missing_feature"] for c in info["capabilities"] if not c["available"]
        }
        assert missing == expected_missing(arch, backend)
        call = Caller(client, tools, info["capabilities"])
        call.called.add("model_info")
        await readouts(call, model)
        await patching(call, model)
        await circuits(call, model)
        await lenses(call, model)
        await features(call, model, tmp_path)
        await swap(call, model)
        await jobs(call)
        await graphs(call, model, tmp_path)
        exported = await call.ok("export_investigation", {})  # every call above, as a rerun script
        assert exported["fingerprint"] == model.fingerprint and exported["calls"]
    assert set(tools) - call.called == set(), "every tool the server lists is called on every architecture"
    assert call.called >= EXPECTED_TOOLS


async def graphs(call: Caller, model: LoadedModel, tmp_path: Path) -> None:
    """attribution_graph and graph_intervene with random per-layer transcoders: where model_info says they run, the
    replacement model reproduces the real logits and zeroing a feature moves each logit directly by what its edges
    predict."""
    cfg = model.bridge.cfg
    folder = write_plt(tmp_path / "transcoders", plt_weights(cfg.n_layers, cfg.d_model, 32, seed=3))
    graph = await call.depends("attribution_graph", None, {"prompt": CLEAN[0], "transcoders": folder})
    if ("attribution_graph", None) in call.missing:  # model_info's word, which `depends` has checked the call against
        await call.depends("graph_intervene", None, {"prompt": CLEAN[0], "transcoders": folder, "features": []})
        return
    content = graph.structured_content
    assert content is not None and content["replacement_logit_error"] <= 1e-3
    top = content["top_features"][0]
    change = {"layer": top["layer"], "position": top["position"], "feature": top["feature"], "value": 0.0}
    result = await call.depends(
        "graph_intervene", None, {"prompt": CLEAN[0], "transcoders": folder, "features": [change]}
    )
    intervened = result.structured_content
    assert intervened is not None and intervened["max_prediction_error"] < 1e-4


async def jobs(call: Caller) -> None:
    """A background call's handle is followed (job_status) and the job stopped (job_cancel) on every architecture."""
    started = await call.ok("patch_heads", {**PAIRS, "background": True})
    job = started["job"]["job_uri"]
    status = await call.ok("job_status", {"job": job})
    assert status["job_uri"] == job and status["tool"] == "patch_heads"
    stopped = await call.ok("job_cancel", {"job": job})
    assert stopped["state"] in ("cancelled", "done")


async def readouts(call: Caller, model: LoadedModel) -> None:
    tok = model.tokenizer
    tokenized = await call.ok("tokenize", {"texts": CLEAN})
    assert tokenized["texts"][0]["ids"] == tok(CLEAN[0])["input_ids"]
    with torch.no_grad():
        clean_logits = model.bridge(encode(tok, CLEAN).input_ids)[:, -1].double()
        corrupt_logits = model.bridge(encode(tok, CORRUPT).input_ids)[:, -1].double()
    good, bad = ([tok.convert_tokens_to_ids(w) for w in words] for words in (GOOD, BAD))
    diff = await call.ok("logit_diff", {"prompts": CLEAN, "correct": GOOD, "incorrect": BAD})
    by_hand = [float(clean_logits[i, good[i]] - clean_logits[i, bad[i]]) for i in range(2)]
    assert diff["logit_diff"]["per_example"] == pytest.approx(by_hand, abs=1e-5)
    kl = await call.ok("kl", {"prompts": CLEAN, "compare_prompts": CORRUPT})
    p, q = torch.log_softmax(clean_logits, -1), torch.log_softmax(corrupt_logits, -1)
    assert kl["kl"]["per_example"] == pytest.approx((p.exp() * (p - q)).sum(-1).tolist(), abs=1e-5)
    rank = await call.ok("answer_rank", {"prompts": CLEAN, "correct": GOOD})
    assert rank["rank"]["per_example"] == [float((clean_logits[i] > clean_logits[i, good[i]]).sum()) for i in range(2)]
    await call.ok("loss", {"texts": CLEAN})
    await call.ok("ablate_head", {"prompts": CLEAN, "heads": ["L1H0"], "correct": GOOD, "incorrect": BAD})
    await call.ok("ablate", {"prompts": CLEAN, "targets": ["L1MLP", "L0H1"], "correct": GOOD, "incorrect": BAD})
    neurons = {"prompts": CLEAN, "targets": ["L1N0,3"], "correct": GOOD, "incorrect": BAD}
    await call.depends("ablate", "neuron targets 'L1N0,3'", neurons)


async def patching(call: Caller, model: LoadedModel) -> None:
    """patch and patch_heads (exact) against TransformerLens' patchers, cell by cell."""
    bridge, tok = model.bridge, model.tokenizer
    corrupt_ids = encode(tok, CORRUPT).input_ids
    _, clean_cache = bridge.run_with_cache(encode(tok, CLEAN).input_ids)
    metric = tl_metric(model)
    references = {
        "resid_pre": tl_patching.get_act_patch_resid_pre,
        "attn_out": tl_patching.get_act_patch_attn_out,
        "mlp_out": tl_patching.get_act_patch_mlp_out,
    }
    for component, patcher in references.items():
        result = await call.complete("patch", {**PAIRS, "component": component})
        assert max_diff(result["patched"], patcher(bridge, corrupt_ids, clean_cache, metric)) < TOLERANCE, component
    by_position = await call.complete("patch", {**PAIRS, "component": "heads_by_pos"})
    reference = tl_patching.get_act_patch_attn_head_out_by_pos(bridge, corrupt_ids, clean_cache, metric)  # [l, p, h]
    assert max_diff(by_position["head_patched"], reference.permute(0, 2, 1)) < TOLERANCE
    heads = await call.complete("patch_heads", PAIRS)
    reference = tl_patching.get_act_patch_attn_head_out_all_pos(bridge, corrupt_ids, clean_cache, metric)
    assert max_diff(heads["patched_logit_diff"], reference) < TOLERANCE
    assert float(reference.abs().max()) > 0.05, "the references must not all be ~0"
    await call.depends("patch", "component='resid_mid'", {**PAIRS, "component": "resid_mid"})
    await call.depends("patch", "component='mlp_neurons'", {**PAIRS, "component": "mlp_neurons", "neurons": [0, 5]})
    figure = await call.ok("get_figure", {"uri": heads["figure_uri"]})
    assert figure["uri"] == heads["figure_uri"]


async def circuits(call: Caller, model: LoadedModel) -> None:
    await call.depends("edge_attribution", None, PAIRS)
    await call.depends("path_patch", None, {**PAIRS, "sender": "L0H0"})
    await call.depends("circuit_faithfulness", None, {**PAIRS, "top_k": 0})
    await call.depends("find_circuit", None, PAIRS)


# Where TransformerLens' direct path patching is the reference; on post-norm blocks it refuses and ours is checked
# against the norm recomputed by hand instead (test_post_norm).
EDGES_APPLY = [arch for arch in MATRIX if arch not in POST_NORM and arch != "gptj"]


def direct_path_reference(model: LoadedModel) -> torch.Tensor:
    """TransformerLens' direct path patching L0H0 → every query head of layer 1, [n_layers, n_heads]."""
    bridge, tok = model.bridge, model.tokenizer
    corrupt_ids = encode(tok, CORRUPT).input_ids
    _, clean_cache = bridge.run_with_cache(encode(tok, CLEAN).input_ids)
    _, corrupt_cache = bridge.run_with_cache(corrupt_ids)
    return tl_patching.get_act_patch_direct_path(  # type: ignore[no-any-return]
        bridge, corrupt_ids, clean_cache, corrupt_cache, tl_metric(model), 0, 0, "q", verbose=False
    )


@pytest.mark.parametrize("arch", EDGES_APPLY)
async def test_path_patching_equals_transformer_lens_and_the_full_graph_is_faithful(
    arch: str, arch_model: Callable[[str], LoadedModel], session_for: Callable[[LoadedModel], ModelHost]
) -> None:
    model = arch_model(arch)
    async with Client(build_server(session_for(model))) as client:
        tools = await tools_by_name(client)
        path = assert_valid_structured(
            tools["path_patch"], await client.call_tool("path_patch", {**PAIRS, "sender": "L0H0"})
        )
        full = await client.call_tool("circuit_faithfulness", {**PAIRS, "top_k": 10**6})
        empty = await client.call_tool("circuit_faithfulness", {**PAIRS, "top_k": 0})
    assert max_diff(path["patched_logit_diff"][1], direct_path_reference(model)[1]) < TOLERANCE
    pins = [assert_valid_structured(tools["circuit_faithfulness"], r)["faithfulness"]["value"] for r in (full, empty)]
    assert pins == pytest.approx([1.0, 0.0], abs=1e-5)


@pytest.mark.parametrize("arch", [arch for arch in MATRIX if arch not in EDGES_APPLY])
def test_transformer_lens_refuses_direct_paths_on_gptj_and_post_norm_blocks(
    arch: str, arch_model: Callable[[str], LoadedModel]
) -> None:
    with pytest.raises((NotImplementedError, ValueError), match=r"split_qkv_input|normalized or scaled"):
        direct_path_reference(arch_model(arch))


async def lenses(call: Caller, model: LoadedModel) -> None:
    prompt = CLEAN[0]
    await call.depends("logit_lens", None, {"prompt": prompt})
    explain = {"prompt": prompt, "answer": GOOD[0], "baseline": BAD[0], "corrupt": CORRUPT[0], "top_k": 2}
    await call.depends("explain", None, explain)
    attention = await call.ok("attention", {"prompt": prompt, "layer": 1, "head": 2})
    _, cache = model.bridge.run_with_cache(encode(model.tokenizer, [prompt]).input_ids)
    assert max_diff(attention["pattern"], cache["blocks.1.attn.hook_pattern"][0, 2]) < 1e-6
    await call.ok("induction", {"seq_len": 6, "n_seqs": 2})
    await call.ok("steer", {"prompt": prompt, "coefficient": 2.0, "positive": "mary", "negative": "john", "layer": 1,
                            "max_new_tokens": 3})  # fmt: skip
    refused = await call.depends("dla", None, {"prompt": prompt, "answer": GOOD[0], "baseline": BAD[0]})
    if refused.is_error:  # as model_info says (`depends` checked it); the numbers below are the local engine's
        return
    dla = refused.structured_content
    assert dla is not None
    with torch.no_grad():
        logits = model.bridge(encode(model.tokenizer, [prompt]).input_ids)[0, -1].double()
    cap = 30.0 if "Gemma2" in type(model.bridge.original_model).__name__ else None
    before_cap = logits if cap is None else cap * torch.atanh(logits / cap)
    good, bad = (model.tokenizer.convert_tokens_to_ids(w) for w in (GOOD[0], BAD[0]))
    assert dla["measured"] == pytest.approx(float(before_cap[good] - before_cap[bad]), abs=1e-5)
    assert dla["total"] == pytest.approx(dla["measured"], abs=1e-5)  # the parts add up, post-norm blocks included


async def features(call: Caller, model: LoadedModel, tmp_path: Path) -> None:
    cfg = model.bridge.cfg
    texts = [f"{name} went to {place}" for name in ("mary", "john", "tom", "bob") for place in ("paris", "france")]
    labels = ["city", "country"] * 4
    # Twice over: the split stratifies by the place (the labels are a function of it) and needs 2 of each held out.
    await call.ok("probe", {"texts": texts * 2, "labels": labels * 2, "layers": [1]})
    post = write_sae(tmp_path / "sae_post", random_weights(32, 0, d_in=cfg.d_model), "blocks.1.hook_resid_post")
    await call.ok("sae", {"text": CLEAN[0], "sae": post})
    await call.ok("sae_features", {"texts": CLEAN, "sae": post, "features": [0, 1]})
    mid = write_sae(tmp_path / "sae_mid", random_weights(32, 1, d_in=cfg.d_model), "blocks.1.hook_resid_mid")
    await call.depends("sae", "an SAE on blocks.L.hook_resid_mid", {"text": CLEAN[0], "sae": mid})
    neurons = write_sae(tmp_path / "sae_neurons", random_weights(32, 2, d_in=int(cfg.d_mlp)), "blocks.1.mlp.hook_post")
    await call.depends("sae", "an SAE on blocks.L.mlp.hook_post", {"text": CLEAN[0], "sae": neurons})
    await naming(call, model, post)


async def naming(call: Caller, model: LoadedModel, sae: str) -> None:
    """feature_examples on a neuron (refused where there are none), a direction and an SAE feature, and
    score_explanation's generation mode; a direction's activations equal the bridge's resid_post projected here."""
    texts = [*CLEAN, "mary went to the store", "the capital of france is paris"]
    await call.depends("feature_examples", "neuron features 'L1N0'", {"feature": "L1N0", "texts": texts})
    unit = [1.0] + [0.0] * (int(model.bridge.cfg.d_model) - 1)
    found = await call.ok(
        "feature_examples", {"feature": {"layer": 1, "direction": unit}, "texts": texts, "window": 64}
    )
    top = found["examples"][0]
    _, cache = model.bridge.run_with_cache(encode(model.tokenizer, [top["text"]]).input_ids)
    reference = cache["blocks.1.hook_out"][0, :, 0]
    assert max_diff(top["activations"], reference[top["window_start"] :][: len(top["activations"])]) < TOLERANCE
    await call.ok("feature_examples", {"feature": {"sae": sae, "feature": 0}, "texts": texts})
    written = {"activating_texts": texts[:2], "non_activating_texts": texts[2:]}
    await call.ok("score_explanation", {"feature": {"layer": 1, "direction": unit}, "explanation": "e", **written})


async def swap(call: Caller, model: LoadedModel) -> None:
    corpus = tiny_corpus(model)
    own = corpus["functions"][0]
    trial = {"template": own["template"], "source": "France", "target": "Canada", "layer": 0, "lens": "logit"}
    words = {"source_answer": "mary", "target_answer": "john", "require_target_known": False}  # a random model's
    await call.depends("causal_swap_trial", None, {**trial, **words})  # own answers may coincide
    settings = {"layers": [0], "control_seeds": [0], "lens": "logit", "position": "last"}
    text = " ".join(["when mary and john went to the store , john gave a drink to mary ."] * 2)
    fit = {"texts": [text, text], "max_seq_len": 16, "skip_first_positions": 2}
    if ("causal_swap_trial", None) in call.missing:  # model_info's word, checked by `depends` against the call
        await call.depends("causal_swap_benchmark", None, {"corpus": corpus, **settings})
        await call.depends("fit_lens", None, fit)
        checked = await call.ok("verify_artifact", {"artifact_json": json.dumps({"mcp_interp": "nothing"})})
        assert checked["valid"] is False
        return
    benchmark = await call.ok("causal_swap_benchmark", {"corpus": corpus, **settings})
    document = json.loads(Path(benchmark["artifact_path"]).read_text(encoding="utf-8"))
    verified = await call.ok("verify_artifact", {"artifact_json": json.dumps(document)})
    assert verified["valid"] is True
    lens = await call.ok("fit_lens", fit)
    assert math.isfinite(lens["lens"]["n_prompts"])
