"""Output of ``explain``: findings that cite numbers from the lens, DLA and patching stages."""

from __future__ import annotations

from pydantic import BaseModel, Field

from mcp_interp.schemas.common import Measurement, Provenance
from mcp_interp.schemas.lens import Contribution

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
        description="Total effect of the patch in logits: patched − corrupt logit difference (direct + through later "
        "layers)."
    )
    direct_effect: float = Field(
        description="The part of patch_effect read directly from the head's changed output: DLA of "
        "output(clean) − output(corrupt) at the answer position, with the corrupt run's final-norm scale frozen. "
        "patch_effect − direct_effect is what passes through later layers."
    )


class ExplainMeasurement(Measurement):
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
    findings: list[str] = Field(description="Plain-language findings, each citing its numbers.")
    caveats: list[str]
    stage_seconds: dict[str, float] = Field(description="Wall time of each stage.")
    report_uri: str | None = Field(default=None, description="report://… Markdown report citing every number.")
    figure_uris: list[str] = Field(default_factory=list)


class ExplainResult(Provenance, ExplainMeasurement):
    pass
