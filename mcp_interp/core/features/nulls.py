"""Null simulations of the features family's verdicts, model-free, driving the code the tools run.

**Probes** (``probe_chance``, ``probe_selective``): the probe's own split (``split_texts``), controls
(``shuffled_labels``, ``keyed_labels``), fits (``held_out_correct``, diff-of-means LDA) and its sequential family-wise
test over layers (``stats.SequentialMaxTest``). Four layers read the same texts (a shared component plus layer noise
of different sizes, so their accuracies correlate). ``probe_chance``: 60 independent texts, labels independent of the
residual under H0; alternative ±1 σ on one coordinate. ``probe_selective``: 20 word types × 10 texts, each text
carrying its type's random embedding (what lets a probe memorise the type); H0: the label is a random function of the
type (balanced) — a probe scores far above chance by memorising, and only the type-keyed control can tell; the
alternative: the label is a property moving one coordinate ±1.5 for every type.

**Naming** (``naming_generation``, ``naming_detection``): activations per token iid N(0, 1) (a unit unrelated to the
explanation), a text's score its maximum over positions — so longer texts score higher, the confound. Generation:
the assistant's 10 "activating" texts are 6–14 tokens and its 10 "non-activating" ones 4–10 (the length-only
alternative of the issue), compared within token counts (``stats.stratified_auroc_test``); power: one token of each
activating text fires at +3. Detection: a 20-pair quiz, each firing text paired with a non-firing one of its token
count (as the quiz draws them), lengths 4–15; H0: a predictor that says "fires" with a probability rising with
length, blind to the unit (``stats.stratified_detection_test``); power: a predictor right on 85 % of each class.
"""

from __future__ import annotations

import numpy as np

from mcp_interp.core.engine.numbers import stats
from mcp_interp.core.engine.numbers.calibration import Calibration, rejected
from mcp_interp.core.features import probe

DRAWS = 200  # the probe's default control draws (most; drawn sequentially)
LAYERS = 4


def family_p(xs: list[np.ndarray], y: np.ndarray, split: probe.Split, labellings: np.ndarray) -> float:
    """The probe's smallest family-wise p over the layers ``xs`` against the control ``labellings`` (fitted only as
    the sequential test asks for draws)."""

    def accuracies(rows: np.ndarray) -> np.ndarray:
        return np.stack([probe.held_out_correct(x, rows, split, "diff_means") for x in xs], 1) / len(split.test)

    test = stats.SequentialMaxTest(accuracies(y[None])[0], n_max=len(labellings))
    while wanted := test.wanted():
        test.add(accuracies(labellings[test.n : test.n + wanted]))
    return float(min(test.result().p_values))


def layers(rng: np.random.Generator, base: np.ndarray, signal: np.ndarray) -> list[np.ndarray]:
    """``LAYERS`` views of the same texts: ``base`` plus layer noise of rising size, and ``signal`` on coordinate 0."""
    out = []
    for scale in np.linspace(0.5, 2.0, LAYERS):
        x = base + scale * rng.normal(size=base.shape)
        x[:, 0] += signal
        out.append(x)
    return out


def _chance_p(rep: int, strength: float) -> float:
    rng = np.random.default_rng(rep)
    y = rng.permutation(np.repeat([0, 1], 30))
    split = probe.split_texts(y, 0.5, rep)
    shuffled, _ = probe.shuffled_labels(y, split, DRAWS, rep + 1)
    return family_p(layers(rng, rng.normal(size=(60, 5)), strength * (2 * y - 1)), y, split, shuffled)


def probe_chance(sims: int, power_sims: int, seed: int) -> list[Calibration]:
    null = [_chance_p(seed * 100_003 + rep, 0.0) for rep in range(sims)]
    alternative = [_chance_p(seed * 100_003 + sims + rep, 1.0) for rep in range(power_sims)]
    return [
        Calibration(
            "probe_chance",
            "4 layers, 60 texts",
            "labels independent of the residual; 4 correlated layers, family-wise (smallest p over layers)",
            "±1 σ on one coordinate in every layer",
            sims,
            rejected(null),
            power_sims,
            rejected(alternative),
            1 / (DRAWS + 1),
        )
    ]


def _selective_p(rep: int, signal: float) -> float:
    rng = np.random.default_rng(rep)
    types, per_type = 20, 10
    key = np.repeat(np.arange(types), per_type)
    base = rng.normal(size=(types, 10))[key] + rng.normal(size=(len(key), 10))
    y = key % 2 if signal else rng.permutation(np.arange(types) % 2)[key]
    split = probe.split_texts(y, 0.25, rep, key=key)
    keyed = probe.keyed_labels(key, y, DRAWS, rep + 2, split)
    return family_p(layers(rng, base, signal * (2 * y - 1)), y, split, keyed)


def probe_selective(sims: int, power_sims: int, seed: int) -> list[Calibration]:
    null = [_selective_p(seed * 100_003 + rep, 0.0) for rep in range(sims)]
    alternative = [_selective_p(seed * 100_003 + sims + rep, 1.5) for rep in range(power_sims)]
    return [
        Calibration(
            "probe_selective",
            "4 layers, 20 types × 10 texts",
            "the label a random function of the word type, the type memorisable from the residual (the shuffled-"
            "label control rejects most of these); type-keyed control, family-wise over 4 correlated layers",
            "a property moving one coordinate ±1.5 for every type",
            sims,
            rejected(null),
            power_sims,
            rejected(alternative),
            1 / (min(DRAWS, 2 ** (20 - 1) - 1) + 1),
        )
    ]


def _maxima(rng: np.random.Generator, lengths: np.ndarray, fire: float) -> np.ndarray:
    """Each text's maximum over its scored positions (all but the first) of iid N(0, 1), one position at +``fire``."""
    out = []
    for n in lengths:
        values = rng.normal(size=int(n) - 1)
        values[rng.integers(values.size)] += fire
        out.append(values.max())
    return np.asarray(out)


def _generation_test(rng: np.random.Generator, fire: float) -> stats.StratifiedAurocTest:
    long, short = rng.integers(6, 15, 10), rng.integers(4, 11, 10)
    return stats.stratified_auroc_test(_maxima(rng, long, fire), _maxima(rng, short, 0.0), long, short)


def naming_generation(sims: int, power_sims: int, seed: int) -> list[Calibration]:
    rng = np.random.default_rng(seed)
    null = [_generation_test(rng, 0.0) for _ in range(sims)]
    alternative = [_generation_test(rng, 3.0).p_value for _ in range(power_sims)]
    return [
        Calibration(
            "naming_generation",
            "10 + 10 texts written",
            "an explanation unrelated to the unit, its activating texts longer (6–14 tokens against 4–10); a text's "
            "score its maximum over positions, so length alone raises it",
            "one token of each activating text fires at +3 σ",
            sims,
            rejected([test.p_value for test in null]),
            power_sims,
            rejected(alternative),
            float(np.median([test.p_floor for test in null])),  # depends on the strata the texts fall in (median)
        )
    ]


def _detection_p(rng: np.random.Generator, right: float | None) -> float:
    lengths = np.repeat(rng.integers(4, 16, 20), 2)
    truth = np.tile([True, False], 20)
    if right is None:
        predicted = rng.random(40) < (lengths - 3) / 13  # longer texts called firing more often, blind to the unit
    else:
        predicted = np.where(rng.random(40) < right, truth, ~truth)
    return stats.stratified_detection_test(truth.tolist(), predicted.tolist(), lengths.tolist()).p_value


def naming_detection(sims: int, power_sims: int, seed: int) -> list[Calibration]:
    rng = np.random.default_rng(seed)
    null = [_detection_p(rng, None) for _ in range(sims)]
    alternative = [_detection_p(rng, 0.85) for _ in range(power_sims)]
    return [
        Calibration(
            "naming_detection",
            "20 length-matched pairs",
            "predictions blind to the unit but saying 'fires' more often for longer texts (P rises from 0.08 at 4 "
            "tokens to 0.92 at 15), on a quiz of firing/non-firing pairs of equal token count",
            "right on 85 % of each class",
            sims,
            rejected(null),
            power_sims,
            rejected(alternative),
            2.0**-20,  # all 20 pairs right, each stratum one firing of two
        )
    ]
