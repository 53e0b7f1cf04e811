"""Benchmark: the features family on the embedded model, one process.

Probe section (``bench_probe``): ``probe`` over every layer on the 400 texts of the shipped
``subject_number`` corpus (logistic, with controls), against a reference measured in the same run:
the same residuals read with one forward pass per layer (what a per-layer loop over
``run_with_cache`` does), then the same fits. Goal (issue "features"): ≤ 30 s for 30 layers × 400
texts. Also prints the probe's accuracy, interval and selectivity by layer.

SAE section (``bench_sae``): a seeded random 16 384-feature standard SAE on the middle layer's
``resid_post``, written in SAELens' format (cfg.json + sae_weights.safetensors) to a temporary
folder, then ``sae`` on a 64-token text timed with the SAE already loaded (the in-process cache) and
with the load included (cache cleared first; the file itself is in the OS page cache after the
first read), and ``sae_features`` (8 texts × 32 features) for scale. Goal (issue "features"): ``sae``
on 64 tokens ≤ 2 s.

Usage: ``python scripts/bench_features.py [--model smollm2-135m] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

import mcp_interp.state.paths as paths
from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.dictionaries.saelens import load_sae
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.engine.text.tokens import token_ids
from mcp_interp.core.features.probe_job import ProbeJob
from mcp_interp.core.features.residuals import read_residuals
from mcp_interp.core.features.sae_report import sae_feature_activations, sae_report
from mcp_interp.corpora import ioi_pairs, subject_number

D_SAE = 16_384
N_TOKENS = 64


def write_random_sae(folder: Path, d_in: int, hook: str, model_name: str, seed: int = 0) -> None:
    """A standard (ReLU) SAE with unit-norm random encoder columns and W_dec = W_encᵀ, in SAELens 6 format."""
    generator = torch.Generator().manual_seed(seed)
    w_enc = torch.randn(d_in, D_SAE, generator=generator)
    w_enc /= w_enc.norm(dim=0, keepdim=True)
    weights = {
        "W_enc": w_enc,
        "b_enc": torch.zeros(D_SAE),
        "W_dec": w_enc.T.contiguous() / 8.0,
        "b_dec": torch.zeros(d_in),
    }
    save_file(weights, str(folder / "sae_weights.safetensors"))
    cfg = {
        "architecture": "standard",
        "d_in": d_in,
        "d_sae": D_SAE,
        "dtype": "float32",
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "metadata": {"sae_lens_version": "6.18.0", "model_name": model_name, "hook_name": hook},
    }
    (folder / "cfg.json").write_text(json.dumps(cfg))


def text_of(model: LoadedModel, n_tokens: int) -> str:
    """A text of about ``n_tokens`` tokens from the IOI corpus (cut at a token boundary)."""
    long = " ".join(pair.clean + " " + pair.correct + "." for pair in ioi_pairs())
    ids = token_ids(model.tokenizer, long)
    return str(model.tokenizer.decode(ids[:n_tokens]))


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, list[float]]:
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), seconds


def reference_sae_numbers(model: LoadedModel, text: str, folder: str) -> tuple[float, float, float, float]:
    """The reference for ``sae``: the same numbers the obvious way, in the same process — a full
    ``run_with_cache`` for the activation, the SAE applied to it, then full forwards with the reconstruction and
    with zeros spliced in by hooks. Returns (L0, clean loss, spliced loss, zero loss) to check they agree."""
    sae = load_sae(folder, model)
    ids = torch.tensor([token_ids(model.tokenizer, text)])
    with torch.inference_mode():
        logits, cache = model.bridge.run_with_cache(ids)
        x = sae.to_input(cache[sae.hook_name][0])
        acts = sae.encode(x)
        x_hat = sae.from_input(sae.decode(acts), cache[sae.hook_name][0])

        def loss(values: torch.Tensor | None) -> float:
            if values is None:
                out = logits
            else:
                hooks = [(sae.hook_name, lambda v, hook: values.unsqueeze(0).to(v.dtype))]
                with model.bridge.hooks(fwd_hooks=hooks):
                    out = model.bridge(ids)
            log_probs = torch.log_softmax(out[0, :-1].double(), dim=-1)
            return float(-log_probs.gather(1, ids[0, 1:, None]).mean())

        l0 = float((acts > 0).sum(dim=-1).double().mean())
        return l0, loss(None), loss(x_hat), loss(torch.zeros_like(x_hat))


def bench_sae(model: LoadedModel, repeats: int = 5) -> None:
    layer = model.bridge.cfg.n_layers // 2
    hook = f"blocks.{layer}.hook_resid_post"  # SAELens' name: the format's field, mapped by the loader
    text = text_of(model, N_TOKENS)
    n_tokens = len(token_ids(model.tokenizer, text))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "sae"
        folder.mkdir()
        paths.configure([*paths.stdio_defaults(), folder])  # the script names its own folder, as --allow-root would
        write_random_sae(folder, int(model.bridge.cfg.d_model), hook, model.name)
        size_mb = (folder / "sae_weights.safetensors").stat().st_size / 1e6
        print(f"\nSAE: {D_SAE} features at {hook} (d_in {model.bridge.cfg.d_model}), weights {size_mb:.0f} MB")

        model.cache.clear()
        started = time.perf_counter()
        load_sae(str(folder), model)
        print(f"  load (cold, from disk): {time.perf_counter() - started:.3f} s")
        measurement, _ = sae_report(model, text, str(folder))  # warm-up
        warm, all_warm = timed(lambda: sae_report(model, text, str(folder)), repeats)

        def cold() -> None:
            model.cache.clear()
            sae_report(model, text, str(folder))

        with_load, all_cold = timed(cold, repeats)
        print(
            f"  sae on {n_tokens} tokens, SAE cached:      median {warm:.3f} s  "
            f"({', '.join(f'{s:.3f}' for s in all_warm)})"
        )
        print(
            f"  sae on {n_tokens} tokens, load included: median {with_load:.3f} s  "
            f"({', '.join(f'{s:.3f}' for s in all_cold)})"
        )
        print(f"  goal ≤ 2 s: {'met' if max(warm, with_load) <= 2.0 else 'NOT met'}")
        reference_sae_numbers(model, text, str(folder))  # warm-up
        reference, _ = timed(lambda: reference_sae_numbers(model, text, str(folder)), repeats)
        l0, clean, spliced, zero = reference_sae_numbers(model, text, str(folder))
        agree = max(
            abs(l0 - measurement.l0),
            abs(clean - (measurement.clean_loss or 0.0)),
            abs(spliced - (measurement.spliced_loss or 0.0)),
            abs(zero - (measurement.zero_ablation_loss or 0.0)),
        )
        print(
            f"  reference (full run_with_cache + spliced/zero forwards, same process): median {reference:.3f} s; "
            f"sae (cached) is {reference / warm:.2f}× of it; max |diff| of L0 and the three losses {agree:.1e}"
        )
        print(
            f"  FVE {measurement.fraction_variance_explained:.3f}, L0 {measurement.l0:.0f}, losses clean "
            f"{measurement.clean_loss:.3f} / spliced {measurement.spliced_loss:.3f} / zero "
            f"{measurement.zero_ablation_loss:.3f} nats (random SAE: its numbers mean nothing)"
        )

        texts = [pair.clean for pair in ioi_pairs()][:8]
        features = list(range(0, D_SAE, D_SAE // 32))
        seconds, _ = timed(lambda: sae_feature_activations(model, texts, str(folder), features), repeats)
        print(f"  sae_features, {len(texts)} texts × {len(features)} features: median {seconds:.3f} s")


def bench_probe(model: LoadedModel) -> None:
    corpus = subject_number()
    n_layers = int(model.bridge.cfg.n_layers)
    print(f"\nprobe: {len(corpus.texts)} texts ({corpus.name}), {n_layers} layers, position {corpus.position!r}")
    started = time.perf_counter()
    job = ProbeJob(model=model, texts=corpus.texts, labels=corpus.labels, position=corpus.position)
    result = drain(job)
    ours = time.perf_counter() - started
    started = time.perf_counter()
    one_pass = read_residuals(model, corpus.texts, None, corpus.position)
    read_once = time.perf_counter() - started
    started = time.perf_counter()
    per_layer = [read_residuals(model, corpus.texts, [layer], corpus.position) for layer in range(n_layers)]
    read_per_layer = time.perf_counter() - started
    same = max(float((one_pass.values[:, i] - r.values[:, 0]).abs().max()) for i, r in enumerate(per_layer))
    fits = ours - read_once
    print(f"  probe, all layers (one forward pass + {n_layers} × 3 fits): {ours:.2f} s; goal ≤ 30 s: "
          f"{'met' if ours <= 30 else 'NOT met'}")  # fmt: skip
    print(
        f"  residuals in one pass {read_once:.2f} s vs one pass per layer {read_per_layer:.2f} s "
        f"({read_per_layer / read_once:.1f}×, max |diff| {same:.1e}); with the fits: {ours:.2f} s vs "
        f"{read_per_layer + fits:.2f} s ({(read_per_layer + fits) / ours:.1f}×)"
    )
    for row in result.layers[:: max(1, n_layers // 10)]:
        print(
            f"  L{row.layer:>2} accuracy {row.accuracy:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}] train "
            f"{row.train_accuracy:.3f} {result.control_kind} control {row.control_accuracy:.3f} selectivity "
            f"{row.selectivity:+.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = load_model(args.model)
    print(f"model {model.name}, torch threads {torch.get_num_threads()}")
    bench_probe(model)
    bench_sae(model, args.repeats)


if __name__ == "__main__":
    main()
