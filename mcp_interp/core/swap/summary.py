"""Summarising executed causal-swap trials: rates with exact intervals, the paired tests, notes.

Model-free: it reads ``TrialRecord``s only, so tests can feed it records built by hand. The
statistics themselves (and the choices behind them) are in ``swap.stats``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from mcp_interp.core.engine import stats as verdicts
from mcp_interp.core.swap import stats
from mcp_interp.core.swap.trial import EXECUTED, INACTIVE, NO_CONTROL, TRIAL_STATUSES
from mcp_interp.schemas.swap import (
    LayerSummary,
    PairedTest,
    PromptLevelTest,
    RateSummary,
    SeedMcNemar,
    SeedRate,
    SeedSpread,
    SwapSettings,
    SwapSummary,
    TrialRecord,
)


def rate_summary(successes: Sequence[bool], prompts: set[tuple[str, str]]) -> RateSummary:
    r = verdicts.rate(successes)
    return RateSummary(
        successes=r.successes, n=r.n, rate=r.rate, ci_low=r.low, ci_high=r.high, n_independent_prompts=len(prompts)
    )


def summarize(trials: Sequence[TrialRecord], layers: Sequence[int], seeds: Sequence[int], excluded: int) -> SwapSummary:
    """Rates, intervals and the paired test over executed trials. Model-free (tests feed records)."""
    executed = [t for t in trials if t.status == EXECUTED]
    prompts = {(t.function, t.source) for t in executed}
    real = [bool(t.real and t.real.top1) for t in executed]
    control_rows = [[c.score.top1 for c in t.controls] for t in executed]
    by_seed = []
    per_seed_tests = []
    for i, seed in enumerate(seeds):
        column = [row[i] for row in control_rows]
        by_seed.append(SeedRate(seed=seed, rate=rate_summary(column, prompts)))
        test = verdicts.mcnemar(real, column)
        per_seed_tests.append(
            SeedMcNemar(seed=seed, real_only=test.real_better, control_only=test.control_better, p_value=test.p_value)
        )
    seed_rates = [s.rate.rate for s in by_seed if s.rate.rate is not None]
    mean, sd, low, high = stats.spread(seed_rates) if seed_rates else (None, None, None, None)
    paired = stats.exchangeable_test(real, control_rows)
    clustered = stats.prompt_level_test(real, control_rows, [f"{t.function}/{t.source}" for t in executed])
    by_layer = []
    for layer in layers:
        at = [t for t in trials if t.layer == layer]
        done = [t for t in at if t.status == EXECUTED]
        layer_prompts = {(t.function, t.source) for t in done}
        by_layer.append(
            LayerSummary(
                layer=layer,
                executed=len(done),
                skipped_source_inactive=sum(t.status == INACTIVE for t in at),
                skipped_no_control_token=sum(t.status == NO_CONTROL for t in at),
                real=rate_summary([bool(t.real and t.real.top1) for t in done], layer_prompts),
                control=rate_summary([c.score.top1 for t in done for c in t.controls], layer_prompts),
            )
        )
    return SwapSummary(
        status_counts={status: sum(t.status == status for t in trials) for status in TRIAL_STATUSES},
        layers=list(layers),
        layers_executed=[s.layer for s in by_layer if s.executed],
        real=rate_summary(real, prompts),
        control=rate_summary([c for row in control_rows for c in row], prompts),
        control_by_seed=by_seed,
        control_seed_spread=SeedSpread(mean=mean, sd=sd, min=low, max=high),
        paired=PairedTest(
            test="exact conditional test: under H0 each trial's real edit is exchangeable with its matched controls, "
            "so given s_i successes among its m + 1 arms it succeeds with probability s_i/(m + 1); the count of real "
            "successes has a Poisson-binomial null",
            real_successes=paired.real_successes,
            expected_real_successes=paired.expected,
            informative_trials=paired.informative_trials,
            p_real_better=paired.p_real_better,
            p_control_better=paired.p_control_better,
            p_value=paired.p_value,
            per_seed=per_seed_tests,
            by_prompt=PromptLevelTest(**dataclasses.asdict(clustered)),
        ),
        by_layer=by_layer,
        n_independent_prompts=len(prompts),
        real_success_prompts=sorted({f"{t.function}/{t.source}" for t in executed if t.real and t.real.top1}),
        excluded_trials=excluded,
        target_was_active=sum(bool(t.target_was_active) for t in executed),
    )


def benchmark_notes(trials: Sequence[TrialRecord], settings: SwapSettings) -> list[str]:
    executed = [t for t in trials if t.status == EXECUTED]
    notes = []
    if executed:
        notes.append(
            "Trials of one prompt at several layers and targets are not independent; the Clopper–Pearson intervals "
            "treat them as if they were, so read every rate next to its n_independent_prompts (the paired tests are "
            "conditional on every arm's outcome and stay valid; paired.by_prompt weights prompts equally)."
        )
    winners = {(t.function, t.source) for t in executed if t.real and t.real.top1}
    if 0 < len(winners) < 3:
        names = ", ".join(f"{f}/{s}" for f, s in sorted(winners))
        wins = sum(bool(t.real and t.real.top1) for t in executed)
        notes.append(
            f"All {wins} real successes come from {len(winners)} prompt(s) ({names}): compare them with that prompt's "
            "own control draws in the artifact before calling it a swap."
        )
    active = sum(bool(t.target_was_active) for t in executed)
    if active:
        notes.append(
            f"In {active} executed trial(s) the target atom was already active, so the substitute edit overwrote its "
            "coordinate instead of adding to it (target_was_active in the artifact): those edits differ in size from "
            "their controls."
        )
    if not executed:
        notes.append(
            "No trial was executed, so there is no rate to report: see status_counts and the per-trial skip reasons "
            "in the artifact (a source concept that is never in the active support is itself a finding about the lens)."
        )
    prompts = {(t.function, t.source) for t in executed}
    if executed and len(prompts) < 5:
        notes.append(
            f"The {len(executed)} executed trials come from only {len(prompts)} distinct prompt(s): trials sharing a "
            "prompt are not independent, so the intervals overstate the evidence."
        )
    if settings.lens == "logit":
        notes.append("Lens: logit lens (J = I); atoms are unembedding columns, which ignore the final norm.")
    return notes
