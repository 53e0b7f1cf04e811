"""Benchmark: ``attribution_graph`` on the embedded model with 30 layers × 1 024-feature transcoders, one process.

The transcoders are built here, quickly and in closed form (no gradient training), so that their sparsity and
their error nodes are those of real, imperfect transcoders rather than of random ones: every layer's MLP input
x and output y are read on the first 40 texts of the shipped ``lens_corpus`` (one batched forward); each
feature's encoder row is a unit vector along a random centred input, its bias puts its pre-activation above 0
on ``ACTIVE_FRACTION`` of the tokens (ReLU), and the decoder and its bias are the ridge least-squares fit of y
from the activations. The fraction of variance explained is measured on the 8 held-out texts. The set is
written in circuit-tracer's format (``config.yaml`` + ``layer_{i}.safetensors``, ``mlp.hook_in`` →
``hook_mlp_out``) to a temporary folder and read back through ``load_transcoders`` like any other.

Then ``attribution_graph`` on a 10-token prompt (goal, issue 24: ≤ 60 s on this 2-core CPU): its time and the
shares in forward passes, backward passes (with their contraction into edge rows) and pruning, the nodes and
edges, the scores and the replacement model's logit error; for ``max_feature_nodes`` = the default and, with
``--all``, every active feature.

Usage: ``python scripts/bench_graphs.py [--model smollm2-135m] [--features 1024] [--all]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

import mcp_interp.state.paths as paths
from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.points import hook_mlp_input, hook_mlp_out
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.graphs.job import DEFAULT_MAX_FEATURE_NODES, MAX_FEATURE_NODES, AttributionGraphJob
from mcp_interp.corpora import corpora_dir

PROMPT = "Fact: the capital of the state containing Dallas is"
ACTIVE_FRACTION = 0.03  # each feature fires on ~3 % of tokens
FIT_TEXTS, HELD_OUT_TEXTS, MAX_TOKENS = 40, 8, 96
RIDGE = 1e-3


def lens_texts() -> list[str]:
    import json

    return list(json.loads((corpora_dir() / "lens_corpus.json").read_text(encoding="utf-8"))["texts"])


def mlp_activations(model: LoadedModel, texts: list[str]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every layer's MLP input (``mlp.hook_in``) and output over the real tokens of ``texts`` (≤ MAX_TOKENS each)."""
    n_layers = model.bridge.cfg.n_layers
    names = [hook_mlp_input(layer) for layer in range(n_layers)] + [hook_mlp_out(layer) for layer in range(n_layers)]
    batch = encode(model.tokenizer, texts, model.device)
    ids, mask = batch.input_ids[:, :MAX_TOKENS], batch.attention_mask[:, :MAX_TOKENS].bool()
    kept: dict[str, torch.Tensor] = {}
    with (
        torch.inference_mode(),
        model.bridge.hooks(fwd_hooks=[(n, lambda v, hook, n=n: kept.__setitem__(n, v[mask].float())) for n in names]),
    ):
        model.bridge(ids, return_type=None)
    return [kept[hook_mlp_input(i)] for i in range(n_layers)], [kept[hook_mlp_out(i)] for i in range(n_layers)]


def fit_layer(x: torch.Tensor, y: torch.Tensor, d_transcoder: int, seed: int) -> dict[str, torch.Tensor]:
    """One closed-form transcoder: random data-direction encoders, quantile biases, ridge decoder."""
    generator = torch.Generator().manual_seed(seed)
    centred = x - x.mean(dim=0)
    picks = torch.randint(0, x.shape[0], (d_transcoder,), generator=generator)
    w_enc = centred[picks] / centred[picks].norm(dim=1, keepdim=True).clamp(min=1e-6)
    pre = x @ w_enc.T
    above = max(1, round(ACTIVE_FRACTION * x.shape[0]))  # tokens on which each feature fires
    b_enc = -pre.kthvalue(x.shape[0] - above, dim=0).values
    acts = torch.relu(pre + b_enc)
    design = torch.cat([acts, torch.ones(acts.shape[0], 1)], dim=1).double()
    gram = design.T @ design
    gram += RIDGE * torch.eye(design.shape[1], dtype=torch.float64) * gram.diagonal().mean()
    solution = torch.linalg.solve(gram, design.T @ y.double()).float()
    return {"W_enc": w_enc, "b_enc": b_enc, "W_dec": solution[:-1].contiguous(), "b_dec": solution[-1].contiguous()}


def fve(layer: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> float:
    recon = torch.relu(x @ layer["W_enc"].T + layer["b_enc"]) @ layer["W_dec"] + layer["b_dec"]
    return 1.0 - float(((y - recon) ** 2).sum() / ((y - y.mean(dim=0)) ** 2).sum())


def build_transcoders(model: LoadedModel, folder: Path, d_transcoder: int) -> tuple[float, list[float], float]:
    """Fit and write the set; returns (seconds, held-out FVE per layer, mean L0 per token per layer)."""
    started = time.perf_counter()
    texts = lens_texts()
    fit_x, fit_y = mlp_activations(model, texts[:FIT_TEXTS])
    test_x, test_y = mlp_activations(model, texts[FIT_TEXTS : FIT_TEXTS + HELD_OUT_TEXTS])
    explained, l0 = [], []
    for layer in range(len(fit_x)):
        weights = fit_layer(fit_x[layer], fit_y[layer], d_transcoder, seed=layer)
        save_file(weights, str(folder / f"layer_{layer}.safetensors"))
        explained.append(fve(weights, test_x[layer], test_y[layer]))
        l0.append(float((test_x[layer] @ weights["W_enc"].T + weights["b_enc"] > 0).sum(1).float().mean()))
    config = {
        "model_kind": "transcoder_set",
        "feature_input_hook": "mlp.hook_in",
        "feature_output_hook": "hook_mlp_out",
        "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return time.perf_counter() - started, explained, sum(l0) / len(l0)


def bench_graph(model: LoadedModel, folder: Path, max_feature_nodes: int, args_verbose: bool) -> None:
    job = AttributionGraphJob(model=model, prompt=PROMPT, transcoders=str(folder), max_feature_nodes=max_feature_nodes)
    started = time.perf_counter()
    for message in job.steps():
        if args_verbose:
            print(f"  {time.perf_counter() - started:7.2f} s  {message}", flush=True)
    result = job.result
    assert result is not None
    seconds = time.perf_counter() - started
    timing, counts = result.timing, result.counts
    assert job.graph_json is not None
    size = len(result.model_dump_json())
    print(
        f"max_feature_nodes={max_feature_nodes}: {seconds:.1f} s (forward {timing.forward_s:.1f} s = "
        f"{timing.forward_s / seconds:.0%}, backward {timing.backward_s:.1f} s = {timing.backward_s / seconds:.0%}, "
        f"pruning {timing.pruning_s:.1f} s = {timing.pruning_s / seconds:.0%})"
    )
    print(
        f"  {len(result.tokens)} tokens, {counts.features_active} active features, {counts.features_in_graph} in the "
        f"graph; kept: {counts.feature_nodes_kept} features, {counts.error_nodes_kept} of {counts.error_nodes} errors, "
        f"{counts.token_nodes} tokens, {counts.logit_nodes} logits; edges {counts.edges_nonzero} non-zero, "
        f"{counts.edges_kept} kept; graph JSON {len(job.graph_json['nodes'])} nodes, "
        f"{len(job.graph_json['links'])} links"
    )
    print(
        f"  replacement_score {result.replacement_score:.3f}, completeness_score {result.completeness_score:.3f}, "
        f"kept_influence {result.kept_influence:.3f}, replacement_logit_error {result.replacement_logit_error:.2e}, "
        f"structured result {size} bytes; targets "
        + ", ".join(f"{t.token!r} {t.probability:.3f}" for t in result.targets)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--all", action="store_true", help="also a graph with every active feature")
    parser.add_argument("--verbose", action="store_true", help="print the time of every job step")
    parser.add_argument("--keep", type=Path, help="write the transcoders to this folder (and reuse them if there)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own, one per core)")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f} before", flush=True)
    model = load_model(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        paths.configure([*paths.stdio_defaults(), folder])  # the script names its own folder, as --allow-root would
        if (folder / "config.yaml").is_file():
            print(f"reusing the transcoders in {folder}", flush=True)
        else:
            run_fit(model, folder, args.features)
        bench_graph(model, folder, DEFAULT_MAX_FEATURE_NODES, args.verbose)
        if args.all:
            bench_graph(model, folder, MAX_FEATURE_NODES, args.verbose)
    print(f"load average {os.getloadavg()[0]:.2f} after (other processes share these cores)", flush=True)


def run_fit(model: LoadedModel, folder: Path, d_transcoder: int) -> None:
    print(f"building transcoders ({d_transcoder} features per layer)", flush=True)
    seconds, explained, l0 = build_transcoders(model, folder, d_transcoder)
    print(
        f"transcoders: {len(explained)} layers × {d_transcoder} features fitted in {seconds:.1f} s; held-out "
        f"fraction of variance explained {min(explained):.2f}..{max(explained):.2f} (mean "
        f"{sum(explained) / len(explained):.2f}), L0 {l0:.1f} per token per layer",
        flush=True,
    )


if __name__ == "__main__":
    main()
