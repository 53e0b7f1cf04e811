"""``ablate_head``: the head-only preset of the engine's ablation measurement."""

from __future__ import annotations

from collections.abc import Sequence

from mcp_interp.core.engine.ablation.effect import ablation_outcome, parsed_ablation
from mcp_interp.core.engine.ablation.targets import Ablation
from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.common import Intervention
from mcp_interp.schemas.heads import AblateHeadMeasurement


def ablate_heads(
    model: LoadedModel,
    prompts: Sequence[str],
    ablation: Ablation | Intervention,
    correct: str | Sequence[str] | None = None,
    incorrect: str | Sequence[str] | None = None,
) -> AblateHeadMeasurement:
    """``ablate`` restricted to heads (the ``ablate_head`` tool)."""
    require(model.backend, "ablate_head")
    parsed = parsed_ablation(model, ablation)
    outcome = ablation_outcome(model, prompts, parsed, correct, incorrect)
    return AblateHeadMeasurement(heads=[str(h) for h in parsed.heads], **dict(outcome))
