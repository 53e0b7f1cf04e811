"""Train small per-layer transcoders for the loaded model on text it can produce offline, in circuit-tracer's format.

Why it exists: no public transcoder set fits SmolLM2, and the server runs offline. This measures what a CPU can do:
the text is the shipped ``lens_corpus`` (48 paragraphs written for the project) plus continuations the model
samples from the first words of each of its sentences (seeded); every layer's MLP input (``mlp.hook_in``) and
output (``hook_mlp_out``) are read on it; each layer's transcoder is TopK (circuit-tracer's ``activation: topk``:
the k largest pre-activations kept) trained with Adam on the squared reconstruction error of the MLP output,
encoder rows initialised from data and the decoder from a least-squares fit, for a fixed time per layer. The
fraction of variance explained (FVE) of the MLP output is measured on held-out tokens (the last 10 % of the
paragraphs and generations, never trained on).

Usage: ``python scripts/train_transcoders.py OUT [--layers 5,15,25] [--features 256] [--k 16] [--seconds 60]
[--generate 64]`` — ``--generate`` continuations of 128 tokens each.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import save_file

from mcp_interp.core.engine.backend.bridge import hf_model
from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.points import hook_mlp_input, hook_mlp_out
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.corpora import corpora_dir

MAX_TOKENS = 160


def texts_of(model: LoadedModel, n_generated: int, seed: int = 0) -> list[str]:
    """The lens corpus' paragraphs plus ``n_generated`` sampled continuations of their sentences' first words."""
    paragraphs = list(json.loads((corpora_dir() / "lens_corpus.json").read_text(encoding="utf-8"))["texts"])
    starts = [" ".join(s.split()[:5]) for p in paragraphs for s in re.split(r"(?<=[.!?])\s+", p) if len(s.split()) > 6]
    generator = torch.Generator().manual_seed(seed)
    chosen = [starts[int(i)] for i in torch.randint(0, len(starts), (n_generated,), generator=generator)]
    generated: list[str] = []
    tokenizer, hf = model.tokenizer, hf_model(model.bridge)
    torch.manual_seed(seed)
    for i in range(0, len(chosen), 16):
        batch = chosen[i : i + 16]
        tokenizer.padding_side = "left"
        inputs = tokenizer(batch, return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = hf.generate(**inputs, max_new_tokens=128, do_sample=True, temperature=0.8, top_p=0.95,
                              pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)  # fmt: skip
        generated += tokenizer.batch_decode(out, skip_special_tokens=True)
    tokenizer.padding_side = "right"
    return paragraphs + generated


def keeper(into: list[torch.Tensor], mask: torch.Tensor) -> Any:
    """A hook appending the real tokens' values (``mask``) to ``into``."""

    def keep(values: torch.Tensor, hook: Any) -> None:
        into.append(values[mask].float())

    return keep


def activations(
    model: LoadedModel, texts: list[str], layers: list[int]
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (MLP input, MLP output) over every real token of ``texts`` (≤ MAX_TOKENS each), float32."""
    kept: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {layer: ([], []) for layer in layers}
    for i in range(0, len(texts), 16):
        batch = encode(model.tokenizer, texts[i : i + 16], model.device)
        ids, mask = batch.input_ids[:, :MAX_TOKENS], batch.attention_mask[:, :MAX_TOKENS].bool()
        hooks = []
        for layer in layers:
            hooks.append((hook_mlp_input(layer), keeper(kept[layer][0], mask)))
            hooks.append((hook_mlp_out(layer), keeper(kept[layer][1], mask)))
        with torch.inference_mode(), model.bridge.hooks(fwd_hooks=hooks):
            model.bridge(ids, return_type=None)
    return {layer: (torch.cat(x), torch.cat(y)) for layer, (x, y) in kept.items()}


def train_layer(
    x: torch.Tensor, y: torch.Tensor, d_transcoder: int, k: int, seconds: float, seed: int
) -> dict[str, torch.Tensor]:
    """A TopK transcoder x → y trained for ``seconds`` (Adam, batches of 1024 tokens)."""
    generator = torch.Generator().manual_seed(seed)
    x_mean, y_mean = x.mean(0), y.mean(0)
    picks = torch.randint(0, x.shape[0], (d_transcoder,), generator=generator)
    w_enc = (x[picks] - x_mean) / (x[picks] - x_mean).norm(dim=1, keepdim=True).clamp(min=1e-6)
    b_enc = -(x_mean @ w_enc.T)
    with torch.no_grad():  # decoder from a least-squares fit of the initial TopK codes
        pre = x @ w_enc.T + b_enc
        codes = torch.zeros_like(pre).scatter_(1, pre.topk(k, dim=1).indices, pre.topk(k, dim=1).values)
        gram = codes.T @ codes + 1e-3 * torch.eye(d_transcoder) * (codes**2).mean()
        w_dec = torch.linalg.solve(gram, codes.T @ (y - y_mean))
    params = [p.clone().requires_grad_(True) for p in (w_enc, b_enc, w_dec, y_mean)]
    optimizer = torch.optim.Adam(params, lr=1e-3)
    started, step = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        index = torch.randint(0, x.shape[0], (1024,), generator=generator)
        pre = x[index] @ params[0].T + params[1]
        top = pre.topk(k, dim=1)
        codes = torch.zeros_like(pre).scatter(1, top.indices, top.values)
        loss = ((codes @ params[2] + params[3] - y[index]) ** 2).sum(1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
    w_enc, b_enc, w_dec, b_dec = (p.detach() for p in params)
    return {
        "W_enc": w_enc.contiguous(),
        "b_enc": b_enc,
        "W_dec": w_dec.contiguous(),
        "b_dec": b_dec,
        "steps": torch.tensor(step),
    }


def fve(weights: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, k: int) -> float:
    pre = x @ weights["W_enc"].T + weights["b_enc"]
    top = pre.topk(k, dim=1)
    recon = torch.zeros_like(pre).scatter(1, top.indices, top.values) @ weights["W_dec"] + weights["b_dec"]
    return 1.0 - float(((y - recon) ** 2).sum() / ((y - y.mean(0)) ** 2).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--layers", default="all")
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0, help="training time per layer")
    parser.add_argument("--generate", type=int, default=64, help="sampled continuations of 128 tokens")
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model)
    n_layers = int(model.bridge.cfg.n_layers)
    layers = list(range(n_layers)) if args.layers == "all" else [int(v) for v in args.layers.split(",")]
    started = time.perf_counter()
    texts = texts_of(model, args.generate)
    held_out = set(range(0, len(texts), 10))  # every tenth text, never trained on
    train = [t for i, t in enumerate(texts) if i not in held_out]
    test = [t for i, t in enumerate(texts) if i in held_out]
    print(f"{len(texts)} texts ({args.generate} generated) in {time.perf_counter() - started:.0f} s", flush=True)
    started = time.perf_counter()
    fit, check = activations(model, train, layers), activations(model, test, layers)
    print(f"activations of {fit[layers[0]][0].shape[0]} training and {check[layers[0]][0].shape[0]} held-out tokens "
          f"in {time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    report = {}
    for layer in layers:
        started = time.perf_counter()
        weights = train_layer(*fit[layer], args.features, args.k, args.seconds, seed=layer)
        steps = int(weights.pop("steps"))
        report[layer] = {
            "fve": fve(weights, *check[layer], args.k),
            "steps": steps,
            "seconds": time.perf_counter() - started,
        }
        save_file(
            {name: t.to(torch.float16) for name, t in weights.items()}, str(args.out / f"layer_{layer}.safetensors")
        )
        print(f"layer {layer}: held-out FVE {report[layer]['fve']:.3f} after {steps} steps", flush=True)
    config = {
        "model_kind": "transcoder_set",
        "feature_input_hook": "mlp.hook_in",
        "feature_output_hook": "hook_mlp_out",
        "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "activation": "topk",
        "k": args.k,
    }
    (args.out / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (args.out / "training.json").write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "layers": report}, indent=1)
    )


if __name__ == "__main__":
    main()
