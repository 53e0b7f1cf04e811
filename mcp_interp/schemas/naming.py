"""Inputs and results of feature naming in the features family: ``feature_examples`` (what makes a feature fire) and
``score_explanation`` (an explanation of it, scored on texts the assistant writes or predicts).

A *feature* is one number per token read off the model: an MLP neuron, the projection on a residual direction, an
SAE feature's or a transcoder feature's encoder activation. Per text, its activation is the maximum over the text's
tokens from position 1 on (position 0 is never scored: without a BOS token it is the attention sink, whose
activations are outliers for many units; with one it is the BOS token itself). A text *fires* when that maximum is
strictly above ``threshold``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from mcp_interp.schemas.common import DirectionRef, ExactRef, Measurement, Provenance

FeatureKind = Literal["neuron", "direction", "sae", "transcoder"]


class SaeFeatureRef(ExactRef):
    sae: str
    feature: int


class TranscoderFeatureRef(ExactRef):
    transcoders: str
    layer: int
    feature: int


FeatureSpec = str | DirectionRef | SaeFeatureRef | TranscoderFeatureRef
FEATURE_DESCRIPTION = (
    "'L6N562' (MLP neuron), {layer, direction} (a vector or 'direction://…'), {sae, feature}, "
    "{transcoders, layer, feature}."
)


class FeatureInfo(BaseModel):
    kind: FeatureKind
    key: str = Field(description="Canonical name; explanations and quizzes are filed under it.")
    description: str
    layer: int
    point: str = Field(description="The hook it is read at.")


class CorpusInfo(BaseModel):
    name: str = Field(description="A shipped corpus, or 'texts' (yours).")
    pool: Literal["search", "held_out", "all"] = Field(description="held_out: quizzes only, never examples.")
    n_texts: int = Field(description="Texts of 2+ tokens read.")
    n_tokens: int = Field(description="Scored tokens (position ≥ 1).")
    license: str | None = None


class Example(BaseModel):
    rank: int = Field(description="1 = largest maximum.")
    text_index: int = Field(description="In the pool read.")
    text: str
    max_activation: float = Field(description="Largest activation over positions ≥ 1.")
    max_position: int = Field(description="Its token index.")
    max_token: str
    window_start: int = Field(description="Token index of tokens[0].")
    tokens: list[str] = Field(description="Tokens around the maximum (± window).")
    activations: list[float] = Field(description="Per token of `tokens`.")


class Quantile(BaseModel):
    quantile: float = Field(description="1 = maximum.")
    token: float = Field(description="Over scored tokens.")
    text_max: float = Field(description="Over per-text maxima.")


class Firing(BaseModel):
    threshold: float = Field(description="A text fires when its maximum is > this (quizzes' default).")
    threshold_rule: str
    texts_firing: float = Field(description="Fraction of texts > threshold.")
    tokens_firing: float = Field(description="Fraction of scored tokens > threshold.")
    tokens_positive: float = Field(description="Fraction of scored tokens > 0.")


class TokenEffect(BaseModel):
    token: str
    token_id: int
    effect: float = Field(description="Logit change per unit of activation (direct path).")


class OutputTokens(BaseModel):
    """What the feature's output does to the logits directly, for units that write to the residual stream."""

    writes: str = Field(description="What the unit adds to the residual stream per unit of activation.")
    method: str
    vector_norm: float
    promoted: list[TokenEffect]
    suppressed: list[TokenEffect] = Field(description="Most negative first.")


class ScoredExplanation(BaseModel):
    explanation_uri: str
    explanation: str
    created: str
    auroc: float | None = Field(default=None, description="Generation.")
    auroc_p: float | None = None
    auroc_p_floor: float | None = None
    balanced_accuracy: float | None = Field(default=None, description="Detection quiz.")
    detection_p: float | None = None
    detection_p_floor: float | None = None


class FeatureExamplesMeasurement(Measurement):
    feature: FeatureInfo
    corpus: CorpusInfo
    examples: list[Example] = Field(description="Top texts by maximum.")
    quantiles: list[Quantile]
    firing: Firing
    output_tokens: OutputTokens | None = None
    explanations: list[ScoredExplanation] = Field(
        default_factory=list, description="Explanations of this feature scored so far, newest first."
    )
    examples_uri: str | None = Field(default=None, description="Top 100 examples, every text's maximum.")


class FeatureExamplesResult(Provenance, FeatureExamplesMeasurement):
    pass


class TextScore(BaseModel):
    text: str
    written_as: Literal["activating", "non_activating"]
    max_activation: float
    max_token: str


class GenerationScore(BaseModel):
    auroc: float = Field(
        description="Over pairs of equal token count: P(activating max > non-activating max) + ½P(=); 0.5 = chance."
    )
    auroc_ci: list[float] = Field(description="95 % (Newcombe).")
    p_value: float = Field(description="One-sided, H0: within each token count the sets are exchangeable.")
    p_floor: float = Field(description="Smallest reachable p; above 0.05 the verdict cannot resolve.")
    p_method: str
    pairs: int = Field(description="Same-length pairs compared.")
    activating_tokens: list[int] = Field(description="Tokens per activating text.")
    non_activating_tokens: list[int]
    verdict: str
    per_text: list[TextScore]


class QuizHandle(BaseModel):
    quiz_id: str = Field(description="Pass it back with `predictions`.")
    texts: list[str] = Field(description="Predict, in order, whether each fires.")
    seed: int
    pool: str


class QuizAnswer(BaseModel):
    text: str
    fires: bool = Field(description="Truth: maximum > threshold.")
    predicted: bool
    max_activation: float


class DetectionScore(BaseModel):
    quiz_id: str
    balanced_accuracy: float = Field(description="(TPR + TNR)/2: 0.5 = chance, 1 = perfect.")
    balanced_accuracy_ci: list[float] = Field(description="Exact 95 %.")
    interval: str
    p_value: float = Field(description="Exact permutation test against chance within token counts, one-sided.")
    p_floor: float = Field(description="Smallest reachable p (all predictions right).")
    true_positive_rate: float
    true_negative_rate: float
    verdict: str
    truth: list[QuizAnswer] = Field(description="The quiz revealed.")


class ScoreExplanationMeasurement(Measurement):
    feature: FeatureInfo
    explanation: str
    threshold: float | None = Field(default=None, description="Fires: maximum > this.")
    generation: GenerationScore | None = None
    quiz: QuizHandle | None = None
    detection: DetectionScore | None = None
    explanation_uri: str | None = None


class ScoreExplanationResult(Provenance, ScoreExplanationMeasurement):
    pass
