"""Outputs of the head tools: ``ablate_head`` and ``patch_heads``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from mcp_interp.schemas.common import Measurement, PositionsSpec, Provenance, Score

# --- ablate_head ----------------------------------------------------------------------------


class MetricSet(BaseModel):
    logit_diff: Score | None = Field(
        default=None, description="logit(correct) − logit(incorrect); null when no answers were given."
    )
    log_prob: Score = Field(description="log P(answer), ≤ 0.")
    rank: Score = Field(description="Rank of the answer; 0 = top-1; saturates at 0.")


class AblationOutcome(Measurement):
    """Every metric before and after an ablation (``ablate_head`` and ``ablate`` share it)."""

    method: Literal["zero", "mean", "resample"]
    positions: PositionsSpec
    mean_over: Literal["per_position", "per_position_from_end"] | None = Field(
        default=None,
        description="For method 'mean': per_position = each position gets the batch mean at that index (equal "
        "lengths); per_position_from_end = each position gets the batch mean at the same distance from each prompt's "
        "last token (unequal lengths; 'last' → the mean answer-position z).",
    )
    permutation: list[int] | None = Field(
        default=None, description="For method 'resample': prompt i received prompt permutation[i]'s activation."
    )
    answer: str = Field(description="Which token log_prob and rank track: 'correct' or the clean run's top-1.")
    answer_tokens: list[str]
    before: MetricSet = Field(description="Clean run.")
    after: MetricSet = Field(description="Ablated run.")
    kl: Score = Field(description="KL(clean‖ablated) at the answer position, nats, ≥ 0.")


class AblateHeadMeasurement(AblationOutcome):
    heads: list[str]


class AblateHeadResult(Provenance, AblateHeadMeasurement):
    pass


# --- patch_heads ----------------------------------------------------------------------------


class HeadScore(BaseModel):
    head: str = Field(description="'L<layer>H<head>'.")
    layer: int
    head_index: int
    score: float | None = Field(
        description="Recovered fraction (denoise) or destroyed fraction (noise) of the clean−corrupt "
        "logit-difference gap; 1 = this head alone carries the whole effect, 0 = none; null if undefined."
    )
    patched_logit_diff: float = Field(description="Mean logit difference of the patched run.")
    per_example_score: list[float | None] | None = None
    per_example_patched_logit_diff: list[float] | None = None


class VerifiedHead(BaseModel):
    head: str
    attribution_score: float | None
    exact_score: float | None


class PatchHeadsMeasurement(Measurement):
    method: Literal["exact", "attribution"]
    approximate: bool = Field(description="True for attribution patching (a first-order estimate).")
    direction: Literal["denoise", "noise"] = Field(
        description="denoise: run corrupt, patch in clean z; noise: run clean, patch in corrupt z."
    )
    positions: PositionsSpec
    clean_logit_diff: Score
    corrupt_logit_diff: Score
    differing_positions: list[list[int]] = Field(
        description="Per pair, token positions where clean and corrupt differ."
    )
    scores: list[list[float | None]] = Field(
        description="[n_layers][n_heads] score (see HeadScore.score); null for heads not evaluated."
    )
    patched_logit_diff: list[list[float | None]] = Field(
        description="[n_layers][n_heads] mean patched logit difference."
    )
    heads: list[HeadScore] = Field(description="Evaluated heads sorted by |score|, largest first.")
    verified: list[VerifiedHead] | None = Field(
        default=None, description="With verify_top: the top heads re-run exactly, both numbers side by side."
    )
    figure_uri: str | None = Field(default=None, description="Heatmap of scores (layers × heads), figure://…")
    engine: str | None = Field(default=None, description="How exact patched runs were computed (exact runs only).")


class PatchHeadsResult(Provenance, PatchHeadsMeasurement):
    pass
