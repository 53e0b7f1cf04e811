"""Outputs every ablation shares: the metrics before and after (``ablate``, ``ablate_head``) and the random
baseline a residual-direction ablation is judged against."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from mcp_interp.schemas.common import ANSWER_KIND, AblationMethod, AnswerKind, Measurement, PositionsSpec, Score

MeanOver = Literal["per_position", "per_position_from_end"]


class MetricSet(BaseModel):
    logit_diff: Score | None = Field(
        default=None, description="logit(correct) − logit(incorrect); null when no answers were given."
    )
    prob_diff: Score | None = Field(default=None, description="P(correct) − P(incorrect), in [−1, 1]; null likewise.")
    log_prob: Score = Field(description="log P(answer), ≤ 0.")
    rank: Score = Field(description="Rank of the answer; 0 = top-1; saturates at 0.")


class AblationOutcome(Measurement):
    """Every metric before and after an ablation (``ablate_head`` and ``ablate`` share it)."""

    method: AblationMethod
    positions: PositionsSpec
    mean_over: MeanOver | None = Field(
        default=None,
        description="For method 'mean': per_position = the batch mean at the same index (equal lengths); "
        "per_position_from_end = at the same distance from each prompt's last token (unequal lengths; 'last' → the "
        "mean answer-position z).",
    )
    permutation: list[int] | None = Field(
        default=None,
        description="For method 'resample': prompt i received prompt (reference prompt, if given) permutation[i]'s.",
    )
    answer: str = Field(description="Which token log_prob and rank track: 'correct' or the clean run's top-1.")
    answer_kind: AnswerKind = Field(default="token", description=ANSWER_KIND)
    answer_tokens: list[str]
    before: MetricSet = Field(description="Clean run.")
    after: MetricSet = Field(description="Ablated run.")
    kl: Score = Field(description="KL(clean‖ablated) at the answer position, nats, ≥ 0.")


class RandomBaseline(BaseModel):
    """The same ablation with its directions (SAE features) replaced by seeded random ones removing the same energy at
    the ablated positions — or, for heads, neurons, MLPs and attention layers, by random sets of the same kind and
    count, never the real one — the real effect ranked among theirs."""

    replaced: str = Field(description="'directions', 'features' or both.")
    statistic: str = Field(description="What is ranked: the mean change (after − before) of this metric.")
    real: float
    draws: list[float] = Field(description="The statistic for each random draw (as many as the test needed).")
    p_value: float = Field(
        description="Sequential two-sided rank test about `centre`: 10/n when the 10th draw at least as far from it "
        "came at draw n, else (1 + #)/(n_max + 1); valid under H0 'the real one is random'."
    )
    p_floor: float = Field(description="Smallest reachable p; above 0.05 the verdict cannot resolve.")
    pool_size: int | None = Field(description="Distinct other sets drawable (null: unlimited).")
    verdict: str
    seed: int = Field(description="The ablation's `seed`.")
    energy: float | None = Field(
        description="Mean squared norm of what the real directions/features remove at the matched positions (null "
        "for components: those draws are of the same kind and count, not energy-matched)."
    )
    draw_energy: list[float] | None = Field(description="The same per draw (matched to `energy`).")
    matched_positions: int = Field(description="Token positions matched over: every ablated one.")
    centre: float | None = Field(
        default=None, description="The null's centre the test measures distances from (median of real + first draws)."
    )
    notes: list[str] = Field(default_factory=list)


class DirectionProjection(BaseModel):
    """Where the evaluated prompts sit along an ablated direction, at the ablated positions (residual units)."""

    target: str
    mean: float
    sd: float
