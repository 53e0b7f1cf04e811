"""The Markdown report of an ``explain`` result: every number in it, every figure linked."""

from __future__ import annotations

from mcp_interp.core.explain.findings import layer_words
from mcp_interp.schemas.common import ModelRef
from mcp_interp.schemas.explain import ExplainMeasurement


def report_markdown(result: ExplainMeasurement, model: ModelRef, figures: dict[str, str]) -> str:
    """The Markdown report: every number in `result`, every figure (name → URI) linked."""
    forms = "never" if result.forms_at_layer is None else layer_words(result.forms_at_layer)
    lines = [
        f"# Why does the model say {result.answer!r}?",
        "",
        f"Prompt: `{result.prompt}`  ",
        f"Answer {result.answer!r} vs baseline {result.baseline!r}"
        + (f"; corrupt prompt `{result.corrupt}`" if result.corrupt else ""),
        "",
        f"Model: {model.name} ({model.source}), weights fingerprint `{model.fingerprint}`, {model.dtype} on "
        f"{model.device}; " + ", ".join(f"{k} {v}" for k, v in model.versions.items()),
        "",
        "## Numbers",
        "",
        "| quantity | value |",
        "| --- | --- |",
        f"| logit({result.answer}) − logit({result.baseline}) | {result.logit_diff:+.4f} |",
        f"| P({result.answer}) | {result.answer_prob:.4f} |",
        f"| rank of {result.answer!r} (0 = top-1) | {result.answer_rank} |",
        f"| first layer where it is top-1 (logit lens) | {forms} |",
    ]
    if result.clean_corrupt_gap is not None:
        lines.append(f"| clean − corrupt logit difference | {result.clean_corrupt_gap:+.4f} |")
    lines += ["", "## Findings", ""] + [f"- {f}" for f in result.findings]
    lines += ["", "## Direct logit attribution (top components)", "", "| component | contribution |", "| --- | --- |"]
    lines += [f"| {c.component} | {c.value:+.4f} |" for c in result.top_dla]
    if result.causal_heads:
        lines += ["", "## Head patching (exact)", "", "| head | recovered fraction | DLA |", "| --- | --- | --- |"]
        for c in result.causal_heads:
            fraction = "n/a" if c.recovered_fraction is None else f"{c.recovered_fraction:+.4f}"
            lines.append(f"| {c.head} | {fraction} | {c.dla:+.4f} |")
    if result.carriers is not None:
        lines += ["", "## Where the information sits (layer × position patching, exact)", ""]
        lines += ["| position | token | layers | resid_pre recovered fraction |", "| --- | --- | --- | --- |"]
        lines += [
            f"| {c.position} | {c.token!r} | {c.from_layer}–{c.to_layer} | "
            f"{c.min_fraction:+.4f} to {c.max_fraction:+.4f} |"
            for c in result.carriers
        ]
        for m in result.moves or []:
            by = (
                ""
                if m.attention_layer is None
                else f" (L{m.attention_layer} attn_out there: {m.attention_fraction:+.4f})"
            )
            lines.append(f"\nMoves from position {m.from_position} to {m.to_position} at layer {m.layer}{by}.")
        for title, cells in (("MLP outputs", result.top_mlps), ("Attention outputs", result.top_attention)):
            lines += ["", f"### {title} (layer, position)", "", "| cell | recovered fraction |", "| --- | --- |"]
            lines += [f"| {c.label} | {c.score:+.4f} |" for c in cells or [] if c.score is not None]
    lines += ["", "## Figures", ""] + [f"- {name}: ![{name}]({uri}) `{uri}`" for name, uri in figures.items()]
    lines += ["", "## Caveats", ""] + [f"- {c}" for c in result.caveats]
    lines += ["", "## Time per stage", ""] + [f"- {k}: {v:.2f} s" for k, v in result.stage_seconds.items()]
    return "\n".join(lines) + "\n"
