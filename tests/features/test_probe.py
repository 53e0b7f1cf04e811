"""Probes and stored directions (features family): the probe's statistics on constructed data (model-free,
seeded simulations of the interval's coverage and power), the residuals it reads against a per-text loop on
`tiny`, direction ablation against a hand projection hook, the random-direction baselines, `steer` along a
stored direction, and `probe` → `direction://` → `ablate` over a real stdio session."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mcp_interp.core.engine.backend.edits import Rewrite
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.numbers.stats import clopper_pearson, rank_test
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.features import probe
from mcp_interp.errors import InputError

COUNTRIES = ["france", "germany", "italy", "spain", "canada", "japan", "china", "india", "egypt", "brazil"]
CITIES = ["paris", "berlin", "rome", "madrid", "ottawa", "tokyo", "beijing", "delhi", "cairo", "lima"]
NAMES = ["mary", "john", "tom", "alice", "bob", "kate"]


def places() -> tuple[list[str], list[str]]:
    texts, labels = [], []
    for name in NAMES:
        for country, city in zip(COUNTRIES, CITIES, strict=True):
            texts += [f"{name} went to {country}", f"{name} went to {city}"]
            labels += ["country", "city"]
    return texts, labels


# --- the probe's fits and controls, model-free (simulations of the verdicts: test_probe_stats.py) ---------


def signal_data(n: int, d: int, strength: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian noise with the label in coordinate 3 only: x_3 += strength · (2y − 1)."""
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1], n // 2)
    x = rng.normal(size=(n, d))
    x[:, 3] += strength * (2 * y - 1)
    return x, y


@pytest.mark.parametrize("method", ["logistic", "diff_means"])
def test_a_probe_finds_the_coordinate_that_carries_the_label(method: str) -> None:
    x, y = signal_data(400, 32, 4.0, seed=0)
    split = probe.split_texts(y, 0.25, seed=0)
    fit = probe.fit_probe(x, y, split, method)  # type: ignore[arg-type]
    assert fit.n_test == 100 and fit.accuracy >= 0.97 and fit.direction_accuracy >= 0.97
    unit = fit.direction / np.linalg.norm(fit.direction)
    assert unit[3] > 0.9  # points toward class 1, along coordinate 3
    shuffled, _ = probe.shuffled_labels(y, split, 20, seed=1)
    control = probe.held_out_correct(x, shuffled, split, method) / fit.n_test  # type: ignore[arg-type]
    assert 0.4 <= control.mean() <= 0.6 and control.max() < fit.accuracy


def test_fits_equal_scikit_learn_called_directly() -> None:
    """Both fits against scikit-learn on residuals standardised by hand with the training part's statistics:
    LogisticRegression (lbfgs, C = 1) and LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto") — whose
    SVD least-squares `shrunk_lda` replaces by a Cholesky solve of its own Ledoit–Wolf covariance."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(4)
    x = rng.normal(size=(240, 40)) * rng.gamma(1.0, 1.0, size=40) + rng.normal(size=40) * 3
    y = (x[:, :3].sum(axis=1) + rng.normal(size=240) > np.median(x[:, :3].sum(axis=1))).astype(np.int64)
    split = probe.split_texts(y, 0.25, seed=2)
    train, test = split.train, split.test
    mean, scale = x[train].mean(axis=0), x[train].std(axis=0)
    z = (x - mean) / scale
    for method, model in (
        ("logistic", LogisticRegression(C=1.0, solver="lbfgs", max_iter=1000)),
        ("diff_means", LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto")),
    ):
        model.fit(z[train], y[train])
        fit = probe.fit_probe(x, y, split, method)  # type: ignore[arg-type]
        assert fit.correct == int((model.predict(z[test]) == y[test]).sum())
        assert fit.train_accuracy == pytest.approx(float((model.predict(z[train]) == y[train]).mean()))
        assert np.allclose(fit.weights, model.coef_[0] / scale, rtol=1e-5, atol=1e-8)
        assert fit.bias == pytest.approx(float(model.intercept_[0] - (model.coef_[0] / scale) @ mean), rel=1e-5)
        # The same count whether fitted alone or among control labellings.
        assert probe.held_out_correct(x, y[None], split, method)[0] == fit.correct  # type: ignore[arg-type]
    means = x[train][y[train] == 1].mean(axis=0) - x[train][y[train] == 0].mean(axis=0)
    assert np.allclose(probe.fit_probe(x, y, split, "diff_means").direction, means)  # stored: μ₁ − μ₀


def test_diff_means_stores_the_mean_difference_and_says_how_well_it_alone_classifies() -> None:
    """A factorial design like subject_number: 20 nuisance values (the token read, norm 30) each with both labels,
    the label a 0.5-unit shift in one coordinate. The split leaves a chance imbalance of nuisance values between
    the training classes, the held-out part the opposite one, so the plain projection on μ₁ − μ₀ classifies near
    or below chance, while LDA (the shared covariance) reads the label (≥ 0.9). `direction_accuracy` is the plain
    projection's accuracy, computed here by hand."""
    rng = np.random.default_rng(0)
    nuisance = np.repeat(np.arange(20), 10)
    y = np.tile([0, 1], 100)
    x = 30.0 * np.eye(40)[nuisance] + rng.normal(scale=0.3, size=(200, 40))
    x[:, 39] = 0.0
    x[:, 39] += 0.5 * (2 * y - 1)
    split = probe.split_texts(y, 0.25, seed=0)
    fit = probe.fit_probe(x, y, split, "diff_means")
    assert fit.accuracy >= 0.9
    projection = x @ fit.direction
    train_y = y[split.train]
    threshold = (projection[split.train][train_y == 1].mean() + projection[split.train][train_y == 0].mean()) / 2
    plain = int(((projection[split.test] > threshold).astype(int) == y[split.test]).sum())
    assert fit.direction_correct == plain
    assert fit.direction_accuracy < fit.accuracy - 0.2


def test_the_exact_interval_is_clopper_pearson() -> None:
    # All wrong / all right: the bounds solve (1 − p)^n = α/2 and p^n = α/2 in closed form.
    assert clopper_pearson(0, 10) == pytest.approx((0.0, 1 - 0.025 ** (1 / 10)))
    assert clopper_pearson(10, 10) == pytest.approx((0.025 ** (1 / 10), 1.0))


@pytest.mark.parametrize("method", ["logistic", "diff_means"])
def test_on_random_labels_the_interval_covers_chance_at_its_level(method: str) -> None:
    """Size: labels independent of x, so every probe's true accuracy is 0.5; the 95 % interval must exclude
    0.5 in at most ~5 % of seeded datasets (300 draws: 5 % + 2.5 standard errors = 8.2 %)."""
    excluded = 0
    draws = 300
    for seed in range(draws):
        x, y = signal_data(80, 10, 0.0, seed)
        split = probe.split_texts(y, 0.5, seed)
        fit = probe.fit_probe(x, y, split, method)  # type: ignore[arg-type]
        low, high = clopper_pearson(fit.correct, fit.n_test)
        excluded += not low <= 0.5 <= high
    assert excluded / draws <= 0.082


def test_with_a_weak_signal_the_interval_excludes_chance_most_of_the_time() -> None:
    """Power: coordinate 3 shifted by ±0.8 σ (Bayes accuracy Φ(0.8) ≈ 0.79) on 40 held-out texts."""
    excluded = 0
    for seed in range(100):
        x, y = signal_data(80, 10, 0.8, seed)
        split = probe.split_texts(y, 0.5, seed)
        fit = probe.fit_probe(x, y, split, "diff_means")
        excluded += clopper_pearson(fit.correct, fit.n_test)[0] > 0.5
    assert excluded >= 70


def test_type_keyed_control_on_pure_type_identity_is_the_real_accuracy_exactly() -> None:
    """Known answer: x is one-hot of the word type and nothing else, 20 types × 20 texts, the label a function of
    the type. The split is stratified by type (5 held-out texts of each), so every relabelling of the types is the
    same problem with its features permuted: each type-keyed draw scores exactly what the real labels score (1.0,
    every held-out type was seen), selectivity is 0 and p = 1. The shuffled-label control scores ≈ 0.5, so the
    real labels beat it (p = 1/21): memorising the type is a real effect, which only the keyed control discounts."""
    key = np.repeat(np.arange(20), 20)
    y = (key < 10).astype(np.int64)
    x = np.eye(20)[key]
    split = probe.split_texts(y, 0.25, seed=0, key=key)
    assert split.kind == "key"
    assert all((key[split.test] == t).sum() == 5 for t in range(20))
    keyed = probe.keyed_labels(key, y, 20, seed=3, split=split)
    shuffled, _ = probe.shuffled_labels(y, split, 20, seed=4)
    counts = probe.held_out_correct(x, np.vstack([y[None], keyed, shuffled]), split, "logistic") / 100
    assert counts[0] == 1.0 and counts[1:21].tolist() == [1.0] * 20
    assert rank_test(counts[0], counts[1:21].tolist(), "greater").p_value == 1.0
    assert 0.35 <= counts[21:].mean() <= 0.65
    assert rank_test(counts[0], counts[21:].tolist(), "greater").p_value == pytest.approx(1 / 21)


def test_keyed_labels_are_fixed_per_type_and_keep_the_label_distribution() -> None:
    key = np.array([0, 0, 1, 1, 1, 2, 3, 3, 4, 4, 5, 5])
    y = np.array([0, 0, 1, 1, 1, 0, 1, 1, 0, 0, 1, 1])  # types 1, 3, 5 carry label 1
    draws = probe.keyed_labels(key, y, 50, seed=7)
    for row in draws:
        assert all(len(set(row[key == t].tolist())) == 1 for t in range(6))  # one label per type
        assert sorted(row[np.unique(key, return_index=True)[1]].tolist()) == [0, 0, 0, 1, 1, 1]  # 3 types each
    # C(6, 3) − 1 = 19 other relabellings of the types exist: each once, never the real one
    assert len(draws) == len({tuple(row) for row in draws}) == 19 and tuple(y) not in {tuple(row) for row in draws}
    assert (draws == probe.keyed_labels(key, y, 50, seed=7)).all()  # seeded
    split = probe.Split(np.array([0, 2, 3, 5, 6, 8, 10, 11]), np.array([1, 4, 7, 9]), "key")
    kept = probe.keyed_labels(key, np.where(np.isin(key, [0, 1]), 1 - y, y), 30, seed=1, split=split)
    assert all(np.bincount(row[part], minlength=2).min() >= 2 for row in kept for part in (split.train, split.test))
    # only the usable ones, counted by hand over every relabelling of the 6 types: none kept past MAX_TRIES
    usable = 0
    for chosen in itertools.combinations(range(6), 3):
        row = np.isin(key, chosen).astype(np.int64)
        usable += all(np.bincount(row[part], minlength=2).min() >= 2 for part in (split.train, split.test))
    real = np.where(np.isin(key, [0, 1]), 1 - y, y)
    real_usable = all(np.bincount(real[part], minlength=2).min() >= 2 for part in (split.train, split.test))
    assert len(kept) == usable - real_usable


def test_a_two_type_key_says_its_control_cannot_reject(tiny: LoadedModel) -> None:
    """Labels a function of the city word, 2 cities: the type-keyed control has one other labelling (the two
    swapped), so its p is at least 1/2 and the probe says it cannot reject at α = 0.05, whatever the accuracy."""
    from mcp_interp.core.engine.jobs import drain
    from mcp_interp.core.features.probe_job import ProbeJob

    texts = [f"{name} went to {city}" for name in NAMES for city in CITIES[:2]] * 2
    labels = ["a" if text.endswith(CITIES[0]) else "b" for text in texts]
    job = ProbeJob(model=tiny, texts=texts, labels=labels, layers=[1], control_draws=19)
    drain(job)
    result = job.result
    assert result is not None and result.control_kind == "type_keyed"
    assert result.labellings == {"type_keyed": 1} and result.p_floor["type_keyed"] == pytest.approx(1 / 2)
    assert result.layers_selective == [] and result.layers[0].selectivity_p >= 0.5
    assert any("cannot reject at α = 0.05" in note for note in result.notes)
    assert any(note.startswith("Selectivity: cannot resolve at α = 0.05") for note in result.notes)


def test_shuffled_labels_keep_what_their_null_fixes() -> None:
    rng = np.random.default_rng(0)
    y = rng.permutation(np.repeat([0, 1], 30))
    split = probe.split_texts(y, 0.3, seed=0)
    draws, how = probe.shuffled_labels(y, split, 20, seed=1)
    assert how == "among texts"
    for row in draws:  # each part keeps its class counts
        for part in (split.train, split.test):
            assert np.bincount(row[part], minlength=2).tolist() == np.bincount(y[part], minlength=2).tolist()
    groups = np.repeat(np.arange(6), 10)
    draws, how = probe.shuffled_labels(y, split, 20, seed=1, groups=groups)
    assert how == "within groups"
    assert all((np.bincount(groups, weights=row) == np.bincount(groups, weights=y)).all() for row in draws)
    key = groups  # the label a function of the group: the groups' labels permuted among the groups
    y_key = (groups % 2).astype(np.int64)
    draws, how = probe.shuffled_labels(y_key, split, 20, seed=1, groups=groups, key=key)
    assert how == "among key types" and all(probe.is_function_of(key.tolist(), row) for row in draws)


def test_find_key_names_the_position_the_label_is_a_function_of() -> None:
    """subject_number's shape: "The <noun(s)> near the <object>", the label the noun's number. The object read at
    the end carries both labels, so the key is token 1, wherever it is read from; variable lengths still find it."""
    nouns = {10: 0, 11: 1, 12: 0, 13: 1}  # token id: its label
    objects = [[20], [21, 22], [23]]
    tokens = [[1, noun, 2, 3, *obj] for noun in nouns for obj in objects]
    y = np.array([nouns[t[1]] for t in tokens])
    names = [[f"t{i}" for i in t] for t in tokens]
    key = probe.find_key(tokens, y, read=-1, names=names)
    assert key is not None and key.name == "token 1" and key.n_types == 4
    assert key.examples == ["t10", "t11", "t12", "t13"]
    assert probe.key_summary(key) == "token 1 (4 types: 't10', 't11', 't12', 't13')"
    assert [len(set(key.values[y == label].tolist())) for label in (0, 1)] == [2, 2]
    # Read at the noun itself (word-level labels): the same key, and ties prefer the position read.
    same_length = [[1, noun, 2, 30] for noun in nouns for _ in range(3)]
    y_same = np.array([nouns[t[1]] for t in same_length])
    assert probe.find_key(same_length, y_same, read=1).name == "token 1"  # type: ignore[union-attr]
    last = [[1, 2, noun] for noun in nouns for _ in range(3)]
    assert probe.find_key(last, y_same, read=-1).name == "token -1"  # type: ignore[union-attr]
    assert probe.find_key(last, y_same, read=2).name == "token 2"  # type: ignore[union-attr]
    # Coarser groups win (fewer types to memorise); no key when every position carries both labels or is unique.
    groups = np.array([0, 0, 0, 1, 1, 1] * 2)
    y_groups = np.array([0, 0, 0, 1, 1, 1] * 2)
    assert probe.find_key(last, y_groups, read=-1, groups=groups).name == "groups"  # type: ignore[union-attr]
    assert probe.find_key([[1, 2]] * 4, np.array([0, 1, 0, 1]), read=-1) is None
    assert probe.find_key([[1, i] for i in range(4)], np.array([0, 1, 0, 1]), read=-1) is None


def unrecurring(n: int, repeated: list[int], column: int) -> tuple[list[list[int]], np.ndarray]:
    """``n`` texts of three tokens: the ``column``-th (0 or 1) is a word of its own (word i, label i % 2) in every text
    but the last few, which repeat the ``repeated`` words with their labels (so the labels are a function of that
    column); the other of the first two tokens is unique, the last is the same full stop in every text."""
    words = [*range(n - len(repeated)), *repeated]
    y = np.array([w % 2 for w in words], dtype=np.int64)
    tokens = [[w, 500 + i, 999] if column == 0 else [500 + i, w, 999] for i, w in enumerate(words)]
    return tokens, y


def test_the_type_keyed_control_needs_types_that_recur() -> None:
    """The audit's datasets, model-free: 60 balanced texts with 58 distinct first words (two words recur, each with
    one label), and 30 with every first word different and one recurring word elsewhere. The labels are a function
    of those columns, but most of their types occur in one text: there is nothing to memorise. Before, both got the
    type-keyed control and a split that ignored the labels (measured with the previous code: chance 0.600 and 0.750
    on balanced sets); now no key is used, the split is stratified by label (chance = the held-out majority: 8 of 15,
    4 of 8) and the reason is given. The rule's second half, by hand: 10 pairs of texts carrying one label each
    happen by chance with probability 2⁻¹⁰ < 0.01 (kept); 6 pairs with 2⁻⁶ = 0.016 (refused)."""
    for n, repeated, column, majority in ((60, [0, 1], 0, 8 / 15), (30, [1], 1, 4 / 8)):
        tokens, y = unrecurring(n, repeated, column)
        assert (np.bincount(y) == n // 2).all()
        candidates = probe.key_candidates(tokens, y, read=-1)
        assert candidates and candidates[0].n_types == n - len(repeated)
        assert candidates[0].problem is not None and "occur in a single text" in candidates[0].problem
        assert probe.find_key(tokens, y, read=-1) is None
        split = probe.split_texts(y, 0.25, seed=0)
        counts = np.bincount(y[split.test])
        assert split.kind == "labels" and counts.max() / counts.sum() == majority
    pairs = np.repeat(np.arange(10), 2)
    labels = pairs % 2
    assert probe.recurrence_problem(pairs, labels) is None
    six = np.repeat(np.arange(6), 2)
    problem = probe.recurrence_problem(six, six % 2)
    assert problem is not None and "0.016" in problem


def test_split_texts_holds_out_whole_groups_or_stratifies_by_the_key() -> None:
    y = np.tile([0, 1], 60)
    groups = np.repeat(np.arange(12), 10)
    split = probe.split_texts(y, 0.25, seed=3, groups=groups)
    assert split.kind == "groups" and not set(groups[split.train]) & set(groups[split.test])
    assert len(split.test) % 10 == 0 and len(split.train) + len(split.test) == 120
    key = np.repeat(np.arange(12), 10) % 6 * 2 + y  # 12 types, each one label
    split = probe.split_texts(y, 0.25, seed=3, key=key)
    assert split.kind == "key" and all(set(np.flatnonzero(key == t)) & set(split.test) for t in range(12))
    assert probe.split_texts(y, 0.25, seed=3).kind == "labels"
    with pytest.raises(InputError, match="single group"):
        probe.split_texts(y, 0.25, seed=0, groups=np.zeros(120, dtype=np.int64))
    one_label_groups = np.repeat([0, 1], 60)  # group 0 all label 0, group 1 all label 1: a part lacks a label
    with pytest.raises(InputError, match="each part needs at least 2 texts of each label"):
        probe.split_texts(np.repeat([0, 1], 60), 0.5, seed=0, groups=one_label_groups)


def test_probe_input_errors_say_how_to_fix_them() -> None:
    with pytest.raises(InputError, match="exactly 2 distinct"):
        probe.encode_labels(["a", "b", "c"])
    with pytest.raises(InputError, match="at least 2 texts of each label"):
        probe.split_texts(np.array([0, 0, 0, 0, 1]), 0.25, 0)
    with pytest.raises(InputError, match="between 0 and 1"):
        probe.split_texts(np.array([0, 1] * 10), 1.5, 0)
    with pytest.raises(InputError, match="one group id per text"):
        probe.encode_groups(["a", "b"], 3)


# --- on tiny -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("position", "words"),
    [
        ("last", ["paris", "paris", "gift"]),
        ("mean", None),  # no single token is read
        (1, ["went", "capital", "gave"]),
        (-2, ["to", "called", "a"]),
    ],
)
def test_residuals_equal_one_text_at_a_time(tiny: LoadedModel, position: Any, words: list[str] | None) -> None:
    from mcp_interp.core.features.residuals import read_residuals

    texts = ["mary went to paris", "the capital of france is called paris", "bob gave a gift"]
    got = read_residuals(tiny, texts, [0, 2], position)
    for i, text in enumerate(texts):
        ids = encode(tiny.tokenizer, [text]).input_ids
        _, cache = tiny.bridge.run_with_cache(ids)
        for column, layer in enumerate([0, 2]):
            resid = cache[f"blocks.{layer}.hook_out"][0]
            expected = resid.mean(0) if position == "mean" else resid[-1 if position == "last" else position]
            assert torch.allclose(got.values[i, column], expected, atol=1e-5)
    assert got.words == words


def test_residuals_refuse_a_position_a_text_lacks(tiny: LoadedModel) -> None:
    from mcp_interp.core.features.residuals import read_residuals

    with pytest.raises(InputError, match="outside text 1"):
        read_residuals(tiny, ["mary went to paris", "bob"], None, 2)
    with pytest.raises(InputError, match=r"layer indices 0\.\.2"):
        read_residuals(tiny, ["mary"], [5], "last")


def run_probe(tiny: LoadedModel, **options: Any) -> Any:
    from mcp_interp.core.engine.jobs import drain
    from mcp_interp.core.features.probe_job import ProbeJob

    texts, labels = places()
    job = ProbeJob(model=tiny, texts=texts, labels=labels, **options)
    drain(job)
    return job


def bridge_residuals(model: LoadedModel, texts: list[str], layers: list[int]) -> np.ndarray:
    """resid_post at the last token of each text from the bridge's own cache (``blocks.L.hook_resid_post``), texts
    batched by token length so that no padding is involved."""
    ids = [model.tokenizer(text).input_ids for text in texts]
    names = [f"blocks.{layer}.hook_resid_post" for layer in layers]
    out = np.zeros((len(texts), len(layers), model.bridge.cfg.d_model))
    for length in sorted({len(i) for i in ids}):
        rows = [i for i, text_ids in enumerate(ids) if len(text_ids) == length]
        with torch.no_grad():
            _, cache = model.bridge.run_with_cache(torch.tensor([ids[i] for i in rows]), names_filter=names)
        for j, name in enumerate(names):
            out[rows, j] = cache[name][:, -1].double().numpy()
    return out


def sklearn_probe(x: np.ndarray, y: np.ndarray, train: np.ndarray, test: np.ndarray) -> tuple[float, float, float]:
    """Held-out and train accuracy of scikit-learn's LogisticRegression on x standardised by the training part, and
    the held-out accuracy of its direction w/σ thresholded at the training classes' midpoint."""
    from sklearn.linear_model import LogisticRegression

    mean, scale = x[train].mean(axis=0), x[train].std(axis=0)
    scale[scale == 0] = 1.0
    model = LogisticRegression(C=1.0, solver="lbfgs", max_iter=1000).fit((x[train] - mean) / scale, y[train])
    accuracy = float((model.predict((x[test] - mean) / scale) == y[test]).mean())
    train_accuracy = float((model.predict((x[train] - mean) / scale) == y[train]).mean())
    projection = x @ (model.coef_[0] / scale)
    threshold = (projection[train][y[train] == 1].mean() + projection[train][y[train] == 0].mean()) / 2
    return accuracy, train_accuracy, float(((projection[test] > threshold) == y[test]).mean())


def hewitt_liang(x: np.ndarray, key: np.ndarray, y: np.ndarray, train: np.ndarray, test: np.ndarray) -> float:
    """An independent type-keyed control: 20 random labellings of the key types (numpy's legacy RandomState, not
    the probe's generator), each fitted by scikit-learn; the mean held-out accuracy."""
    rng = np.random.RandomState(12345)
    types = np.unique(key)
    type_label = np.array([y[key == t][0] for t in types])
    accuracies = []
    for _ in range(20):
        labels = rng.permutation(type_label)[np.searchsorted(types, key)]
        accuracies.append(sklearn_probe(x, labels, train, test)[0])
    return float(np.mean(accuracies))


def test_probe_job_against_scikit_learn_on_bridge_residuals(tiny: LoadedModel) -> None:
    """`places()`: the label (city or country) is a function of the last word, 20 types, read there. Residuals from
    the bridge's cache, the split rebuilt with scikit-learn's own stratified splitter (stratified by that word),
    accuracies from scikit-learn directly. The type-keyed control agrees with an independent one within 0.1 (layer 2); a
    random model's residual identifies the word, so the labels beat the shuffled-label control at every layer."""
    from sklearn.model_selection import train_test_split

    job = run_probe(tiny, position="last")
    result = job.result
    texts, labels = places()
    y = np.array([label == "country" for label in labels], dtype=np.int64)  # labels sorted: city, country
    # Strata: the last token's id, coded in the order of its decimal string (the probe's coding of key types).
    key = np.unique([str(tiny.tokenizer(text).input_ids[-1]) for text in texts], return_inverse=True)[1]
    train, test = (
        np.sort(part) for part in train_test_split(np.arange(len(texts)), test_size=30, stratify=key, random_state=0)
    )
    x = bridge_residuals(tiny, texts, [0, 1, 2])
    assert (result.split, result.n_test, result.control_kind) == ("key", 30, "type_keyed")
    assert result.control_key is not None and result.control_key.startswith("token -1 (20 types: 'france', 'paris'")
    assert result.chance == pytest.approx(max(y[test].mean(), 1 - y[test].mean()))
    for row, direction in zip(result.layers, job.directions, strict=True):
        accuracy, train_accuracy, direction_accuracy = sklearn_probe(x[:, row.layer], y, train, test)
        assert (row.accuracy, row.train_accuracy) == (accuracy, train_accuracy)
        assert row.direction_accuracy == direction_accuracy == direction.accuracy
        assert (row.ci_low, row.ci_high) == pytest.approx(clopper_pearson(round(accuracy * 30), 30))
        if row.layer == 2:
            assert row.control_accuracy == pytest.approx(hewitt_liang(x[:, 2], key, y, train, test), abs=0.1)
        assert row.shuffled_accuracy is not None and row.shuffled_accuracy < accuracy - 0.2
        unit = np.array(direction.vector)
        assert float(np.linalg.norm(unit)) == pytest.approx(1.0, abs=1e-9)
        projections = x[:, row.layer] @ unit
        assert direction.projection_std == pytest.approx(float(projections.std()), rel=1e-5)
        assert direction.projection_means["city"] == pytest.approx(float(projections[y == 0].mean()), rel=1e-5)
        assert direction.labels == ["city", "country"] and direction.model_fingerprint == tiny.fingerprint
    assert result.layers_beating_chance == [0, 1, 2]
    # The best of 3 layers, chosen on the held-out texts, gets the exact interval at level 1 − 0.05/3.
    best = next(row for row in result.layers if row.layer == result.best_layer)
    assert result.best_ci_adjusted == pytest.approx(clopper_pearson(round(best.accuracy * 30), 30, 1 - 0.05 / 3))


def test_probe_job_with_groups_holds_out_whole_groups(tiny: LoadedModel) -> None:
    """Groups = the name (6 names × 20 texts): whole names are held out (the split rebuilt with scikit-learn's
    GroupShuffleSplit). The label is still a function of the last word, whose 20 types recur under every name, so
    memorising the word pays on unseen names. With groups held out the only exact shuffle is among the key types —
    the type-keyed control — so it runs once: its mean agrees with an independent Hewitt & Liang control (numpy's
    legacy generator, scikit-learn fits), and no shuffled-label numbers stand beside it as if they were a second
    control (they used to be the same draws, reported twice)."""
    from sklearn.model_selection import GroupShuffleSplit

    texts, labels = places()
    names = [text.split()[0] for text in texts]
    job = run_probe(tiny, layers=[1], groups=names, control_draws=19)
    result = job.result
    first_seen = {name: i for i, name in enumerate(dict.fromkeys(names))}  # group ids in order of first appearance
    groups = np.array([first_seen[name] for name in names])
    train, test = (
        np.sort(part)
        for part in next(GroupShuffleSplit(1, test_size=0.25, random_state=0).split(np.arange(120), groups=groups))
    )
    assert (result.split, result.n_test, result.control_kind) == ("groups", len(test), "type_keyed")
    y = np.array([label == "country" for label in labels], dtype=np.int64)
    key = np.unique([str(tiny.tokenizer(text).input_ids[-1]) for text in texts], return_inverse=True)[1]
    x = bridge_residuals(tiny, texts, [1])[:, 0]
    row = result.layers[0]
    assert row.accuracy == sklearn_probe(x, y, train, test)[0]
    assert row.control_accuracy == pytest.approx(hewitt_liang(x, key, y, train, test), abs=0.1)
    assert row.control_accuracy > 0.6  # memorised words: a shuffle within names would score ≈ 0.5
    assert (row.shuffled_accuracy, row.shuffled_p) == (None, None)
    assert list(result.draws_made) == ["type_keyed"] and 10 <= result.draws_made["type_keyed"] <= 19
    assert any("the only exact shuffle" in note for note in result.notes)
    with pytest.raises(InputError, match="needs the controls"):
        run_probe(tiny, layers=[1], groups=names, control=False)
    with pytest.raises(InputError, match="19 to 1000"):
        run_probe(tiny, layers=[1], control_draws=5)


def test_direction_ablation_equals_a_hand_projection_hook(tiny: LoadedModel) -> None:
    from mcp_interp.core.localize.ablate import ablate
    from mcp_interp.schemas.common import Intervention

    prompts = ["when mary and john went to the store , john gave a drink to"] * 2
    vector = torch.randn(64, generator=torch.Generator().manual_seed(5))
    unit = vector / vector.norm()
    spec = Intervention(ablate=[{"layer": 1, "direction": vector.tolist()}])  # type: ignore[list-item]
    result = ablate(tiny, prompts, spec, "mary", "john")

    def project_out(resid: torch.Tensor, hook: Any) -> torch.Tensor:
        return resid - (resid @ unit).unsqueeze(-1) * unit

    ids = encode(tiny.tokenizer, prompts).input_ids
    good, bad = (tiny.tokenizer.convert_tokens_to_ids(w) for w in ("mary", "john"))
    with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=[("blocks.1.hook_resid_post", project_out)]):
        logits = tiny.bridge(ids)[:, -1].double()
    assert result.after.logit_diff is not None
    assert result.after.logit_diff.value == pytest.approx(float((logits[:, good] - logits[:, bad]).mean()), abs=1e-5)

    # Its random baseline is rebuilt by hand in tests/engine/test_baselines.py.


def test_directions_sharing_a_layer_are_kept_apart_and_orthonormalised(tiny: LoadedModel) -> None:
    from mcp_interp.core.engine.references import resolve_intervention
    from mcp_interp.schemas.common import Intervention

    first, second = [1.0] + [0.0] * 63, [1.0, 1.0] + [0.0] * 62
    spec = Intervention(ablate=[{"layer": 2, "direction": first}, {"layer": 2, "direction": second}])  # type: ignore[list-item]
    ablation = resolve_intervention(spec, tiny)
    assert ablation is not None and len(ablation.targets) == 2
    vectors = [t.direction for t in ablation.targets]
    assert vectors[0] is not None and vectors[1] is not None
    assert vectors[0].tolist() == first and vectors[1].tolist() == [0.0, 1.0] + [0.0] * 62
    duplicate = Intervention(ablate=[{"layer": 2, "direction": first}, {"layer": 2, "direction": [2.0] + [0.0] * 63}])  # type: ignore[list-item]
    deduplicated = resolve_intervention(duplicate, tiny)
    assert deduplicated is not None and len(deduplicated.targets) == 1  # the same unit vector twice
    third = [0.0, 3.0] + [0.0] * 62
    same = Intervention(ablate=[{"layer": 2, "direction": v} for v in (first, second, third)])  # type: ignore[misc]
    with pytest.raises(InputError, match="linearly dependent"):
        resolve_intervention(same, tiny)


def test_steer_with_a_stored_direction(tiny: LoadedModel) -> None:
    from mcp_interp.core.lens.steer import greedy, steer

    job = run_probe(tiny, layers=[1])
    direction = job.directions[0]
    prompt = "when mary and john went to the store , john gave a drink to"
    result = steer(tiny, prompt, None, None, None, 2.0, 5, 0, direction, "direction://x")
    unit = torch.tensor(direction.vector)
    added = 2.0 * direction.projection_std * unit

    def add(resid: torch.Tensor, hook: Any) -> torch.Tensor:
        return resid + added

    ids = encode(tiny.tokenizer, [prompt]).ids(0)
    expected = greedy(tiny, ids, 5, [Rewrite("blocks.1.hook_out", lambda v: add(v, None))])
    assert result.site == "resid_post" and result.layer == 1
    assert result.steered_text == tiny.tokenizer.decode(expected)
    with torch.no_grad():
        base = torch.log_softmax(tiny.bridge(torch.tensor([ids]))[0, -1].double(), -1)
        with tiny.bridge.hooks(fwd_hooks=[("blocks.1.hook_out", add)]):
            moved = torch.log_softmax(tiny.bridge(torch.tensor([ids]))[0, -1].double(), -1)
    assert result.next_token_kl == pytest.approx(float((base.exp() * (base - moved)).sum()), abs=1e-6)
    # Its random baseline is rebuilt by hand in tests/engine/test_baselines.py.
    with pytest.raises(InputError, match="not several"):
        steer(tiny, prompt, "good", "bad", None, 1.0, 5, 0, direction)
    with pytest.raises(InputError, match="a stored `direction`"):
        steer(tiny, prompt, None, None, 1, 1.0, 5, 0)


def test_stored_directions_are_checked_against_the_loaded_weights(tiny: LoadedModel) -> None:
    from mcp_interp.core.engine.references import load_direction
    from mcp_interp.errors import NotFound

    job = run_probe(tiny, layers=[2])
    data = job.directions[0].model_dump_json().encode()
    loaded = load_direction("direction://" + "a" * 32, lambda _id: data, tiny)
    assert loaded.vector == job.directions[0].vector and loaded.layer == 2

    foreign = job.directions[0].model_copy(update={"model_fingerprint": "f" * 64, "model_name": "other"})
    with pytest.raises(InputError, match="fitted on model 'other'"):
        load_direction("direction://" + "a" * 32, lambda _id: foreign.model_dump_json().encode(), tiny)

    def missing(_id: str) -> bytes:
        raise NotFound("No direction with id 'b…'.")

    with pytest.raises(InputError, match="Run `probe` again"):
        load_direction("direction://" + "b" * 32, missing, tiny)
    with pytest.raises(InputError, match="not a direction URI"):
        load_direction("figure://" + "a" * 32, missing, tiny)

    from mcp_interp.core.engine.references import resolve_intervention
    from mcp_interp.schemas.common import Intervention

    elsewhere = Intervention(ablate=[{"layer": 1, "direction": "direction://" + "a" * 32}])  # type: ignore[list-item]
    with pytest.raises(InputError, match="fitted on layer 2's resid_post, but the target names layer 1"):
        resolve_intervention(elsewhere, tiny, lambda _id: data)


# --- end to end over stdio -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_stdio_probe_then_ablate_its_direction(tmp_path: Path, tiny: LoadedModel) -> None:
    from mcp import Client

    from tests.helpers import assert_valid_structured, error_text, stdio_params, tools_by_name

    texts, labels = places()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MCP_INTERP_OUTPUT": str(tmp_path / "out")}
    prompts = ["when mary and john went to the store , john gave a drink to"] * 2
    async with Client(stdio_params("tiny", env), read_timeout_seconds=120) as client:
        tools = await tools_by_name(client)
        result = assert_valid_structured(
            tools["probe"],
            await client.call_tool("probe", {"texts": texts, "labels": labels, "layers": [1, 2], "control_draws": 19}),
        )
        uri = result["layers"][0]["direction_uri"]
        resource = await client.read_resource(uri)
        stored = json.loads(resource.contents[0].text)  # type: ignore[union-attr]
        ablated = assert_valid_structured(
            tools["ablate"],
            await client.call_tool(
                "ablate",
                {
                    "prompts": prompts,
                    "targets": [{"layer": 1, "direction": uri}],
                    "correct": "mary",
                    "incorrect": "john",
                },
            ),
        )
        by_vector = assert_valid_structured(
            tools["ablate"],
            await client.call_tool(
                "ablate",
                {
                    "prompts": prompts,
                    "targets": [{"layer": 1, "direction": stored["vector"]}],
                    "correct": "mary",
                    "incorrect": "john",
                },
            ),
        )
        unknown = await client.call_tool(
            "ablate", {"prompts": prompts, "targets": [{"layer": 1, "direction": "direction://" + "0" * 32}]}
        )
        figure = await client.read_resource(result["figure_uri"])
    assert resource.contents[0].mime_type == "application/json"
    assert stored["layer"] == 1 and len(stored["vector"]) == 64
    assert float(np.linalg.norm(stored["vector"])) == pytest.approx(1.0, abs=1e-6)
    assert ablated["after"] == by_vector["after"]
    # the stored direction and its vector get the same seeded baseline, drawn until 10 are as extreme (or 200)
    baseline, again = ablated["random_baseline"], by_vector["random_baseline"]
    assert baseline["draws"] == pytest.approx(again["draws"]) and baseline["p_value"] == again["p_value"]
    assert 10 <= len(baseline["draws"]) <= 200
    assert "Run `probe` again" in error_text(unknown)
    assert figure.contents[0].mime_type == "image/png"


def test_the_summary_words_selectivity_from_the_family_wise_verdict_only() -> None:
    """The text block calls the best layer "selective" only when it is in layers_selective (family-wise over the
    layers probed): a layer whose own p is small but which the family-wise test does not keep reads "not shown
    selective" (over 8 null layers the best layer's own 20-draw p ≤ 0.05 in 0.147 of datasets)."""
    from mcp_interp.mcp.features import probe_summary
    from mcp_interp.schemas.features import ProbeLayer, ProbeResult

    def layer(number: int, p: float) -> ProbeLayer:
        return ProbeLayer.model_construct(
            layer=number, accuracy=0.7, selectivity=0.1, selectivity_ci=[0.0, 0.2], selectivity_p=p, direction_uri=None
        )

    def result(selective: list[int]) -> ProbeResult:
        return ProbeResult.model_construct(
            layers=[layer(0, 0.04), layer(1, 0.5)],
            best_layer=0,
            best_ci_adjusted=[0.5, 0.9],
            n_test=40,
            chance=0.5,
            control_kind="type_keyed",
            control_key="token 1",
            layers_beating_chance=[0],
            layers_selective=selective,
            figure_uri=None,
            labels=["other", "place"],
            points_to="place",
        )

    assert "(not shown selective)" in probe_summary(result([]))
    assert "Directions point toward 'place' (from 'other')" in probe_summary(result([]))
    assert "(selective)" in probe_summary(result([0])) and "selective 1 of 2" in probe_summary(result([0]))


def test_a_cut_30_layer_probe_keeps_its_best_and_significant_layers() -> None:
    """A SmolLM2-sized probe (30 layers, every field filled) is over the 16 KB budget; before issue 32 the cut kept
    layers 0–14 and lost the causal layers 26–29. Known answer: 27 is the most accurate, 29 the most selective,
    26–29 and 5 are selective, 20–29 and 5, 12 beat chance; the rest of the rows that fit are the most accurate of
    0–25, computed here from the accuracies."""
    from mcp_interp.mcp.results import BUDGET, compact, cut_note, size
    from mcp_interp.schemas.common import ModelRef
    from mcp_interp.schemas.features import ProbeLayer, ProbeResult

    rng = np.random.default_rng(3)
    accuracy = {layer: float(rng.uniform(0.55, 0.8)) for layer in range(26)}
    accuracy |= {26: 0.91, 27: 0.97, 28: 0.95, 29: 0.93}
    selectivity = {layer: accuracy[layer] - 0.5 - (0.2 if layer < 26 else 0.0) for layer in range(30)}
    selectivity[29] = 0.6  # the most selective, not the most accurate
    selective = [5, 26, 27, 28, 29]
    beating = [5, 12, *range(20, 30)]
    rows = [
        ProbeLayer(
            layer=layer,
            accuracy=accuracy[layer],
            ci_low=accuracy[layer] - 0.11234567,
            ci_high=accuracy[layer] + 0.07654321,
            train_accuracy=1.0,
            shuffled_accuracy=0.5123456789,
            shuffled_p=0.0049751243781,
            control_accuracy=accuracy[layer] - selectivity[layer],
            selectivity=selectivity[layer],
            selectivity_ci=[selectivity[layer] - 0.1, selectivity[layer] + 0.1],
            selectivity_p=0.0049751243781,
            direction_uri=f"direction://{layer:032x}",
            direction_norm=12.345678901,
            direction_accuracy=accuracy[layer] - 0.0123456,
            projection_gap=1.23456789,
        )
        for layer in range(30)
    ]
    result = ProbeResult(
        model=ModelRef(
            name="smollm2-135m",
            source="embedded",
            fingerprint="0" * 16,
            dtype="float32",
            device="cpu",
            versions={"torch": "2"},
        ),
        run_id="0" * 32,
        elapsed_s=1.0,
        method="logistic",
        position="last",
        labels=["0", "1"],
        points_to="1",
        n_texts=400,
        n_train=300,
        n_test=100,
        split="labels",
        chance=0.5,
        seed=0,
        control_kind="type_keyed",
        control_key="token 1 (40 types)",
        control_draws=200,
        layers=rows,
        best_layer=27,
        best_ci_adjusted=[0.9, 0.99],
        layers_beating_chance=beating,
        layers_selective=selective,
        notes=["a note as long as the controls' notes of a real probe " * 8] * 14,  # 6.2 KB
    )
    full = result.model_dump(mode="json")
    assert size(full) > BUDGET  # the whole list does not fit
    assert size({**full, "layers": full["layers"][:15]}) <= BUDGET  # the old cut (first 15) would have fitted

    data, cut = compact(result)
    kept = [row["layer"] for row in data["layers"]]
    # Independently: the must-keep layers, then the others by accuracy; the result keeps the longest prefix of that
    # order that fits with the note and result_uri the server adds.
    must = sorted({27, 29, *selective, *beating})
    order = [*must, *sorted((layer for layer in range(30) if layer not in must), key=lambda layer: -accuracy[layer])]
    n = len(kept)
    assert len(must) < n < 30 and kept == sorted(order[:n])  # in layer order
    assert {26, 27, 28, 29} <= set(kept) and kept != list(range(n))

    def condensed(row: dict[str, Any]) -> dict[str, Any]:  # every number to 4 significant digits
        def four(v: Any) -> Any:
            return [four(x) for x in v] if isinstance(v, list) else float(f"{v:.4g}") if isinstance(v, float) else v

        return {key: four(value) for key, value in row.items()}

    assert data["layers"] == [condensed(full["layers"][layer]) for layer in kept]  # rows condensed, then chosen
    assert data["best_layer"] == 27 and data["layers_selective"] == selective
    assert len(cut) == 2 and f"{n} of 30 rows ({', '.join(map(str, kept))})" in cut[1]
    uri = "result://" + "f" * 32
    returned = {**data, "result_uri": uri, "notes": [*data["notes"], cut_note(cut, uri)]}
    assert size(returned) <= BUDGET  # as returned, note and URI included
    one_more = {**returned, "layers": [condensed(full["layers"][i]) for i in sorted(order[: n + 1])]}
    assert size(one_more) + len(", 99") > BUDGET  # the next layer would not fit, its name in the note included
    assert "the best layer by held-out accuracy, the best by selectivity" in cut[1]


def test_the_probe_layer_order_puts_each_kind_of_important_layer_first() -> None:
    """Known answer, every tier distinct: best accuracy 28; best selectivity 3 (low accuracy, in no verdict list);
    selective 27, 26; beating chance 25, 10; then the rest by accuracy (ties by layer)."""
    from mcp_interp.schemas.features import layers_by_importance

    accuracy = [0.60, 0.61, 0.62, 0.55, 0.63, 0.64, 0.65, 0.66, 0.67, 0.68, 0.58, 0.69, 0.70, 0.71, 0.72]
    accuracy += [0.73, 0.74, 0.75, 0.76, 0.77, 0.78, 0.79, 0.80, 0.81, 0.82, 0.83, 0.90, 0.88, 0.95, 0.84]
    rows = [{"layer": i, "accuracy": a, "selectivity": 0.1} for i, a in enumerate(accuracy)]
    rows[3]["selectivity"] = 0.3
    rows[0]["selectivity"] = None
    order = layers_by_importance(rows, best_layer=28, beating=[10, 25, 26, 27], selective=[26, 27])
    rest = sorted(set(range(30)) - {28, 3, 26, 27, 25, 10}, key=lambda i: -accuracy[i])
    assert order == [28, 3, 26, 27, 25, 10, *rest]
    assert rest[:3] == [29, 24, 23] and rest[-1] == 0


def test_a_probe_names_the_label_its_directions_point_to(tiny: LoadedModel) -> None:
    """points_to is labels[1], in the result and in every stored direction, and it is the sign: the texts of that label
    project higher on the stored vector than the others, computed here from the bridge's own residuals."""
    job = run_probe(tiny, layers=[2])
    texts, labels = places()
    result, direction = job.result, job.directions[0]
    assert result.points_to == result.labels[1] == direction.points_to
    residuals = bridge_residuals(tiny, texts, [2])[:, 0]
    projection = residuals @ np.array(direction.vector)
    toward = projection[[str(label) == direction.points_to for label in labels]].mean()
    away = projection[[str(label) != direction.points_to for label in labels]].mean()
    assert toward > away
