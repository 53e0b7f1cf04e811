"""What one verdict's null simulation measured: its size at α under a stated null and its power on a stated
alternative, each with its exact interval — one row of ``docs/calibration.md`` (``scripts/calibrate.py``).

Every verdict the package words (``stats.VERDICTS``) has a simulator that drives the package's own test — the very
function a tool calls to get that verdict's p-value — on data built to carry what real data carries (pool sizes,
shared units, text lengths, depth, post-selection). A simulator is a function ``(sims, power_sims, seed) → list of
Calibration``: one entry per scenario (e.g. one head, one MLP). The suite runs each with few simulations
(``tests/test_calibration.py``); the script runs them with many and writes the table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mcp_interp.core.engine.numbers.stats import ALPHA, clopper_pearson


@dataclass(frozen=True)
class Calibration:
    """``rejections`` of ``sims`` null datasets had p ≤ ``alpha`` (the size; ≤ α is the goal, 0.06 the bound we
    hold), ``power_rejections`` of ``power_sims`` alternative datasets (the power); ``p_floor`` the smallest p the
    test can reach at the tool's defaults in this scenario."""

    key: str
    scenario: str
    null: str
    alternative: str
    sims: int
    rejections: int
    power_sims: int
    power_rejections: int
    p_floor: float
    alpha: float = ALPHA
    gives_verdict: bool = True  # False: no verdict rests on this row (a post-selection p, a replaced null)
    without_verdict: str = "reported without a verdict"  # why not, in the table

    @property
    def size(self) -> float:
        return self.rejections / self.sims

    @property
    def size_interval(self) -> tuple[float, float]:
        """Exact (Clopper–Pearson) 95 % interval of the size."""
        return clopper_pearson(self.rejections, self.sims)

    @property
    def power(self) -> float:
        return self.power_rejections / self.power_sims

    @property
    def power_interval(self) -> tuple[float, float]:
        return clopper_pearson(self.power_rejections, self.power_sims)


Simulator = Callable[[int, int, int], list[Calibration]]


def rejected(p_values: Sequence[float], alpha: float = ALPHA) -> int:
    """How many of ``p_values`` are ≤ α (a rejection)."""
    return sum(float(p) <= alpha for p in p_values)
