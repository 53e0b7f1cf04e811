"""Output of ``explain``: findings that cite numbers from the lens, DLA and patching stages."""

from __future__ import annotations

from pydantic import BaseModel, Field

from mcp_interp.schemas.common import Measurement, Provenance
from mcp_interp.schemas.lens import Contribution
from mcp_interp.schemas.localize import PatchCell

# --- explain --------------------------------------------------------------------------------


class CausalHead(BaseModel):
    head: str
    recovered_fraction: float | None = Field(
        description="Fraction of the clean−corrupt logit-difference gap restored by patching this head's clean output "
        "into the corrupt run (exact); 1 = all of it."
    )
    attribution_estimate: float | None = None
    dla: float = Field(description="The head's direct logit attribution in the clean run (what it writes there).")
    patch_effect: float = Field(
        description="Total effect of the patch in logits: patched − corrupt logit difference (direct + through what "
        "reads it after: its layer's MLP and later layers)."
    )
    direct_effect: float = Field(
        description="The part of patch_effect read directly from the head's changed output: DLA of "
        "output(clean) − output(corrupt) at the answer position, with the corrupt run's final-norm scale frozen. "
        "patch_effect − direct_effect is what passes through later layers."
    )


class Carrier(BaseModel):
    """A run of consecutive layers whose residual stream at one position carries the clean−corrupt gap."""

    position: int = Field(description="Token index (0-based).")
    token: str = Field(description="The prompt's token at `position`.")
    from_layer: int = Field(description="First layer (resid_pre, i.e. the input of that block) of the run.")
    to_layer: int = Field(description="Last layer of the run, inclusive.")
    min_fraction: float = Field(description="Smallest resid_pre recovered fraction over the run (1 = all of the gap).")
    max_fraction: float = Field(description="Largest resid_pre recovered fraction over the run.")


class Move(BaseModel):
    """Where the top carrying position changes to a later one and stays: information moving forward (by attention,
    the only way between positions) unless the new position's own token differs (``to_position_differs``)."""

    from_position: int
    from_token: str
    to_position: int
    to_token: str
    to_position_differs: bool = Field(
        description="True when to_position's own token differs between the prompts: then the change of carrier need "
        "not be a move (it may come from that token); False: only attention can have brought the difference there."
    )
    layer: int = Field(
        description="First layer whose input (resid_pre) has `to_position` as the top position (≥ 0.3 of the gap, "
        "staying for 2 layers); the move was made by earlier blocks."
    )
    attention_layer: int | None = Field(
        description="The earlier layer (< `layer`) whose attn_out at `to_position` recovers the most, if that is ≥ 0.1 "
        "of the gap (the block that moved it); None otherwise or if attn_out was not patched there."
    )
    attention_fraction: float | None = Field(description="That attn_out cell's recovered fraction (1 = all of it).")


class ExplainMeasurement(Measurement):
    BULKY = ("resid_pre_map", "attn_out_map", "mlp_out_map")

    prompt: str
    answer: str
    baseline: str
    corrupt: str | None
    logit_diff: float = Field(description="logit(answer) − logit(baseline) in the real run.")
    answer_prob: float
    answer_rank: int
    forms_at_layer: int | None = Field(description="logit_lens' first_top1_layer for the answer (−1 = the embedding).")
    top_dla: list[Contribution]
    causal_heads: list[CausalHead] | None = Field(
        default=None, description="With a corrupt prompt: heads by exact patching recovered fraction."
    )
    clean_corrupt_gap: float | None = None
    map_tokens: list[str] | None = Field(
        default=None,
        description="With `corrupt`: the maps' tokens ('clean/corrupt' where they differ).",
    )
    resid_pre_map: list[list[float | None]] | None = Field(
        default=None,
        description="With `corrupt`: [layer][position] recovered fraction of patching resid_pre, as patch returns it.",
    )
    attn_out_map: list[list[float | None]] | None = Field(
        default=None,
        description="With `corrupt`: [layer][position] for attn_out at up to 4 positions whose resid_pre reaches 0.1 "
        "(None elsewhere; null if none does).",
    )
    mlp_out_map: list[list[float | None]] | None = Field(
        default=None, description="With `corrupt`: [layer][position] for mlp_out, at attn_out_map's positions."
    )
    carriers: list[Carrier] | None = Field(
        default=None,
        description="With `corrupt`: runs of layers where one position's resid_pre recovers ≥ 0.2 of the gap.",
    )
    moves: list[Move] | None = Field(default=None, description="With `corrupt`: where the carrying position changes.")
    top_mlps: list[PatchCell] | None = Field(
        default=None, description="With `corrupt`: mlp_out_map's cells by |recovered fraction|."
    )
    top_attention: list[PatchCell] | None = Field(
        default=None, description="With `corrupt`: attn_out_map's cells by |recovered fraction|."
    )
    findings: list[str] = Field(description="Plain-language findings, each citing its numbers.")
    caveats: list[str]
    stage_seconds: dict[str, float] = Field(description="Wall time of each stage.")
    report_uri: str | None = Field(default=None, description="report://… Markdown report citing every number.")
    figure_uris: list[str] = Field(default_factory=list)


class ExplainResult(Provenance, ExplainMeasurement):
    pass
