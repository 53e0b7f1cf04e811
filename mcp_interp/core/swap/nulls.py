"""The causal-swap verdicts' null simulations (``swap_strict``, ``swap_specificity``, ``swap_beats_all``): the
benchmark's sharing structure, read from the shipped corpus files, simulated model-free; the p-values are the
engine's ``relabel_test`` on the units ``summarize`` relabels (tests/swap/test_stats.py checks they equal
``summarize``'s on a simulated benchmark).

What is shared in a real benchmark, and so in these simulations:

* the trials: every (function, source, target) of the corpus file (``corpus.trial_keys``) whose source and target
  prompts the model answers (``require_target_known``, the default) — on SmolLM2-135M-Instruct 13 of the 16
  ``capitals_languages`` prompts and 7 of the 16 ``countries`` ones (measured; docs/tools/swap.md), so a target is
  the real arm of 5–6 prompts per function, in both functions;
* the layers: 29 editable layers, and a trial executes only where its source atom is active (the default benchmark
  executed 996 of 2 088 slots, so each (function, source, layer) is active with probability 0.48 here);
* the tokens: the real arm of every trial toward a target is the target's token, whose effect on the edited margin
  is shared by all those trials (σ²/2 of its variance shared across functions, σ²/2 per function); each control is
  a token with an effect drawn the same way, shared by the trials it stands in (``design``: once per swap — the
  protocol, every layer of one swap — or once per target, which would need a token matched to every source); plus a
  per-swap unedited margin and a per-trial effect shared by all arms of a trial, and independent noise N(0, 1) per
  edit.

``effect`` is added to the real arm (0 = H0: the target is one more displacement-matched token).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mcp_interp.core.engine.numbers import stats as engine_stats
from mcp_interp.core.engine.numbers.calibration import Calibration
from mcp_interp.core.swap.corpus import load_corpus, trial_keys

# The prompts SmolLM2-135M-Instruct does not answer as its strict top-1 (measured with the benchmark's baseline rule).
INCAPABLE = {
    "capitals_languages": {("capital", "Russia"), ("language", "China"), ("language", "Japan")},
    "countries": {
        ("language", "France"),
        ("language", "China"),
        ("continent", "Canada"),
        ("continent", "China"),
        ("continent", "Egypt"),
        *(("currency", c) for c in ("France", "Canada", "China", "Egypt")),
    },
}
ACTIVE_LAYERS = 29  # the layers a source atom may be active at in the default corpus's swaps
ACTIVE = 0.48
SEEDS = 5


@dataclass(frozen=True)
class Sharing:
    """The swaps a benchmark of ``corpus`` runs, and the units each shares: per swap its function, its prompt
    (function, source) and its target."""

    corpus: str
    swaps: list[tuple[str, str, str]]
    function: np.ndarray  # [swaps] function index
    prompt: np.ndarray  # [swaps] (function, source) index
    target: np.ndarray  # [swaps] target concept index


def index(values: list[object]) -> np.ndarray:
    seen: dict[object, int] = {}
    return np.array([seen.setdefault(v, len(seen)) for v in values], dtype=np.int64)


def sharing(name: str) -> Sharing:
    corpus = load_corpus(name)
    answers = {(f.name, c): f.answers[c] for f in corpus.functions for c in corpus.concepts}
    capable = {key for key in answers if key not in INCAPABLE[name]}
    swaps = [
        (k.function, k.source, k.target)
        for k in trial_keys(corpus)
        if (k.function, k.source) in capable
        and (k.function, k.target) in capable
        and answers[(k.function, k.source)] != answers[(k.function, k.target)]
    ]
    return Sharing(
        corpus=name,
        swaps=swaps,
        function=index([f for f, _, _ in swaps]),
        prompt=index([(f, s) for f, s, _ in swaps]),
        target=index([t for _, _, t in swaps]),
    )


@dataclass(frozen=True)
class Simulated:
    gains: np.ndarray  # [trials, 1 + SEEDS] margin gain of each arm, real first
    edited: np.ndarray  # [trials, 1 + SEEDS] edited margin (success = > 0)
    swap: np.ndarray  # [trials] the swap each trial belongs to


def simulate(
    rng: np.random.Generator, structure: Sharing, sigma: float, effect: float, design: str = "swap"
) -> Simulated:
    """One benchmark's executed trials under the token-effect model (module docstring), in swap order. ``design``:
    controls drawn once per swap ("swap", the protocol) or once per target ("target")."""
    n_swaps, n_functions = len(structure.swaps), int(structure.function.max()) + 1
    n_targets = int(structure.target.max()) + 1
    half = sigma / np.sqrt(2)
    shared = rng.normal(0.0, half, size=(n_targets, 1 + SEEDS))  # token effect, every function
    per_function = rng.normal(0.0, half, size=(n_functions, n_targets, 1 + SEEDS))
    tokens = shared[structure.target] + per_function[structure.function, structure.target]  # [swaps, arms]
    if design == "swap":  # fresh control tokens for every swap; the real arm is still the target's token
        tokens[:, 1:] = rng.normal(0.0, half, size=(n_swaps, SEEDS)) + rng.normal(0.0, half, size=(n_swaps, SEEDS))
    elif design != "target":
        raise ValueError(design)
    tokens[:, 0] += effect
    n_prompts = int(structure.prompt.max()) + 1
    active = rng.random((n_prompts, ACTIVE_LAYERS)) < ACTIVE  # the source atom is active at (function, source, layer)
    swap, _ = np.nonzero(active[structure.prompt])
    unedited = rng.normal(-1.5, 0.5, size=n_swaps)[swap]
    gains = tokens[swap] + rng.normal(0.0, 0.5, size=(swap.size, 1)) + rng.normal(size=(swap.size, 1 + SEEDS))
    return Simulated(gains=gains, edited=unedited[:, None] + gains, swap=swap)


def beats_all_rows(gains: np.ndarray) -> np.ndarray:
    """1 where an arm's gain is strictly above every other arm's in its trial (0 everywhere on a tie for first)."""
    top = gains.max(axis=1, keepdims=True)
    unique = (gains == top).sum(axis=1, keepdims=True) == 1
    return ((gains == top) & unique).astype(np.float64)


def cluster_means(values: np.ndarray, labels: np.ndarray) -> list[list[float]]:
    """Per cluster, the mean over its trials of each arm's value (what ``swap.stats.arm_means`` computes)."""
    sums = np.zeros((int(labels.max()) + 1, values.shape[1]))
    np.add.at(sums, labels, values)
    counts = np.bincount(labels, minlength=sums.shape[0])
    return (sums[counts > 0] / counts[counts > 0, None]).tolist()


def p_values(run: Simulated, labels: np.ndarray, seed: int, draws: int = 999) -> dict[str, float]:
    """The three tests' two-sided p-values, relabelling per ``labels`` (one per trial)."""
    outcomes = {
        "strict": (run.edited > 0).astype(np.float64),
        "margin": run.gains,
        "beats_all": beats_all_rows(run.gains),
    }
    return {
        name: engine_stats.relabel_test(cluster_means(values, labels), seed=seed, draws=draws).p_value
        for name, values in outcomes.items()
    }


def tested(run: Simulated, structure: Sharing) -> tuple[Simulated, np.ndarray]:
    """The trials the protocol tests — per target, the swap with the most executed trials (the lowest swap index on a
    tie; ``summary.tested_swaps``'s rule, written out here) — and their target labels."""
    counts = np.bincount(run.swap, minlength=len(structure.swaps))
    chosen = []
    for target in np.unique(structure.target):
        swaps = np.flatnonzero(structure.target == target)
        if counts[swaps].max() > 0:
            chosen.append(swaps[np.argmax(counts[swaps])])  # argmax: the first of the largest
    keep = np.isin(run.swap, chosen)
    subset = Simulated(gains=run.gains[keep], edited=run.edited[keep], swap=run.swap[keep])
    return subset, structure.target[subset.swap]


def rejections(
    name: str, sigma: float, effect: float, reps: int, seed: int, design: str = "swap", unit: str = "tested"
) -> dict[str, float]:
    """Rejection rates at α = 0.05 of the strict, margin and beats-all tests over ``reps`` simulated benchmarks of
    corpus ``name``. ``unit``: relabel per target on one swap each ("tested", the protocol), per target over all its
    swaps ("target"), or per prompt (function, source), the design before."""
    structure = sharing(name)
    rng = np.random.default_rng(seed)
    counts = {"strict": 0, "margin": 0, "beats_all": 0}
    for rep in range(reps):
        run = simulate(rng, structure, sigma, effect, design)
        if unit == "tested":
            run, labels = tested(run, structure)
        else:
            labels = {"target": structure.target, "prompt": structure.prompt}[unit][run.swap]
        for test, p in p_values(run, labels, rep).items():
            counts[test] += p <= engine_stats.ALPHA
    return {test: n / reps for test, n in counts.items()}


SWAP_KEYS = {"strict": "swap_strict", "margin": "swap_specificity", "beats_all": "swap_beats_all"}
SIGMA = 1.5  # the token effects' spread (logits): the largest the size tests use, where sharing matters most


def swap_verdicts(sims: int, power_sims: int, seed: int) -> list[Calibration]:
    """The three tests on both shipped corpora (``capitals_languages``: 8 targets; ``countries``: 4), relabelling per
    target on one tested swap each, under H0 (the target one more displacement-matched token, every token's effect
    shared by every trial it is an arm of) and with the real token 1 logit better (σ = 0.5)."""
    rows = []
    for offset, name in enumerate(("capitals_languages", "countries")):
        null = rejections(name, SIGMA, 0.0, reps=sims, seed=seed + 2 * offset)
        power = rejections(name, 0.5, 1.0, reps=power_sims, seed=seed + 2 * offset + 1)
        targets = len(set(sharing(name).target.tolist()))
        floor = 2 / (1 + SEEDS) ** targets  # two-sided: every target's real arm on top
        for test, key in SWAP_KEYS.items():
            rows.append(
                Calibration(
                    key,
                    f"{name} ({targets} targets)",
                    f"the target one more displacement-matched token; token effects σ = {SIGMA:g} shared by every "
                    "trial a token is an arm of (a target: 5–11 swaps), the corpus's real sharing and active layers",
                    "the real token 1 logit better than an average one (σ = 0.5)",
                    sims,
                    round(null[test] * sims),
                    power_sims,
                    round(power[test] * power_sims),
                    floor,
                )
            )
    return rows
