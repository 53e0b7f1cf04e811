"""Benchmark: ``patch`` (localize family) on the embedded model, against TransformerLens in the same process.

On the 8 IOI pairs of ``mcp_interp/data/corpora/ioi.json`` (denoise: run corrupt, patch in clean,
metric = mean logit difference at the answer position), times:

1. the references — ``transformer_lens.patching.get_act_patch_resid_pre`` (one full forward per
   layer × position) and ``get_act_patch_block_every`` (resid_pre, attn_out and mlp_out);
   ``get_act_patch_attn_head_out_all_pos`` for the head-attribution ratio;
2. ``patch(component=resid_pre)`` exact, then the three block components exact (what
   ``block_every`` computes);
3. attribution: the three block components and ``patch_heads(method="attribution")``;

and prints wall times, speed-up ratios and the max |difference| of exact vs the references. Goals
(issue "localize"): exact ≥ 10× faster than TransformerLens at ≤ 1e-4; attribution ≥ 50× faster
than the TransformerLens exact functions.

Usage: ``python scripts/bench_localize.py [--model smollm2-135m] [--skip-heads-reference]``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.engine.text.answers import resolve_answers
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.heads.patch_heads import PatchHeadsJob
from mcp_interp.core.localize.patch import PatchJob
from mcp_interp.corpora import ioi_pairs

BLOCK_COMPONENTS = ("resid_pre", "attn_out", "mlp_out")  # the order of get_act_patch_block_every


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument(
        "--skip-heads-reference", action="store_true", help="Skip TransformerLens' per-head patching (~70 s)."
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformer_lens import patching

    model = load_model(args.model)
    pairs = ioi_pairs()
    clean, corrupt = [p.clean for p in pairs], [p.corrupt for p in pairs]
    correct, incorrect = [p.correct for p in pairs], [p.incorrect for p in pairs]
    clean_batch, corrupt_batch = encode(model.tokenizer, clean), encode(model.tokenizer, corrupt)
    print(
        f"model {model.name}: {model.bridge.cfg.n_layers} layers, {len(pairs)} IOI pairs of "
        f"{clean_batch.input_ids.shape[1]} tokens, torch threads {torch.get_num_threads()}"
    )
    good = torch.tensor(resolve_answers(model.tokenizer, correct, len(pairs), "correct"))
    bad = torch.tensor(resolve_answers(model.tokenizer, incorrect, len(pairs), "incorrect"))

    def metric(logits: torch.Tensor) -> torch.Tensor:
        final = logits[torch.arange(len(pairs)), corrupt_batch.answer_positions]
        return (final.gather(1, good[:, None]) - final.gather(1, bad[:, None])).mean()

    def ours(component: str, method: str = "exact") -> tuple[PatchJob, float]:
        job = PatchJob(
            model=model,
            clean_prompts=clean,
            corrupt_prompts=corrupt,
            correct=correct,
            incorrect=incorrect,
            component=component,
            method=method,
        )
        _, seconds = timed(lambda: drain(job))
        return job, seconds

    ours("resid_pre")  # one-time kernel/allocator warm-up, as in a running server
    times: dict[str, float] = {}
    exact_grids = {}
    for component in BLOCK_COMPONENTS:
        job, times[f"patch {component} exact"] = ours(component)
        assert job.result is not None and job.result.patched is not None
        exact_grids[component] = torch.tensor(job.result.patched, dtype=torch.float64)
        print(f"  {component}: engine {job.engine}")
    for component in BLOCK_COMPONENTS:
        _, times[f"patch {component} attribution"] = ours(component, "attribution")
    heads = PatchHeadsJob(
        model=model,
        clean_prompts=clean,
        corrupt_prompts=corrupt,
        correct=correct,
        incorrect=incorrect,
        method="attribution",
    )
    _, times["patch_heads attribution"] = timed(lambda: drain(heads))

    (_, clean_cache), t_cache = timed(lambda: model.bridge.run_with_cache(clean_batch.input_ids))
    ref_pre, t_ref_pre = timed(
        lambda: patching.get_act_patch_resid_pre(model.bridge, corrupt_batch.input_ids, clean_cache, metric)
    )
    ref_every, t_ref_every = timed(
        lambda: patching.get_act_patch_block_every(model.bridge, corrupt_batch.input_ids, clean_cache, metric)
    )
    t_ref_pre += t_cache
    t_ref_every += t_cache

    print("\nexact patching (wall time, ratio = TransformerLens / ours)")
    print(f"  TransformerLens get_act_patch_resid_pre      {t_ref_pre:8.2f} s")
    print(f"  TransformerLens get_act_patch_block_every    {t_ref_every:8.2f} s")
    t_pre = times["patch resid_pre exact"]
    t_three = sum(times[f"patch {c} exact"] for c in BLOCK_COMPONENTS)
    print(f"  patch resid_pre exact                        {t_pre:8.2f} s   {t_ref_pre / t_pre:6.1f}x")
    print(f"  patch resid_pre + attn_out + mlp_out exact   {t_three:8.2f} s   {t_ref_every / t_three:6.1f}x")
    print(f"  max |diff| resid_pre vs reference: {(exact_grids['resid_pre'] - ref_pre.double()).abs().max():.2e}")
    for index, component in enumerate(BLOCK_COMPONENTS):
        difference = (exact_grids[component] - ref_every[index].double()).abs().max()
        print(f"  max |diff| {component} vs block_every: {difference:.2e}")

    print("\nattribution (ratio = TransformerLens exact / ours)")
    for component in BLOCK_COMPONENTS:
        seconds = times[f"patch {component} attribution"]
        reference = t_ref_pre if component == "resid_pre" else t_ref_every / 3
        print(f"  patch {component:<9} attribution  {seconds:6.2f} s   {reference / seconds:6.1f}x")
    t_heads = times["patch_heads attribution"]
    if args.skip_heads_reference:
        print(f"  patch_heads attribution   {t_heads:6.2f} s   (heads reference skipped)")
    else:
        _, t_ref_heads = timed(
            lambda: patching.get_act_patch_attn_head_out_all_pos(
                model.bridge, corrupt_batch.input_ids, clean_cache, metric
            )
        )
        t_ref_heads += t_cache
        print(f"  TransformerLens get_act_patch_attn_head_out_all_pos  {t_ref_heads:8.2f} s")
        print(f"  patch_heads attribution   {t_heads:6.2f} s   {t_ref_heads / t_heads:6.1f}x")


if __name__ == "__main__":
    main()
