"""``ablate``: every metric before and after removing any components; a residual direction is judged against
random directions that remove the same energy."""

from __future__ import annotations

from collections.abc import Sequence

from mcp_interp.core.engine.ablation import ablation_outcome, parsed_ablation
from mcp_interp.core.engine.baselines import random_direction_baseline
from mcp_interp.core.engine.interventions import Ablation
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.ablation import RandomDirections
from mcp_interp.schemas.common import Intervention
from mcp_interp.schemas.localize import AblateMeasurement


def ablate(
    model: LoadedModel,
    prompts: Sequence[str],
    ablation: Ablation | Intervention,
    correct: str | Sequence[str] | None = None,
    incorrect: str | Sequence[str] | None = None,
) -> AblateMeasurement:
    """Every metric before and after ablating any targets (heads, MLPs, attention layers, neurons, directions)."""
    parsed = parsed_ablation(model, ablation)
    outcome = ablation_outcome(model, prompts, parsed, correct, incorrect)
    measurement = AblateMeasurement(targets=[str(t) for t in parsed.targets], **dict(outcome))
    if parsed.directions:
        measurement.random_directions = random_direction_baseline(model, prompts, parsed, correct, incorrect)
        measurement.notes.append(compare_with_random(measurement, measurement.random_directions))
    return measurement


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
