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

from mcp_interp.schemas.common import DirectionRef, Measurement, Provenance

FeatureKind = Literal["neuron", "direction", "sae", "transcoder"]


class SaeFeatureRef(BaseModel):
    sae: str = Field(description="An SAELens-format folder or cached hub id.")
    feature: int = Field(description="Feature id, 0..d_sae−1.")


class TranscoderFeatureRef(BaseModel):
    transcoders: str = Field(description="circuit-tracer format: a folder or a cached hub id.")
    layer: int
    feature: int


FeatureSpec = str | DirectionRef | SaeFeatureRef | TranscoderFeatureRef
FEATURE_DESCRIPTION = (
    "'L6N562' (MLP neuron), {layer, direction} (a vector or 'direction://…'), {sae, feature}, "
    "{transcoders, layer, feature}."
)


class FeatureInfo(BaseModel):
    kind: FeatureKind
    key: str = Field(description="Canonical name: explanations and quizzes are filed under it.")
    description: str = Field(description="What the activation is, in words.")
    layer: int
    point: str = Field(description="The model's hook the activation is read from.")


class CorpusInfo(BaseModel):
    name: str = Field(description="A shipped corpus, or 'texts' (the caller's).")
    pool: Literal["search", "held_out", "all"] = Field(
        description="search: the texts examples come from; held_out: the texts quizzes come from (never shown as "
        "examples); all: the caller's texts."
    )
    n_texts: int = Field(description="Texts read (those of one token have no scored position and are left out).")
    n_tokens: int = Field(description="Scored tokens (position ≥ 1) over those texts.")
    license: str | None = Field(default=None, description="The shipped corpus's licence, shortened.")


class Example(BaseModel):
    rank: int = Field(description="1 = the text with the largest activation.")
    text_index: int = Field(description="Index of the text in the pool read.")
    text: str
    max_activation: float = Field(description="The text's largest activation (positions ≥ 1).")
    max_position: int = Field(description="Token index of that maximum (0-based).")
    max_token: str
    window_start: int = Field(description="Token index of tokens[0].")
    tokens: list[str] = Field(description="The tokens around the maximum (± window).")
    activations: list[float] = Field(description="The activation on each of those tokens.")


class Quantile(BaseModel):
    quantile: float = Field(description="0.5 = median, 1 = maximum.")
    token: float = Field(description="Quantile of the activation over every scored token.")
    text_max: float = Field(description="Quantile of the per-text maximum over the texts.")


class Firing(BaseModel):
    threshold: float = Field(description="A text fires when its maximum is > this; the quizzes' default.")
    threshold_rule: str = Field(description="How it was chosen.")
    texts_firing: float = Field(description="Fraction of texts whose maximum is > threshold, [0, 1].")
    tokens_firing: float = Field(description="Fraction of scored tokens > threshold, [0, 1].")
    tokens_positive: float = Field(description="Fraction of scored tokens > 0, [0, 1].")


class TokenEffect(BaseModel):
    token: str
    token_id: int
    effect: float = Field(description="Change of this token's logit per unit of activation (direct path only).")


class OutputTokens(BaseModel):
    """What the feature's output does to the logits directly, for units that write to the residual stream."""

    writes: str = Field(description="The vector the unit adds to the residual stream per unit of activation.")
    method: str = Field(description="How an effect is computed (what is ignored).")
    vector_norm: float
    promoted: list[TokenEffect] = Field(description="Largest effects first.")
    suppressed: list[TokenEffect] = Field(description="Most negative effects first.")


class ScoredExplanation(BaseModel):
    explanation_uri: str = Field(description="explanation://…: the explanation, its scores and their data.")
    explanation: str
    created: str = Field(description="UTC, ISO 8601.")
    auroc: float | None = Field(default=None, description="Generation mode: AUROC of written texts.")
    auroc_p: float | None = None
    balanced_accuracy: float | None = Field(default=None, description="Detection quiz.")
    detection_p: float | None = None


class FeatureExamplesMeasurement(Measurement):
    feature: FeatureInfo
    corpus: CorpusInfo
    examples: list[Example] = Field(description="The top_k texts by their maximum, largest first.")
    quantiles: list[Quantile]
    firing: Firing
    output_tokens: OutputTokens | None = Field(
        default=None, description="Null when the unit writes nothing to the residual stream (see notes)."
    )
    explanations: list[ScoredExplanation] = Field(
        default_factory=list, description="Every explanation of this feature scored on this server, newest first."
    )
    examples_uri: str | None = Field(
        default=None, description="result://…: the top 100 examples and every text's maximum."
    )


class FeatureExamplesResult(Provenance, FeatureExamplesMeasurement):
    pass


class TextScore(BaseModel):
    text: str
    written_as: Literal["activating", "non_activating"]
    max_activation: float
    max_token: str


class GenerationScore(BaseModel):
    auroc: float = Field(
        description="P(an activating text's maximum > a non-activating one's) + ½ P(equal): 1 = perfectly "
        "separated, 0.5 = chance, < 0.5 = backwards."
    )
    auroc_ci: list[float] = Field(description="95 % interval (Newcombe's score interval).")
    p_value: float = Field(description="One-sided, H0: the two sets' activations are exchangeable.")
    p_method: str = Field(description="Exact Mann–Whitney (no ties) or a permutation test of U (ties).")
    verdict: str
    per_text: list[TextScore]


class QuizHandle(BaseModel):
    quiz_id: str = Field(description="quiz://…: pass it back with `predictions`.")
    texts: list[str] = Field(description="Predict for each, in order, whether the feature fires (true) or not (false).")
    seed: int = Field(description="Seed of the draw.")
    pool: str = Field(description="Where the texts were drawn from.")
    n_firing: int = Field(description="How many of them fire (which ones is hidden).")


class QuizAnswer(BaseModel):
    text: str
    fires: bool = Field(description="The truth: its maximum is > threshold.")
    predicted: bool
    max_activation: float


class DetectionScore(BaseModel):
    quiz_id: str
    balanced_accuracy: float = Field(
        description="(true-positive rate + true-negative rate)/2: 0.5 = chance (constant answers too), 1 = perfect."
    )
    balanced_accuracy_ci: list[float] = Field(description="Exact 95 % interval.")
    interval: str = Field(description="clopper_pearson (balanced quiz) or per_class_clopper_pearson.")
    p_value: float = Field(description="One-sided permutation test of the predictions against chance (exact).")
    true_positive_rate: float
    true_negative_rate: float
    verdict: str
    truth: list[QuizAnswer] = Field(description="The quiz revealed, in its order.")


class ScoreExplanationMeasurement(Measurement):
    feature: FeatureInfo
    explanation: str
    threshold: float | None = Field(default=None, description="A text fires when its maximum is > this.")
    generation: GenerationScore | None = None
    quiz: QuizHandle | None = Field(default=None, description="A new detection quiz; truth kept on the server.")
    detection: DetectionScore | None = Field(default=None, description="A quiz scored.")
    explanation_uri: str | None = Field(default=None, description="explanation://… when something was scored.")


class ScoreExplanationResult(Provenance, ScoreExplanationMeasurement):
    pass
