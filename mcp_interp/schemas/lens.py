"""Outputs of the lens tools: ``logit_lens``, ``dla``, ``attention``, ``induction``, ``steer``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from mcp_interp.schemas.common import Measurement, Provenance

# --- logit_lens -----------------------------------------------------------------------------


class TokenProb(BaseModel):
    token: str
    id: int
    prob: float = Field(description="Probability in [0, 1].")


class LensLayer(BaseModel):
    layer: int = Field(description="The block whose output is read; −1 = the embedding (site 'embed').")
    site: Literal["embed", "resid_post"] = Field(description="'embed' (before block 0) or the block's resid_post.")
    top: list[TokenProb] = Field(description="Top-k tokens of the final norm + unembedding of this residual.")
    target_prob: float
    target_rank: int = Field(description="Tokens with a strictly higher logit; 0 = top-1.")
    target_tied: int = Field(
        default=0, description="Other tokens with the target's logit: rank 0 with ties is no top-1."
    )


class LogitLensMeasurement(Measurement):
    prompt: str
    target: str = Field(description="Token tracked across layers (the model's own top-1 if none was given).")
    target_id: int
    answer_position: int
    layers: list[LensLayer]
    first_top1_layer: int | None = Field(
        description="First layer (as in layers[].layer; −1 = the embedding) from which the target is top-1, untied, "
        "to the end; null if never."
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
    BULKY = ("pattern",)

    prompt: str
    layer: int
    head: int
    tokens: list[str]
    pattern: list[list[float]] | None = Field(description="[query][key] attention weights (causal: key ≤ query).")
    answer_position: int
    top_attended: list[AttendedToken] = Field(description="Keys the answer position attends to most.")
    figure_uri: str | None = None


class AttentionResult(Provenance, AttentionMeasurement):
    pass


# --- induction ------------------------------------------------------------------------------


class InductionMeasurement(Measurement):
    RANKED = ("heads",)

    seq_len: int
    n_seqs: int
    seed: int
    prefix: str | None = Field(default=None, description="Text whose tokens start every sequence, if given.")
    scores: list[list[float]] = Field(
        description="[n_layers][n_heads] mean attention from each token of the repeated half to the token "
        "after its earlier occurrence; in [0, 1]; ~1/position for a uniform head, near 1 for an induction head."
    )
    heads: list[Contribution] = Field(description="Heads sorted by induction score (component = 'L<l>H<h>').")
    sequences: list[list[int]] = Field(
        description="The token ids run, one list per sequence: the start (BOS if the tokenizer prepends one, or the "
        "prefix's tokens), then seq_len random tokens twice. Pass them to `loss` as `token_ids`."
    )
    predicted_positions: list[int] = Field(
        description="Token indices of the second copy (after its first token) that an induction head lets the model "
        "predict: `loss` with these `positions` measures the loss induction should lower."
    )
    figure_uri: str | None = None


class InductionResult(Provenance, InductionMeasurement):
    pass


# --- steer ----------------------------------------------------------------------------------


class ConceptBaseline(BaseModel):
    """The steered continuation's concept score ranked among the continuations of stand-in vectors of the same norm at
    the same site (differences of two reference texts' activations there; greedy, same prompt), drawn sequentially."""

    concept: str = Field(description="What the score is (see `steer`'s `concept`).")
    real: float = Field(description="The steered continuation's score.")
    unsteered: float = Field(description="The unsteered continuation's score, for scale.")
    draws: list[float] = Field(description="Each stand-in's continuation's score.")
    p_value: float = Field(
        description="Sequential rank test, 'greater': 10/n when the 10th stand-in score ≥ real came at draw n, else "
        "(1 + #)/(n_max + 1); valid under H0 'the vector is one more stand-in'."
    )
    p_floor: float = Field(description="Smallest reachable p: 1/(random_draws + 1).")
    verdict: str = Field(
        description="Reported without a verdict: the test's simulated size on SmolLM2 is above 0.06 "
        "(docs/calibration.md)."
    )


class SteerMeasurement(Measurement):
    prompt: str
    positive: str | None = Field(default=None, description="ActAdd: the text whose residual is added.")
    negative: str | None = Field(default=None, description="ActAdd: the text whose residual is subtracted.")
    direction_uri: str | None = Field(default=None, description="The stored direction steered along, if any.")
    sae_feature: str | None = Field(
        default=None, description="The SAE or transcoder feature whose decoder row is added, if any."
    )
    layer: int
    site: str = Field(
        description="Where the vector is added: resid_pre of `layer` (ActAdd), resid_post of `layer` (a stored "
        "direction, the stream its probe read), or the SAE's site (resid_pre, resid_mid, resid_post, attn_out, "
        "mlp_out, z, mlp_post) for a feature."
    )
    coefficient: float = Field(
        description="ActAdd: multiplier of resid(positive) − resid(negative). A stored direction: in units of the std "
        "of its probe texts' projections (1 = one typical spread along the direction). An SAE feature: the "
        "activation added (coefficient × its decoder row)."
    )
    vector_norm: float = Field(description="L2 norm of the coefficient's unit (the added vector ÷ |coefficient|).")
    added_norm: float = Field(description="L2 norm of the vector actually added: |coefficient| × vector_norm.")
    residual_norm: float = Field(description="L2 norm of the prompt's residual at that site (last token), for scale.")
    residual_norms: list[float] = Field(
        default_factory=list, description="The same at every prompt position (a note says where added_norm exceeds it)."
    )
    next_token_kl: float = Field(
        description="KL(baseline‖steered) of the next-token distribution after the prompt, nats, ≥ 0: how much the "
        "first prediction moves."
    )
    random_next_token_kl: list[float] = Field(
        description="The same KL for stand-ins of norm random_norm at the same site: differences of two reference "
        "texts' activations there, cut to the vector's texts' token counts (seeded by `seed`)."
    )
    random_norm: float = Field(description="L2 norm each stand-in was scaled to: added_norm.")
    random_p_value: float = Field(
        description="Sequential rank test of next_token_kl among the stand-ins' KLs ('greater'; 10/n when the 10th "
        "KL ≥ it came at draw n, else (1 + #)/(n_max + 1)): the prediction moved more than the stand-ins move it."
    )
    random_p_floor: float = Field(description="Smallest reachable p: 1/(random_draws + 1).")
    baseline_text: str = Field(description="Greedy continuation without steering.")
    steered_text: str = Field(description="Greedy continuation with the vector added at every position.")
    repetition_baseline: float = Field(description="Fraction of repeated 3-grams in the baseline continuation.")
    repetition_steered: float = Field(description="Fraction of repeated 3-grams in the steered continuation.")
    concept_baseline: ConceptBaseline | None = Field(
        default=None, description="With `concept`: the steered text's score against the stand-ins' texts."
    )
    random_continuations: list[str] = Field(
        default_factory=list, description="With `concept`: the first 3 stand-ins' continuations."
    )


class SteerResult(Provenance, SteerMeasurement):
    pass
