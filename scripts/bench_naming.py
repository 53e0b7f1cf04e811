"""Benchmark of `feature_examples` on SmolLM2 over the shipped corpus's 2,000 search texts.

Measured in one process, one after the other:

1. cold: `FeatureExamplesJob` for one neuron with empty caches — one batched pass (texts sorted by length, batches of
   ≤ 4,096 padded tokens, each forward stopped at the neuron's layer), the ranking, the output tokens;
2. warm: the same call again (the feature's activations come from the cache: no forward);
3. same point: another neuron of the same layer (computed from the cached values at `mlp.hook_post`: no forward);
4. the reference: a per-text loop — each text run alone through the same seam, stopped at the same point — over
   `--reference-texts` texts (all 2,000 by default; fewer are timed and scaled linearly, and the output says so).

It prints each time, the ratio reference / cold, the largest difference between the batched and the per-text
activations, and the machine's load average before and after (the 2 cores are shared). Goal: cold ≤ 30 s.

    HF_HUB_OFFLINE=1 python scripts/bench_naming.py [--layer 6] [--neuron 562] [--reference-texts 2000] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch

from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.points import hook_mlp_post
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.features.examples import FeatureExamplesJob
from mcp_interp.corpora import text_corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layer", type=int, default=6)
    parser.add_argument("--neuron", type=int, default=562)
    parser.add_argument("--reference-texts", type=int, default=2000)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own, one per core)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model("smollm2-135m")
    texts = text_corpus("wordnet_examples").search
    tokens = sum(len(model.tokenizer(t)["input_ids"]) for t in texts)
    print(f"SmolLM2, {len(texts)} texts ({tokens} tokens), torch threads {torch.get_num_threads()}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")

    def timed(neuron: int) -> tuple[float, object]:
        started = time.perf_counter()
        job = FeatureExamplesJob(model=model, feature=f"L{args.layer}N{neuron}", top_k=10, window=8)
        result = drain(job)
        return time.perf_counter() - started, result

    cold, result = timed(args.neuron)
    warm, _ = timed(args.neuron)
    other, _ = timed(args.neuron + 1)
    point = hook_mlp_post(args.layer)
    n_ref = min(args.reference_texts, len(texts))
    cached = model.cache.peek(("naming_feature", f"L{args.layer}N{args.neuron}", _key(texts)))
    worst = 0.0
    started = time.perf_counter()
    for i, text in enumerate(texts[:n_ref]):
        ids = torch.tensor([model.tokenizer(text)["input_ids"]])
        values = model.backend.run(ids, capture=[point], stop_at=point, output="none").acts[point][0, :, args.neuron]
        worst = max(worst, float(np.abs(values.float().numpy() - cached.values[i]).max()))
    reference = (time.perf_counter() - started) * len(texts) / n_ref
    scaled = "" if n_ref == len(texts) else f" (timed on {n_ref} texts, scaled to {len(texts)})"
    top = result.examples[0]  # type: ignore[attr-defined]
    print(f"cold (one batched pass + ranking): {cold:.1f} s   goal ≤ 30 s")
    print(f"warm (the feature cached): {warm:.2f} s")
    print(f"another neuron of layer {args.layer} (its values cached): {other:.2f} s")
    print(f"per-text loop{scaled}: {reference:.1f} s   ratio per-text / batched cold = {reference / cold:.1f}×")
    print(f"max |batched − per-text| = {worst:.2e}")
    print(f"top example: {top.max_activation:.3f} at {top.max_token!r} in {top.text!r}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def _key(texts: list[str]) -> str:
    from mcp_interp.core.features.activations import texts_key

    return texts_key(texts)


if __name__ == "__main__":
    main()
