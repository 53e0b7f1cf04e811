"""The measurement behind ``ablate`` and ``ablate_head``: every metric before and after, and where they disagree.

Metrics see different things (see ``core.metrics``). The most common way to a confident wrong
conclusion is reading one that is blind to the effect — rank stuck at 0 while the logit
difference halves, KL tiny while the correct−incorrect margin collapses — so disagreements are
written into ``notes`` rather than left for the reader to spot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from mcp_interp.core import metrics
from mcp_interp.core.answers import Answer, answer_log_probs, describe, resolve_answer_specs, spacing_notes
from mcp_interp.core.bridge import hook_out
from mcp_interp.core.interventions import Ablation, Target, ablation_from_spec, prepare_ablation
from mcp_interp.core.readouts import answer_logits
from mcp_interp.core.tokens import encode
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.common import AblationSpec, Score
from mcp_interp.schemas.heads import AblateHeadMeasurement, AblationOutcome, MetricSet
from mcp_interp.schemas.localize import AblateMeasurement, RandomDirections

# Thresholds for disagreement notes, in the metrics' own units.
LOGIT_DIFF_MOVED = 0.5  # nats of log-odds: a change worth reporting
KL_SMALL = 0.1  # nats
RANDOM_DIRECTIONS = 5  # random unit directions a direction ablation is compared with


def ablate_heads(
    model: LoadedModel,
    prompts: Sequence[str],
    ablation: Ablation | AblationSpec,
    correct: str | Sequence[str] | None = None,
    incorrect: str | Sequence[str] | None = None,
) -> AblateHeadMeasurement:
    """``ablate`` restricted to heads (the ``ablate_head`` tool)."""
    parsed = _parsed(model, ablation)
    outcome = ablation_outcome(model, prompts, parsed, correct, incorrect)
    return AblateHeadMeasurement(heads=[str(h) for h in parsed.heads], **dict(outcome))


def ablate(
    model: LoadedModel,
    prompts: Sequence[str],
    ablation: Ablation | AblationSpec,
    correct: str | Sequence[str] | None = None,
    incorrect: str | Sequence[str] | None = None,
) -> AblateMeasurement:
    """Every metric before and after ablating any targets (heads, MLPs, attention layers, neurons, directions)."""
    parsed = _parsed(model, ablation)
    outcome = ablation_outcome(model, prompts, parsed, correct, incorrect)
    measurement = AblateMeasurement(targets=[str(t) for t in parsed.targets], **dict(outcome))
    if any(t.kind == "direction" for t in parsed.targets):
        measurement.random_directions = random_direction_baseline(model, prompts, parsed, correct, incorrect)
        measurement.notes.append(compare_with_random(measurement, measurement.random_directions))
    return measurement


def random_unit_vectors(n: int, d_model: int, seed: int) -> torch.Tensor:
    """``n`` directions uniform on the unit sphere of R^d_model (normalised Gaussians), from a seeded CPU
    generator so the same seed draws the same directions on every machine."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    draws = torch.randn(n, d_model, generator=generator, dtype=torch.float64)
    return (draws / draws.norm(dim=1, keepdim=True)).to(torch.float32)


def residual_rows(model: LoadedModel, prompts: Sequence[str], layers: Sequence[int]) -> dict[int, torch.Tensor]:
    """Every real token's resid_post at each of ``layers`` ([tokens, d_model], float64), from one forward."""
    from mcp_interp.core.patching import capture_forward

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
    directions = [t for t in ablation.targets if t.kind == "direction"]
    rows = residual_rows(model, prompts, sorted({t.layer for t in directions}))
    d_model = int(model.bridge.cfg.d_model)
    generator = torch.Generator(device="cpu").manual_seed(ablation.seed)
    gaussians = torch.randn(RANDOM_DIRECTIONS, len(directions), d_model, generator=generator, dtype=torch.float64)

    def energy(layer: int, unit: torch.Tensor) -> float:
        return float(((rows[layer] @ unit.to(torch.float64)) ** 2).mean())

    matched = [
        energy_matched_directions(rows[t.layer], energy(t.layer, t.direction), gaussians[:, j])
        for j, t in enumerate(directions)
        if t.direction is not None
    ]
    logit_diff: list[float] = []
    log_prob: list[float] = []
    kl: list[float] = []
    energies: list[float] = []
    for i in range(RANDOM_DIRECTIONS):
        drawn = iter(range(len(directions)))
        targets, removed = [], 0.0
        for t in ablation.targets:
            if t.kind != "direction":
                targets.append(t)
                continue
            unit = matched[next(drawn)][i]
            removed += energy(t.layer, unit)
            targets.append(Target(t.layer, "direction", (), unit.to(torch.float32)))
        outcome = ablation_outcome(model, prompts, replace(ablation, targets=targets), correct, incorrect)
        if outcome.before.logit_diff is not None and outcome.after.logit_diff is not None:
            logit_diff.append(outcome.after.logit_diff.value - outcome.before.logit_diff.value)
        log_prob.append(outcome.after.log_prob.value - outcome.before.log_prob.value)
        kl.append(outcome.kl.value)
        energies.append(removed)
    direction_energy = sum(energy(t.layer, t.direction) for t in directions if t.direction is not None)
    return RandomDirections(
        n=RANDOM_DIRECTIONS,
        seed=ablation.seed,
        logit_diff_change=logit_diff or None,
        log_prob_change=log_prob,
        kl=kl,
        direction_energy=direction_energy,
        energy=energies,
    )


def compare_with_random(measurement: AblateMeasurement, baseline: RandomDirections) -> str:
    """One sentence placing the direction's effect among the random directions' effects."""
    if measurement.before.logit_diff is not None and measurement.after.logit_diff is not None:
        name = "logit difference"
        change = measurement.after.logit_diff.value - measurement.before.logit_diff.value
        random = baseline.logit_diff_change or []
    else:
        name, change = "log-prob", measurement.after.log_prob.value - measurement.before.log_prob.value
        random = baseline.log_prob_change
    largest = max(abs(v) for v in random)
    verdict = (
        "larger than every random direction's" if abs(change) > largest else "NOT larger than the random directions'"
    )
    unmatched = [e for e in baseline.energy if abs(e - baseline.direction_energy) > 0.05 * baseline.direction_energy]
    caveat = (
        f" {len(unmatched)} random direction(s) could not be matched within 5 % (energies "
        f"{', '.join(f'{e:.3g}' for e in baseline.energy)} vs {baseline.direction_energy:.3g})."
        if unmatched
        else ""
    )
    return (
        f"Projecting out the direction changes the {name} by {change:+.3f}; {baseline.n} random unit directions at the "
        f"same layer removing the same energy (mean squared projection {baseline.direction_energy:.3g}) change it by "
        f"{', '.join(f'{v:+.3f}' for v in random)} (largest |change| {largest:.3f}): the direction's effect is "
        f"{verdict}.{caveat}"
    )


def _parsed(model: LoadedModel, ablation: Ablation | AblationSpec) -> Ablation:
    if isinstance(ablation, Ablation):
        return ablation
    parsed = ablation_from_spec(ablation, model.bridge.cfg, model)  # a tool's arguments, names as strings or objects
    assert parsed is not None
    return parsed


def ablation_outcome(
    model: LoadedModel,
    prompts: Sequence[str],
    ablation: Ablation,
    correct: Any = None,
    incorrect: Any = None,
) -> AblationOutcome:
    """Every metric with and without ``ablation``. Answers may be several tokens or sets
    (``core.answers``): their log-prob and logit difference are then teacher-forced, ranks are of
    the first token."""
    batch = encode(model.tokenizer, prompts, model.device)
    n = len(batch.texts)
    good = resolve_answer_specs(model.tokenizer, correct, n, "correct") if correct is not None else None
    bad = resolve_answer_specs(model.tokenizer, incorrect, n, "incorrect") if incorrect is not None else None
    prepared = prepare_ablation(model.bridge, batch, ablation)
    clean = answer_logits(model, batch)
    with torch.inference_mode(), model.bridge.hooks(fwd_hooks=prepared.hooks):
        ablated = metrics.at_answer_positions(
            model.bridge(batch.input_ids, return_type="logits"), batch.answer_positions
        )

    notes: list[str] = []
    if good is None:
        tracked = [Answer(model.tokenizer.decode([int(i)]), ((int(i),),), "token") for i in clean.argmax(dim=-1)]
        answer = "clean top-1"
        notes.append("No `correct` answer given: log_prob and rank track each prompt's clean top-1 token.")
    else:
        tracked, answer = good, "correct"
        not_top = [i for i in range(n) if int(clean[i].argmax()) != good[i].first_token]
        if not_top:
            what = "The correct answer" if all(a.kind == "token" for a in good) else "The correct answer's first token"
            notes.append(f"{what} is not the clean top-1 for examples {not_top}.")
    sequences = any(a.kind != "token" for a in tracked + (bad or []))
    if sequences:
        notes.append(
            "Some answer is several tokens or a set: log_prob and logit_diff are teacher-forced sequence "
            "log-probabilities (logit_diff = log P(correct) − log P(incorrect)), with the ablation applied to the "
            "teacher-forced run; rank is that of the first token."
        )
        notes.extend(spacing_notes(model.tokenizer, tracked + (bad or [])))

    def metric_set(logits: torch.Tensor, with_ablation: Ablation | None) -> MetricSet:
        first = [a.first_token for a in tracked]
        if not sequences:
            diff = None
            if bad is not None and good is not None:
                diff = metrics.logit_diff(logits, first, [a.first_token for a in bad])
            return MetricSet(
                logit_diff=diff, log_prob=metrics.answer_logprob(logits, first), rank=metrics.answer_rank(logits, first)
            )
        log_prob = answer_log_probs(model.bridge, batch, tracked, with_ablation)
        diff = None
        if bad is not None and good is not None:
            diff = metrics.score_of(log_prob - answer_log_probs(model.bridge, batch, bad, with_ablation))
        return MetricSet(logit_diff=diff, log_prob=metrics.score_of(log_prob), rank=metrics.answer_rank(logits, first))

    before, after = metric_set(clean, None), metric_set(ablated, ablation)
    kl = metrics.kl_divergence(clean, ablated)
    if (good is None) != (bad is None):
        notes.append("Give both `correct` and `incorrect` to get the logit difference.")
    notes.extend(disagreements(before, after, kl))
    return AblationOutcome(
        method=ablation.method,
        positions=ablation.positions if ablation.positions is not None else "all",  # type: ignore[arg-type]
        mean_over=prepared.mean_over,
        permutation=prepared.permutation,
        answer=answer,
        answer_tokens=[
            describe(model.tokenizer, a) if sequences else model.tokenizer.decode([a.first_token]) for a in tracked
        ],
        before=before,
        after=after,
        kl=kl,
        notes=notes,
    )


def disagreements(before: MetricSet, after: MetricSet, kl: Score) -> list[str]:
    """Plain-language notes where one metric moved and another cannot see it."""
    notes = []
    if before.logit_diff is not None and after.logit_diff is not None:
        ld_before, ld_after = before.logit_diff.value, after.logit_diff.value
        moved = abs(ld_after - ld_before)
        ranks_stuck_at_zero = all(r == 0 for r in before.rank.per_example + after.rank.per_example)
        if ranks_stuck_at_zero and moved >= LOGIT_DIFF_MOVED:
            notes.append(
                f"Rank stayed 0 on every example while the logit difference moved from {ld_before:+.3f} to "
                f"{ld_after:+.3f}: rank is saturated and blind to this effect; cite the logit difference."
            )
        if ld_before > 0 and ld_after < 0.5 * ld_before and kl.value < KL_SMALL:
            notes.append(
                f"KL(clean‖ablated) is only {kl.value:.4f} nats although the logit difference fell from "
                f"{ld_before:+.3f} to {ld_after:+.3f}: the probability mass that moved is small, but the "
                "correct−incorrect margin collapsed. KL alone would call this head unimportant."
            )
        if kl.value >= 1.0 and moved < 0.1 * max(abs(ld_before), 1e-9):
            notes.append(
                f"KL(clean‖ablated) is {kl.value:.3f} nats but the logit difference barely moved "
                f"({ld_before:+.3f} → {ld_after:+.3f}): the ablation changes the output distribution, "
                "not the correct−incorrect comparison."
            )
        if ld_before > 0 > ld_after:
            notes.append(f"The ablation flips the preference: logit difference {ld_before:+.3f} → {ld_after:+.3f}.")
    elif all(r == 0 for r in before.rank.per_example + after.rank.per_example) and kl.value >= KL_SMALL:
        notes.append(
            f"Rank stayed 0 everywhere although KL(clean‖ablated) = {kl.value:.3f} nats: rank is saturated; "
            "give correct/incorrect answers to measure the logit difference."
        )
    return notes
