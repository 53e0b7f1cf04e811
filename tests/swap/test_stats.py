"""Model-free checks of the causal-swap statistics: hand computations, scipy, and seeded simulations of the whole
protocol summary (hand-built ``TrialRecord``s through ``summarize``) — its size under a token-effect null and its
power under a real effect."""

from __future__ import annotations

import itertools
import math
import zlib

import numpy as np
import pytest
import torch
from scipy import stats

from mcp_interp.core.engine.numbers import stats as engine_stats
from mcp_interp.core.swap import nulls as sharing
from mcp_interp.core.swap import stats as swap_stats
from mcp_interp.core.swap.summary import summarize
from mcp_interp.schemas.swap import AnswerScore, ControlDraw, TrialBaseline, TrialRecord

ALPHA = 0.05


def test_score_answer_rank_margin_and_ties() -> None:
    logits = torch.tensor([1.0, 3.0, 2.0, 3.0, -1.0])
    tied = swap_stats.score_answer(logits, 1)
    # Token 3 ties token 1 for first: rank 0 (ties optimistic), margin 0, so not a strict top-1.
    assert (tied.rank, tied.margin, tied.strict_top1, tied.top_token) == (0, 0.0, False, 1)
    second = swap_stats.score_answer(logits, 2)
    assert (second.rank, second.margin, second.strict_top1) == (2, -1.0, False)
    logits[3] = 2.5
    top = swap_stats.score_answer(logits, 1)
    assert (top.rank, top.margin, top.strict_top1) == (0, 0.5, True)
    last = swap_stats.score_answer(logits, 4)
    assert last.rank == 4 and last.margin == -4.0


def test_score_sequence_is_strict_top1_at_every_step() -> None:
    steps = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 4.0, 1.0], [1.0, 2.0, 2.0, 0.0]], dtype=torch.float64)
    both = swap_stats.score_sequence(steps[:2], [1, 0])  # top-1 at both steps, margins 1 and 1
    assert both.strict_top1 and both.margin == 1.0 and both.rank == 0 and both.logit == 3.0
    fails = swap_stats.score_sequence(steps[:2], [1, 2])  # the second token is beaten by token 0 by 1
    assert not fails.strict_top1 and fails.margin == -1.0 and fails.top_token == 0 and fails.rank == 0
    tie = swap_stats.score_sequence(steps, [1, 0, 2])  # a tie for first at the last step is not a success
    assert tie.margin == 0.0 and not tie.strict_top1 and tie.top_token in (1, 2)
    one = swap_stats.score_sequence(steps[:1], [3])
    assert one == swap_stats.score_answer(steps[0], 3)


def test_clopper_pearson_equals_scipy_binomtest_exact_interval() -> None:
    for k, n in [(0, 6), (6, 6), (1, 10), (5, 10), (37, 120), (0, 1)]:
        reference = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        low, high = engine_stats.clopper_pearson(k, n)
        assert math.isclose(low, reference.low, abs_tol=1e-12) and math.isclose(high, reference.high, abs_tol=1e-12)
    assert round(engine_stats.clopper_pearson(0, 6)[1], 4) == 0.4593  # 1 − 0.025^(1/6), by hand
    assert engine_stats.clopper_pearson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        engine_stats.clopper_pearson(3, 2)


def test_rate_and_spread() -> None:
    r = engine_stats.rate([True, False, False, True])
    assert (r.successes, r.n, r.rate) == (2, 4, 0.5)
    assert (r.low, r.high) == engine_stats.clopper_pearson(2, 4)
    assert engine_stats.rate([]).rate is None
    mean, sd, low, high = swap_stats.spread([0.2, 0.4, 0.6])
    assert math.isclose(mean, 0.4) and math.isclose(sd, 0.2) and (low, high) == (0.2, 0.6)
    assert swap_stats.spread([0.3])[1] == 0.0


def test_arm_means_and_beats_all_by_hand() -> None:
    rows = [[1.0, 0.0, 2.0], [3.0, 0.0, 0.0], [0.5, 0.5, 0.5]]
    assert swap_stats.arm_means(rows, ["b", "a", "b"]) == [[0.75, 0.25, 1.25], [3.0, 0.0, 0.0]]  # first-seen order
    with pytest.raises(ValueError, match="arms"):
        swap_stats.arm_means([[1.0, 0.0], [1.0, 0.0, 0.0]], ["a", "a"])
    assert swap_stats.beats_all([0.3, 0.1, -2.0]) == [1.0, 0.0, 0.0]
    assert swap_stats.beats_all([0.1, 0.4, 0.2]) == [0.0, 1.0, 0.0]
    assert swap_stats.beats_all([0.4, 0.4, 0.2]) == [0.0, 0.0, 0.0]  # a tie for first: nobody beats all


# --- hand-built trials ------------------------------------------------------------------------------------------


def score(margin: float) -> AnswerScore:
    """An answer score carrying what summarize reads: the margin, and success = margin > 0."""
    return AnswerScore(
        token=" x",
        token_id=1,
        logit=margin,
        rank=0 if margin > 0 else 3,
        margin=margin,
        top1=margin > 0,
        top_token=" x",
    )


def record(
    function: str,
    source: str,
    target: str,
    layer: int,
    unedited: float,
    edited: list[float] | None,
    tokens: list[int] | None = None,
) -> TrialRecord:
    """One trial: ``edited`` holds the target answer's margin after the real edit and after each control (None: the
    trial was skipped, source inactive); ``unedited`` its margin before. The gains are written in as edited −
    unedited, as the protocol records them. Control tokens: ``tokens``, else ids of the swap's own (as the
    benchmark draws them by (seed, swap))."""
    executed = edited is not None
    own = 10 * (zlib.crc32(f"{function}/{source}→{target}".encode()) % 10**6)
    ids = tokens if tokens is not None else [own + s for s in range(len(edited or []))]
    return TrialRecord(
        function=function,
        source=source,
        target=target,
        layer=layer,
        prompt=f"{function} of {source}",
        position=3,
        position_token=" x",
        status="executed" if executed else "skipped_source_inactive",
        baseline=TrialBaseline(source_answer=score(1.0), target_answer=score(unedited)),
        real=score(edited[0]) if executed else None,
        margin_gain=edited[0] - unedited if executed else None,
        control_margin_gains=[m - unedited for m in edited[1:]] if executed else [],
        controls=[
            ControlDraw(seed=s, token=f" c{s}", token_id=ids[s], displacement=1.0, edit_norm=1.0, score=score(m))
            for s, m in enumerate(edited[1:])
        ]
        if executed
        else [],
    )


def enumerate_relabellings(arms: list[list[float]]) -> tuple[float, float, float]:
    """(statistic, P(≥), P(≤)) over every choice of real column per prompt, written out independently: the statistic
    is the mean over prompts of (the real column − the mean of the other columns)."""

    def statistic(choice: tuple[int, ...]) -> float:
        return float(np.mean([a[j] - (sum(a) - a[j]) / (len(a) - 1) for a, j in zip(arms, choice, strict=True)]))

    observed = statistic(tuple(0 for _ in arms))
    null = [statistic(c) for c in itertools.product(*(range(len(a)) for a in arms))]
    return (
        observed,
        float(np.mean([v >= observed - 1e-12 for v in null])),
        float(np.mean([v <= observed + 1e-12 for v in null])),
    )


def test_summarize_by_hand() -> None:
    """Three targets (Japan, Italy, France: the clusters) from three prompts, two controls: every number recomputed
    here from the margins written in. France is the target of two swaps with one trial each: the tests use the first
    (capital/Japan→France); the rates and medians use every executed trial."""
    trials = [
        # Toward Japan (capital/France, layers 0 and 1), Italy (capital/France) and France (capital/Japan and
        # language/Italy); arms = (real, control 0, control 1)
        record("capital", "France", "Japan", 0, -2.0, [0.5, -3.0, -1.0]),  # gains +2.5, −1.0, +1.0; real top-1
        record("capital", "France", "Japan", 1, -2.0, [-1.0, -1.5, -2.5]),  # gains +1.0, +0.5, −0.5
        record("capital", "France", "Italy", 0, -1.0, [-0.5, 0.5, -2.0]),  # gains +0.5, +1.5, −1.0; control 0 top-1
        record("capital", "Japan", "France", 0, -3.0, [-2.0, -2.0, -4.0]),  # gains +1.0, +1.0, −1.0: a tie for first
        record("language", "Italy", "France", 1, -1.0, [-2.0, -0.5, -1.0]),  # gains −1.0, +0.5, 0.0
        record("language", "Italy", "France", 0, -1.0, None),  # skipped: not in any test
    ]
    summary = summarize(trials, layers=[0, 1], seeds=[0, 1], excluded=7)
    assert summary.status_counts == {"executed": 5, "skipped_source_inactive": 1, "skipped_no_control_token": 0}
    assert (summary.real.successes, summary.real.n, summary.real.n_independent_prompts) == (1, 5, 3)
    assert (summary.control.successes, summary.control.n) == (1, 10)
    # Per target (Japan, Italy, France, in order of first appearance), per arm: the mean over its tested swap's trials.
    assert summary.tested_swaps == ["capital/France→Japan", "capital/France→Italy", "capital/Japan→France"]
    success = [[0.5, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    gains = [[1.75, -0.25, 0.25], [0.5, 1.5, -1.0], [1.0, 1.0, -1.0]]
    beats = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]  # capital/Japan→France ties: nobody beats all
    for test, arms in ((summary.swap_test, success), (summary.specificity.margin_gain, gains)):
        observed, greater, less = enumerate_relabellings(arms)  # 3^3 = 27 relabellings: exact
        assert test.method == "exact" and test.targets == 3
        assert test.difference == pytest.approx(observed)
        assert test.p_greater == pytest.approx(greater)
        assert test.p_value == pytest.approx(min(1.0, 2 * min(greater, less)))
        assert test.real == pytest.approx(np.mean([a[0] for a in arms]))
        assert test.control == pytest.approx(np.mean([np.mean(a[1:]) for a in arms]))
    observed, greater, less = enumerate_relabellings(beats)
    assert summary.specificity.beats_all_test.difference == pytest.approx(observed)
    assert summary.specificity.beats_all_test.p_value == pytest.approx(min(1.0, 2 * min(greater, less)))
    assert summary.specificity.margin_gain.real_above == 1  # Japan: 1.75 above −0.25 and 0.25; France only ties
    specificity = summary.specificity
    assert (specificity.beats_all, specificity.trials, specificity.chance) == (2, 5, 1 / 3)
    assert specificity.real_median_gain == 1.0  # of +2.5, +1.0, +0.5, +1.0, −1.0
    assert specificity.control_median_gain == pytest.approx(0.25)  # of −1, +1, +0.5, −0.5, +1.5, −1, +1, −1, +0.5, 0
    assert [(row.layer, row.executed, row.skipped_source_inactive) for row in summary.by_layer] == [
        (0, 3, 1),
        (1, 2, 0),
    ]
    assert [(row.real_successes, row.control_successes) for row in summary.by_layer] == [(1, 1), (0, 0)]
    assert summary.by_layer[0].real_median_gain == 1.0 and summary.by_layer[1].control_median_gain == 0.25
    assert summary.layers_executed == [0, 1] and summary.real_success_prompts == ["capital/France"]
    assert (summary.excluded_trials, summary.n_independent_prompts) == (7, 3)
    assert summary.control_seed_spread.mean == pytest.approx(0.1)  # seed 0: 1/5, seed 1: 0/5


def test_the_verdict_tells_no_swap_from_no_effect() -> None:
    """No edit ever reaches the top-1 (margins stay ≤ −3), but every real edit gains 1 logit more than its controls,
    over 8 targets: the verdict says there is no swap *and* that the effect is specific, each with its p-value."""
    rng = np.random.default_rng(0)
    trials = []
    for p in range(8):
        for layer in range(3):
            controls = rng.normal(0.0, 0.3, size=3)
            edited = [-8.0 + 1.0 + rng.normal(0.0, 0.1), *(-8.0 + controls)]
            trials.append(record("f", f"s{p}", f"t{p}", layer, -8.5, edited))
    summary = summarize(trials, layers=[0, 1, 2], seeds=[0, 1, 2], excluded=0, draws=9999)
    assert summary.real.successes == 0 and summary.swap_test.p_value == 1.0
    assert summary.specificity.margin_gain.p_value == pytest.approx(2 / 4**8)  # the real arm tops all 8 targets
    assert summary.specificity.margin_gain.difference > 0.5
    assert summary.specificity.beats_all == 24 and summary.specificity.beats_all_test.p_value < 0.01
    assert "no swap shown beyond the controls (p = 1, p_floor = " in summary.verdict
    assert "specific: the real edits raise the target answer's margin" in summary.verdict
    assert "24/24 trials" in summary.verdict and "chance 0.250" in summary.verdict


# --- the protocol under the shipped corpora's sharing: seeded size and power (mcp_interp/core/swap/nulls.py) ----------


def test_the_simulated_sharing_is_the_shipped_corpus_and_summarize_reads_it_as_simulated() -> None:
    """The simulated benchmark is the real one's shape, counted by hand from the corpus file: capitals_languages has
    7 capable capital prompts and 6 language ones, so 7·6 + 6·5 = 72 swaps, 13 prompts and 8 targets, each target
    the real arm of 6 capital prompts (when the model knows its capital) and 5 language ones (its language). And
    summarize, given the simulated trials, tests the swaps and gets the p-values the simulation computes (countries:
    4 targets, so the relabelling is exact)."""
    structure = sharing.sharing("capitals_languages")
    assert len(structure.swaps) == 72 and len(set(structure.prompt)) == 13 and len(set(structure.target)) == 8
    per_target = np.bincount(structure.target)
    assert sorted(per_target.tolist()) == [5, 6, 6, 11, 11, 11, 11, 11]  # Russia: language only; China, Japan: capital
    countries = sharing.sharing("countries")
    run = sharing.simulate(np.random.default_rng(5), countries, 0.5, 0.0)
    trials = []
    for row, edited, swap in zip(run.gains, run.edited, run.swap, strict=True):
        function, source, target = countries.swaps[swap]
        unedited = float(edited[0] - row[0])
        trials.append(record(function, source, target, 0, unedited, edited.tolist()))
    summary = summarize(trials, [0], range(sharing.SEEDS), 0, seed=7, draws=999)
    subset, labels = sharing.tested(run, countries)
    expected = sharing.p_values(subset, labels, 7)
    assert summary.tested_swaps == ["{}/{}→{}".format(*countries.swaps[s]) for s in dict.fromkeys(subset.swap.tolist())]
    assert summary.swap_test.method == "exact" and summary.swap_test.targets == 4 < len(set(run.swap.tolist()))
    assert summary.swap_test.p_value == pytest.approx(expected["strict"])
    assert summary.specificity.margin_gain.p_value == pytest.approx(expected["margin"])
    assert summary.specificity.beats_all_test.p_value == pytest.approx(expected["beats_all"])


@pytest.mark.parametrize("corpus", ["capitals_languages", "countries"])
@pytest.mark.parametrize("sigma", [0.0, 0.5, 1.5])
def test_size_under_the_shipped_corpora_sharing(corpus: str, sigma: float) -> None:
    """H0: the target is one more displacement-matched token, every token (target or control) with an effect of its
    own (σ logits) shared by every trial it is an arm of — for a target, every swap toward it (5–6 prompts per
    function). Relabelling per target on one swap each, all three tests reject ≤ 6 % of 2000 simulated benchmarks
    at α = 0.05."""
    sizes = sharing.rejections(corpus, sigma, 0.0, reps=2000, seed=int(10 * sigma) + len(corpus))
    assert max(sizes.values()) <= 0.06, sizes


def test_the_null_sees_shared_targets() -> None:
    """The same null detects the designs that ignore the shared target: relabelling per prompt (the design this
    replaced) or per target over all its swaps, each prompt with its own controls, reject in ≥ 15 % of 300
    benchmarks of capitals_languages at σ = 1.5 (measured 0.45–0.49 and 0.25–0.27), so the size test above can fail."""
    per_prompt = sharing.rejections("capitals_languages", 1.5, 0.0, reps=300, seed=40, unit="prompt")
    all_swaps = sharing.rejections("capitals_languages", 1.5, 0.0, reps=300, seed=41, unit="target")
    assert min(per_prompt.values()) >= 0.25 and min(all_swaps.values()) >= 0.15, (per_prompt, all_swaps)


@pytest.mark.parametrize(("corpus", "at_least"), [("capitals_languages", 0.9), ("countries", 0.65)])
def test_power_under_a_real_effect(corpus: str, at_least: float) -> None:
    """The real token 1 logit better than an average token (σ = 0.5): found by every test in most of 200 benchmarks
    (measured 0.98–1.00 on capitals_languages' 8 targets, 0.73–0.85 on countries' 4)."""
    power = sharing.rejections(corpus, 0.5, 1.0, reps=200, seed=99)
    assert min(power.values()) >= at_least, power


def test_targets_whose_tested_swaps_share_a_control_token_are_relabelled_together() -> None:
    """Three targets, one swap each; Japan's and Italy's swaps share control token 7: they become one cluster (their
    trials' arms averaged by column, one relabelling), France stays alone — 2 units relabelled, exactly as
    ``relabel_test`` on those two rows by hand; the group is reported."""
    trials = [
        record("capital", "France", "Japan", 0, -2.0, [0.5, -3.0, -1.0], tokens=[7, 8]),
        record("capital", "France", "Italy", 0, -1.0, [-0.5, 0.5, -2.0], tokens=[9, 7]),
        record("capital", "Japan", "France", 0, -3.0, [-2.0, -2.0, -4.0], tokens=[11, 12]),
    ]
    summary = summarize(trials, [0], [0, 1], 0)
    assert summary.shared_controls == [["Italy", "Japan"]]
    assert summary.specificity.margin_gain.targets == 2
    merged = [(2.5 + 0.5) / 2, (-1.0 + 1.5) / 2, (1.0 - 1.0) / 2]  # Japan's and Italy's gains, column by column
    alone = [1.0, 1.0, -1.0]
    by_hand = engine_stats.relabel_test([merged, alone])
    assert summary.specificity.margin_gain.p_value == pytest.approx(by_hand.p_value)
    assert summary.specificity.margin_gain.p_floor == pytest.approx(2 / 9)  # 3 × 3 relabellings, two-sided
