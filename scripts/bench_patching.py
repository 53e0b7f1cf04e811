"""Benchmark: head patching on the embedded model, against TransformerLens in the same process.

On the 8 IOI pairs of ``mcp_interp/data/corpora/ioi.json`` (denoise: run corrupt, patch in clean ``hook_z`` at
every position, metric = mean logit difference at the answer position), times:

1. the reference — ``transformer_lens.patching.get_act_patch_attn_head_out_all_pos`` (one full
   forward per head, 270 heads);
2. ``patch_heads`` exact (mcp-interp's core, the engine the server uses);
3. ``patch_heads`` attribution;

and prints the wall times, the speed-up ratios, the max |difference| of exact vs the reference,
and for attribution its Spearman rank correlation and top-10 overlap with exact. Also the top 5
heads by exact patching and by zero-ablation (each head alone, logit difference drop).

Then the same comparison on a GPT-NeoX (Pythia-style parallel block) model saved as a local folder: a seeded
random ``GPTNeoXConfig`` of 6 layers × 8 heads (d_model 256, rotary over a quarter of each head, the project's
word-level tiny tokenizer) on three IOI-style pairs in that tokenizer's vocabulary; it prints both wall times,
their ratio and the max |difference| of exact vs the reference, all measured in this run.

Usage: ``python scripts/bench_patching.py [--model smollm2-135m] [--skip-reference] [--only-neox]``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from scipy.stats import spearmanr

from mcp_interp.core.engine.ablation.targets import Ablation, HeadTarget
from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.loader.tiny import tiny_tokenizer_dir
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.engine.text.answers import resolve_answers
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.heads.ablate_head import ablate_heads
from mcp_interp.core.heads.patch_heads import PatchHeadsJob
from mcp_interp.corpora import ioi_pairs

NEOX_PAIRS = [  # (clean, corrupt, correct, incorrect) in the tiny tokenizer's vocabulary
    ("when mary and john went to the store , john gave a drink to", "when mary and john went to the store , mary gave "
     "a drink to", "mary", "john"),
    ("when tom and james went to the park , james gave a ball to", "when tom and james went to the park , tom gave a "
     "ball to", "tom", "james"),
    ("when dan and sid went to the shop , sid gave an apple to", "when dan and sid went to the shop , dan gave an "
     "apple to", "dan", "sid"),
]  # fmt: skip


def run_job(job: PatchHeadsJob) -> float:
    started = time.perf_counter()
    drain(job)
    return time.perf_counter() - started


def neox_folder(folder: str) -> str:
    """A seeded random GPT-NeoX (parallel attention and MLP, Pythia's partial rotary) saved as an HF folder."""
    from transformers import AutoTokenizer, GPTNeoXConfig, GPTNeoXForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir()))
    config = GPTNeoXConfig(
        vocab_size=len(tokenizer), hidden_size=256, num_hidden_layers=6, num_attention_heads=8, intermediate_size=1024,
        rotary_pct=0.25, use_parallel_residual=True, max_position_embeddings=256, initializer_range=0.05,
        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPTNeoXForCausalLM(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def neox_row() -> None:
    """Exact patch_heads against TransformerLens on the GPT-NeoX folder: both timed here, and their max error."""
    import tempfile

    from transformer_lens import patching

    clean, corrupt, correct, incorrect = (list(column) for column in zip(*NEOX_PAIRS, strict=True))
    with tempfile.TemporaryDirectory() as folder:
        model = load_model(neox_folder(folder))
    cfg = model.bridge.cfg
    kwargs = dict(model=model, clean_prompts=clean, corrupt_prompts=corrupt, correct=correct, incorrect=incorrect)
    run_job(PatchHeadsJob(**kwargs))  # the first call pays the one-time warm-up, as in the main rows
    exact = PatchHeadsJob(**kwargs)
    t_exact = run_job(exact)
    assert exact.result is not None
    clean_batch, corrupt_batch = encode(model.tokenizer, clean), encode(model.tokenizer, corrupt)
    good = torch.tensor(resolve_answers(model.tokenizer, correct, len(clean), "correct"))
    bad = torch.tensor(resolve_answers(model.tokenizer, incorrect, len(clean), "incorrect"))

    def metric(logits: torch.Tensor) -> torch.Tensor:
        final = logits[torch.arange(len(clean)), corrupt_batch.answer_positions]
        return (final.gather(1, good[:, None]) - final.gather(1, bad[:, None])).mean()

    started = time.perf_counter()
    _, clean_cache = model.bridge.run_with_cache(clean_batch.input_ids)
    reference = patching.get_act_patch_attn_head_out_all_pos(
        model.bridge, corrupt_batch.input_ids, clean_cache, metric
    ).double()
    t_ref = time.perf_counter() - started
    error = (torch.tensor(exact.result.patched_logit_diff, dtype=torch.float64) - reference).abs().max()
    print(
        f"\nGPT-NeoX folder ({cfg.n_layers} layers x {cfg.n_heads} heads, d_model {cfg.d_model}, parallel block, "
        f"{len(clean)} pairs; engine {exact.engine}):"
    )
    print(f"  TransformerLens get_act_patch_attn_head_out_all_pos  {t_ref:8.2f} s")
    print(f"  patch_heads exact, second call                       {t_exact:8.2f} s  {t_ref / t_exact:6.1f}x faster")
    print(f"  max |patched logit diff difference| = {error:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--skip-reference", action="store_true", help="Do not run TransformerLens' module.")
    parser.add_argument("--only-neox", action="store_true", help="Only the GPT-NeoX folder row.")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.only_neox:
        neox_row()
        return
    model = load_model(args.model)
    pairs = ioi_pairs()
    clean, corrupt = [p.clean for p in pairs], [p.corrupt for p in pairs]
    correct, incorrect = [p.correct for p in pairs], [p.incorrect for p in pairs]
    n_layers, n_heads = model.bridge.cfg.n_layers, model.bridge.cfg.n_heads
    print(
        f"model {model.name}: {n_layers} layers x {n_heads} heads = {n_layers * n_heads} heads, "
        f"{len(pairs)} IOI pairs, torch threads {torch.get_num_threads()}"
    )

    exact = PatchHeadsJob(
        model=model, clean_prompts=clean, corrupt_prompts=corrupt, correct=correct, incorrect=incorrect, method="exact"
    )
    t_exact_cold = run_job(exact)  # the first call in a fresh process (one-time kernel/allocator warm-up)
    exact = PatchHeadsJob(
        model=model, clean_prompts=clean, corrupt_prompts=corrupt, correct=correct, incorrect=incorrect, method="exact"
    )
    t_exact = run_job(exact)  # what a running server sees from its second call on
    assert exact.result is not None
    ours = torch.tensor(exact.result.patched_logit_diff, dtype=torch.float64)
    print(f"exact engine: {exact.engine}")

    attribution = PatchHeadsJob(
        model=model,
        clean_prompts=clean,
        corrupt_prompts=corrupt,
        correct=correct,
        incorrect=incorrect,
        method="attribution",
    )
    t_attr = run_job(attribution)
    assert attribution.result is not None

    rows = [
        ("patch_heads exact, first call in the process", t_exact_cold),
        ("patch_heads exact, second call", t_exact),
        ("patch_heads attribution", t_attr),
    ]
    if not args.skip_reference:
        from transformer_lens import patching

        clean_batch, corrupt_batch = encode(model.tokenizer, clean), encode(model.tokenizer, corrupt)
        good = torch.tensor(resolve_answers(model.tokenizer, correct, len(pairs), "correct"))
        bad = torch.tensor(resolve_answers(model.tokenizer, incorrect, len(pairs), "incorrect"))

        def metric(logits: torch.Tensor) -> torch.Tensor:
            final = logits[torch.arange(len(pairs)), corrupt_batch.answer_positions]
            return (final.gather(1, good[:, None]) - final.gather(1, bad[:, None])).mean()

        started = time.perf_counter()
        _, clean_cache = model.bridge.run_with_cache(clean_batch.input_ids)
        reference = patching.get_act_patch_attn_head_out_all_pos(
            model.bridge, corrupt_batch.input_ids, clean_cache, metric
        ).double()
        t_ref = time.perf_counter() - started
        rows.insert(0, ("TransformerLens get_act_patch_attn_head_out_all_pos", t_ref))

    width = max(len(name) for name, _ in rows)
    print("\nwall time")
    for name, seconds in rows:
        ratio = f"  {t_ref / seconds:6.1f}x faster than the reference" if not args.skip_reference else ""
        print(f"  {name:<{width}}  {seconds:8.2f} s{ratio if name != rows[0][0] or args.skip_reference else ''}")
    if not args.skip_reference:
        print(f"\nexact vs reference: max |patched logit diff difference| = {(ours - reference).abs().max():.2e}")

    exact_scores = [(h.head, h.score or 0.0) for h in exact.result.heads]
    attr_by_head = {h.head: h.score or 0.0 for h in attribution.result.heads}
    names = [name for name, _ in exact_scores]
    rho = spearmanr([s for _, s in exact_scores], [attr_by_head[n] for n in names]).statistic
    top_exact = set(names[:10])
    top_attr = {h.head for h in attribution.result.heads[:10]}
    print(f"attribution vs exact: Spearman rho = {rho:.3f}, top-10 overlap = {len(top_exact & top_attr)}/10")

    print(
        f"\nclean logit diff {exact.result.clean_logit_diff.value:+.3f}, "
        f"corrupt {exact.result.corrupt_logit_diff.value:+.3f}"
    )
    print("top 5 heads by exact patching (recovered fraction):")
    for row in exact.result.heads[:5]:
        print(f"  {row.head:<7} {row.score:+.3f}  (patched logit diff {row.patched_logit_diff:+.3f})")

    started = time.perf_counter()
    drops = []
    for layer in range(n_layers):
        for head in range(n_heads):
            result = ablate_heads(model, clean, Ablation([HeadTarget(layer, head)], "zero"), correct, incorrect)
            assert result.before.logit_diff is not None and result.after.logit_diff is not None
            drops.append((result.before.logit_diff.value - result.after.logit_diff.value, f"L{layer}H{head}"))
    drops.sort(reverse=True)
    print(f"top 5 heads by zero-ablation (drop in clean logit diff; {time.perf_counter() - started:.1f} s for all):")
    for drop, name in drops[:5]:
        print(f"  {name:<7} {drop:+.3f}")
    if not args.skip_reference:
        neox_row()


if __name__ == "__main__":
    main()
