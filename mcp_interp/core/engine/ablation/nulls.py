"""Null simulations of the ablation verdicts (``component_ablation``, ``direction_ablation``), model-free, driving the
code the tools run: ``ComponentPool`` (the band of layers, never the real set) and ``stats.sequential_two_sided_test``
for components; ``energy_matched_directions`` and the same test for directions.

**Components.** A model of SmolLM2's shape (30 layers × 9 heads, 1 536 neurons a layer); a head's ablation moves the
metric by N(0, σ_l²), σ_l rising linearly from 0.03 at layer 0 to 0.3 at layer 29 — heads at other depths differ in
how much they can move the output (SmolLM2's random heads moved an IOI logit difference by −0.22…+0.37), the confound
the band of layers is there for. H0: the real head is one more head of its own layer (its change drawn like its
layer's heads'); it is chosen uniformly over the model, edge layers included. Alternative: its change is 6 σ of its
layer (the issue's L23H3: −2.78 against draws within ±0.37). One MLP: 30 MLPs with the same depth spread, the real
one among the other 29 (floor 1/30).

**Directions.** Residual rows with a power-law spectrum (λ_i ∝ i^−1.5 over 64 dimensions, like a trained model's
anisotropic stream), a linear readout g; ablating unit u changes the metric by −mean((x·u)(g·u)). H0: the real
direction is one more energy-matched random direction (drawn with its own Gaussians); alternative: u leans toward g
(u ∝ g + 0.5 n, n an energy-matched random direction).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from mcp_interp.core.engine.ablation.baselines import ComponentPool, energy_matched_directions
from mcp_interp.core.engine.ablation.targets import BlockOutputTarget, HeadTarget, Target
from mcp_interp.core.engine.numbers import stats
from mcp_interp.core.engine.numbers.calibration import Calibration, rejected

LAYERS, HEADS, D_MLP = 30, 9, 1536
SPREAD = np.linspace(0.03, 0.3, LAYERS)  # σ_l: how far a layer's heads move the metric
OUTLIER = 6.0  # the alternative: the real head's change, in σ of its layer


def _model() -> Any:
    return SimpleNamespace(cfg=SimpleNamespace(n_layers=LAYERS, n_heads=HEADS, d_mlp=D_MLP))


def heads(targets: list[Target]) -> list[HeadTarget]:
    return [t for t in targets if isinstance(t, HeadTarget)]


def blocks(targets: list[Target]) -> list[BlockOutputTarget]:
    return [t for t in targets if isinstance(t, BlockOutputTarget)]


def _ranked(real: float, draw: Any, pool: ComponentPool) -> float:
    """``component_baseline``'s test: sequential, two-sided, at most every other set the pool holds."""
    cap = min(stats.MOST_DRAWS, pool.sets.size)
    h, batch = min(stats.STOP_AFTER, cap), min(stats.BATCH, cap)
    return stats.sequential_two_sided_test(real, draw, h=h, n_max=cap, batch=batch).p_value


def _head_p(rng: np.random.Generator, shift: float) -> float:
    effects = rng.normal(0.0, 1.0, (LAYERS, HEADS)) * SPREAD[:, None]
    layer, head = int(rng.integers(LAYERS)), int(rng.integers(HEADS))
    real = effects[layer, head] + shift * SPREAD[layer] * rng.choice([-1.0, 1.0])
    pool = ComponentPool.of(_model(), [HeadTarget(layer, head)], stats.MOST_DRAWS, int(rng.integers(2**31)))

    def draw(k: int) -> list[float]:
        return [float(sum(effects[t.layer, t.head] for t in heads(targets))) for targets in pool.draw(k)]

    return _ranked(real, draw, pool)


def _mlp_p(rng: np.random.Generator, shift: float) -> float:
    effects = rng.normal(0.0, 1.0, LAYERS) * SPREAD
    layer = int(rng.integers(LAYERS))
    real = effects[layer] + shift * SPREAD[layer] * rng.choice([-1.0, 1.0])
    pool = ComponentPool.of(_model(), [BlockOutputTarget(layer, "MLP")], stats.MOST_DRAWS, int(rng.integers(2**31)))

    def draw(k: int) -> list[float]:
        return [float(sum(effects[t.layer] for t in blocks(targets))) for targets in pool.draw(k)]

    return _ranked(real, draw, pool)


def component_ablation(sims: int, power_sims: int, seed: int) -> list[Calibration]:
    rng = np.random.default_rng(seed)
    one_head_pool = ComponentPool.of(_model(), [HeadTarget(15, 0)], stats.MOST_DRAWS, 0).sets.size
    mlp_pool = LAYERS - 1
    head_null = [_head_p(rng, 0.0) for _ in range(sims)]
    head_alt = [_head_p(rng, OUTLIER) for _ in range(power_sims)]
    mlp_null = [_mlp_p(rng, 0.0) for _ in range(sims)]
    mlp_alt = [_mlp_p(rng, OUTLIER) for _ in range(power_sims)]
    depth = "head changes N(0, σ_l²), σ_l 0.03 (layer 0) → 0.3 (layer 29)"
    return [
        Calibration(
            "component_ablation",
            "one head (30 × 9 heads)",
            f"the real head one more head of its own layer, any layer; {depth}; random heads from the band of "
            f"layers grown to hold 200 other heads ({one_head_pool} in the middle of the model), never the head itself",
            f"its change {OUTLIER:g} σ of its layer",
            sims,
            rejected(head_null),
            power_sims,
            rejected(head_alt),
            stats.rank_floor(stats.MOST_DRAWS, one_head_pool),
        ),
        Calibration(
            "component_ablation",
            "one MLP (30 layers)",
            f"the real MLP one more layer's MLP, {depth.replace('head', 'MLP')}; the other 29 MLPs, every one drawn",
            f"its change {OUTLIER:g} σ of its layer",
            sims,
            rejected(mlp_null),
            power_sims,
            rejected(mlp_alt),
            stats.rank_floor(stats.MOST_DRAWS, mlp_pool),
        ),
    ]


DIMS, ROWS = 64, 200
SPECTRUM = np.arange(1, DIMS + 1) ** -1.5


def _direction_p(rng: np.random.Generator, lean: float) -> float:
    generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
    rows = torch.randn(ROWS, DIMS, generator=generator, dtype=torch.float64) * torch.tensor(SPECTRUM).sqrt()
    readout = torch.randn(DIMS, generator=generator, dtype=torch.float64)
    second = rows.T @ rows / ROWS

    def change(u: torch.Tensor) -> float:
        return float(-((rows @ u) * (readout @ u)).mean())

    gaussians = torch.randn(1, DIMS, generator=generator, dtype=torch.float64)
    base = energy_matched_directions(rows, float(torch.trace(second) / DIMS), gaussians)[0]
    real = (readout / readout.norm() + lean * base) if lean else base
    real = real / real.norm()
    target = float(real @ second @ real)

    def draw(k: int) -> list[float]:
        units = energy_matched_directions(rows, target, torch.randn(k, DIMS, generator=generator, dtype=torch.float64))
        return [change(u) for u in units]

    return stats.sequential_two_sided_test(change(real), draw).p_value


def direction_ablation(sims: int, power_sims: int, seed: int) -> list[Calibration]:
    rng = np.random.default_rng(seed)
    null = [_direction_p(rng, 0.0) for _ in range(sims)]
    alternative = [_direction_p(rng, 0.5) for _ in range(power_sims)]
    return [
        Calibration(
            "direction_ablation",
            "one direction (64 dims, λ_i ∝ i^−1.5)",
            "the real direction one more energy-matched random direction of an anisotropic stream; the change is "
            "linear in the removed projection",
            "the direction leans toward the readout (u ∝ g/|g| + 0.5 n)",
            sims,
            rejected(null),
            power_sims,
            rejected(alternative),
            stats.rank_floor(stats.MOST_DRAWS),
        )
    ]
