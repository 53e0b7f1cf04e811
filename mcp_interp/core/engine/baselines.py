"""Random baselines an effect is judged against: random directions that remove the same energy as a real one.

A direction's effect means something only next to the effect of directions that are *not* special but
otherwise comparable; ``random_direction_baseline`` re-runs an ablation with every direction replaced by such
a random direction and reports what changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from mcp_interp.core.engine.ablation import ablation_outcome
from mcp_interp.core.engine.bridge import hook_out
from mcp_interp.core.engine.forward import capture_forward
from mcp_interp.core.engine.interventions import Ablation, DirectionTarget
from mcp_interp.core.engine.tokens import encode
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.ablation import RandomDirections

RANDOM_DIRECTIONS = 5  # random unit directions a direction ablation is compared with


def random_unit_vectors(n: int, d_model: int, seed: int) -> torch.Tensor:
    """``n`` directions uniform on the unit sphere of R^d_model (normalised Gaussians), from a seeded CPU
    generator so the same seed draws the same directions on every machine."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    draws = torch.randn(n, d_model, generator=generator, dtype=torch.float64)
    return (draws / draws.norm(dim=1, keepdim=True)).to(torch.float32)


def residual_rows(model: LoadedModel, prompts: Sequence[str], layers: Sequence[int]) -> dict[int, torch.Tensor]:
    """Every real token's resid_post at each of ``layers`` ([tokens, d_model], float64), from one forward."""
    batch = encode(model.tokenizer, prompts, model.device)
    names = {hook_out(layer): layer for layer in layers}
    acts = capture_forward(model.bridge, batch.input_ids, sorted(names)).acts
    real = batch.attention_mask.bool()
    return {layer: acts[name][real].detach().to(torch.float64).cpu() for name, layer in names.items()}


def energy_matched_directions(rows: torch.Tensor, target: float, gaussians: torch.Tensor) -> torch.Tensor:
    """Random unit directions that remove the same energy as the real one: u ∝ Σ_i g_i λ_i^(γ/2) v_i, with
    (λ_i, v_i) the eigenpairs of the residual's second moment S = E[x xᵀ] over the prompts' tokens and g a
    Gaussian draw. γ = 0 is a uniform direction; γ > 0 leans toward the stream's energetic directions, γ < 0
    away from them. uᵀSu = Σ λ^(1+γ) g² / Σ λ^γ g² rises monotonically with γ (its derivative is a variance),
    so for each draw γ ∈ [−4, 4] is found by bisection to give uᵀSu = ``target`` (clamped at the ends).
    ``rows`` [tokens, d_model] float64, ``gaussians`` [n, d_model] → [n, d_model] unit vectors."""
    second = rows.T @ rows / rows.shape[0]
    eigenvalues, eigenvectors = torch.linalg.eigh(second)
    eigenvalues = eigenvalues.clamp_min(float(eigenvalues.max()) * 1e-12)
    out = []
    for g in gaussians:
        weight = g**2

        def energy(gamma: float, weight: torch.Tensor = weight) -> float:
            scaled = weight * eigenvalues**gamma
            return float((scaled * eigenvalues).sum() / scaled.sum())

        low, high = -4.0, 4.0
        if target <= energy(low):
            gamma = low
        elif target >= energy(high):
            gamma = high
        else:
            for _ in range(60):
                gamma = (low + high) / 2
                low, high = (gamma, high) if energy(gamma) < target else (low, gamma)
            gamma = (low + high) / 2
        vector = eigenvectors @ (g * eigenvalues ** (gamma / 2))
        out.append(vector / vector.norm())
    return torch.stack(out)


def random_direction_baseline(
    model: LoadedModel, prompts: Sequence[str], ablation: Ablation, correct: Any, incorrect: Any
) -> RandomDirections:
    """The ablation re-run ``RANDOM_DIRECTIONS`` times with every direction target replaced by a random unit
    direction at the same layer that removes the same energy (``energy_matched_directions``), the other targets
    unchanged.

    Why energy-matched: a uniform random direction in R^d_model carries about 1/d_model of the stream's energy,
    much less than most directions fitted to data (a difference of means often picks up the stream's largest
    components), so "larger than random" would be nearly guaranteed; directions drawn from the residual's
    covariance instead are dominated by its few huge components (attention sinks) and break the model. Matching
    the energy removed (the mean squared projection over the prompts' tokens) compares like with like."""
    directions = ablation.directions
    rows = residual_rows(model, prompts, sorted({t.layer for t in directions}))
    d_model = int(model.bridge.cfg.d_model)
    generator = torch.Generator(device="cpu").manual_seed(ablation.seed)
    gaussians = torch.randn(RANDOM_DIRECTIONS, len(directions), d_model, generator=generator, dtype=torch.float64)

    def energy(layer: int, unit: torch.Tensor) -> float:
        return float(((rows[layer] @ unit.to(torch.float64)) ** 2).mean())

    matched = [
        energy_matched_directions(rows[t.layer], energy(t.layer, t.direction), gaussians[:, j])
        for j, t in enumerate(directions)
    ]
    logit_diff: list[float] = []
    log_prob: list[float] = []
    kl: list[float] = []
    energies: list[float] = []
    for i in range(RANDOM_DIRECTIONS):
        drawn = iter(range(len(directions)))
        targets, removed = [], 0.0
        for t in ablation.targets:
            if not isinstance(t, DirectionTarget):
                targets.append(t)
                continue
            unit = matched[next(drawn)][i]
            removed += energy(t.layer, unit)
            targets.append(DirectionTarget(t.layer, unit.to(torch.float32)))
        outcome = ablation_outcome(model, prompts, replace(ablation, targets=targets), correct, incorrect)
        if outcome.before.logit_diff is not None and outcome.after.logit_diff is not None:
            logit_diff.append(outcome.after.logit_diff.value - outcome.before.logit_diff.value)
        log_prob.append(outcome.after.log_prob.value - outcome.before.log_prob.value)
        kl.append(outcome.kl.value)
        energies.append(removed)
    direction_energy = sum(energy(t.layer, t.direction) for t in directions)
    return RandomDirections(
        n=RANDOM_DIRECTIONS,
        seed=ablation.seed,
        logit_diff_change=logit_diff or None,
        log_prob_change=log_prob,
        kl=kl,
        direction_energy=direction_energy,
        energy=energies,
    )
