"""Linear probes and the controls that make their accuracy mean something: model-free, arrays in, numbers out.

A probe is binary: ``y`` ∈ {0, 1}, the direction points toward class 1.

Fits (both on residuals standardised with the training part's mean and standard deviation, so a few
large-magnitude dimensions do not dominate the penalty or the shrinkage):

* ``logistic`` — scikit-learn's ``LogisticRegression`` (lbfgs, L2, ``C = 1``, ``max_iter = 1000``). Its decision
  function is linear in the raw residual, w·(x − μ)/σ + b = (w/σ)·x + b′, so the stored direction is w/σ.
* ``diff_means`` — Marks & Tegmark's mass-mean probe: the stored direction is the difference of the class means
  μ₁ − μ₀ (what interventions use); texts are classified by linear discriminant analysis, Σ⁻¹(μ₁ − μ₀) with the
  classes' Ledoit–Wolf-shrunk covariance — exactly scikit-learn's ``LinearDiscriminantAnalysis(solver="lsqr",
  shrinkage="auto")`` (the tests compare the two), solved by Cholesky instead of an SVD least-squares (~50× faster
  at d = 576). The two differ: when a nuisance (the token read) dominates the residual, the projection on μ₁ − μ₀
  can classify held-out texts at chance or below while LDA reads the label, so each layer reports both the
  classifier's ``accuracy`` and the stored direction's own (``direction_accuracy``: the projection thresholded at
  the midpoint of the training classes' mean projections).

Controls. A probe's held-out accuracy is only evidence against a null, and each control is the exact null
distribution of that accuracy under one hypothesis: the same procedure (same split, same fit) run on relabelled
data. The real labels' accuracy is ranked among the draws' — sequentially (Besag & Clifford: draws are made until 10
per layer are at least as good, or up to a cap, so a clear effect reaches p ≈ 0.005 and a null stops after a few
dozen) and family-wise over the layers (each draw's best layer, ``engine.stats.SequentialMaxTest``) — which is exact
whenever the real labelling is exchangeable with the draws under the null, whatever the residuals look like,
because the randomness is in the labels:

* shuffled-label control — labels permuted among texts (within the training and the held-out part, so each part
  keeps its class counts). Null: the labels carry nothing the residuals see. Any dataset beats it when the residual
  identifies something the label is a function of (the subject word, say) and that thing recurs across the split.
  With ``groups`` held out, labels are shuffled within each group; when the label is also a function of a key, the
  only exact shuffle is among the key types — the type-keyed control itself, so it is run once, not twice.
* type-keyed control (Hewitt & Liang 2019) — when the label is a function of a *key* whose types recur
  (``recurrence_problem``): the token at one position (any position of the text, not only the one read; counted
  from the start or from the end) or the group. Each key type gets a random label: the types' labels permuted among
  the types, so the label distribution over types is kept. Null: the probe only recognises the key type and learns
  its label — memorisation. A probe that reads the property beats it; one that reads which word is there does as
  well on a random labelling of the words. A key whose types do not recur (a word seen in one text) is not used:
  there is nothing to memorise, and the result says why.

Selectivity = accuracy − mean control accuracy (the type-keyed control when there is a key, else the shuffled-label
one), with an interval for that difference (``selectivity_interval``); "selective" comes only from the family-wise
p-value, which keeps "some layer is selective" at α under the null over every layer probed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mcp_interp.errors import InputError
from mcp_interp.schemas.features import ProbeMethod, SplitKind


@dataclass(frozen=True)
class Split:
    train: np.ndarray  # indices, sorted
    test: np.ndarray
    kind: SplitKind = "labels"  # stratified by the labels, by the key type, plain random, or whole groups held out


@dataclass(frozen=True)
class ProbeFit:
    """A fitted probe: ``direction`` (raw residual space, not normalised) is what is stored and intervened on;
    texts are classified as 1 iff x·weights + bias > 0 (the same vector for logistic; for diff_means the
    covariance-corrected one)."""

    direction: np.ndarray  # [d_model] float64
    weights: np.ndarray  # [d_model] float64
    bias: float
    train_accuracy: float
    correct: int  # held-out texts classified correctly
    n_test: int
    direction_correct: int  # held-out texts the stored direction alone classifies correctly (midpoint threshold)
    hits: np.ndarray  # [n_test] bool: which held-out texts it classifies correctly

    @property
    def accuracy(self) -> float:
        return self.correct / self.n_test

    @property
    def direction_accuracy(self) -> float:
        return self.direction_correct / self.n_test


@dataclass(frozen=True)
class Key:
    """What the labels are a function of: ``name`` ("token 1", "token -2", "groups"), one integer type id per text,
    the type names (for the notes), and — when its types do not recur enough for a type-keyed control — why."""

    name: str
    values: np.ndarray  # [texts] int, type id
    n_types: int
    examples: list[str]
    problem: str | None = None  # why the type-keyed control is not applied on it (None: it is)


def encode_labels(labels: Sequence[object]) -> tuple[np.ndarray, list[str]]:
    """Labels as 0/1 and the two class names (sorted, so the same data gives the same orientation);
    the direction points toward the second."""
    names = [str(label) for label in labels]
    classes = sorted(set(names))
    if len(classes) != 2:
        raise InputError(
            f"`labels` must have exactly 2 distinct values for a probe direction; got {len(classes)} "
            f"({classes[:5]}). For more classes, probe one class against the rest by relabelling."
        )
    return np.array([classes.index(name) for name in names], dtype=np.int64), classes


def encode_groups(groups: Sequence[Hashable], n: int) -> np.ndarray:
    """One integer id per text (ids in order of first appearance)."""
    if len(groups) != n:
        raise InputError(f"`groups` has {len(groups)} entries for {n} texts: give one group id per text.")
    ids: dict[str, int] = {}
    return np.array([ids.setdefault(str(g), len(ids)) for g in groups], dtype=np.int64)


# --- keys: is the label a function of one token (or of the group)? --------------------------------------------


def is_function_of(values: Sequence[Hashable] | np.ndarray, y: np.ndarray) -> bool:
    """True when every value carries one label only and some value occurs more than once (otherwise there is
    nothing to memorise)."""
    seen: dict[Hashable, int] = {}
    for value, label in zip(values, y.tolist(), strict=True):
        if seen.setdefault(value, label) != label:
            return False
    return len(seen) < len(y)


COINCIDENCE = 0.01  # a key is used only if random labels would be a function of it less often than this


def recurrence_problem(values: np.ndarray, y: np.ndarray) -> str | None:
    """Why a type-keyed control on these types would be meaningless (None when it is not).

    Two conditions, both about whether there is a type to memorise:

    * **every type is in ≥ 2 texts.** A type seen in one text cannot be memorised: held out, its type was never
      trained on; trained on, no held-out text shares it. "Each type carries one label" is then vacuous for it, and
      relabelling it is relabelling one text — the shuffled-label control, with a split that ignores the labels
      (so a balanced set gets held-out parts like 9/6 and "chance" 0.600).
    * **clearly fewer types than texts**: random labels would be a function of the column by coincidence with
      probability Π_types (p^s + (1 − p)^s) (s texts of a type, p the label rate) — for balanced labels 2^−(texts −
      types) — and that must be below ``COINCIDENCE`` = 0.01: at least 7 more texts than types. Otherwise the key
      may be an accident of this sample (with 10 pairs of texts, 1 random labelling in 1 000 is a function of them)
      and a control built on it changes the split and the verdicts for nothing."""
    counts = np.bincount(values)
    counts = counts[counts > 0]
    once = int((counts == 1).sum())
    if once:
        return (
            f"{once} of its {counts.size} types occur in a single text, and a type seen once cannot be memorised "
            "(the type-keyed control would relabel single texts)"
        )
    rate = float(np.mean(y))
    chance = float(np.prod(rate**counts + (1 - rate) ** counts))
    if chance > COINCIDENCE:
        return (
            f"its {counts.size} types in {values.size} texts are too many: random labels would be a function of them "
            f"with probability {chance:.2g} (above {COINCIDENCE}), so that this one is may be a coincidence"
        )
    return None


def key_candidates(
    tokens: Sequence[Sequence[int]],
    y: np.ndarray,
    read: int | None,
    groups: np.ndarray | None = None,
    names: Sequence[Sequence[str]] | None = None,
) -> list[Key]:
    """Every key the labels are a function of, among the token at each position every text has (from the start,
    0…, and from the end, −1…) and the groups, preferred first: coarsest (fewest types: a key with fewer types is
    easier to memorise, so its control is the most demanding), then the position read (``read``, from the start if
    ≥ 0, from the end if < 0), then the groups, then the earliest position. Each says whether its types recur
    enough for a type-keyed control (``recurrence_problem``)."""
    shortest = min(len(t) for t in tokens)
    candidates: list[tuple[int, int, int, str, list[Hashable], list[str]]] = []
    for order, offset in enumerate([*range(shortest), *range(-1, -shortest - 1, -1)]):
        column = [t[offset] for t in tokens]
        if is_function_of(column, y):
            shown = [names[i][offset] for i in range(len(tokens))] if names is not None else [str(v) for v in column]
            rank = 0 if offset == read else 2
            candidates.append((len(set(column)), rank, order, f"token {offset}", list(column), shown))
    if groups is not None and is_function_of(groups.tolist(), y):
        candidates.append((len(set(groups.tolist())), 1, -1, "groups", groups.tolist(), [str(g) for g in groups]))
    keys = []
    for n_types, _, _, name, column, shown in sorted(candidates, key=lambda c: (c[0], c[1], c[2])):
        _, values = np.unique(np.array([str(v) for v in column], dtype=object), return_inverse=True)
        values = values.astype(np.int64)
        examples = list(dict.fromkeys(shown))[:4]
        keys.append(Key(name, values, n_types, examples, recurrence_problem(values, y)))
    return keys


def find_key(
    tokens: Sequence[Sequence[int]],
    y: np.ndarray,
    read: int | None,
    groups: np.ndarray | None = None,
    names: Sequence[Sequence[str]] | None = None,
) -> Key | None:
    """The preferred key (``key_candidates``) whose types recur enough for a type-keyed control, or None."""
    return next((key for key in key_candidates(tokens, y, read, groups, names) if key.problem is None), None)


# --- the split ----------------------------------------------------------------------------------------------


def split_texts(
    y: np.ndarray,
    test_fraction: float,
    seed: int,
    *,
    groups: np.ndarray | None = None,
    key: np.ndarray | None = None,
) -> Split:
    """A seeded split that holds out ``test_fraction`` of the texts (of the groups, with ``groups``). With groups,
    whole groups are held out (no group on both sides). With a key and no groups, stratified by the key type when
    every stratum can be (singleton types pooled), else plain random: either way independent of the labels. With
    neither, stratified by the labels. Both parts need ≥ 2 texts of each label."""
    from sklearn.model_selection import GroupShuffleSplit, train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise InputError(f"`test_fraction` must be between 0 and 1 (exclusive), got {test_fraction}.")
    counts = np.bincount(y, minlength=2)
    indices = np.arange(len(y))
    n_test = int(np.ceil(test_fraction * len(y)))
    if counts.min() < 2 or n_test < 2 or len(y) - n_test < 2:
        raise InputError(
            f"Too few texts to split: class counts {counts.tolist()}, {n_test} held out of {len(y)}. A probe "
            "needs at least 2 texts of each label in both the training and the held-out part; give more texts "
            "(a few dozen per label for a usable interval) or change `test_fraction`."
        )
    kind: SplitKind
    if groups is not None:
        if len(set(groups.tolist())) < 2:
            raise InputError("`groups` has a single group: holding out whole groups needs at least 2.")
        splitter = GroupShuffleSplit(n_splits=1, test_size=test_fraction, random_state=seed)
        train, test = next(splitter.split(indices, groups=groups))
        kind = "groups"
    elif key is not None:
        strata = _pooled_strata(key)
        n_strata = len(set(strata.tolist()))
        if n_strata <= min(n_test, len(y) - n_test) and np.bincount(strata).min() >= 2:
            train, test = train_test_split(indices, test_size=n_test, stratify=strata, random_state=seed)
            kind = "key"
        else:
            train, test = train_test_split(indices, test_size=n_test, random_state=seed)
            kind = "random"
    else:
        train, test = train_test_split(indices, test_size=n_test, stratify=y, random_state=seed)
        kind = "labels"
    train, test = np.sort(train), np.sort(test)
    for part, name in ((train, "training"), (test, "held-out")):
        part_counts = np.bincount(y[part], minlength=2)
        if part_counts.min() < 2:
            how = "whole groups" if kind == "groups" else "texts independently of the labels (their key)"
            raise InputError(
                f"The split holds out {how}, and the {name} part got class counts {part_counts.tolist()}: each "
                "part needs at least 2 texts of each label. Try another `seed`, more texts or groups, or another "
                "`test_fraction`."
            )
    return Split(train, test, kind)


def _pooled_strata(key: np.ndarray) -> np.ndarray:
    """Key types as strata, types with a single text pooled into one stratum (joined to the largest if alone)."""
    counts = np.bincount(key)
    strata = np.where(counts[key] >= 2, key, -1)
    if (strata == -1).sum() == 1:
        strata[strata == -1] = int(np.argmax(counts))
    _, strata = np.unique(strata, return_inverse=True)
    return strata


# --- fits -----------------------------------------------------------------------------------------------------

_CONTROLLER: Any = None


def _one_blas_thread() -> Any:
    """A context in which BLAS runs one thread. The fits are small dense problems (hundreds of texts, d_model
    columns) repeated for every control draw: BLAS threads buy nothing there and, on a busy machine, oversubscribed
    threads made a 90 × 64 logistic fit 15× slower (0.42 s against 0.028 s). The limit is process-wide while the
    context lasts (threadpoolctl; the controller scans the loaded libraries once)."""
    global _CONTROLLER
    if _CONTROLLER is None:
        import scipy.linalg  # noqa: F401  # load the libraries first, so the controller sees them
        import sklearn.linear_model  # noqa: F401
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=1, user_api="blas")


def _standardise(x: np.ndarray, train: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x standardised by the training part's mean and standard deviation (a constant dimension keeps scale 1)."""
    x = x.astype(np.float64)
    mean = x[train].mean(axis=0)
    scale = x[train].std(axis=0)
    scale[scale == 0] = 1.0
    return (x - mean) / scale, mean, scale


def _classifier(z: np.ndarray, y: np.ndarray, method: ProbeMethod) -> tuple[np.ndarray, float]:
    """Weights and bias on standardised features: 1 iff z·w + b > 0."""
    if len(np.unique(y)) < 2:
        # A control draw can leave one class out of the training part: predict the only class seen.
        return np.zeros(z.shape[1]), 1.0 if y[0] == 1 else -1.0
    if method == "logistic":
        from sklearn.linear_model import LogisticRegression

        model = LogisticRegression(C=1.0, solver="lbfgs", max_iter=1000)
        model.fit(z, y)
        return model.coef_[0].astype(np.float64), float(model.intercept_[0])
    if method == "diff_means":
        return shrunk_lda(z, y)
    raise InputError(f"Unknown probe method {method!r}; use 'logistic' or 'diff_means'.")


def shrunk_lda(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Binary LDA with Ledoit–Wolf shrinkage, as scikit-learn's ``LinearDiscriminantAnalysis(solver="lsqr",
    shrinkage="auto")`` computes it (the tests compare them): each class's covariance is the Ledoit–Wolf estimate
    of that class standardised, rescaled, weighted by the class prior; weights Σ⁻¹(μ₁ − μ₀), bias the difference of
    the two discriminant functions' constants. Σ is positive definite (shrinkage > 0), so a Cholesky solve gives
    the least-squares solution; written in numpy because scikit-learn's per-call overhead dominates the control
    draws on small problems."""
    from scipy import linalg

    priors = np.bincount(y, minlength=2) / len(y)
    means = np.stack([x[y == k].mean(axis=0) for k in (0, 1)])
    covariance = np.zeros((x.shape[1], x.shape[1]))
    for k in (0, 1):
        rows = x[y == k]
        centred = rows - rows.mean(axis=0)
        scale = np.sqrt((centred**2).mean(axis=0))
        scale[scale < 10 * np.finfo(np.float64).eps] = 1.0  # a constant dimension keeps scale 1 (StandardScaler)
        covariance += priors[k] * (scale[:, None] * _ledoit_wolf(centred / scale) * scale[None, :])
    try:
        coef = linalg.solve(covariance, means.T, assume_a="pos").T
    except linalg.LinAlgError:
        coef = linalg.lstsq(covariance, means.T)[0].T
    intercept = -0.5 * np.einsum("kd,kd->k", means, coef) + np.log(priors)
    return coef[1] - coef[0], float(intercept[1] - intercept[0])


def _ledoit_wolf(a: np.ndarray) -> np.ndarray:
    """Ledoit & Wolf's (2004) shrunk covariance of centred rows ``a`` [n, p]: (1 − s)·S + s·(tr S / p)·I with their
    optimal s (scikit-learn's ``ledoit_wolf_shrinkage``, the same sums without its blocks)."""
    a = a - a.mean(axis=0)
    n, p = a.shape
    empirical = a.T @ a / n
    if p == 1:
        return empirical
    squares = a**2
    trace = float(squares.sum()) / n
    mu = trace / p
    delta_sum = float((empirical**2).sum())
    beta = (float((squares.sum(axis=1) ** 2).sum()) / n - delta_sum) / (p * n)
    delta = (delta_sum - 2.0 * mu * trace + p * mu**2) / p
    beta = min(beta, delta)
    shrinkage = 0.0 if beta == 0 else beta / delta
    shrunk = (1.0 - shrinkage) * empirical
    shrunk.flat[:: p + 1] += shrinkage * mu
    return shrunk


def fit_probe(x: np.ndarray, y: np.ndarray, split: Split, method: ProbeMethod) -> ProbeFit:
    """Fit on ``split.train``, count correct on ``split.test``. ``x`` [texts, d_model]."""
    z, mean, scale = _standardise(x, split.train)
    with _one_blas_thread():
        weights_z, bias_z = _classifier(z[split.train], y[split.train], method)
    weights = weights_z / scale
    bias = bias_z - float(weights @ mean)
    x64 = x.astype(np.float64)
    predicted = (z @ weights_z + bias_z > 0).astype(np.int64)
    train_accuracy = float((predicted[split.train] == y[split.train]).mean())
    hits = predicted[split.test] == y[split.test]
    train = x64[split.train]
    if method == "diff_means" and len(np.unique(y[split.train])) == 2:
        direction = train[y[split.train] == 1].mean(axis=0) - train[y[split.train] == 0].mean(axis=0)
    else:
        direction = weights
    return ProbeFit(
        direction=direction,
        weights=weights,
        bias=bias,
        train_accuracy=train_accuracy,
        correct=int(hits.sum()),
        n_test=len(split.test),
        direction_correct=direction_correct(x64, y, split, direction),
        hits=hits,
    )


def direction_correct(x: np.ndarray, y: np.ndarray, split: Split, direction: np.ndarray) -> int:
    """Held-out texts classified right by the direction alone: class 1 iff the projection exceeds the midpoint of
    the two training classes' mean projections (the rule a reader of the stored direction would use)."""
    projection = x @ direction
    train = split.train
    if len(np.unique(y[train])) < 2 or not np.any(direction):
        return 0
    threshold = (projection[train][y[train] == 1].mean() + projection[train][y[train] == 0].mean()) / 2
    return int(((projection[split.test] > threshold).astype(np.int64) == y[split.test]).sum())


def held_out_hits(x: np.ndarray, labellings: np.ndarray, split: Split, method: ProbeMethod) -> np.ndarray:
    """For each row of ``labellings`` [k, texts], which held-out texts [k, n_test] the probe fitted on that labelling
    classifies right — the same standardisation, fit and split as ``fit_probe`` (so a real labelling gets the same
    count)."""
    z, _, _ = _standardise(x, split.train)
    hits = np.empty((len(labellings), len(split.test)), dtype=bool)
    with _one_blas_thread():
        for i, labels in enumerate(labellings):
            weights, bias = _classifier(z[split.train], labels[split.train], method)
            hits[i] = (z[split.test] @ weights + bias > 0).astype(np.int64) == labels[split.test]
    return hits


def held_out_correct(x: np.ndarray, labellings: np.ndarray, split: Split, method: ProbeMethod) -> np.ndarray:
    """For each row of ``labellings``, the number of held-out texts classified right (``held_out_hits``)."""
    return held_out_hits(x, labellings, split, method).sum(axis=1)


def selectivity_interval(
    real_hits: np.ndarray,
    control_hits: np.ndarray,
    units: np.ndarray,
    seed: int,
    confidence: float = 0.95,
    resamples: int = 2000,
) -> tuple[float, float]:
    """An interval for selectivity = accuracy − mean control accuracy: ``real_hits`` [n_test] and ``control_hits``
    [draws, n_test] are the held-out texts each probe got right; ``units`` [n_test] the held-out units that are
    independent (key types, groups, or texts).

    selectivity ± t · √(v + s²/draws), where s² is the variance of the control draws' accuracies and v the variance
    of the real accuracy, taken as the larger of two estimates: s² itself (under the null the real accuracy is one
    more draw, so its whole sampling error — fitting and held-out texts, with every dependence the relabelling keeps
    — is the draws' spread), and a bootstrap over the held-out units of the real accuracy (``scipy.stats.bootstrap``:
    its held-out sampling error under any effect, clustered where texts share a type or group). t has draws − 1
    degrees of freedom, or units − 1 when the bootstrap's variance is the larger (3 held-out groups give it 2).

    The old interval, the t-interval of the control mean alone, ignored the real accuracy's own error and covered 0
    in 25–26 % of null datasets; this one's coverage is simulated in ``tests/features/test_probe_stats.py`` (0.94–0.98
    at 95 %, with and without an effect, for independent texts, memorisable types and held-out groups)."""
    from scipy import stats as scipy_stats

    real = np.asarray(real_hits, dtype=np.float64)
    controls = np.asarray(control_hits, dtype=np.float64).mean(axis=1)
    draws = controls.size
    estimate = float(real.mean() - controls.mean())
    if draws < 2:
        return estimate, estimate
    spread = float(controls.var(ddof=1))
    _, unit = np.unique(np.asarray(units), return_inverse=True)
    n_units = int(unit.max()) + 1
    texts = np.bincount(unit, minlength=n_units).astype(np.float64)
    right = np.bincount(unit, weights=real, minlength=n_units)
    held_out = 0.0
    if n_units > 1:

        def accuracy(chosen: np.ndarray, axis: int = -1) -> np.ndarray:
            picked = np.asarray(chosen, dtype=np.int64)
            return right[picked].sum(axis=axis) / texts[picked].sum(axis=axis)

        boot = scipy_stats.bootstrap(
            (np.arange(n_units),),
            accuracy,
            n_resamples=resamples,
            vectorized=True,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
        held_out = float(boot.standard_error) ** 2
    # The bootstrap's variance rests on the held-out units, so it has about units − 1 degrees of freedom.
    freedom = draws - 1 if spread >= held_out else min(draws - 1, n_units - 1)
    half = float(scipy_stats.t.ppf((1 + confidence) / 2, freedom)) * np.sqrt(max(spread, held_out) + spread / draws)
    return estimate - half, estimate + half


# --- controls -------------------------------------------------------------------------------------------------


def shuffled_labels(
    y: np.ndarray,
    split: Split,
    draws: int,
    seed: int,
    groups: np.ndarray | None = None,
    key: np.ndarray | None = None,
) -> tuple[np.ndarray, str]:
    """``draws`` shuffled labellings [draws, texts] and how they were shuffled.

    Without groups: among texts, within the training and the held-out part (each keeps its class counts). Texts of a
    type seen in training are then predictable by memorising the type, a real effect this control rightly counts.
    With groups held out, memorising cannot help on unseen groups, and a permutation is only exact over units that
    are exchangeable under the null: when the label is a function of a key (a token type or the group), the key
    types' labels are permuted among the types (the type-keyed control itself: texts of a type share both their
    label and, in the residual, their type); otherwise labels are shuffled among the texts of each group."""
    if groups is not None and key is not None:
        return keyed_labels(key, y, draws, seed, split), "among key types"
    rng = np.random.default_rng(seed)
    units = [split.train, split.test] if groups is None else [np.flatnonzero(groups == g) for g in np.unique(groups)]
    out = np.tile(y, (draws, 1))
    for row in out:
        for unit in units:
            row[unit] = row[unit][rng.permutation(len(unit))]
    return out, "within groups" if groups is not None else "among texts"


MAX_TRIES = 100  # per wanted labelling, when sampling (not enumerating) usable distinct labellings
ENUMERATE_LABELLINGS = 100_000  # at most this many type labellings: every one is checked (exact counts)


def keyed_labels(key: np.ndarray, y: np.ndarray, draws: int, seed: int, split: Split | None = None) -> np.ndarray:
    """Hewitt & Liang's control task with the label distribution kept: the key types' labels (the label is a
    function of the type) permuted among the types; every text of a type gets its type's label. Returns at most
    ``draws`` *distinct* labellings [m, texts], never the real one — with T types of which r are labelled 1 there are
    C(T, r) − 1 others, so 2 types allow 1 and 4 types 5: ``len`` of the answer says how many exist when it is below
    ``draws``, and the floor of the test on them is 1/(m + 1).

    With ``split``, only relabellings that leave both parts ≥ 2 texts of each label are kept — the condition the
    real labels met to be probed at all (``split_texts`` refuses them otherwise) — and an unusable one is never kept:
    the real labelling and the draws are then exchangeable over the same set, and the rank test stays exact. Up to
    ``ENUMERATE_LABELLINGS`` type labellings every one is checked (in a seeded random order); beyond, uniform ones
    are drawn, a repeat or an unusable one drawn again, at most ``MAX_TRIES`` per labelling wanted."""
    rng = np.random.default_rng(seed)
    n_types = int(key.max()) + 1
    type_label = np.zeros(n_types, dtype=np.int64)
    type_label[key] = y
    ones = int(type_label.sum())
    real = tuple(np.flatnonzero(type_label).tolist())
    out: list[np.ndarray] = []

    def usable(chosen: tuple[int, ...]) -> np.ndarray | None:
        labels = np.zeros(n_types, dtype=np.int64)
        labels[list(chosen)] = 1
        text_labels = labels[key]
        return text_labels if split is None or _probeable(text_labels, split) else None

    if math.comb(n_types, ones) <= ENUMERATE_LABELLINGS:
        every = [c for c in itertools.combinations(range(n_types), ones) if c != real]
        for i in rng.permutation(len(every)):
            labels = usable(every[int(i)])
            if labels is not None:
                out.append(labels)
                if len(out) == draws:
                    break
    else:
        seen = {real}
        for _ in range(MAX_TRIES * draws):
            chosen = tuple(sorted(int(t) for t in rng.choice(n_types, ones, replace=False)))
            if chosen in seen:
                continue
            seen.add(chosen)
            labels = usable(chosen)
            if labels is not None:
                out.append(labels)
                if len(out) == draws:
                    break
    return np.stack(out) if out else np.zeros((0, len(y)), dtype=np.int64)


def _probeable(labels: np.ndarray, split: Split) -> bool:
    return all(np.bincount(labels[part], minlength=2).min() >= 2 for part in (split.train, split.test))


def key_summary(key: Key) -> str:
    """'token 1 (40 types: ' dog', ' dogs', …)'."""
    shown = ", ".join(repr(e) for e in key.examples)
    more = ", …" if key.n_types > len(key.examples) else ""
    return f"{key.name} ({key.n_types} types: {shown}{more})"
