"""Scores of patched runs as fractions of a clean−corrupt gap, their ranking, and finite numbers for results.

Convention (one number per unit, the same reading in both directions):

* ``denoise`` (run corrupt, patch in clean): score = (m_patched − m_corrupt) / (m_clean − m_corrupt),
  the fraction of the gap the unit *restores*;
* ``noise`` (run clean, patch in corrupt): score = (m_clean − m_patched) / (m_clean − m_corrupt),
  the fraction it *destroys*.

1 = the unit alone carries the effect, 0 = none, negative = it works against it. The batch value is the
ratio of the means (``metrics.recovered_fraction``): one pair with a tiny gap cannot blow it up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from mcp_interp.core.engine.numbers import metrics
from mcp_interp.schemas.common import PatchDirection, Score

SMALL_GAP = 0.5  # |clean − corrupt| logit difference below which fractions are unstable
SMALL_PROB_GAP = 0.05  # the same for prob_diff (probability mass, in [−1, 1])


def gap_is_small(metric: str, gap: float) -> bool:
    """Whether a clean − corrupt gap is too small for fractions of it to be stable: below ``SMALL_GAP`` in logit
    difference, ``SMALL_PROB_GAP`` in probability difference, or exactly 0 for any metric."""
    limit = {"logit_diff": SMALL_GAP, "prob_diff": SMALL_PROB_GAP}.get(metric, 0.0)
    return abs(gap) < limit or gap == 0


TOP_WITH_EXAMPLES = 10  # ranked items that carry per-example values in a result


def finite(value: float) -> float | None:
    """``value`` as a float, or None when it is NaN or infinite (results never carry non-finite numbers)."""
    return float(value) if math.isfinite(value) else None


def directed_score(
    patched: torch.Tensor, clean: torch.Tensor, corrupt: torch.Tensor, direction: PatchDirection
) -> Score:
    """The fraction of the gap restored (``denoise``) or destroyed (``noise``), mean and per pair."""
    fraction = metrics.recovered_fraction(patched, clean, corrupt)
    if direction == "denoise":
        return fraction
    return Score(value=1.0 - fraction.value, per_example=[1.0 - v for v in fraction.per_example])


MIN_PAIRS_FOR_INTERVAL = 4
BOOTSTRAP_DRAWS = 2000


def score_interval(
    patched: torch.Tensor,
    clean: torch.Tensor,
    corrupt: torch.Tensor,
    direction: PatchDirection,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float] | None:
    """A percentile bootstrap interval of a cell's score (the ratio of means over pairs, ``directed_score``): pairs
    resampled with replacement ``BOOTSTRAP_DRAWS`` times; None below ``MIN_PAIRS_FOR_INTERVAL`` pairs, where a
    resampled ratio means little, and None when the gap is 0 in too many resamples to define the interval."""
    n = int(clean.shape[0])
    if n < MIN_PAIRS_FOR_INTERVAL:
        return None
    generator = torch.Generator(device="cpu").manual_seed(seed)
    picks = torch.randint(0, n, (BOOTSTRAP_DRAWS, n), generator=generator)
    p, c, k = (v.detach().to("cpu", torch.float64)[picks].mean(dim=1) for v in (patched, clean, corrupt))
    gap = c - k
    fraction = (p - k) / gap if direction == "denoise" else (c - p) / gap
    fraction = fraction[torch.isfinite(fraction)]
    if fraction.numel() < 0.99 * BOOTSTRAP_DRAWS:
        return None
    tail = (1 - level) / 2
    low, high = torch.quantile(fraction, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return float(low), float(high)


def ranked_by_magnitude(values: Sequence[float]) -> list[int]:
    """Indices of ``values`` by decreasing |value|; NaN last."""
    return sorted(range(len(values)), key=lambda i: -abs(values[i]) if values[i] == values[i] else 0.0)


def ranked_scores(
    patched: torch.Tensor, clean: torch.Tensor, corrupt: torch.Tensor, direction: PatchDirection
) -> list[int]:
    """Rows of ``patched`` ([units, pairs]) by decreasing |score|."""
    return ranked_by_magnitude([directed_score(row, clean, corrupt, direction).value for row in patched])
