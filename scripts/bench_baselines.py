"""Benchmark: the random baseline of a direction ablation, stacked draws against one forward per draw.

``ablate`` ranks a residual direction's effect among ``random_draws`` energy-matched random directions
(``engine.baselines``). The draws run as stacked copies of the prompt batch, several per forward. This script times,
in one process on the same prompts and direction (the demo's 8 IOI prompts, the mean difference of their last-token
residuals at the middle layer):

* the baseline with 5 (the old default) and with 20 draws (stacked), and
* the reference: the same 20 random directions, each ablation run as its own forward (what a loop over
  ``ablation_outcome`` did before), measured here, not remembered.

It prints the ratios 20-stacked / 5-stacked and 20-stacked / 20-unstacked, and checks the two 20-draw runs give the
same changes. Usage: ``python scripts/bench_baselines.py [--model smollm2-135m] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from mcp_interp.core.engine.ablation import baselines
from mcp_interp.core.engine.ablation.effect import ablation_outcome
from mcp_interp.core.engine.ablation.targets import Ablation, DirectionTarget
from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.points import hook_out
from mcp_interp.core.engine.text.components import position_mask
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.corpora import ioi_pairs


def timed(run: Callable[[], object], repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = load_model(args.model)
    pairs = ioi_pairs()[:8]
    prompts = [p.clean for p in pairs]
    correct, incorrect = [p.correct for p in pairs], [p.incorrect for p in pairs]
    layer = model.bridge.cfg.n_layers // 2
    batch = encode(model.tokenizer, prompts, model.device)
    resid = model.backend.capture(batch.input_ids, [hook_out(layer)]).acts[hook_out(layer)]
    direction = resid[torch.arange(len(prompts)), batch.answer_positions].mean(dim=0)
    ablation = Ablation([DirectionTarget(layer, (direction / direction.norm()).float())], positions="all")

    # The tool refuses fewer than 19 draws (they cannot reach p < 0.05); the timing of 5 is what the old default cost.
    baselines.stats.check_draws = lambda n, what="random_draws": None  # type: ignore[assignment]
    five, _ = timed(lambda: baselines.random_baseline(model, prompts, ablation, correct, incorrect, 5), args.repeats)
    twenty, stacked = timed(
        lambda: baselines.random_baseline(model, prompts, ablation, correct, incorrect, 20), args.repeats
    )

    def one_forward_per_draw() -> list[float]:
        mask = position_mask(ablation.positions, batch.attention_mask, batch.answer_positions)
        matched, _ = baselines.matched_mask(mask)
        generator = torch.Generator(device="cpu").manual_seed(ablation.seed)
        target = ablation.directions[0]
        draws = baselines.random_directions(target, resid[matched], 20, generator)
        before = ablation_outcome(model, prompts, ablation, correct, incorrect).before.logit_diff
        assert before is not None
        out = []
        for drawn in draws:
            outcome = ablation_outcome(model, prompts, replace(ablation, targets=[drawn]), correct, incorrect)
            assert outcome.after.logit_diff is not None
            out.append(outcome.after.logit_diff.value - before.value)
        return out

    reference, looped = timed(one_forward_per_draw, args.repeats)
    assert stacked is not None and isinstance(looped, list)
    worst = max(abs(a - b) for a, b in zip(stacked.draws, looped, strict=True))  # type: ignore[attr-defined]
    print(f"model {model.name}: 8 IOI prompts, direction at layer {layer}, positions 'all'")
    print(f"stacked, 5 draws: {five:.2f} s; stacked, 20 draws: {twenty:.2f} s")
    print(f"reference (one forward per draw, 20 draws): {reference:.2f} s")
    print(f"ratio 20 stacked / 5 stacked: {twenty / five:.2f}")
    print(f"ratio 20 stacked / 20 one-per-forward: {twenty / reference:.2f}")
    print(f"largest |difference| between the two 20-draw runs: {worst:.2e}")


if __name__ == "__main__":
    main()
