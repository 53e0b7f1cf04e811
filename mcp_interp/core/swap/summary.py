"""Summarising executed causal-swap trials: the strict success rate, the graded specificity, their tests, notes.

Model-free: it reads ``TrialRecord``s only, so tests can feed it records built by hand. Three questions, each
answered by the same target-level relabelling test (``engine.stats.relabel_test``; the choice is explained in
``swap.stats`` and ``tested_swaps``), each on one number per (target, arm) — the arms are the real edit (toward the
target) and one control per seed, each one token in every trial of a swap (``swap.controls``), summarised over the
trials (every layer) of the one swap per target the tests use:

* **swap** — the headline rule: the strict top-1 success rate of the target's answer (``swap_test``);
* **specificity** — the mean margin gain (edited − unedited margin of the target's answer, logits; > 0 = toward
  the target): does the real edit move the answer more than a displacement-matched control does?
* **beats all** — the fraction of trials in which an arm's margin gain is above every other arm's; by chance
  1/(m + 1) for each arm.

Rates, medians and the beats-all count describe every executed trial; the p-values rest on the tested swaps.
A benchmark can show "no swap" (0 strict successes, p = 1) with a specific graded effect (the real edit raises the
target's margin more than its controls, p small): the verdict says both, so neither reads as the other.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from mcp_interp.core.engine.numbers import stats as verdicts
from mcp_interp.core.swap import stats
from mcp_interp.core.swap.trial import EXECUTED, INACTIVE, NO_CONTROL, TRIAL_STATUSES
from mcp_interp.schemas.swap import (
    LayerSummary,
    PromptTest,
    RateSummary,
    SeedSpread,
    Specificity,
    SwapSettings,
    SwapSummary,
    TrialRecord,
)


def rate_summary(successes: Sequence[bool], prompts: set[tuple[str, str]]) -> RateSummary:
    r = verdicts.rate(successes)
    return RateSummary(
        successes=r.successes, n=r.n, rate=r.rate, ci_low=r.low, ci_high=r.high, n_independent_prompts=len(prompts)
    )


def tested_swaps(executed: Sequence[TrialRecord]) -> dict[str, tuple[str, str]]:
    """Per target, the swap (function, source) whose trials the tests use: the one with the most executed trials (the
    first in trial order on a tie) — a choice made from which edits could run, never from their outcomes.

    Why one swap per target: the target's token is the real arm of every swap toward it — about 6 prompts per
    function, in each function — so whatever that one token does is shared by all of them, while each swap's controls
    are tokens of their own (a control displacement-matched to every source at every layer practically never exists:
    none on the default benchmark). Relabelling per prompt (function, source), as before, or per target over all its
    swaps, then reads a target's own effect as specificity: simulated on the shipped corpora's sharing, 12–46 % and
    9–24 % rejections of a true null at α = 0.05 once tokens have effects of their own (σ = 0.5–1.5 logits). Within
    one swap every column is one token at every layer, the columns are exchangeable under the null, and different
    targets' swaps share no arm token (controls are never corpus words), so the relabelling is exact; it rejects
    3–5 % (``tests/swap/test_stats.py``). The other swaps still count in the rates, medians and by-layer numbers."""
    counts: dict[tuple[str, str, str], int] = {}
    for trial in executed:
        swap = (trial.target, trial.function, trial.source)
        counts[swap] = counts.get(swap, 0) + 1
    best: dict[str, tuple[tuple[str, str], int]] = {}
    for (target, function, source), n in counts.items():
        if target not in best or n > best[target][1]:
            best[target] = ((function, source), n)
    return {target: swap for target, (swap, _) in best.items()}


def control_clusters(tested: Sequence[TrialRecord]) -> dict[str, str]:
    """Each tested target's cluster: its own, or — when its tested swap shares a control token with another target's
    (union–find over the tokens) — the first target of the group. Relabelling is exact when the clusters share no
    arm token; targets tied by a shared token are relabelled together (one cluster), so the shared token's effect
    is not counted as two independent ones. Controls are drawn by (seed, swap) and kept apart across targets while
    the pools allow (``benchmark``), so this is rare; it is reported in ``shared_controls``."""
    parent: dict[str, str] = {}

    def find(target: str) -> str:
        while parent.setdefault(target, target) != target:
            parent[target] = parent[parent[target]]
            target = parent[target]
        return target

    owner: dict[int, str] = {}
    for trial in tested:
        find(trial.target)
        for control in trial.controls:
            if control.token_id in owner:
                a, b = find(owner[control.token_id]), find(trial.target)
                if a != b:
                    parent[max(a, b)] = min(a, b)
            else:
                owner[control.token_id] = trial.target
    return {target: find(target) for target in parent}


def relabel_floor(arms: list[list[float]], draws: int) -> float:
    """The smallest two-sided p ``relabel_test`` can give: 2/∏(m_c + 1) when enumerated exactly, else 2/(draws + 1)
    (capped at 1)."""
    total = math.prod(len(row) for row in arms) if arms else 1
    if total <= verdicts.EXACT_ENUMERATION_LIMIT:
        return min(1.0, 2 / total)
    return min(1.0, 2 / (draws + 1))


def prompt_test(arms: list[list[float]], seed: int, draws: int) -> PromptTest:
    """``relabel_test`` on one value per (target, arm), real arm first, as the schema reports it."""
    test = verdicts.relabel_test(arms, seed=seed, draws=draws)
    return PromptTest(
        p_floor=relabel_floor(arms, draws),
        real=test.real_mean,
        control=test.control_mean,
        difference=test.statistic,
        targets=test.clusters,
        real_above=test.real_above,
        p_value=test.p_value,
        p_greater=test.p_greater,
        method="exact" if test.method == "exact" else "monte_carlo",
        draws=test.draws,
    )


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(
    trials: Sequence[TrialRecord],
    layers: Sequence[int],
    seeds: Sequence[int],
    excluded: int,
    seed: int = 0,
    draws: int = verdicts.RELABEL_DRAWS,
) -> SwapSummary:
    """Rates and intervals over executed trials, and the three target-level tests over the tested swaps
    (``tested_swaps``). ``seed`` and ``draws`` drive the Monte Carlo relabellings when exact enumeration is too large
    (its p-values are valid for any seed)."""
    executed = [t for t in trials if t.status == EXECUTED]
    prompts = {(t.function, t.source) for t in executed}
    chosen = tested_swaps(executed)
    tested = [t for t in executed if chosen[t.target] == (t.function, t.source)]
    cluster_of = control_clusters(tested)
    clusters = [cluster_of[t.target] for t in tested]
    groups: dict[str, list[str]] = {}
    for target, root in cluster_of.items():
        groups.setdefault(root, []).append(target)
    real = [bool(t.real and t.real.top1) for t in executed]
    control_rows = [[c.score.top1 for c in t.controls] for t in executed]
    gains = [[gain_of(t), *t.control_margin_gains] for t in executed]
    by_seed = [verdicts.rate([row[i] for row in control_rows]).rate for i in range(len(seeds))]
    seed_rates = [r for r in by_seed if r is not None]
    mean, sd, low, high = stats.spread(seed_rates) if seed_rates else (None, None, None, None)
    successes = [[float(bool(t.real and t.real.top1)), *(float(c.score.top1) for c in t.controls)] for t in tested]
    swap = prompt_test(stats.arm_means(successes, clusters), seed, draws)
    tested_gains = [[gain_of(t), *t.control_margin_gains] for t in tested]
    specificity = specificity_of(gains, tested_gains, clusters, len(seeds), seed, draws)
    real_rate = rate_summary(real, prompts)
    return SwapSummary(
        verdict=verdict(real_rate, swap, specificity, len(seeds)),
        status_counts={status: sum(t.status == status for t in trials) for status in TRIAL_STATUSES},
        layers=list(layers),
        layers_executed=sorted({t.layer for t in executed}),
        real=real_rate,
        control=rate_summary([c for row in control_rows for c in row], prompts),
        control_seed_spread=SeedSpread(mean=mean, sd=sd, min=low, max=high),
        swap_test=swap,
        specificity=specificity,
        by_layer=[layer_summary(trials, layer) for layer in layers],
        n_independent_prompts=len(prompts),
        real_success_prompts=sorted({f"{t.function}/{t.source}" for t in executed if t.real and t.real.top1}),
        tested_swaps=[f"{function}/{source}→{target}" for target, (function, source) in chosen.items()],
        excluded_trials=excluded,
        target_was_active=sum(bool(t.target_was_active) for t in executed),
        shared_controls=[sorted(group) for group in groups.values() if len(group) > 1],
    )


def gain_of(trial: TrialRecord) -> float:
    if trial.margin_gain is None or not trial.control_margin_gains:
        raise ValueError(f"executed trial {trial.function}/{trial.source}→{trial.target} has no margin gains")
    return trial.margin_gain


def specificity_of(
    gains: list[list[float]], tested: list[list[float]], clusters: list[str], m: int, seed: int, draws: int
) -> Specificity:
    """The margin-gain and beats-all tests on the ``tested`` trials (one swap per target, ``clusters`` their targets),
    the medians and the beats-all count over every executed trial's ``gains``; each row is a trial's arms (real
    first), ``m`` controls each."""
    wins = sum(int(stats.beats_all(row)[0]) for row in gains)
    return Specificity(
        real_median_gain=median([row[0] for row in gains]),
        control_median_gain=median([g for row in gains for g in row[1:]]),
        margin_gain=prompt_test(stats.arm_means(tested, clusters), seed, draws),
        beats_all=wins,
        trials=len(gains),
        beats_all_rate=wins / len(gains) if gains else None,
        chance=1 / (m + 1),
        beats_all_test=prompt_test(
            stats.arm_means([stats.beats_all(row) for row in tested], clusters), seed + 1, draws
        ),
    )


def layer_summary(trials: Sequence[TrialRecord], layer: int) -> LayerSummary:
    at = [t for t in trials if t.layer == layer]
    done = [t for t in at if t.status == EXECUTED]
    return LayerSummary(
        layer=layer,
        executed=len(done),
        skipped_source_inactive=sum(t.status == INACTIVE for t in at),
        skipped_no_control_token=sum(t.status == NO_CONTROL for t in at),
        real_successes=sum(bool(t.real and t.real.top1) for t in done),
        control_successes=sum(c.score.top1 for t in done for c in t.controls),
        real_median_gain=median([gain_of(t) for t in done]),
        control_median_gain=median([g for t in done for g in t.control_margin_gains]),
    )


def verdict(real: RateSummary, swap: PromptTest, specificity: Specificity, m: int) -> str:
    """Both answers in words, each worded three ways from its own p-value and floor (two-sided, α = 0.05:
    ``verdicts.worded``) and never from a rate alone."""
    if not real.n:
        return "No trial executed: nothing was tested (see status_counts)."
    up = swap.difference > 0
    strict = verdicts.worded(
        "swap_strict",
        swap.p_value,
        swap.p_floor,
        "the real edits swap the answer more often than their controls"
        if up
        else "the controls swap the answer more often than the real edits",
        "no swap shown beyond the controls",
    )
    gain = specificity.margin_gain
    graded = verdicts.worded(
        "swap_specificity",
        gain.p_value,
        gain.p_floor,
        "specific: the real edits raise the target answer's margin more than their controls"
        if gain.difference > 0
        else "anti-specific: the controls raise the target answer's margin more than the real edits",
        "not shown specific: the real edits' margin gains are not shown to differ from their controls'",
    )
    beats = verdicts.worded(
        "swap_beats_all",
        specificity.beats_all_test.p_value,
        specificity.beats_all_test.p_floor,
        "more often than chance",
        "not shown more often than chance",
    )
    rate = specificity.beats_all_rate or 0.0
    real_gain, control_gain = specificity.real_median_gain, specificity.control_median_gain
    medians = (
        f"median margin gain real {real_gain:+.3f}, controls {control_gain:+.3f}; "
        if real_gain is not None and control_gain is not None
        else ""
    )
    return (
        f"Strict swap: {real.successes}/{real.n} real edits made the target's answer the top-1 — {strict}, "
        f"target-level, {swap.targets} targets, one swap each. Graded: {graded} ({medians}per-target mean real − "
        f"control {gain.difference:+.3f} logits); the real edit beat all {m} controls in "
        f"{specificity.beats_all}/{specificity.trials} trials ({rate:.3f} vs chance {specificity.chance:.3f}; on "
        f"the tested swaps {beats})."
    )


def benchmark_notes(trials: Sequence[TrialRecord], settings: SwapSettings) -> list[str]:
    executed = [t for t in trials if t.status == EXECUTED]
    notes = []
    if executed:
        notes.append(
            "Trials of one prompt at several layers and targets are not independent: the Clopper–Pearson intervals "
            "treat them as if they were (read them next to n_independent_prompts); the p-values do not — each test "
            "takes one swap per target (tested_swaps: a target's token is the real arm of every swap toward it), "
            "summarises its trials per arm and relabels which arm is real once per target."
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
    targets = {t.target for t in executed}
    if executed and len(prompts) < 5:
        notes.append(
            f"The {len(executed)} executed trials come from only {len(prompts)} distinct prompt(s): little evidence, "
            "however many layers they span."
        )
    if executed and len(targets) < 5:
        m = len(settings.control_seeds)
        notes.append(
            f"The tests relabel per target, and the executed trials swap toward only {len(targets)} target(s): with "
            f"{m} controls the smallest two-sided p-value is {min(1.0, 2 / (m + 1) ** len(targets)):.3g}, and "
            "power is low."
        )
    if settings.lens == "logit":
        notes.append("Lens: logit lens (J = I); atoms are unembedding columns, which ignore the final norm.")
    return notes
