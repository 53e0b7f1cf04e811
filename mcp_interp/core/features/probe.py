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
data, ``draws`` times. The real labels' accuracy is ranked among the draws' (``engine.stats.rank_test``,
p = (1 + #{draws ≥ real}) / (draws + 1)), which is exact whenever the real labelling is exchangeable with the
draws under the null — whatever the residuals look like, because the randomness is in the labels:

* shuffled-label control — labels permuted among texts (within the training and the held-out part, so each part
  keeps its class counts). Null: the labels carry nothing the residuals see. Any dataset beats it when the residual
  identifies something the label is a function of (the subject word, say) and that thing recurs across the split.
  With ``groups`` held out, labels are shuffled within each group, or, when the label is a function of a key, the
  key types' labels among the types (see ``shuffled_labels``: only those units are exchangeable).
* type-keyed control (Hewitt & Liang 2019) — when the label is a function of a *key*: the token at one position
  (any position of the text, not only the one read; counted from the start or from the end) or the group. Each key
  type gets a random label: the types' labels permuted among the types, so the label distribution over types is
  kept. Null: the probe only recognises the key type and learns its label — memorisation. A probe that reads the
  property beats it; one that reads which word is there does as well on a random labelling of the words.

Selectivity = accuracy − mean control accuracy (the type-keyed control when there is a key, else the shuffled-label
one), with the t interval of that mean over the draws; "selective" comes only from the p-value. Over layers,
``family_wise_p`` (max over layers of each draw) keeps "some layer is selective" at α under the null.

The split is held fixed across the real labels and every draw. When the controls are exact only if the split does
not depend on the labels (a key or groups), it does not: whole groups held out (``GroupShuffleSplit``), or a split
stratified by the key type (which stratifies the labels too, the label being a function of the type). Otherwise it
is stratified by the labels, and the draws permute within the two parts.
"""

from __future__ import annotations

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

    @property
    def accuracy(self) -> float:
        return self.correct / self.n_test

    @property
    def direction_accuracy(self) -> float:
        return self.direction_correct / self.n_test


@dataclass(frozen=True)
class Key:
    """What the labels are a function of: ``name`` ("token 1", "token -2", "groups"), one integer type id per text,
    and the type names (for the notes)."""

    name: str
    values: np.ndarray  # [texts] int, type id
    n_types: int
    examples: list[str]


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


def find_key(
    tokens: Sequence[Sequence[int]],
    y: np.ndarray,
    read: int | None,
    groups: np.ndarray | None = None,
    names: Sequence[Sequence[str]] | None = None,
) -> Key | None:
    """The coarsest key the labels are a function of, among the token at each position every text has (from the
    start, 0…, and from the end, −1…) and the groups. Coarsest = fewest types: a key with fewer types is easier to
    memorise, so its control is the most demanding. Ties: the position read (``read``, from the start if ≥ 0, from
    the end if < 0), then the groups, then the earliest position."""
    shortest = min(len(t) for t in tokens)
    candidates: list[tuple[int, int, str, list[Hashable], list[str]]] = []
    for offset in [*range(shortest), *range(-1, -shortest - 1, -1)]:
        column = [t[offset] for t in tokens]
        if is_function_of(column, y):
            shown = [names[i][offset] for i in range(len(tokens))] if names is not None else [str(v) for v in column]
            rank = 0 if offset == read else 2
            candidates.append((len(set(column)), rank, f"token {offset}", list(column), shown))
    if groups is not None and is_function_of(groups.tolist(), y):
        candidates.append((len(set(groups.tolist())), 1, "groups", groups.tolist(), [str(g) for g in groups]))
    if not candidates:
        return None
    n_types, _, name, column, shown = min(candidates, key=lambda c: (c[0], c[1]))
    _, values = np.unique(np.array([str(v) for v in column], dtype=object), return_inverse=True)
    examples = list(dict.fromkeys(shown))[:4]
    return Key(name, values.astype(np.int64), n_types, examples)


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
    correct = int((predicted[split.test] == y[split.test]).sum())
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
        correct=correct,
        n_test=len(split.test),
        direction_correct=direction_correct(x64, y, split, direction),
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


def held_out_correct(x: np.ndarray, labellings: np.ndarray, split: Split, method: ProbeMethod) -> np.ndarray:
    """For each row of ``labellings`` [k, texts], the held-out texts the probe fitted on that labelling classifies
    right — the same standardisation, fit and split as ``fit_probe`` (so a real labelling gets the same count)."""
    z, _, _ = _standardise(x, split.train)
    counts = np.empty(len(labellings), dtype=np.int64)
    with _one_blas_thread():
        for i, labels in enumerate(labellings):
            weights, bias = _classifier(z[split.train], labels[split.train], method)
            counts[i] = int(((z[split.test] @ weights + bias > 0).astype(np.int64) == labels[split.test]).sum())
    return counts


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


MAX_TRIES = 100  # per draw, when a relabelling must leave each part of the split ≥ 2 texts of each label


def keyed_labels(key: np.ndarray, y: np.ndarray, draws: int, seed: int, split: Split | None = None) -> np.ndarray:
    """Hewitt & Liang's control task with the label distribution kept: the key types' labels (the label is a
    function of the type) permuted among the types, ``draws`` times; every text of a type gets its type's label.

    With ``split``, only relabellings that leave both parts ≥ 2 texts of each label are kept — the condition the
    real labels met to be probed at all (``split_texts`` refuses them otherwise), so the real labelling and the
    draws are uniform over the same set and the rank test stays exact."""
    rng = np.random.default_rng(seed)
    n_types = int(key.max()) + 1
    type_label = np.zeros(n_types, dtype=np.int64)
    type_label[key] = y
    out = []
    for _ in range(draws):
        for _ in range(MAX_TRIES):
            labels = type_label[rng.permutation(n_types)][key]
            if split is None or _probeable(labels, split):
                break
        out.append(labels)
    return np.stack(out)


def _probeable(labels: np.ndarray, split: Split) -> bool:
    return all(np.bincount(labels[part], minlength=2).min() >= 2 for part in (split.train, split.test))


def family_wise_p(real: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """Per layer, the max-statistic permutation p-value (Westfall & Young, single step): the real accuracy at layer
    l, centred on the mean of layer l's real and drawn accuracies, against the *largest* centred accuracy over all
    layers of each draw: p_l = (1 + #{draws whose maximum ≥ real_l}) / (draws + 1). The draws relabel every layer
    at once, so under the null the real and drawn rows are exchangeable and P(any p_l ≤ α) ≤ α over all layers —
    no Bonferroni factor, which 20 draws could never pay. ``real`` [L], ``draws`` [B, L]; p in [1/(B + 1), 1]."""
    values = np.vstack([np.asarray(real, dtype=np.float64)[None, :], np.asarray(draws, dtype=np.float64)])
    centred = values - values.mean(axis=0)
    maxima = centred[1:].max(axis=1)
    tolerance = 1e-9
    return (1 + (maxima[None, :] >= centred[0][:, None] - tolerance).sum(axis=1)) / (len(maxima) + 1)


def key_summary(key: Key) -> str:
    """'token 1 (40 types: ' dog', ' dogs', …)'."""
    shown = ", ".join(repr(e) for e in key.examples)
    more = ", …" if key.n_types > len(key.examples) else ""
    return f"{key.name} ({key.n_types} types: {shown}{more})"
