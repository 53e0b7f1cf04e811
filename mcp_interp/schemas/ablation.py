"""Outputs every ablation shares: the metrics before and after (``ablate``, ``ablate_head``) and the random
baseline a residual-direction ablation is judged against."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from mcp_interp.schemas.common import Measurement, PositionsSpec, Score


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


class RandomDirections(BaseModel):
    """The same ablation with each residual direction replaced by a random unit direction at its layer that
    removes the same energy (mean squared projection over the prompts' tokens), so effects compare like with like."""

    n: int = Field(description="How many random directions (seeded, energy-matched to the real one).")
    seed: int = Field(description="Seed of the draws (the ablation's `seed`).")
    logit_diff_change: list[float] | None = Field(
        default=None, description="Per random direction: mean logit difference after − before (None without answers)."
    )
    log_prob_change: list[float] = Field(description="Per random direction: mean log-prob after − before.")
    kl: list[float] = Field(description="Per random direction: mean KL(clean‖ablated), nats.")
    direction_energy: float = Field(
        description="Mean squared projection of the prompts' residuals on the ablated direction(s), over every "
        "token: the energy projecting it out removes (residual units²)."
    )
    energy: list[float] = Field(description="The same for each random direction: compare before comparing effects.")
