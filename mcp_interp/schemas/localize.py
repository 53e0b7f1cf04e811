"""Results of the localize family: ``patch`` (component × layer × position) and ``loss``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mcp_interp.schemas.ablation import AblationOutcome, DirectionProjection, RandomBaseline
from mcp_interp.schemas.common import (
    PATCH_ANSWER_KIND,
    AnswerKind,
    Measurement,
    PatchDirection,
    PatchMethod,
    PatchMetric,
    Provenance,
    Score,
)

GRID = " Inline to 3 decimals; full precision in result_uri (result://…)."
STORED_GRID = " Always null in a returned result: the full grid is in result_uri (result://…)."

Component = Literal["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "heads_by_pos", "mlp_neurons"]


class NoiseCorruption(BaseModel):
    """Causal tracing's corruption (Meng et al. 2022): the corrupt run is the clean prompt with Gaussian noise added to
    the token embeddings of some positions — the subject's tokens, found in each prompt, or fixed indices."""

    model_config = ConfigDict(extra="forbid")
    positions: list[int] | None = Field(default=None, description="Token indices noised in every prompt.")
    subjects: str | list[str] | None = Field(
        default=None, description="Text located in each prompt (one for all, or one per prompt); its tokens are noised."
    )
    scale: float = Field(default=3.0, gt=0, le=100, description="The noise's std in units of the embeddings' std.")
    samples: int = Field(default=10, ge=1, le=100, description="Noise draws per prompt, their metrics averaged.")
    seed: int = 0


class NoiseInfo(BaseModel):
    sigma: float = Field(description="Standard deviation of the Gaussian noise added to each embedding coordinate.")
    scale: float = Field(description="sigma in units of embedding_std (ROME used 3).")
    embedding_std: float = Field(description="Std of the token embeddings' coordinates (`std_of` says over what).")
    std_of: str
    samples: int = Field(description="Noise draws per prompt; every corrupt metric is their mean.")
    seed: int
    positions: list[list[int]] = Field(description="Per prompt: the token positions noised.")


class PositionToken(BaseModel):
    position: int = Field(description="Token index (0-based) in the pair.")
    clean_token: str = Field(description="The first clean prompt's token here ('' past its end).")
    corrupt_token: str = Field(description="The first corrupt prompt's token here ('' past its end).")
    differs_in_pairs: int = Field(description="How many pairs have different clean and corrupt tokens here.")


class PatchCell(BaseModel):
    label: str = Field(description="The cell in words, e.g. \"layer 12, token ' John' (position 9)\".")
    layer: int
    head: int | None = Field(default=None, description="Head index (heads_by_pos only).")
    neuron: int | None = Field(default=None, description="Neuron index (mlp_neurons only).")
    position: int | None = Field(default=None, description="Token position; None = every position (neurons).")
    token: str | None = Field(default=None, description="The first clean prompt's token at `position`.")
    score: float | None = Field(
        description="Recovered (denoise) or destroyed (noise) fraction of the clean−corrupt gap of the metric: "
        "1 = this cell alone carries it, 0 = nothing, negative = works against it; None when undefined."
    )
    patched: float = Field(description="Mean metric value of the patched run.")
    per_example_score: list[float | None] | None = Field(default=None, description="Per pair (top cells only).")
    per_example_patched: list[float] | None = Field(default=None, description="Per pair (top cells only).")
    interval: list[float] | None = Field(
        default=None, description="Top cells, ≥ 4 pairs: 95% bootstrap interval of `score` over the pairs."
    )


class VerifiedCell(BaseModel):
    label: str
    attribution_score: float | None
    exact_score: float | None


class PatchMeasurement(Measurement):
    RANKED = ("cells",)
    ROUNDED = ("scores", "head_scores")
    BULKY = ("head_scores",)  # layer × head × position: over the budget on a large model (then in result:// only)
    STORED = ("patched", "head_patched")

    component: Component
    method: PatchMethod
    approximate: bool = Field(description="True for attribution (a first-order gradient estimate).")
    direction: PatchDirection = Field(
        description="denoise: corrupt run, clean activation patched in; noise: clean run, corrupt patched in."
    )
    metric: PatchMetric = Field(
        description="logit_diff: logit(correct) − logit(incorrect); log_prob: log P(correct); "
        "kl: KL(clean‖run) at the answer position, nats (0 for the clean run)."
    )
    answer_kind: AnswerKind | None = Field(default=None, description=PATCH_ANSWER_KIND)
    clean: Score = Field(description="The metric on the clean prompts.")
    corrupt: Score = Field(description="The metric on the corrupt prompts.")
    tokens: list[PositionToken] = Field(description="Every position of the (padded) batch, with its tokens.")
    differing_positions: list[list[int]] = Field(description="Per pair: token positions where clean ≠ corrupt.")
    skipped_positions: list[int] = Field(
        description="Positions before the first where any pair differs, in a causal model: clean and corrupt "
        "activations are identical there, so a patch is a no-op; score 0 in the grids, not run, not in cells. Empty "
        "where attention is bidirectional (every position is run)."
    )
    scores: list[list[float | None]] | None = Field(
        default=None,
        description="[layer][position] score for resid_*/attn_out/mlp_out (None = not requested)." + GRID,
    )
    patched: list[list[float | None]] | None = Field(
        default=None, description="[layer][position] mean patched metric, same layout as `scores`." + STORED_GRID
    )
    head_scores: list[list[list[float | None]]] | None = Field(
        default=None,
        description="[layer][head][position] score for heads_by_pos (None = not requested). Inline to 3 decimals "
        "when it fits; full precision in result_uri.",
    )
    head_patched: list[list[list[float | None]]] | None = Field(
        default=None,
        description="[layer][head][position] mean patched metric, same layout as `head_scores`." + STORED_GRID,
    )
    cells: list[PatchCell] = Field(description="Cells run, by |score|, per-example values for the top 10.")
    verified: list[VerifiedCell] | None = Field(
        default=None, description="With attribution and verify_top: exact scores of the top cells."
    )
    sweep: str | None = Field(default=None, description="How exact patched runs were computed.")
    engine_requests: int | None = Field(default=None, description="Remote backends: requests the exact runs took.")
    rows: int | None = Field(default=None, description="Remote backends: patched rows they carried.")
    noise: NoiseInfo | None = Field(default=None, description="With `noise`: the corruption as run.")
    figure_uri: str | None = Field(default=None, description="Heatmap of scores, figure://…")


class PatchResult(Provenance, PatchMeasurement):
    pass


class TextLoss(BaseModel):
    text: str
    tokens: list[str] = Field(description="The text's tokens; token k+1 is predicted at position k.")
    loss: list[float] = Field(description="Per predicted token: −log P(token | text before it), nats, ≥ 0.")
    correct: list[bool] = Field(description="Per predicted token: was it the model's top-1 prediction?")
    mean_loss: float = Field(description="Mean of `loss` over the scored tokens (next-token cross-entropy, nats).")
    accuracy: float = Field(description="Fraction of scored tokens that were the top-1, in [0, 1].")
    scored_positions: list[int] = Field(
        description="Token indices k whose loss (loss[k − 1]) enters mean_loss and accuracy: `positions`, default "
        "every token after the first."
    )


class LossMeasurement(Measurement):
    intervention: str | None = Field(default=None, description="The intervention applied, in words; None = none.")
    texts: list[TextLoss]
    mean_loss: float = Field(description="Cross-entropy over the scored tokens of every text, nats.")
    accuracy: float = Field(description="Top-1 accuracy over the scored tokens of every text.")
    clean_mean_loss: float | None = Field(
        default=None, description="With an intervention: the same loss without it, for comparison."
    )
    clean_accuracy: float | None = Field(default=None, description="With an intervention: accuracy without it.")


class LossResult(Provenance, LossMeasurement):
    pass


class AblateMeasurement(AblationOutcome):
    targets: list[str] = Field(description="The ablated components, as parsed (e.g. 'L9H3', 'L28MLP').")
    random_baseline: RandomBaseline | None = Field(
        default=None,
        description="The effect against random ones: energy-matched directions or SAE features when there are any, "
        "else random heads, neurons, MLPs or attention layers of the same kind and count.",
    )
    projections: list[DirectionProjection] = Field(
        default_factory=list, description="Per ablated direction: the prompts' projection on it before ablating."
    )


class AblateResult(Provenance, AblateMeasurement):
    pass
