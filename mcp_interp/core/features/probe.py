"""Linear probes with honest controls: the fit, the held-out accuracy and its exact interval.

Model-free on purpose (arrays in, numbers out), so its statistics are checked by simulation
without a model. A probe is binary: ``y`` ∈ {0, 1}, the direction points toward class 1.

* ``logistic`` — scikit-learn's ``LogisticRegression`` (solver ``lbfgs``, L2 penalty, ``C = 1``,
  ``max_iter = 1000``) on standardised features (each residual dimension centred and scaled by its
  training-set standard deviation, so a few large-magnitude dimensions do not dominate the penalty).
  The decision function is linear in the raw residual x: w·(x − μ)/σ + b = (w/σ)·x + b′, so the
  stored direction is w/σ — a direction in the residual stream itself, usable by interventions.
* ``diff_means`` — the "mass-mean" probe of Marks & Tegmark (2023): the direction is the difference
  of the class means, μ₁ − μ₀ (no optimiser; often the more causally faithful direction, and what
  interventions use), and texts are classified with the same means under the classes' shared
  covariance, Σ⁻¹(μ₁ − μ₀) — scikit-learn's ``LinearDiscriminantAnalysis`` (solver ``lsqr``,
  Ledoit–Wolf ``shrinkage="auto"``, since d_model can exceed the training texts) on standardised
  features. The plain
  projection on μ₁ − μ₀ is not used to classify: when a nuisance variable dominates the residual
  (the token read, say) and is balanced against the label, the training split's means differ by a
  chance imbalance of that nuisance, and the held-out split carries the opposite imbalance, so the
  projection classifies below chance (measured: 0.37–0.56 on SmolLM2's subject_number, where the
  covariance-corrected rule reaches the logistic probe's 0.97–1.00).

Accuracy is measured on a held-out stratified split (``train_test_split(stratify=y)``, seeded);
its 95 % interval is the exact Clopper–Pearson interval of k correct out of n held-out texts
(``engine.stats.clopper_pearson``, from beta quantiles), which covers the true accuracy in
at least 95 % of splits (a seeded simulation in the tests checks this).

Controls (selectivity = accuracy − control accuracy):

* ``word_identity`` (Hewitt & Liang 2019) — when the label is a function of the token read (each
  word type always carries the same label), each word type gets a random fixed label with the
  labels' frequencies. A probe that reaches the same accuracy on this task only memorises which
  word it sees, so a real probe's selectivity over it is what the representation adds;
* ``permuted`` — the labels shuffled across texts (seeded): any accuracy above chance on it is
  the probe fitting noise. Used as the control when the labels are not word-level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from mcp_interp.core.engine.stats import CONFIDENCE, clopper_pearson
from mcp_interp.errors import InputError

ProbeMethod = Literal["logistic", "diff_means"]


@dataclass(frozen=True)
class Split:
    train: np.ndarray  # indices
    test: np.ndarray


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

    @property
    def accuracy(self) -> float:
        return self.correct / self.n_test


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


def stratified_split(y: np.ndarray, test_fraction: float, seed: int) -> Split:
    """A seeded stratified split; every class needs ≥ 2 texts so both halves can hold it."""
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise InputError(f"`test_fraction` must be between 0 and 1 (exclusive), got {test_fraction}.")
    counts = np.bincount(y, minlength=2)
    n_test = int(np.ceil(test_fraction * len(y)))
    if counts.min() < 2 or n_test < 2 or len(y) - n_test < 2:
        raise InputError(
            f"Too few texts to split: class counts {counts.tolist()}, {n_test} held out of {len(y)}. A probe "
            "needs at least 2 texts of each label in both the training and the held-out part; give more texts "
            "(a few dozen per label for a usable interval) or change `test_fraction`."
        )
    indices = np.arange(len(y))
    train, test = train_test_split(indices, test_size=n_test, stratify=y, random_state=seed)
    return Split(np.sort(train), np.sort(test))


def fit_probe(x: np.ndarray, y: np.ndarray, split: Split, method: ProbeMethod) -> ProbeFit:
    """Fit on ``split.train``, count correct on ``split.test``. ``x`` [texts, d_model]."""
    x_train, y_train = x[split.train].astype(np.float64), y[split.train]
    if len(np.unique(y_train)) < 2:
        # A control task can leave one class out of the training part: predict the only class seen.
        direction = weights = np.zeros(x.shape[1])
        bias = 1.0 if y_train[0] == 1 else -1.0
    elif method == "logistic":
        weights, bias = _logistic(x_train, y_train)
        direction = weights
    elif method == "diff_means":
        direction = x_train[y_train == 1].mean(axis=0) - x_train[y_train == 0].mean(axis=0)
        weights, bias = _shared_covariance(x_train, y_train)
    else:
        raise InputError(f"Unknown probe method {method!r}; use 'logistic' or 'diff_means'.")
    predict = lambda rows: (x[rows].astype(np.float64) @ weights + bias > 0).astype(np.int64)  # noqa: E731
    train_accuracy = float((predict(split.train) == y_train).mean())
    correct = int((predict(split.test) == y[split.test]).sum())
    return ProbeFit(direction, weights, float(bias), train_accuracy, correct, len(split.test))


def _logistic(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    from sklearn.linear_model import LogisticRegression

    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    model = LogisticRegression(C=1.0, solver="lbfgs", max_iter=1000)
    model.fit((x - mean) / scale, y)
    weights = model.coef_[0] / scale
    return weights, float(model.intercept_[0] - weights @ mean)


def _shared_covariance(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Σ⁻¹(μ₁ − μ₀) and its threshold: linear discriminant analysis with Ledoit–Wolf shrinkage, on standardised
    features (as the logistic probe), so the shrinkage target is each dimension's own scale rather than one
    variance for all — a few huge dimensions would otherwise drown the rest — and mapped back to raw units."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale == 0] = 1.0
    model = LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto")
    model.fit((x - mean) / scale, y)
    weights = model.coef_[0].astype(np.float64) / scale
    return weights, float(model.intercept_[0] - weights @ mean)


def beyond_chance(corrects: Sequence[int], n_test: int, chance: float) -> tuple[list[int], float]:
    """Which of L probes (layers) beat ``chance``, family-wise: those whose exact interval at the Bonferroni
    level 1 − 0.05/L lies above it, and that level. The best layer is chosen by the same held-out texts, so its
    own 95 % interval would overstate it; across L layers at least one unadjusted interval clears chance far more
    often than 5 % under the null (a seeded simulation in the tests checks the adjusted rate)."""
    level = 1 - (1 - CONFIDENCE) / len(corrects)
    return [i for i, correct in enumerate(corrects) if clopper_pearson(correct, n_test, level)[0] > chance], level


def is_word_level(words: Sequence[str] | None, y: np.ndarray) -> bool:
    """True when every word type read carries one label only (the label is a function of the token), and
    some type occurs more than once (otherwise no memorisation is possible to control for)."""
    if words is None:
        return False
    seen: dict[str, int] = {}
    for word, label in zip(words, y.tolist(), strict=True):
        if seen.setdefault(word, label) != label:
            return False
    return len(seen) < len(words)


def word_identity_control(words: Sequence[str], y: np.ndarray, seed: int) -> np.ndarray:
    """Hewitt & Liang's control task: each word type gets a random label, drawn with the labels'
    frequencies (seeded), fixed for every occurrence of that type."""
    rng = np.random.default_rng(seed)
    p_one = float(y.mean())
    types = sorted(set(words))
    label_of = {word: int(rng.random() < p_one) for word in types}
    return np.array([label_of[word] for word in words], dtype=np.int64)


def permuted_control(y: np.ndarray, seed: int) -> np.ndarray:
    """The labels in a seeded random order (same class counts, no relation to the texts)."""
    return np.random.default_rng(seed).permutation(y)
