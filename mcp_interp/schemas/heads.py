"""Outputs of the head tools: ``ablate_head`` and ``patch_heads``."""

from __future__ import annotations

from pydantic import BaseModel, Field

from mcp_interp.schemas.ablation import AblationOutcome, RandomBaseline
from mcp_interp.schemas.common import (
    PATCH_ANSWER_KIND,
    AnswerKind,
    Measurement,
    PatchDirection,
    PatchMethod,
    PatchMetric,
    PositionsSpec,
    Provenance,
    Score,
)

# --- ablate_head ----------------------------------------------------------------------------


class AblateHeadMeasurement(AblationOutcome):
    heads: list[str]
    random_baseline: RandomBaseline | None = Field(
        default=None, description="The heads' effect against random heads of the same layers, same count."
    )


class AblateHeadResult(Provenance, AblateHeadMeasurement):
    pass


# --- patch_heads ----------------------------------------------------------------------------


class HeadScore(BaseModel):
    head: str = Field(description="'L<layer>H<head>'.")
    layer: int
    head_index: int
    score: float | None = Field(
        description="Recovered fraction (denoise) or destroyed fraction (noise) of the clean−corrupt "
        "logit-difference gap, a ratio of means over the pairs: (mean patched − mean corrupt) / (mean clean − mean "
        "corrupt) for denoise; 1 = this head alone carries the whole effect, 0 = none; null if undefined."
    )
    patched_logit_diff: float = Field(description="Mean logit difference of the patched run.")
    per_example_score: list[float | None] | None = Field(
        default=None,
        description="Each pair's own fraction (top heads only; null where its gap is 0). Their mean is not `score`.",
    )
    per_example_patched_logit_diff: list[float] | None = Field(default=None, description="Per pair (top heads only).")


class VerifiedHead(BaseModel):
    head: str
    attribution_score: float | None
    exact_score: float | None


class PatchHeadsMeasurement(Measurement):
    RANKED = ("heads",)
    ROUNDED = ("scores",)
    STORED = ("patched_logit_diff",)

    method: PatchMethod
    approximate: bool = Field(description="True for attribution patching (a first-order estimate).")
    direction: PatchDirection = Field(
        description="denoise: run corrupt, patch in clean z; noise: run clean, patch in corrupt z."
    )
    metric: PatchMetric = Field(
        default="logit_diff",
        description="What is read at the answer: logit_diff (logit(correct) − logit(incorrect); with answers of "
        "several tokens log P(correct) − log P(incorrect), teacher-forced), log_prob (log P(correct)), or kl "
        "(KL(clean‖run), nats). The *_logit_diff fields hold this metric.",
    )
    answer_kind: AnswerKind | None = Field(default=None, description=PATCH_ANSWER_KIND)
    positions: PositionsSpec
    clean_logit_diff: Score = Field(description="The metric on the clean prompts.")
    corrupt_logit_diff: Score = Field(description="The metric on the corrupt prompts.")
    differing_positions: list[list[int]] = Field(
        description="Per pair, token positions where clean and corrupt differ."
    )
    scores: list[list[float | None]] | None = Field(
        default=None,
        description="[n_layers][n_heads] score (see HeadScore.score); null for heads not evaluated. Inline to 3 "
        "decimals; full precision in result_uri (result://…).",
    )
    patched_logit_diff: list[list[float | None]] | None = Field(
        default=None,
        description="[n_layers][n_heads] mean patched metric. Always null in a returned result: it is in result_uri.",
    )
    heads: list[HeadScore] = Field(
        description="Evaluated heads by |score|, largest first. score: a ratio of means over pairs; the top 10 carry "
        "per_example_score, each pair's own ratio."
    )
    verified: list[VerifiedHead] | None = Field(
        default=None, description="With verify_top: the top heads re-run exactly, both numbers side by side."
    )
    figure_uri: str | None = Field(default=None, description="Heatmap of scores (layers × heads), figure://…")
    sweep: str | None = Field(default=None, description="How exact patched runs were computed (exact runs only).")
    engine_requests: int | None = Field(default=None, description="Remote backends: requests the exact runs took.")
    rows: int | None = Field(default=None, description="Remote backends: patched rows they carried.")


class PatchHeadsResult(Provenance, PatchHeadsMeasurement):
    pass
