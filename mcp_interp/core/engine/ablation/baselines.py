"""Random baselines an ablation is judged against: random stand-ins that remove the same energy as the real thing.

A residual direction's (or a set of SAE features') effect means something only next to the effect of stand-ins that
are *not* special but otherwise comparable. ``random_baseline`` re-runs the ablation with every direction replaced by
a random direction at its layer, and every SAE feature by a random feature of its dictionary, each matched on the
energy it removes at the ablated positions, and ranks the real effect among theirs with the exact rank test
(``stats.rank_test``): p = (1 + #{|random change| ≥ |real change|}) / (n + 1).

What "energy" is: for a direction u, the mean over the ablated positions of (x·u)², the squared projection
zero-ablation removes; for features, the mean of ‖Σ_f a_f W_dec[f]‖², their decoded contribution. Token 0 is left out
of the match when other positions are ablated: in most models its residual is an attention sink with a norm far
above every other token's, so it alone would decide which random directions "match" (its own energies are reported
in a note). The draws run stacked, several copies of the batch in one forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from mcp_interp.core.engine.ablation.targets import (
    Ablation,
    DirectionTarget,
    FeaturesTarget,
    PreparedAblation,
    Target,
    prepare_ablation,
    stacked_edits,
)
from mcp_interp.core.engine.backend.forward import Capture
from mcp_interp.core.engine.numbers import metrics, stats
from mcp_interp.core.engine.text.answers import Answer, answer_log_probs, resolve_answer_specs
from mcp_interp.core.engine.text.components import position_mask
from mcp_interp.core.engine.text.tokens import Batch, encode
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.ablation import RandomBaseline

TOKENS_PER_FORWARD = 4096  # stacked copies of the batch per forward, in tokens: bounded memory
FEATURE_ENERGY_RATIO = 1.25  # a random feature matches when its energy is within this factor of the real one's


def random_unit_vectors(n: int, d_model: int, seed: int) -> torch.Tensor:
    """``n`` directions uniform on the unit sphere of R^d_model (normalised Gaussians), from a seeded CPU
    generator so the same seed draws the same directions on every machine."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    draws = torch.randn(n, d_model, generator=generator, dtype=torch.float64)
    return (draws / draws.norm(dim=1, keepdim=True)).to(torch.float32)


def energy_matched_directions(rows: torch.Tensor, target: float, gaussians: torch.Tensor) -> torch.Tensor:
    """Random unit directions that remove the same energy as the real one: u ∝ Σ_i g_i λ_i^(γ/2) v_i, with
    (λ_i, v_i) the eigenpairs of the residual's second moment S = E[x xᵀ] over ``rows`` (the matched positions) and
    g a Gaussian draw. γ = 0 is a uniform direction; γ > 0 leans toward the stream's energetic directions, γ < 0
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


def matched_mask(mask: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The ablated positions energies are matched over, and whether token 0 was left out (see the module)."""
    without_first = mask.clone()
    without_first[:, 0] = False
    if bool(without_first.any()) and bool(mask[:, 0].any()):
        return without_first, True
    return mask, False


@dataclass(frozen=True)
class Effect:
    """What an ablation does to the prompts, as the baseline ranks it: the mean change of ``statistic``."""

    statistic: str
    tracked: list[Answer]
    bad: list[Answer] | None
    sequences: bool

    def value(self, model: LoadedModel, batch: Batch, logits: torch.Tensor, prepared: PreparedAblation | None) -> float:
        """The statistic's mean over prompts (logit difference or log-prob of the tracked answer)."""
        if not self.sequences:
            first = [a.first_token for a in self.tracked]
            if self.bad is not None:
                return metrics.logit_difference(logits, first, [a.first_token for a in self.bad]).value
            return metrics.answer_logprob(logits, first).value
        good = answer_log_probs(model.backend, batch, self.tracked, prepared)
        if self.bad is not None:
            good = good - answer_log_probs(model.backend, batch, self.bad, prepared)
        return float(good.mean())


def effect_of(model: LoadedModel, batch: Batch, clean: torch.Tensor, correct: Any, incorrect: Any) -> Effect:
    """The statistic: the logit difference when both answers are given, else the log-prob of the correct answer (or
    of each prompt's clean top-1), as ``ablation_outcome`` tracks them."""
    n = len(batch.texts)
    good = resolve_answer_specs(model.tokenizer, correct, n, "correct") if correct is not None else None
    bad = resolve_answer_specs(model.tokenizer, incorrect, n, "incorrect") if incorrect is not None else None
    if good is None:
        good = [Answer(model.tokenizer.decode([int(i)]), ((int(i),),), "token") for i in clean.argmax(dim=-1)]
    with_bad = bad if correct is not None and bad is not None else None
    sequences = any(a.kind != "token" for a in good + (with_bad or []))
    return Effect("logit_diff" if with_bad is not None else "log_prob", good, with_bad, sequences)


def random_baseline(
    model: LoadedModel,
    prompts: Sequence[str],
    ablation: Ablation,
    correct: Any = None,
    incorrect: Any = None,
    draws: int = stats.DEFAULT_DRAWS,
) -> RandomBaseline | None:
    """The ablation re-run ``draws`` times with its directions and SAE features replaced by energy-matched random
    ones (the other targets unchanged), the real effect ranked among theirs; None when it has neither."""
    special = [i for i, t in enumerate(ablation.targets) if isinstance(t, DirectionTarget | FeaturesTarget)]
    if not special:
        return None
    stats.check_draws(draws)
    batch = encode(model.tokenizer, prompts, model.device)
    mask = position_mask(ablation.positions, batch.attention_mask, batch.answer_positions)
    matched, first_left_out = matched_mask(mask)
    names = sorted({t.hook() for t in ablation.targets})
    capture = model.backend.capture(batch.input_ids, names)
    clean = answer_logits(model, batch, capture)
    effect = effect_of(model, batch, clean, correct, incorrect)
    before = effect.value(model, batch, clean, None)

    generator = torch.Generator(device="cpu").manual_seed(ablation.seed)
    stand_ins: dict[int, list[Target]] = {}
    for i in special:
        target = ablation.targets[i]
        values = capture.acts[target.hook()]
        if isinstance(target, DirectionTarget):
            stand_ins[i] = random_directions(target, values[matched], draws, generator)
        else:
            assert isinstance(target, FeaturesTarget)
            stand_ins[i] = random_features(target, values[matched], draws, generator)
    variants = [ablation] + [
        replace(ablation, targets=[stand_ins[i][j] if i in stand_ins else t for i, t in enumerate(ablation.targets)])
        for j in range(draws)
    ]
    prepared = [prepare_ablation(model, batch, variant, clean=capture.acts) for variant in variants]
    changes = [value - before for value in effect_values(model, batch, effect, prepared)]
    test = stats.rank_test(changes[0], changes[1:])

    def energy(variant: Ablation, where: torch.Tensor) -> float:
        return sum(removed_energy(variant.targets[i], capture.acts[variant.targets[i].hook()][where]) for i in special)

    notes = []
    if first_left_out:
        first = torch.zeros_like(mask)
        first[:, 0] = mask[:, 0]
        at_first = sorted(energy(v, first) for v in variants[1:])
        notes.append(
            f"Token 0 is ablated too but left out of the energy match (an attention sink in most models): there the "
            f"real {kind_of(ablation, special)} carry {energy(ablation, first):.3g}, the random ones "
            f"{at_first[0]:.3g}–{at_first[-1]:.3g} (median {at_first[len(at_first) // 2]:.3g})."
        )
    return RandomBaseline(
        replaced=kind_of(ablation, special),
        statistic=f"{effect.statistic} change",
        real=test.real,
        draws=list(test.draws),
        p_value=test.p_value,
        verdict=stats.versus_random(test, f"energy-matched random {kind_of(ablation, special)}"),
        seed=ablation.seed,
        energy=energy(ablation, matched),
        draw_energy=[energy(v, matched) for v in variants[1:]],
        matched_positions=int(matched.sum()),
        notes=notes,
    )


def kind_of(ablation: Ablation, special: Sequence[int]) -> str:
    kinds = {"directions" if isinstance(ablation.targets[i], DirectionTarget) else "features" for i in special}
    return " and ".join(sorted(kinds))


def answer_logits(model: LoadedModel, batch: Batch, run: Capture) -> torch.Tensor:
    """[rows, vocab] logits at each row's answer position (rows may be stacked copies of the batch), float64."""
    copies = run.final.shape[0] // batch.input_ids.shape[0]
    return model.backend.logits_at(run, batch.answer_positions.repeat(copies)).to(torch.float64)


def effect_values(
    model: LoadedModel, batch: Batch, effect: Effect, prepared: Sequence[PreparedAblation]
) -> list[float]:
    """The statistic under each prepared ablation, the single-token case run as stacked copies of the batch."""
    if effect.sequences:  # teacher-forced rows differ per answer: one run per variant
        return [effect.value(model, batch, torch.empty(0), p) for p in prepared]
    rows = batch.input_ids.shape[0]
    per_forward = max(1, TOKENS_PER_FORWARD // batch.input_ids.numel())
    values: list[float] = []
    for start in range(0, len(prepared), per_forward):
        chunk = prepared[start : start + per_forward]
        edits = stacked_edits([p.edits for p in chunk], rows)
        logits = answer_logits(model, batch, model.backend.capture(batch.input_ids.repeat(len(chunk), 1), edits=edits))
        values.extend(effect.value(model, batch, logits[j * rows : (j + 1) * rows], None) for j in range(len(chunk)))
    return values


def random_directions(
    target: DirectionTarget, rows: torch.Tensor, draws: int, generator: torch.Generator
) -> list[Target]:
    """``draws`` random directions at the target's layer removing its energy at ``rows`` [tokens, d_model]."""
    rows = rows.detach().to("cpu", torch.float64)
    gaussians = torch.randn(draws, rows.shape[1], generator=generator, dtype=torch.float64)
    target_energy = float(((rows @ target.direction.to(torch.float64).cpu()) ** 2).mean())
    units = energy_matched_directions(rows, target_energy, gaussians)
    return [DirectionTarget(target.layer, unit.to(torch.float32)) for unit in units]


def random_features(
    target: FeaturesTarget, values: torch.Tensor, draws: int, generator: torch.Generator
) -> list[Target]:
    """``draws`` random feature sets of the target's dictionary, each real feature replaced by one whose energy
    a²‖W_dec‖² at the matched positions (``values`` [tokens, ...] of the SAE's hook) is within a factor
    ``FEATURE_ENERGY_RATIO`` of it — or, when fewer than ``draws`` features are that close, one of the ``draws``
    nearest in log energy. Never one of the real features; distinct within a set."""
    sae = target.sae
    with torch.inference_mode():
        activations = sae.encode(sae.to_input(values)).to(torch.float64)
        norms = sae.W_dec.detach().to(torch.float64).norm(dim=1)
    energies = (activations**2).mean(dim=0).cpu() * norms.cpu() ** 2
    log_energy = torch.log(energies.clamp_min(1e-30))
    excluded = torch.zeros_like(energies, dtype=torch.bool)
    excluded[list(target.features)] = True
    pools = []
    for feature in target.features:
        distance = (log_energy - log_energy[feature]).abs().masked_fill(excluded, float("inf"))
        close = torch.nonzero(distance <= torch.log(torch.tensor(FEATURE_ENERGY_RATIO, dtype=torch.float64)))
        pool = close.flatten() if close.numel() >= draws else torch.argsort(distance)[:draws]
        pools.append(pool)
    sets = []
    for _ in range(draws):
        chosen: list[int] = []
        for pool in pools:
            free = [int(f) for f in pool if int(f) not in chosen]
            chosen.append(free[int(torch.randint(len(free), (1,), generator=generator))])
        sets.append(FeaturesTarget(sae=sae, features=tuple(sorted(chosen)), source=target.source))
    return list(sets)


def removed_energy(target: Target, values: torch.Tensor) -> float:
    """The mean squared norm of what zero-ablating ``target`` removes at ``values`` [tokens, ...] (its hook's values
    at the matched positions): (x·u)² for a direction, ‖Σ_f a_f W_dec[f]‖² for features."""
    with torch.inference_mode():
        if isinstance(target, DirectionTarget):
            return float(((values.to(torch.float64) @ target.direction.to(values.device, torch.float64)) ** 2).mean())
        assert isinstance(target, FeaturesTarget)
        part = target.read(values.unsqueeze(0))[0].to(torch.float64)  # [tokens, features]
        decoded = part @ target.sae.W_dec[list(target.features)].to(torch.float64)
        return float((decoded**2).sum(dim=-1).mean())
