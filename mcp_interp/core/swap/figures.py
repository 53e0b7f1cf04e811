"""Figures of the causal-swap family: the graded effect and the strict success rate by layer."""

from __future__ import annotations

from collections.abc import Sequence

from mcp_interp.core.engine.numbers.stats import clopper_pearson
from mcp_interp.figures import DPI, LOCK, plt, png
from mcp_interp.schemas.swap import LayerSummary


def swap_layers_figure(rows: Sequence[LayerSummary], m: int, title: str) -> bytes:
    """By edited layer, real edit vs its ``m`` controls: the median margin gain (logits; > 0 = toward the target's
    answer), the strict success rate with exact 95 % intervals, and the number of executed trials.

    A layer with no executed trial is marked with an x at 0 so "nothing executed here" is visible, not absent. The
    rates' intervals treat a layer's trials as independent (descriptive; the tests are in the summary).
    """
    layers = [row.layer for row in rows]
    with LOCK:
        fig, (gain, rate, count) = plt.subplots(
            3, 1, figsize=(8, 6.5), dpi=DPI, sharex=True, gridspec_kw={"height_ratios": [3, 2, 1]}
        )
        try:
            real = [(row.layer - 0.15, row.real_median_gain, row.real_successes, row.executed) for row in rows]
            control = [
                (row.layer + 0.15, row.control_median_gain, row.control_successes, row.executed * m) for row in rows
            ]
            for label, colour, values in (("real edit", "tab:red", real), (f"controls ({m})", "tab:grey", control)):
                done = [(x, g, k, n) for x, g, k, n in values if n > 0 and g is not None]
                gain.plot([v[0] for v in done], [v[1] for v in done], "o", color=colour, label=label)
                points = [(x, k / n, *clopper_pearson(k, n)) for x, _, k, n in done]
                rate.errorbar(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    yerr=[[p[1] - p[2] for p in points], [p[3] - p[1] for p in points]],
                    fmt="o",
                    color=colour,
                    capsize=3,
                )
                count.bar([v[0] for v in values], [v[3] for v in values], width=0.3, color=colour)
            empty = [row.layer for row in rows if row.executed == 0]
            gain.scatter(empty, [0.0] * len(empty), marker="x", color="black", label="no executed trial")
            gain.axhline(0.0, color="black", linewidth=0.6)
            gain.set_ylabel("median margin gain (logits)")
            gain.set_title(title, fontsize=9)
            gain.legend(fontsize=8)
            rate.set_ylim(-0.05, 1.05)
            rate.set_ylabel("strict top-1 rate")
            count.set_ylabel("edits")
            count.set_xlabel("edited layer (block output)")
            if len(layers) <= 32:
                count.set_xticks(layers)
            fig.tight_layout()
            return png(fig)
        finally:
            plt.close(fig)
