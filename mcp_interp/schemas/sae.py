"""Results of the sparse-autoencoder tools of the features family: ``sae`` and ``sae_features``.

An SAE (sparse autoencoder, "dictionary") maps the model's activation x at one hook to d_sae
feature activations a ≥ 0, most of them 0, and back to a reconstruction x̂ = a·W_dec + b_dec.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from mcp_interp.schemas.common import Measurement, Provenance

SaeArchitecture = Literal["standard", "jumprelu", "topk"]
"""How an SAE's encoder turns pre-activations into feature activations (SAELens' names)."""


class SaeInfo(BaseModel):
    """Which dictionary produced the numbers, as read from its folder."""

    folder: str = Field(description="Resolved path of the SAE folder (cfg.json + sae_weights.safetensors).")
    architecture: SaeArchitecture = Field(
        description="standard: a = ReLU(pre); jumprelu: a = ReLU(pre) where pre > the feature's threshold, else 0; "
        "topk: only the k largest pre-activations per token are kept (ReLU'd), the rest are 0."
    )
    hook_name: str = Field(
        description="The activation the SAE was trained on, as written in cfg.json (a TransformerLens "
        "HookedTransformer name such as 'blocks.12.hook_resid_post')."
    )
    bridge_hook: str = Field(description="The hook on this server's model where the SAE reads (and splices).")
    layer: int = Field(description="Block index of the hook, 0-based.")
    d_in: int = Field(description="Width of the activation the SAE reads.")
    d_sae: int = Field(description="Number of features (dictionary size); feature ids are 0..d_sae-1.")
    k: int | None = Field(default=None, description="topk only: features active per token.")
    apply_b_dec_to_input: bool = Field(description="Whether b_dec is subtracted from x before encoding.")
    model_name: str | None = Field(default=None, description="The model the SAE was trained on, per cfg.json.")


class FeatureActivation(BaseModel):
    feature: int = Field(description="Feature id, 0..d_sae-1.")
    activation: float = Field(
        description="The feature's activation on this token, > 0 (inactive features are omitted)."
    )


class SaeToken(BaseModel):
    position: int = Field(description="Token index in the text, 0-based.")
    token: str = Field(description="The token as text.")
    l0: int = Field(description="Number of features active (activation > 0) on this token, 0..d_sae.")
    relative_error: float | None = Field(
        description="‖x − x̂‖² / ‖x‖² for this token: 0 = perfect reconstruction, 1 = as bad as predicting 0, "
        "can exceed 1; None when x = 0."
    )
    activation_norm: float = Field(description="‖x‖, the norm of the model's activation at the hook on this token.")
    top_features: list[FeatureActivation] = Field(
        description="The most active features on this token, largest first: at most top_k, only activations > 0."
    )


class SaeMeasurement(Measurement):
    sae: SaeInfo
    text: str
    tokens: list[str] = Field(description="The text's tokens under the server's tokenization rule.")
    top_k: int = Field(description="How many features per token were asked for.")
    per_token: list[SaeToken] = Field(description="One entry per token, in order.")
    fraction_variance_explained: float | None = Field(
        description="1 − Σ_t ‖x_t − x̂_t‖² / Σ_t ‖x_t − x̄‖² over the text's tokens t (x̄ = the mean activation over "
        "those tokens): 1 = perfect, 0 = no better than x̄, negative = worse than x̄. None with fewer than 2 "
        "tokens or zero variance."
    )
    fraction_variance_explained_excluding_first: float | None = Field(
        description="The same over tokens 1..n−1: the first token is often an attention sink with an outlier norm "
        "that dominates the sums (SAELens' own evaluations drop it). None with fewer than 3 tokens."
    )
    l0: float = Field(description="Mean number of active features per token (≥ 0; 0 = the SAE is dead on this text).")
    features_active: int = Field(description="Distinct features active on at least one token of the text.")
    clean_loss: float | None = Field(
        description="Mean next-token cross-entropy of the text, nats, unmodified model. None with fewer than 2 tokens."
    )
    spliced_loss: float | None = Field(
        description="The same with the SAE's reconstruction x̂ replacing the activation at the hook at every position "
        "(nats, ≥ 0; lower = better; equal to clean_loss for a perfect SAE)."
    )
    zero_ablation_loss: float | None = Field(
        description="The same with the activation at the hook replaced by 0 at every position: the scale against "
        "which the spliced loss is judged."
    )
    loss_recovered: float | None = Field(
        description="(zero_ablation_loss − spliced_loss) / (zero_ablation_loss − clean_loss): 1 = splicing the SAE in "
        "costs nothing, 0 = as bad as zeroing the activation, negative = worse than zeroing; None when the "
        "denominator is 0 or there is no loss."
    )
    figure_uri: str | None = Field(
        default=None, description="Token × feature heatmap of the top features' activations, figure://…"
    )


class SaeResult(Provenance, SaeMeasurement):
    pass


class TextTokens(BaseModel):
    text: str
    tokens: list[str] = Field(description="The text's tokens under the server's tokenization rule.")


class FeatureOnText(BaseModel):
    activations: list[float] = Field(description="The feature's activation on each token of the text, ≥ 0, in order.")
    max: float = Field(description="Largest activation on this text (0 = the feature never fires on it).")
    max_position: int = Field(description="Token index of the largest activation (the first one on ties).")
    max_token: str = Field(description="The token at max_position.")


class FeatureReport(BaseModel):
    feature: int = Field(description="Feature id, 0..d_sae-1.")
    texts: list[FeatureOnText] = Field(description="One entry per text, in the order given.")
    max: float = Field(description="Largest activation over every token of every text, ≥ 0.")
    active_fraction: float = Field(description="Fraction of all tokens of all texts where the feature is > 0, [0, 1].")


class SaeFeaturesMeasurement(Measurement):
    sae: SaeInfo
    texts: list[TextTokens] = Field(description="The texts and their tokens, in the order given.")
    features: list[FeatureReport] = Field(description="One entry per requested feature, in the order given.")


class SaeFeaturesResult(Provenance, SaeFeaturesMeasurement):
    pass
