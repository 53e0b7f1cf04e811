"""``ablate_head``: the head-only preset of the engine's ablation measurement."""

from __future__ import annotations

from collections.abc import Sequence

from mcp_interp.core.engine.ablation.baselines import component_baseline, no_random_sets
from mcp_interp.core.engine.ablation.effect import ablation_outcome, parsed_ablation
from mcp_interp.core.engine.ablation.targets import Ablation
from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.numbers import stats
from mcp_interp.core.engine.references import Lookup
from mcp_interp.schemas.common import Intervention
from mcp_interp.schemas.heads import AblateHeadMeasurement


def ablate_heads(
    model: LoadedModel,
    prompts: Sequence[str],
    ablation: Ablation | Intervention,
    correct: str | Sequence[str] | None = None,
    incorrect: str | Sequence[str] | None = None,
    random_draws: int = stats.MOST_DRAWS,
    lookup: Lookup | None = None,
) -> AblateHeadMeasurement:
    """``ablate`` restricted to heads (the ``ablate_head`` tool), with the heads ranked among random heads of a band of
    layers around them (``component_baseline``)."""
    require(model.backend, "ablate_head")
    parsed = parsed_ablation(model, ablation, lookup)
    outcome = ablation_outcome(model, prompts, parsed, correct, incorrect)
    measurement = AblateHeadMeasurement(heads=[str(h) for h in parsed.heads], **dict(outcome))
    baseline = component_baseline(model, prompts, parsed, correct, incorrect, random_draws)
    if baseline is None and (why := no_random_sets(model, parsed, random_draws)):
        measurement.notes.append(why)
    if baseline is not None:
        measurement.random_baseline = baseline
        ordered = sorted(baseline.draws)
        spread = f", {baseline.statistic} {ordered[0]:+.3f} to {ordered[-1]:+.3f}" if ordered else ""
        measurement.notes.append(
            f"Against random heads ({len(ordered)} sets of {baseline.pool_size}{spread}), the heads' "
            f"{baseline.statistic} {baseline.real:+.3f}: {baseline.verdict}."
        )
    return measurement
