"""The statistics that score an explanation (``engine.numbers.stats``: ``auroc_test``, ``detection_test``), model-free:
known answers computed by hand, their size under the null and their power by seeded simulation, and the coverage of
their intervals."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from mcp_interp.core.engine.numbers import stats
from mcp_interp.core.engine.numbers.stats import auroc, auroc_interval, auroc_test, detection_test

ALPHA = 0.05
SIZE_LIMIT = 0.06  # a test's rejection rate under its null at α = 0.05, allowing simulation noise


# --- known answers --------------------------------------------------------------------------------------------------


def test_auroc_known_answers() -> None:
    # Every x above every y: U = 9 of 9 pairs; the exact one-sided Mann–Whitney p is 1/C(6, 3) (one ordering of 20).
    perfect = auroc_test([3.0, 4.0, 5.0], [0.0, 1.0, 2.0])
    assert perfect.auroc == 1.0 and perfect.p_value == pytest.approx(1 / 20) and perfect.method == "exact Mann–Whitney"
    # x = [1, 3], y = [2, 0]: pairs 1>2 no, 1>0 yes, 3>2 yes, 3>0 yes → 3/4.
    assert auroc([1.0, 3.0], [2.0, 0.0]) == 0.75
    # Ties count one half: [1, 1] against [1, 0] → (0.5 + 1 + 0.5 + 1)/4.
    assert auroc([1.0, 1.0], [1.0, 0.0]) == 0.75


def test_swapping_the_sets_gives_one_minus_the_auroc() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(1, 1, 12), np.maximum(rng.normal(0, 1, 9), 0)  # ties at 0 in y
    forward, backward = auroc_test(x, y), auroc_test(y, x)
    assert backward.auroc == pytest.approx(1 - forward.auroc)
    assert backward.low == pytest.approx(1 - forward.high) and backward.high == pytest.approx(1 - forward.low)


def test_the_tie_p_value_is_the_hypergeometric_count() -> None:
    """3 ones and 7 zeros pooled, 5 per set: U grows with the number k of ones in x, so p = P(k ≥ observed)."""
    test = auroc_test([1, 1, 1, 0, 0], [0, 0, 0, 0, 0])
    assert test.method == "exact permutation"
    assert test.p_value == pytest.approx(math.comb(7, 2) / math.comb(10, 5))
    one = auroc_test([1, 1, 0, 0, 0], [1, 0, 0, 0, 0])  # k = 2: P(k ≥ 2) = (C(3,2)C(7,3) + C(3,3)C(7,2)) / C(10,5)
    assert one.p_value == pytest.approx((3 * 35 + 21) / 252)


def test_perfect_predictions_give_one_with_a_small_p_and_constant_ones_exactly_chance() -> None:
    truth = [True] * 10 + [False] * 10
    perfect = detection_test(truth, truth)
    assert perfect.balanced_accuracy == 1.0 and perfect.p_value == pytest.approx(1 / math.comb(20, 10))
    assert perfect.low == pytest.approx(0.025 ** (1 / 20))  # Clopper–Pearson's lower bound for 20 of 20
    for constant in (True, False):
        flat = detection_test(truth, [constant] * 20)
        assert flat.balanced_accuracy == 0.5 and flat.p_value >= 0.3
    inverted = detection_test(truth, [not t for t in truth])
    assert inverted.balanced_accuracy == 0.0 and inverted.p_value == 1.0


def test_the_detection_p_value_is_the_one_sided_fisher_count() -> None:
    # 4 fire, 4 do not; 4 predicted to fire, 3 of them right: P(TP ≥ 3) = (C(4,3)C(4,1) + C(4,4)C(4,0)) / C(8,4).
    truth = [True, True, True, True, False, False, False, False]
    said = [True, True, True, False, True, False, False, False]
    test = detection_test(truth, said)
    assert test.balanced_accuracy == 0.75 and test.true_positives == 3 and test.true_negatives == 3
    assert test.p_value == pytest.approx((4 * 4 + 1) / 70)
    # Unbalanced: 2 fire of 6. The interval is the mean of the per-class Clopper–Pearson intervals at √0.95 each.
    unbalanced = detection_test([True, True, False, False, False, False], [True, False, False, False, False, True])
    assert unbalanced.balanced_accuracy == pytest.approx((1 / 2 + 3 / 4) / 2)
    level = math.sqrt(0.95)
    low = (scipy_stats.beta.ppf((1 - level) / 2, 1, 2) + scipy_stats.beta.ppf((1 - level) / 2, 3, 2)) / 2
    assert unbalanced.interval == "per_class_clopper_pearson" and unbalanced.low == pytest.approx(low)


# --- size and power ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ties", [False, True])
def test_the_generation_test_holds_its_size_and_has_power(ties: bool) -> None:
    """Under H0 both sets come from one distribution (with ties: a ReLU'd normal, about half exactly 0); under the
    alternative the activating set is shifted by 1.5 standard deviations."""
    rng = np.random.default_rng(34)
    m = n = 8  # C(16, 8) = 12 870 relabellings: the tie test is exact

    def draw(shift: float) -> tuple[np.ndarray, np.ndarray]:
        x, y = rng.normal(shift, 1, m), rng.normal(0, 1, n)
        return (np.maximum(x, 0), np.maximum(y, 0)) if ties else (x, y)

    null = [auroc_test(*draw(0.0)).p_value <= ALPHA for _ in range(300)]
    power = [auroc_test(*draw(1.5)).p_value <= ALPHA for _ in range(100)]
    print(f"generation test (ties={ties}): size {np.mean(null):.3f}, power at 1.5 sd {np.mean(power):.2f}")
    assert np.mean(null) <= SIZE_LIMIT
    assert np.mean(power) >= 0.6


def test_the_detection_test_holds_its_size_and_has_power() -> None:
    """H0: predictions independent of the truth (a coin, or a biased coin on an unbalanced quiz); the alternative: a
    predictor right on 85 % of each class."""
    rng = np.random.default_rng(35)
    rejections = []
    for n_pos, n_neg, rate in ((10, 10, 0.5), (6, 14, 0.3), (10, 10, 0.8)):
        truth = [True] * n_pos + [False] * n_neg
        rejections += [
            detection_test(truth, list(rng.random(n_pos + n_neg) < rate)).p_value <= ALPHA for _ in range(1000)
        ]
    truth = [True] * 10 + [False] * 10
    right = [
        detection_test(truth, [t if rng.random() < 0.85 else not t for t in truth]).p_value <= ALPHA for _ in range(500)
    ]
    print(f"detection test: size {np.mean(rejections):.3f}, power at 85 % right {np.mean(right):.2f}")
    assert np.mean(rejections) <= SIZE_LIMIT
    assert np.mean(right) >= 0.8


# --- interval coverage ----------------------------------------------------------------------------------------------


def test_the_auroc_interval_covers() -> None:
    """Normal shifts (true AUROC Φ(δ/√2)) at several sizes, extremes included: coverage of the 95 % interval."""
    rng = np.random.default_rng(36)
    worst = 1.0
    for m, n in ((10, 10), (5, 15), (20, 20)):
        for delta in (0.0, 1.0, 2.5):
            truth = float(scipy_stats.norm.cdf(delta / math.sqrt(2)))
            hits = 0
            for _ in range(400):
                value = auroc(rng.normal(delta, 1, m), rng.normal(0, 1, n))
                low, high = auroc_interval(value, m, n)
                hits += low <= truth <= high
            worst = min(worst, hits / 400)
    print(f"AUROC interval: worst coverage {worst:.3f}")
    assert worst >= 0.93


@pytest.mark.parametrize(("n_pos", "n_neg"), [(10, 10), (6, 14)])
def test_the_balanced_accuracy_interval_covers(n_pos: int, n_neg: int) -> None:
    """Predictors whose two classes' success rates differ (the accuracy is then not binomial) and equal ones."""
    rng = np.random.default_rng(37)
    truth = [True] * n_pos + [False] * n_neg
    worst = 1.0
    for tpr, tnr in ((0.9, 0.6), (0.75, 0.75), (0.97, 0.97), (0.5, 0.5)):
        hits = 0
        for _ in range(1000):
            said = [rng.random() < tpr if t else rng.random() >= tnr for t in truth]
            test = detection_test(truth, said)
            hits += test.low <= (tpr + tnr) / 2 <= test.high
        worst = min(worst, hits / 1000)
    print(f"balanced accuracy interval ({n_pos}/{n_neg}): worst coverage {worst:.3f}")
    assert worst >= 0.94


@pytest.mark.parametrize(("m", "n"), [(5, 7), (30, 25)])  # C(12, 5) = 792 splits: exact; C(55, 30): Monte Carlo
def test_the_tie_test_equals_scipys_permutation_test(m: int, n: int) -> None:
    rng = np.random.default_rng(m)
    x, y = np.round(rng.normal(0.4, 1, m)), np.round(rng.normal(0, 1, n))  # integers: many ties

    def u(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        return scipy_stats.mannwhitneyu(a, b, axis=axis, method="asymptotic").statistic

    reference = scipy_stats.permutation_test(
        (x, y), u, permutation_type="independent", vectorized=True, n_resamples=99_999, alternative="greater", rng=rng
    ).pvalue
    ours = auroc_test(x, y)
    assert ours.method == ("exact permutation" if m == 5 else "Monte Carlo permutation")
    assert ours.p_value == pytest.approx(reference, abs=1e-12 if m == 5 else 0.005)


# --- within token-count strata (issue 41 §4) ------------------------------------------------------------------


def test_one_stratum_is_the_exact_mann_whitney_and_fisher_tests() -> None:
    """All texts of one length: the stratified AUROC test is scipy's exact one-sided Mann–Whitney test, and the
    stratified quiz test is scipy's one-sided Fisher exact test."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(0.8, 1, 9), rng.normal(0, 1, 8)
    test = stats.stratified_auroc_test(x, y, [7] * 9, [7] * 8)
    assert test.p_value == pytest.approx(scipy_stats.mannwhitneyu(x, y, alternative="greater", method="exact").pvalue)
    assert test.auroc == pytest.approx(np.mean(x[:, None] > y[None, :])) and test.pairs == 72
    assert test.p_floor == pytest.approx(1 / math.comb(17, 9))
    truth = [True] * 6 + [False] * 6
    said = [True, True, True, True, False, False, True, False, False, False, False, False]
    quiz = stats.stratified_detection_test(truth, said, [9] * 12)
    table = [[4, 2], [1, 5]]  # fires & said, fires & not said; quiet & said, quiet & not said
    assert quiz.p_value == pytest.approx(scipy_stats.fisher_exact(table, alternative="greater").pvalue)
    assert quiz.p_floor == pytest.approx(1 / math.comb(12, 6))


def test_two_strata_by_enumeration() -> None:
    """Two token counts, the relabellings within each written out: the p is the share of them whose same-stratum
    pairwise U is at least the observed one (U counted pair by pair, not from ranks)."""
    x, y = [3.0, 5.0, 1.0, 4.0], [2.0, 0.5, 6.0, 0.0, 2.5]
    sx, sy = [5, 5, 8, 8], [5, 5, 8, 8, 8]

    def u(xs: list[float], ys: list[float], a: list[int], b: list[int]) -> float:
        return sum(
            (p > q) + 0.5 * (p == q) for p, s in zip(xs, a, strict=True) for q, t in zip(ys, b, strict=True) if s == t
        )

    observed = u(x, y, sx, sy)
    groups = {s: [v for v, t in zip(x + y, sx + sy, strict=True) if t == s] for s in (5, 8)}
    counts = {s: sx.count(s) for s in (5, 8)}
    null = []
    for first in itertools.combinations(range(4), counts[5]):
        for second in itertools.combinations(range(5), counts[8]):
            xs = [groups[5][i] for i in first] + [groups[8][i] for i in second]
            ys = [v for i, v in enumerate(groups[5]) if i not in first] + [
                v for i, v in enumerate(groups[8]) if i not in second
            ]
            null.append(u(xs, ys, [5] * 2 + [8] * 2, [5] * 2 + [8] * 3))
    test = stats.stratified_auroc_test(x, y, sx, sy)
    assert test.pairs == 2 * 2 + 2 * 3 and test.auroc == pytest.approx(observed / 10)
    assert test.p_value == pytest.approx(np.mean(np.array(null) >= observed - 1e-9))
    assert test.p_floor == pytest.approx(1 / (math.comb(4, 2) * math.comb(5, 2)))


def test_a_length_only_predictor_gains_nothing_in_length_matched_strata() -> None:
    """A quiz of pairs of equal length (one firing, one not): a predictor that says "fires" for the longer texts
    says it for both texts of a pair, so within every stratum it is constant and its p is 1, however it orders the
    lengths; the unstratified test, blind to the pairing, would rate it like any other predictor."""
    lengths = [6, 6, 9, 9, 12, 12, 15, 15]
    truth = [True, False] * 4
    long = [n >= 12 for n in lengths]
    assert stats.stratified_detection_test(truth, long, lengths).p_value == pytest.approx(1.0)
