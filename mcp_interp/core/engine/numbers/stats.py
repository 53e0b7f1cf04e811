"""Statistics every family's verdicts rest on: exact intervals and exact tests, model-free.

Model-free on purpose (numbers in, numbers out), so each statistic is checked by a seeded simulation of
its size under its null and its power without a model (``tests/engine/test_stats.py``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.optimize import brentq

from mcp_interp.errors import InputError

CONFIDENCE = 0.95


def clopper_pearson(successes: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Exact (Clopper–Pearson) two-sided interval for a binomial proportion, from beta quantiles.

    ``(0, 1)`` when ``n == 0``: no trials, no information. 0 of 6 gives ``(0, 0.4593)``.
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    tail = (1 - confidence) / 2
    low = 0.0 if successes == 0 else float(stats.beta.ppf(tail, successes, n - successes + 1))
    high = 1.0 if successes == n else float(stats.beta.ppf(1 - tail, successes + 1, n - successes))
    return low, high


@dataclass(frozen=True)
class Rate:
    successes: int
    n: int
    low: float
    high: float

    @property
    def rate(self) -> float | None:
        return self.successes / self.n if self.n else None


def rate(successes: Sequence[bool]) -> Rate:
    k, n = sum(bool(s) for s in successes), len(successes)
    low, high = clopper_pearson(k, n)
    return Rate(successes=k, n=n, low=low, high=high)


@dataclass(frozen=True)
class SignTest:
    """Exact two-sided sign test of paired differences; with one control per trial, the exact McNemar test."""

    real_better: int  # trials where the real edit succeeded and the control did not
    control_better: int  # where the control succeeded and the real edit did not
    ties: int  # both or neither (they carry no information and drop out)
    p_value: float


def mcnemar(real: Sequence[bool], control: Sequence[bool]) -> SignTest:
    """Exact McNemar test of one control draw per trial against the real edit (discordant pairs vs ½)."""
    if len(real) != len(control):
        raise ValueError(f"{len(real)} real outcomes but {len(control)} control outcomes")
    better = sum(r and not c for r, c in zip(real, control, strict=True))
    worse = sum(c and not r for r, c in zip(real, control, strict=True))
    informative = better + worse
    p_value = 1.0 if informative == 0 else float(stats.binomtest(better, informative, 0.5).pvalue)
    return SignTest(real_better=better, control_better=worse, ties=len(real) - informative, p_value=p_value)


# --- Random baselines: the real effect ranked among effects of random stand-ins ---------------------------------

DEFAULT_DRAWS = 20  # random stand-ins a real effect is ranked among: the smallest p is 1/21 < 0.05
MAX_DRAWS = 100
ALPHA = 0.05


@dataclass(frozen=True)
class RankTest:
    """Where a real effect ranks among the effects of ``n`` random stand-ins (directions, features, circuits).

    H0: the real thing is one more random draw, so the n + 1 effects are exchangeable and the real one's rank is
    uniform; ``p_value = (1 + #{draws at least as extreme}) / (n + 1)`` is then exact (P(p ≤ α) ≤ α for every α),
    ties counted against the real effect. It can never be below 1/(n + 1): with 5 draws "larger than every random
    one" is p = 1/6 — a coin flip's worth of evidence.

    A sequential test (``sequential_rank_test``, ``h`` set) drew until ``h`` draws were at least as extreme or
    ``n_max`` were drawn; then ``p_value`` is h/n when it stopped early, (1 + #)/(n_max + 1) otherwise.
    """

    real: float
    draws: tuple[float, ...]
    at_least_as_extreme: int  # draws whose effect is at least as extreme as the real one
    p_value: float  # in [1/(n + 1), 1]
    alternative: str  # "magnitude": |draw| ≥ |real|; "greater": draw ≥ real; "less": draw ≤ real
    h: int | None = None  # sequential: the number of extreme draws that stops it (None: a fixed number of draws)
    n_max: int | None = None  # sequential: the most draws it may make
    centre: float | None = None  # two-sided: the value distances are measured from (``sequential_two_sided_test``)

    @property
    def n(self) -> int:
        return len(self.draws)

    @property
    def stopped_early(self) -> bool:
        return self.h is not None and self.at_least_as_extreme >= self.h

    @property
    def p_floor(self) -> float:
        """The smallest p this test could have reached: 1/(n_max + 1) (sequential), 1/(n + 1) (fixed draws)."""
        return 1.0 / ((self.n_max if self.n_max is not None else self.n) + 1)


def _extreme(values: np.ndarray, real: float, alternative: str) -> np.ndarray:
    """Which draws are at least as extreme as ``real`` (ties count against the real effect)."""
    if alternative == "magnitude":
        return np.abs(values) >= abs(real)
    if alternative == "greater":
        return values >= real
    if alternative == "less":
        return values <= real
    raise ValueError(f"unknown alternative {alternative!r}")


def rank_test(real: float, draws: Sequence[float], alternative: str = "magnitude") -> RankTest:
    """The exact Monte Carlo rank test (see ``RankTest``); ``alternative`` says what "more extreme" means."""
    values = tuple(float(d) for d in draws)
    if not values:
        raise ValueError("a rank test needs at least one random draw")
    extreme = int(_extreme(np.asarray(values), float(real), alternative).sum())
    return RankTest(
        real=float(real),
        draws=values,
        at_least_as_extreme=extreme,
        p_value=(1 + extreme) / (len(values) + 1),
        alternative=alternative,
    )


# --- Sequential Monte Carlo: draw until the answer is clear (Besag & Clifford 1991) ------------------------------

STOP_AFTER = 10  # h: extreme draws that settle "not significant"
MOST_DRAWS = 200  # n_max: the smallest p is 1/201 ≈ 0.005
BATCH = 20  # draws asked for at a time (the first batch alone is the old fixed 20)

DrawBatch = Callable[[int], Sequence[float]]
DrawRows = Callable[[int], np.ndarray]


def check_sequential(h: int, n_max: int, batch: int) -> None:
    if not 1 <= h <= n_max or batch < 1:
        raise ValueError(f"need 1 <= h <= n_max and batch >= 1, got h={h}, n_max={n_max}, batch={batch}")


def besag_clifford_p(extreme: int, n: int, h: int, n_max: int) -> float:
    """The sequential p-value: h/n when the h-th extreme draw came at draw n, else (1 + extreme)/(n_max + 1)."""
    if extreme >= h:
        return h / n
    if n != n_max:
        raise ValueError(f"stopped after {n} of {n_max} draws with only {extreme} < h = {h} extreme ones")
    return (1 + extreme) / (n_max + 1)


def sequential_rank_test(
    real: float,
    draw: DrawBatch,
    alternative: str = "magnitude",
    h: int = STOP_AFTER,
    n_max: int = MOST_DRAWS,
    batch: int = BATCH,
) -> RankTest:
    """The real effect ranked among random draws made only as long as they are needed (Besag & Clifford 1991).

    ``draw(k)`` returns k new null values (the caller runs the model k times). Draws are asked for in batches of
    ``batch`` until ``h`` of them are at least as extreme as the real value — then p = h/n, n the draw that made it h
    (later draws of that batch are discarded unseen, so the stopping rule is exactly the published one) — or until
    ``n_max`` are drawn, when p = (1 + #extreme)/(n_max + 1), the fixed-n rank test. Under H0 (the real value
    exchangeable with the draws) P(p ≤ α) ≤ α for every α, as for the fixed test; a weak effect stops after about
    h/p draws (≈ 20 at p ≈ 0.5) while a strong one reaches p = 1/(n_max + 1) ≈ 0.005 instead of the fixed-20 floor
    1/21. ``tests/engine/test_stats.py`` simulates its size and power."""
    check_sequential(h, n_max, batch)
    real = float(real)
    values: list[float] = []
    extreme = 0
    while len(values) < n_max:
        wanted = min(batch, n_max - len(values))
        new = np.asarray(draw(wanted), dtype=np.float64).reshape(-1)
        if new.size != wanted:
            raise ValueError(f"asked for {wanted} draws, got {new.size}")
        for value, is_extreme in zip(new.tolist(), _extreme(new, real, alternative).tolist(), strict=True):
            values.append(value)
            extreme += bool(is_extreme)
            if extreme >= h:
                return RankTest(real, tuple(values), extreme, h / len(values), alternative, h, n_max)
    return RankTest(real, tuple(values), extreme, besag_clifford_p(extreme, n_max, h, n_max), alternative, h, n_max)


TIE_TOLERANCE = 1e-6  # relative: values closer than this are equal (float noise of separately batched forwards)


def sequential_two_sided_test(
    real: float, draw: DrawBatch, h: int = STOP_AFTER, n_max: int = MOST_DRAWS, batch: int = BATCH
) -> RankTest:
    """Two-sided, about the centre of the null: an effect on either side of where the draws sit counts.

    "|draw| ≥ |real|" asks whether the real effect is further from 0 than the draws, which is one-sided in disguise
    when the draws share a shift: real +0.4 against draws around −0.5 ± 0.2 is far from them but never rejected. Here
    the centre c is the median of the real value and the first batch of draws (a symmetric function of values that
    are exchangeable under H0, fixed from then on, as ``SequentialMaxTest`` centres), and the sequential rank test runs
    on distances |v − c|, "greater". ``draws`` are the raw values; ``centre`` is c. ``tests/engine/test_stats.py``
    simulates its size (shifted and heavy-tailed nulls) and its power on the far side of a shift."""
    check_sequential(h, n_max, batch)
    first = [float(v) for v in np.asarray(draw(min(batch, n_max)), dtype=np.float64).reshape(-1)]
    centre = float(np.median([float(real), *first]))
    pending, raw = list(first), []

    def distances(k: int) -> list[float]:
        nonlocal pending
        if not pending:
            pending = [float(v) for v in np.asarray(draw(k), dtype=np.float64).reshape(-1)]
        taken, pending = pending[:k], pending[k:]
        raw.extend(taken)
        return [abs(v - centre) for v in taken]

    # distances within TIE_TOLERANCE of the real one are ties (counted against it): a draw that is the real set again,
    # run in another batch of forwards, differs from it by float noise alone (~1e-7)
    tolerance = TIE_TOLERANCE * max(1.0, abs(float(real)), abs(centre))
    test = sequential_rank_test(abs(float(real) - centre) - tolerance, distances, "greater", h, n_max, batch)
    return RankTest(
        float(real), tuple(raw[: test.n]), test.at_least_as_extreme, test.p_value, "two-sided", h, n_max, centre
    )


@dataclass(frozen=True)
class FamilyRankTest:
    """A sequential max-statistic test over a family (the layers of a probe): for each member, where its real value
    ranks among the draws' *largest* value over all members (Westfall & Young's single step), drawn sequentially.

    Values are centred per member on the mean of the real value and the first batch of draws (fixed from then on),
    so a member whose draws run high does not own every draw's maximum. Member j's p is Besag–Clifford's on "draw
    maximum ≥ real_j": h/n_j when the h-th such draw came at draw n_j, else (1 + count)/(n + 1) after n = n_max
    draws. Drawing stops when every member has its h (or at n_max). Under the complete null (the real row
    exchangeable with the drawn rows) P(some member's p ≤ α) ≤ α: the smallest p is the sequential rank test of the
    real row's maximum."""

    real: tuple[float, ...]
    draws: np.ndarray  # [n, members], the draws made (in order)
    centre: tuple[float, ...]
    at_least_as_extreme: tuple[int, ...]  # per member, among the draws its p uses: maxima ≥ its centred real value
    used: tuple[int, ...]  # per member, the draws its p uses (n_j)
    p_values: tuple[float, ...]
    h: int
    n_max: int

    @property
    def n(self) -> int:
        return int(self.draws.shape[0])


class SequentialMaxTest:
    """``sequential_max_test`` fed batch by batch, for a caller that reports progress between batches: ask
    ``wanted()`` for the size of the next batch (0: finished), ``add`` its rows, then read ``result()``."""

    def __init__(self, real: Sequence[float], h: int = STOP_AFTER, n_max: int = MOST_DRAWS, batch: int = BATCH):
        check_sequential(h, n_max, batch)
        self.observed = np.asarray(real, dtype=np.float64).reshape(-1)
        self.h, self.n_max, self.batch = h, n_max, batch
        members = self.observed.size
        self.rows: list[np.ndarray] = []
        self.count = np.zeros(members, dtype=np.int64)
        self.used = np.zeros(members, dtype=np.int64)
        self.done = np.zeros(members, dtype=bool)
        self.centre = np.zeros(members)
        self.n = 0

    def wanted(self) -> int:
        return 0 if self.done.all() or self.n >= self.n_max else min(self.batch, self.n_max - self.n)

    def add(self, rows: np.ndarray) -> int:
        """Take a batch of ``wanted()`` rows [k, members]; returns how many were used (the rest come after the stop
        and are discarded)."""
        wanted = self.wanted()
        new = np.asarray(rows, dtype=np.float64).reshape(-1, self.observed.size)
        if new.shape[0] != wanted:
            raise ValueError(f"asked for {wanted} draws, got {new.shape[0]}")
        if self.n == 0:
            self.centre = np.vstack([self.observed[None], new]).mean(axis=0)
        target = self.observed - self.centre
        maxima = (new - self.centre).max(axis=1)
        tolerance = 1e-9 * max(1.0, float(np.abs(target).max()), float(np.abs(maxima).max()))
        taken = 0
        for maximum in maxima.tolist():
            self.n += 1
            taken += 1
            hit = ~self.done & (maximum >= target - tolerance)
            self.count[hit] += 1
            reached = ~self.done & (self.count >= self.h)
            self.used[reached] = self.n
            self.done |= reached
            if self.done.all():
                break
        self.rows.append(new[:taken])
        return taken

    def result(self) -> FamilyRankTest:
        if self.wanted():
            raise ValueError(f"not finished: {self.wanted()} more draws wanted")
        used = np.where(self.done, self.used, self.n)
        p = [besag_clifford_p(int(c), int(u), self.h, self.n_max) for c, u in zip(self.count, used, strict=True)]
        return FamilyRankTest(
            real=tuple(self.observed.tolist()),
            draws=np.vstack(self.rows) if self.rows else np.zeros((0, self.observed.size)),
            centre=tuple(self.centre.tolist()),
            at_least_as_extreme=tuple(int(c) for c in self.count),
            used=tuple(int(u) for u in used),
            p_values=tuple(p),
            h=self.h,
            n_max=self.n_max,
        )


def sequential_max_test(
    real: Sequence[float], draw: DrawRows, h: int = STOP_AFTER, n_max: int = MOST_DRAWS, batch: int = BATCH
) -> FamilyRankTest:
    """``real`` [members]; ``draw(k)`` → [k, members], k null rows (one relabelling each, every member at once).
    "Extreme" is "greater": a draw counts against member j when its largest centred value is ≥ real_j's."""
    test = SequentialMaxTest(real, h, n_max, batch)
    while wanted := test.wanted():
        test.add(draw(wanted))
    return test.result()


MAX_SEQUENTIAL_DRAWS = 1000


def check_most_draws(n: int, what: str = "random_draws") -> None:
    """Refuse a cap on sequential draws that cannot support a verdict at α = 0.05, or costs too much."""
    if isinstance(n, bool) or not isinstance(n, int) or not 19 <= n <= MAX_SEQUENTIAL_DRAWS:
        raise InputError(
            f"`{what}` (the most draws a sequential test may make) must be from 19 to {MAX_SEQUENTIAL_DRAWS}: the "
            f"smallest possible p-value is 1/({what} + 1), so fewer than 19 can never reach p < 0.05 (got {n!r})."
        )


def check_draws(n: int, what: str = "random_draws") -> None:
    """Refuse a number of random draws that cannot support a verdict at α = 0.05, or costs too much."""
    if isinstance(n, bool) or not isinstance(n, int) or not 19 <= n <= MAX_DRAWS:
        raise InputError(
            f"`{what}` must be from 19 to {MAX_DRAWS}: with n draws the smallest possible p-value is 1/(n + 1), so "
            f"fewer than 19 can never reach p < 0.05 (got {n!r})."
        )


# --- Verdicts: three-way, and each one registered with its calibration row --------------------------------------

# Every verdict the package words, by key: the row of docs/calibration.md (scripts/calibrate.py) that simulates its
# size under its real null. ``worded`` refuses a key that is not here, and tests/test_calibration.py fails when a
# key has no simulation or no row, or when a schema reports a p-value without its floor.
VERDICTS: dict[str, str] = {
    "component_ablation": "a head's, neuron set's or MLP's ablation against random ones of the same kind and count",
    "direction_ablation": "a direction's or SAE features' ablation against energy-matched random ones",
    "circuit_faithfulness": "a circuit's faithfulness against random circuits from the top 4k of its ranking",
    "probe_chance": "a probe layer beats the shuffled-label control (family-wise over layers)",
    "probe_selective": "a probe layer beats the type-keyed control (family-wise over layers)",
    "swap_strict": "real edits swap the answer more often than their controls",
    "swap_specificity": "real edits raise the target's margin more than their controls",
    "swap_beats_all": "the real edit beats all its controls more often than chance",
    "steer_kl": "a steering vector moves the next-token distribution more than random vectors of its norm",
    "steer_concept": "a steering vector writes its concept more than random vectors of its norm",
    "naming_generation": "an explanation's written texts separate (AUROC within token-count strata)",
    "naming_detection": "an explanation's quiz predictions beat chance (within token-count strata)",
}
RESOLVE = "cannot resolve at α = 0.05"


def outcome(p_value: float, p_floor: float, alpha: float = ALPHA) -> str:
    """ "significant" (p ≤ α), "cannot resolve" (p > α and the smallest reachable p, ``p_floor``, is above α: the
    test could not have rejected) or "not significant" (p > α though it could have been ≤ α)."""
    if p_value <= alpha:
        return "significant"
    return "cannot resolve" if p_floor > alpha else "not significant"


def worded(
    key: str, p_value: float, p_floor: float, significant: str, not_significant: str, alpha: float = ALPHA
) -> str:
    """A verdict in words, three ways (``outcome``): ``significant`` when p ≤ α; "cannot resolve at α = 0.05" with
    the floor when p_floor > α; else ``not_significant`` — which never says "no effect" or "indistinguishable": a p
    above α only fails to reject. ``key`` names the verdict's calibration row (``VERDICTS``)."""
    if key not in VERDICTS:
        raise ValueError(f"verdict {key!r} has no calibration row: add it to stats.VERDICTS and scripts/calibrate.py")
    kind = outcome(p_value, p_floor, alpha)
    if kind == "significant":
        return f"{significant} (p = {p_value:.3g})"
    if kind == "cannot resolve":
        return f"{RESOLVE}: the smallest p this test can reach is {p_floor:.3g} (p = {p_value:.3g})"
    return f"{not_significant} (p = {p_value:.3g}, p_floor = {p_floor:.3g})"


def rank_floor(n_max: int, pool: int | None = None) -> float:
    """The smallest p a rank test can reach with at most ``n_max`` draws from ``pool`` distinct other sets (None:
    unlimited): 1/(min(n_max, pool) + 1); 1 when the pool is empty."""
    cap = n_max if pool is None else min(n_max, pool)
    return 1.0 / (cap + 1)


def versus_random(
    key: str, test: RankTest, what: str = "random draws", p_floor: float | None = None, alpha: float = ALPHA
) -> str:
    """A rank test's verdict in words (``worded``, ``key`` its calibration row): "beats n …", "does not beat n … at
    α" or "cannot resolve at α" when the floor (``p_floor``, default the test's own) is above α."""
    how = (
        f"; drawn sequentially, stopping at {test.h} at least as extreme or {test.n_max} draws"
        if test.h is not None
        else ""
    )
    floor = test.p_floor if p_floor is None else p_floor
    count = f"{test.at_least_as_extreme} at least as extreme{how}"
    words = worded(
        key,
        test.p_value,
        floor,
        f"beats {test.n} {what}",
        f"does not beat {test.n} {what} at α = {alpha}",
        alpha,
    )
    if outcome(test.p_value, floor, alpha) == "cannot resolve":
        return f"{words}, against {test.n} {what}"
    return f"{words[:-1]}; {count})"


# --- Random sets that differ from the real one ---------------------------------------------------------------

ENUMERATE_BELOW = 200  # fewer distinct other sets than this: every one of them, in a random order


@dataclass(frozen=True)
class Slot:
    """One part of a random set: ``k`` distinct items of ``pool`` (item ids), the real set's being ``real``."""

    pool: tuple[int, ...]
    real: tuple[int, ...]

    @property
    def k(self) -> int:
        return len(self.real)


class DistinctSets:
    """Random sets made of one k-subset per ``Slot``, each different from the real set (every slot's ``real``) and
    from each other: the stand-ins a real set is ranked among, which must never contain it (a redraw of the real set
    is a tie that caps p at about 1/pool). ``size`` counts the distinct other sets; when it is below
    ``ENUMERATE_BELOW`` every one is listed in a seeded random order, else sets are drawn uniformly and a repeat or
    the real set is drawn again. Under H0 "the real set is one more random set" the real set and any n of these are
    exchangeable, so a rank test on them is exact, and its floor is ``rank_floor(n_max, size)``."""

    def __init__(self, slots: Sequence[Slot], seed: int) -> None:
        self.slots = list(slots)
        for slot in self.slots:
            if not set(slot.real) <= set(slot.pool) or len(set(slot.real)) != slot.k:
                raise ValueError("each slot's real items must be distinct members of its pool")
        self.size = math.prod(math.comb(len(s.pool), s.k) for s in self.slots) - 1
        self.generator = np.random.default_rng(seed)
        self.real = tuple(tuple(sorted(s.real)) for s in self.slots)
        self.seen = {self.real}
        self.listed: list[tuple[tuple[int, ...], ...]] | None = None
        if self.size < ENUMERATE_BELOW:
            every = itertools.product(*(itertools.combinations(sorted(s.pool), s.k) for s in self.slots))
            others = [c for c in every if c != self.real]
            self.listed = [others[i] for i in self.generator.permutation(len(others))]
        self.made = 0

    def take(self, n: int) -> list[tuple[tuple[int, ...], ...]]:
        """The next ``n`` sets (per slot its sorted items); fewer when the sets run out."""
        if self.listed is not None:
            out = self.listed[self.made : self.made + n]
            self.made += len(out)
            return out
        out = []
        while len(out) < n and len(self.seen) <= self.size:
            chosen = tuple(
                tuple(sorted(int(i) for i in self.generator.choice(s.pool, s.k, replace=False))) for s in self.slots
            )
            if chosen not in self.seen:
                self.seen.add(chosen)
                out.append(chosen)
        self.made += len(out)
        return out


# --- Arm relabelling within clusters: a permutation test valid under dependence ----------------------------------

EXACT_ENUMERATION_LIMIT = 200_000
RELABEL_DRAWS = 100_000
RELABEL_CHUNK = 2_000


@dataclass(frozen=True)
class RelabelTest:
    """Real arm against its controls, with the label relabelled per *cluster* (one prompt, one token, …).

    Each cluster c has m_c + 1 arms — the real one (column 0) and its controls — each summarised by one number
    a_c[j] over all of the cluster's trials (a mean margin gain, a success rate, …). H0: in every cluster the real
    arm is one more control, so which column carries the real label is uniform over the m_c + 1 columns,
    independently across clusters. The statistic is the mean over clusters of a_c[real] − mean_j a_c[j]; its null
    distribution is exact (enumeration) when ∏(m_c + 1) is small, else a seeded Monte Carlo whose p-value
    (count + 1)/(draws + 1) is itself valid. Valid however trials *within* a cluster depend on each other (a token
    effect shared by every trial of a prompt), because the whole cluster moves together; it needs the arms'
    columns to be exchangeable under H0 (each control column drawn like the real one: one token per column).
    """

    statistic: float  # mean over clusters of a_c[0] − mean_j a_c[j]; 0 = the real arm is an average arm
    real_mean: float  # mean over clusters of a_c[0]
    control_mean: float  # mean over clusters of the controls' mean
    clusters: int
    real_above: int  # clusters where the real arm exceeds every control arm
    p_greater: float  # one-sided: the real arm is larger than its controls
    p_less: float
    p_value: float  # two-sided: 2 · min(one-sided), capped at 1
    method: str  # "exact" or "monte_carlo"
    draws: int  # Monte Carlo draws (0 when exact)


def relabel_test(arms: Sequence[Sequence[float]], seed: int = 0, draws: int = RELABEL_DRAWS) -> RelabelTest:
    """``arms[c]``: cluster c's per-arm values, the real arm first (at least one control each); ``draws``: Monte
    Carlo relabellings when the exact enumeration is too large."""
    rows = [np.asarray(row, dtype=np.float64) for row in arms]
    if any(row.size < 2 for row in rows):
        raise ValueError("every cluster needs the real arm and at least one control")
    if not rows:
        return RelabelTest(0.0, 0.0, 0.0, 0, 0, 1.0, 1.0, 1.0, "exact", 0)
    n = len(rows)
    # Centre each cluster on its arms' mean: under H0 the contribution of cluster c is (a_c[J] − mean a_c) / n with J
    # uniform, and the statistic a_c[0] − mean of the *other* arms is a fixed multiple (m + 1)/m of this, per cluster.
    scale = [row.size / (row.size - 1) for row in rows]
    centred = [(row - row.mean()) * s / n for row, s in zip(rows, scale, strict=True)]
    observed = float(sum(c[0] for c in centred))
    tolerance = 1e-12 * max(1.0, max(float(np.abs(c).max()) for c in centred))
    sizes = [row.size for row in rows]
    if math.prod(sizes) <= EXACT_ENUMERATION_LIMIT:
        totals = np.zeros(1)
        for c in centred:
            totals = (totals[:, None] + c[None, :]).ravel()
        greater = float(np.mean(totals >= observed - tolerance))
        less = float(np.mean(totals <= observed + tolerance))
        method, draws = "exact", 0
    else:
        generator = np.random.default_rng(seed)
        at_least = at_most = 0
        for start in range(0, draws, RELABEL_CHUNK):
            size = min(RELABEL_CHUNK, draws - start)
            total = np.zeros(size)
            for c in centred:
                total += c[generator.integers(0, c.size, size)]
            at_least += int(np.sum(total >= observed - tolerance))
            at_most += int(np.sum(total <= observed + tolerance))
        greater = (at_least + 1) / (draws + 1)
        less = (at_most + 1) / (draws + 1)
        method = "monte_carlo"
    controls = [float(row[1:].mean()) for row in rows]
    return RelabelTest(
        statistic=observed,
        real_mean=float(np.mean([row[0] for row in rows])),
        control_mean=float(np.mean(controls)),
        clusters=n,
        real_above=sum(bool(row[0] > row[1:].max()) for row in rows),
        p_greater=min(1.0, greater),
        p_less=min(1.0, less),
        p_value=min(1.0, 2 * min(greater, less)),
        method=method,
        draws=draws,
    )


# --- Intervals of a mean ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeanInterval:
    mean: float
    low: float
    high: float
    n: int


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> MeanInterval:
    """Student-t interval of a mean (one value: the interval is the point; the spread is unknown, said by n = 1)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("no values")
    mean = float(data.mean())
    if data.size == 1:
        return MeanInterval(mean, mean, mean, 1)
    half = float(stats.t.ppf((1 + confidence) / 2, data.size - 1) * data.std(ddof=1) / math.sqrt(data.size))
    return MeanInterval(mean, mean - half, mean + half, int(data.size))


# --- Scoring an explanation: does it separate texts the feature fires on from texts it does not? ----------------

PERMUTATION_DRAWS = 99_999  # Monte Carlo permutations when the exact enumeration is larger than this
PERMUTATION_CHUNK = 5_000
Values = Sequence[float] | np.ndarray


@dataclass(frozen=True)
class AurocTest:
    """How well values ``x`` (texts written to make a feature fire) rank above values ``y`` (texts written not to).

    ``auroc`` = P(X > Y) + ½ P(X = Y) over all pairs, the Mann–Whitney U divided by ``n_x · n_y``: 1 = every x above
    every y, 0.5 = no separation, 0 = every x below every y (the sets are swapped). ``low``/``high``: Newcombe's
    score-type 95 % interval (2006, method 5: the Hanley–McNeil variance at θ with both sample sizes replaced by their
    mean, inverted like Wilson's interval, so it stays informative at 0 and 1). ``p_value``: one-sided, H0 = the two
    sets' values are exchangeable (the explanation does not separate them), against x tending higher.
    """

    auroc: float
    low: float
    high: float
    p_value: float
    method: str  # "exact Mann–Whitney" (no ties), "exact permutation" or "Monte Carlo permutation" (ties)
    n_x: int
    n_y: int


def auroc(x: Values, y: Values) -> float:
    """P(X > Y) + ½ P(X = Y) over every pair (x, y)."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("both samples need at least one value")
    greater = (a[:, None] > b[None, :]).sum()
    equal = (a[:, None] == b[None, :]).sum()
    return float((greater + 0.5 * equal) / (a.size * b.size))


def auroc_interval(value: float, n_x: int, n_y: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Newcombe's method-5 interval for an AUROC ``value`` from ``n_x`` and ``n_y`` values: every θ with
    (value − θ)² ≤ z² V(θ), V(θ) = θ(1 − θ)/(n_x n_y) · [1 + (N* − 1)((1 − θ)/(2 − θ) + θ/(1 + θ))],
    N* = (n_x + n_y)/2."""
    z = float(stats.norm.ppf((1 + confidence) / 2))
    half = (n_x + n_y) / 2

    def excess(theta: float) -> float:
        spread = (
            theta * (1 - theta) / (n_x * n_y) * (1 + (half - 1) * ((1 - theta) / (2 - theta) + theta / (1 + theta)))
        )
        return (value - theta) ** 2 - z * z * spread

    edge = 1e-12
    low = 0.0 if value <= edge else float(brentq(excess, 0.0, value - edge))
    high = 1.0 if value >= 1 - edge else float(brentq(excess, value + edge, 1.0))
    return max(0.0, low), min(1.0, high)


def rank_sum_permutation_p(ranks: np.ndarray, n_first: int, seed: int = 0) -> tuple[float, str]:
    """One-sided p of the first ``n_first`` entries' rank sum against every split of ``ranks`` into ``n_first`` and
    the rest (midranks, so ties are exact): P(a random subset's sum ≥ the observed one). All C(N, n_first) subsets
    when there are at most ``PERMUTATION_DRAWS`` (exact), else that many seeded uniform subsets with p = (k + 1)/(draws
    + 1), itself a valid p-value. The same test as ``scipy.stats.permutation_test`` on U (a test checks it)."""
    n = ranks.size
    observed = float(ranks[:n_first].sum())
    tolerance = 1e-9 * max(1.0, float(np.abs(ranks).sum()))
    total = math.comb(n, n_first)
    if total <= PERMUTATION_DRAWS:
        subsets = np.fromiter(
            itertools.chain.from_iterable(itertools.combinations(range(n), n_first)), dtype=np.int64
        ).reshape(total, n_first)
        return float(np.mean(ranks[subsets].sum(axis=1) >= observed - tolerance)), "exact permutation"
    generator = np.random.default_rng(seed)
    at_least = 0
    for start in range(0, PERMUTATION_DRAWS, PERMUTATION_CHUNK):
        size = min(PERMUTATION_CHUNK, PERMUTATION_DRAWS - start)
        picks = np.argpartition(generator.random((size, n)), n_first - 1, axis=1)[:, :n_first]
        at_least += int(np.sum(ranks[picks].sum(axis=1) >= observed - tolerance))
    return (at_least + 1) / (PERMUTATION_DRAWS + 1), "Monte Carlo permutation"


def auroc_test(x: Values, y: Values, seed: int = 0) -> AurocTest:
    """``AurocTest`` of ``x`` over ``y``. Without ties the p-value is the exact one-sided Mann–Whitney test (scipy);
    with ties (features are often exactly 0 on many texts) it is the permutation test of U (``rank_sum_permutation_p``:
    U is the first set's midrank sum minus a constant), which stays exact under ties where the tabulated
    distribution does not."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    value = auroc(a, b)
    low, high = auroc_interval(value, a.size, b.size)
    pooled = np.concatenate([a, b])
    if np.unique(pooled).size == pooled.size:
        p_value = float(stats.mannwhitneyu(a, b, alternative="greater", method="exact").pvalue)
        method = "exact Mann–Whitney"
    else:
        p_value, method = rank_sum_permutation_p(stats.rankdata(pooled), a.size, seed)
    return AurocTest(value, low, high, min(1.0, p_value), method, int(a.size), int(b.size))


@dataclass(frozen=True)
class DetectionTest:
    """Predictions ("fires" / "does not") of texts whose truth is known, scored as balanced accuracy.

    ``balanced_accuracy`` = (true-positive rate + true-negative rate)/2: 0.5 is chance for any predictor that ignores
    the text (constant answers included), 1 is perfect, 0 is perfectly inverted. ``p_value``: the permutation test of
    the predictions against chance — H0: the predictions are exchangeable across the texts (they carry no information
    about the truth). For fixed numbers of firing texts and of "fires" predictions, every permutation's balanced
    accuracy rises with its true positives, which are hypergeometric under H0, so the p-value over all permutations is
    exact: P(TP ≥ observed) (one-sided Fisher). ``low``/``high``: an exact 95 % interval for the predictor's balanced
    accuracy — with as many firing as non-firing texts it equals the accuracy and the interval is Clopper–Pearson's on
    the correct answers (valid, conservative, when the two classes' success rates differ: Hoeffding 1956); otherwise
    the mean of the two classes' Clopper–Pearson intervals at level √0.95 each (both hold together with probability
    ≥ 0.95).
    """

    balanced_accuracy: float
    low: float
    high: float
    interval: str  # "clopper_pearson" or "per_class_clopper_pearson"
    p_value: float
    true_positive_rate: float
    true_negative_rate: float
    n_firing: int
    n_not_firing: int
    true_positives: int
    true_negatives: int


def detection_test(truth: Sequence[bool], predicted: Sequence[bool], confidence: float = CONFIDENCE) -> DetectionTest:
    """``DetectionTest`` of ``predicted`` against ``truth`` (one bool per text, both classes present)."""
    if len(truth) != len(predicted):
        raise ValueError(f"{len(truth)} truths but {len(predicted)} predictions")
    fires = [bool(t) for t in truth]
    said = [bool(p) for p in predicted]
    n_pos = sum(fires)
    n_neg = len(fires) - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("balanced accuracy needs texts of both classes")
    tp = sum(f and s for f, s in zip(fires, said, strict=True))
    tn = sum(not f and not s for f, s in zip(fires, said, strict=True))
    tpr, tnr = tp / n_pos, tn / n_neg
    called = sum(said)
    p_value = float(stats.hypergeom.sf(tp - 1, len(fires), n_pos, called))
    if n_pos == n_neg:
        low, high = clopper_pearson(tp + tn, len(fires), confidence)
        interval = "clopper_pearson"
    else:
        level = math.sqrt(confidence)
        pos_low, pos_high = clopper_pearson(tp, n_pos, level)
        neg_low, neg_high = clopper_pearson(tn, n_neg, level)
        low, high = (pos_low + neg_low) / 2, (pos_high + neg_high) / 2
        interval = "per_class_clopper_pearson"
    return DetectionTest(
        balanced_accuracy=(tpr + tnr) / 2,
        low=low,
        high=high,
        interval=interval,
        p_value=min(1.0, max(0.0, p_value)),
        true_positive_rate=tpr,
        true_negative_rate=tnr,
        n_firing=n_pos,
        n_not_firing=n_neg,
        true_positives=tp,
        true_negatives=tn,
    )


# --- Naming scores that do not reward length: tests within token-count strata ---------------------------------
#
# A text's activation is its maximum over positions, and a longer text has more positions, so its maximum is larger
# whatever the text says: an unrelated explanation whose "activating" texts are longer won an ordinary AUROC test
# 24.5 % of the time at α = 0.05 (issue 41). Comparing only texts of the same token count removes length exactly:
# within a stratum the two sets' maxima are exchangeable under H0 however long the texts are, and the test permutes
# within strata (van Elteren's stratified rank-sum; for the quiz, Fisher's test within strata).


@dataclass(frozen=True)
class StratifiedAurocTest:
    """``x`` over ``y`` compared only within strata (token counts). ``auroc`` = P(X > Y) + ½P(X = Y) over the
    same-stratum pairs (0.5 = chance; 0.5 and p = 1 when there are none); ``low``/``high`` Newcombe's interval with
    the texts that have a partner; ``p_value`` one-sided (x higher), the permutation of the sets' labels within each
    stratum — exact by enumeration up to ``PERMUTATION_DRAWS`` relabellings, else Monte Carlo; ``p_floor`` the
    smallest p it can give: 1/∏ C(n_s, a_s) (or 1/(draws + 1))."""

    auroc: float
    low: float
    high: float
    p_value: float
    p_floor: float
    method: str  # "exact stratified permutation" or "Monte Carlo stratified permutation"
    pairs: int  # same-stratum (x, y) pairs
    n_x: int  # x texts with at least one y of their stratum
    n_y: int
    strata: int


def stratified_auroc_test(
    x: Values, y: Values, strata_x: Sequence[int] | np.ndarray, strata_y: Sequence[int] | np.ndarray, seed: int = 0
) -> StratifiedAurocTest:
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    sa, sb = np.asarray(strata_x), np.asarray(strata_y)
    shared = sorted(set(sa.tolist()) & set(sb.tolist()))
    blocks: list[tuple[np.ndarray, int]] = []  # per stratum: midranks of the pooled values, how many are x
    u = 0.0
    pairs = n_x = n_y = 0
    for s in shared:
        xs, ys = a[sa == s], b[sb == s]
        ranks = stats.rankdata(np.concatenate([xs, ys]))
        blocks.append((ranks, xs.size))
        u += float(ranks[: xs.size].sum()) - xs.size * (xs.size + 1) / 2
        pairs += xs.size * ys.size
        n_x, n_y = n_x + xs.size, n_y + ys.size
    if not pairs:
        return StratifiedAurocTest(0.5, 0.0, 1.0, 1.0, 1.0, "no same-stratum pairs", 0, 0, 0, 0)
    observed = sum(float(r[:k].sum()) for r, k in blocks)
    tolerance = 1e-9 * max(1.0, observed)
    total = math.prod(math.comb(r.size, k) for r, k in blocks)
    if total <= PERMUTATION_DRAWS:
        sums = np.zeros(1)
        for r, k in blocks:
            subsets = np.array([r[list(c)].sum() for c in itertools.combinations(range(r.size), k)])
            sums = (sums[:, None] + subsets[None, :]).ravel()
        p_value, floor, method = float(np.mean(sums >= observed - tolerance)), 1 / total, "exact stratified permutation"
    else:
        generator = np.random.default_rng(seed)
        at_least = 0
        for start in range(0, PERMUTATION_DRAWS, PERMUTATION_CHUNK):
            size = min(PERMUTATION_CHUNK, PERMUTATION_DRAWS - start)
            sums = np.zeros(size)
            for r, k in blocks:
                if k == r.size:
                    sums += r.sum()
                    continue
                picks = np.argpartition(generator.random((size, r.size)), k - 1, axis=1)[:, :k]
                sums += r[picks].sum(axis=1)
            at_least += int(np.sum(sums >= observed - tolerance))
        p_value = (at_least + 1) / (PERMUTATION_DRAWS + 1)
        floor, method = max(1 / total, 1 / (PERMUTATION_DRAWS + 1)), "Monte Carlo stratified permutation"
    value = u / pairs
    low, high = auroc_interval(value, n_x, n_y)
    return StratifiedAurocTest(value, low, high, min(1.0, p_value), floor, method, pairs, n_x, n_y, len(blocks))


@dataclass(frozen=True)
class StratifiedDetection:
    """``DetectionTest``'s balanced accuracy and interval, with the p-value taken within strata (token counts): H0 =
    within each stratum the predictions carry no information about which texts fire. P(TP ≥ observed) with each
    stratum's true positives hypergeometric and independent (their distributions convolved): exact, and a predictor
    that reads only length gains nothing. ``p_floor``: ∏ 1/C(N_s, K_s), the p of predictions that are all right."""

    test: DetectionTest
    p_value: float
    p_floor: float
    strata: int


def stratified_detection_test(
    truth: Sequence[bool], predicted: Sequence[bool], strata: Sequence[int], confidence: float = CONFIDENCE
) -> StratifiedDetection:
    overall = detection_test(truth, predicted, confidence)
    fires, said, groups = np.asarray(truth, dtype=bool), np.asarray(predicted, dtype=bool), np.asarray(strata)
    pmf = np.ones(1)
    floor = 1.0
    observed = 0
    values = np.unique(groups)
    for value in values:
        inside = groups == value
        n, k, called = int(inside.sum()), int(fires[inside].sum()), int(said[inside].sum())
        observed += int((fires & said)[inside].sum())
        support = np.arange(0, min(k, called) + 1)
        pmf = np.convolve(pmf, stats.hypergeom.pmf(support, n, k, called))
        floor /= math.comb(n, k)
    p_value = float(min(1.0, max(0.0, pmf[observed:].sum())))
    return StratifiedDetection(overall, p_value, floor, int(values.size))
