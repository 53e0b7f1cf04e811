"""``ablate``: every metric before and after removing any components; residual directions and SAE features are
judged against random stand-ins that remove the same energy at the same positions (``engine.baselines``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mcp_interp.core.engine.ablation.baselines import no_random_sets, random_baseline
from mcp_interp.core.engine.ablation.effect import ablation_outcome, parsed_ablation
from mcp_interp.core.engine.ablation.targets import Ablation
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.numbers import stats
from mcp_interp.core.engine.references import Lookup
from mcp_interp.core.engine.text.components import position_mask
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.schemas.ablation import DirectionProjection, RandomBaseline
from mcp_interp.schemas.common import AblationMethod, Intervention
from mcp_interp.schemas.localize import AblateMeasurement

WHAT_IS_DONE: dict[AblationMethod, str] = {
    "zero": "Projecting out",
    "mean": "Replacing the projection on",
    "resample": "Resampling the projection on",
}


def ablate(
    model: LoadedModel,
    prompts: Sequence[str],
    ablation: Ablation | Intervention,
    correct: str | Sequence[str] | None = None,
    incorrect: str | Sequence[str] | None = None,
    random_draws: int = stats.MOST_DRAWS,
    lookup: Lookup | None = None,
) -> AblateMeasurement:
    """Every metric before and after ablating any targets (heads, MLPs, attention layers, neurons, directions, SAE
    features); with directions or features, ``random_draws`` energy-matched random stand-ins and the rank p-value."""
    parsed = parsed_ablation(model, ablation, lookup)
    outcome = ablation_outcome(model, prompts, parsed, correct, incorrect)
    measurement = AblateMeasurement(targets=[str(t) for t in parsed.targets], **dict(outcome))
    if parsed.directions:
        measurement.projections = direction_projections(model, prompts, parsed)
        measurement.notes.extend(projection_notes(measurement.projections, parsed.method))
    baseline = random_baseline(model, prompts, parsed, correct, incorrect, random_draws)
    if baseline is None and (why := no_random_sets(model, parsed, random_draws)):
        measurement.notes.append(why)
    if baseline is not None:
        measurement.random_baseline = baseline
        measurement.notes.append(compare_with_random(parsed, baseline))
        measurement.notes.extend(baseline.notes)
    return measurement


def direction_projections(model: LoadedModel, prompts: Sequence[str], ablation: Ablation) -> list[DirectionProjection]:
    """The clean prompts' projection x·u on each ablated direction at the ablated positions (mean and sd)."""
    batch = encode(model.tokenizer, prompts, model.device)
    mask = position_mask(ablation.positions, batch.attention_mask, batch.answer_positions)
    acts = model.backend.capture(batch.input_ids, sorted({t.hook() for t in ablation.directions})).acts
    out = []
    for target in ablation.directions:
        values = acts[target.hook()][mask].to(torch.float64)
        projection = values @ target.direction.to(values.device, torch.float64)
        sd = float(projection.std()) if projection.numel() > 1 else 0.0
        out.append(DirectionProjection(target=str(target), mean=float(projection.mean()), sd=sd))
    return out


def projection_notes(projections: Sequence[DirectionProjection], method: AblationMethod) -> list[str]:
    """Zero is not a neutral value for a direction the prompts sit far along: say so, with the numbers."""
    notes = []
    for p in projections:
        if method == "zero" and abs(p.mean) > max(p.sd, 1e-9):
            notes.append(
                f"{p.target}: the prompts' projection is {p.mean:+.3g} on average (sd {p.sd:.3g}); zero-ablation sets "
                f"it to 0 for every prompt, a shift of {-p.mean:+.3g} in the same direction for all, not only a "
                "removal of what varies. Method 'mean' replaces it by the average instead."
            )
    return notes


def compare_with_random(ablation: Ablation, baseline: RandomBaseline) -> str:
    """One sentence: the real effect, the random ones' range, the p-value and the verdict it supports."""
    ordered = sorted(baseline.draws)
    if not ordered:
        return f"No random set of {baseline.replaced} differs from the real one: {baseline.verdict}."
    if baseline.energy is None or baseline.draw_energy is None:  # components: random ones of the same kind
        return (
            f"{ablation.method.capitalize()}-ablating the {baseline.replaced} changes the "
            f"{baseline.statistic.removesuffix(' change')} by {baseline.real:+.3f}; {len(ordered)} random sets of "
            f"{baseline.replaced} of the same kind and count change it by {ordered[0]:+.3f} to {ordered[-1]:+.3f}: "
            f"the real effect {baseline.verdict}."
        )
    energy, draw_energy = baseline.energy, baseline.draw_energy
    mismatched = [e for e in draw_energy if abs(e - energy) > 0.05 * max(energy, 1e-12)]
    caveat = (
        f" {len(mismatched)} of the {len(baseline.draws)} random draws could not be matched within 5 % of the real "
        f"energy {energy:.3g} (theirs {min(draw_energy):.3g}–{max(draw_energy):.3g})."
        if mismatched
        else ""
    )
    what = (
        WHAT_IS_DONE[ablation.method]
        if baseline.replaced == "directions"
        else f"{ablation.method.capitalize()}-ablating"
    )
    return (
        f"{what} the {baseline.replaced} changes the {baseline.statistic.removesuffix(' change')} by "
        f"{baseline.real:+.3f}; {len(ordered)} random {baseline.replaced} removing the same energy "
        f"({baseline.energy:.3g}, over {baseline.matched_positions} positions) change it by {ordered[0]:+.3f} to "
        f"{ordered[-1]:+.3f}: the real effect {baseline.verdict}.{caveat}"
    )
