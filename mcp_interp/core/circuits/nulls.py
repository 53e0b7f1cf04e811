"""Null simulation of ``circuit_faithfulness``'s verdict as ``find_circuit`` reaches it, model-free: the ranking, the
bisection to the target, the held-out split (``held_out_split``, ``held_out_fraction``) and the baseline (``judged``:
random circuits from the top 4k, never the circuit itself, ranked sequentially) are the package's own; only the model
is replaced by a linear one.

**The model.** 60 candidate items (edges); on pair p ablating everything but the set S recovers
Σ_{i∈S} c_ip / Σ_i c_ip of the gap, c_ip = μ_i + noise (sd 0.5, pairs differ). Attribution ranks items by their mean
c over the selecting pairs plus its own error (sd 0.2). H0 "the ranking inside the pool carries no information": every
μ_i = 1, so the chosen circuit is one more set of its size, except that it was chosen for its score on the selecting
pairs. Alternative: 20 items carry μ = 1, the other 40 μ = 0.1. 12 pairs, find_circuit's defaults (target 0.8, 100
random circuits): held out by default (half the pairs), and post-selection (``held_out=0``: the p is reported
without a verdict — this row says why).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import torch

from mcp_interp.core.circuits.faithfulness_job import CIRCUIT_DRAWS, held_out_fraction, judged
from mcp_interp.core.circuits.selection import EdgeRanking, held_out_split
from mcp_interp.core.engine.numbers.calibration import Calibration, rejected
from mcp_interp.schemas.common import Score

ITEMS, PAIRS, TARGET = 60, 12, 0.8
NOISE, ATTRIBUTION_ERROR = 0.5, 0.2  # sd of an item's contribution across pairs, and of attribution's estimate


class LinearAblator:
    """What ``judged`` asks of an ``Ablator``, on the linear model: per pair the fraction a circuit keeps."""

    def __init__(self, contributions: np.ndarray) -> None:
        self.contributions = contributions  # [items, pairs]

    def run_chunked(self, circuit: set[tuple[int, int]]) -> Generator[tuple[int, int], None, torch.Tensor]:
        kept = [i for i, _ in circuit]
        yield from ()
        return torch.tensor(self.contributions[kept].sum(0) / self.contributions.sum(0))

    def recovered(self, values: torch.Tensor) -> Score:
        return Score(value=float(values.mean()), per_example=[float(v) for v in values])


def _drain(steps: Generator[Any, None, Any]) -> Any:
    while True:
        try:
            next(steps)
        except StopIteration as finished:
            return finished.value


def _circuit_p(rng: np.random.Generator, relevant: int, held_out: float | None) -> float:
    means = np.ones(ITEMS) if relevant == ITEMS else np.where(np.arange(ITEMS) < relevant, 1.0, 0.1)
    contributions = means[:, None] + rng.normal(0.0, NOISE, (ITEMS, PAIRS))
    seed = int(rng.integers(2**31))
    selecting, evaluating = held_out_split(PAIRS, held_out_fraction(held_out, PAIRS), seed)
    chosen = LinearAblator(contributions[:, selecting])
    scores = contributions[:, selecting].mean(1) + rng.normal(0.0, ATTRIBUTION_ERROR, ITEMS)
    ranking = EdgeRanking([(int(i), 0) for i in np.argsort(-np.abs(scores))], graph=None)  # type: ignore[arg-type]
    low, high = 0, ITEMS
    while high - low > 1:  # find_circuit's bisection: the smallest top k reaching the target on the selecting pairs
        middle = (low + high) // 2
        if chosen.recovered(_drain(chosen.run_chunked(ranking.top(middle)))).value >= TARGET:
            high = middle
        else:
            low = middle
    judge = LinearAblator(contributions[:, evaluating]) if evaluating else chosen
    real = judge.recovered(_drain(judge.run_chunked(ranking.top(high)))).value
    baseline = _drain(judged(judge, ranking, high, real, CIRCUIT_DRAWS, seed, not evaluating))  # type: ignore[arg-type]
    return float(baseline.p_value)


def circuit_faithfulness(sims: int, power_sims: int, seed: int) -> list[Calibration]:
    rng = np.random.default_rng(seed)
    rows = []
    for scenario, held_out in (("find_circuit, half the pairs held out (default)", None), ("post-selection", 0.0)):
        null = [_circuit_p(rng, ITEMS, held_out) for _ in range(sims)]
        alternative = [_circuit_p(rng, 20, held_out) for _ in range(power_sims)]
        where = "6 held-out pairs" if held_out is None else "the 12 pairs that chose it (reported without a verdict)"
        rows.append(
            Calibration(
                "circuit_faithfulness",
                scenario,
                f"60 exchangeable candidate edges (linear recovery, pair noise sd {NOISE:g}, attribution error sd "
                f"{ATTRIBUTION_ERROR:g}); the "
                f"circuit chosen by bisection to 0.8 on its selecting pairs, scored on {where} against up to 100 "
                "random circuits from the top 4k",
                "20 of the 60 edges carry the effect (μ 1 against 0.1)",
                sims,
                rejected(null),
                power_sims,
                rejected(alternative),
                1 / (CIRCUIT_DRAWS + 1),
                gives_verdict=held_out is None,
            )
        )
    return rows
