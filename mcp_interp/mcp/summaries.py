"""Summary lines several families' tools share (the text block beside a result; the result itself is the JSON)."""

from __future__ import annotations

from mcp_interp.schemas.ablation import AblationOutcome


def ablation_summary(result: AblationOutcome) -> str:
    """One paragraph for an ablation's before/after (``ablate_head`` and ``ablate``)."""
    diff = ""
    baseline = getattr(result, "random_baseline", None)  # ablate and ablate_head rank the effect among random ones
    if result.before.logit_diff is not None and result.after.logit_diff is not None:
        diff = f"logit difference {result.before.logit_diff.value:+.3f} → {result.after.logit_diff.value:+.3f}; "
    return (
        f"{result.method}-ablation: {diff}log-prob {result.before.log_prob.value:+.3f} → "
        f"{result.after.log_prob.value:+.3f}; KL(clean‖ablated) {result.kl.value:.4f} nats."
        + (f" Against random {baseline.replaced}: p = {baseline.p_value:.3g}." if baseline is not None else "")
        + (f" Notes: {len(result.notes)} (read them)." if result.notes else "")
    )
