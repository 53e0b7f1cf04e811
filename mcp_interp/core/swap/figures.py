"""Figures of the causal-swap family: success rates by layer."""

from __future__ import annotations

from collections.abc import Sequence

from mcp_interp.figures import DPI, LOCK, plt, png


def swap_rates_figure(
    layers: Sequence[int],
    real: Sequence[tuple[float | None, float, float, int]],
    control: Sequence[tuple[float | None, float, float, int]],
    title: str,
) -> bytes:
    """Success rate by layer, real edit vs controls, with exact 95% intervals as error bars.

    Each entry is (rate or None, ci_low, ci_high, n); layers with n = 0 are drawn as an empty
    marker at the bottom so "nothing executed here" is visible rather than absent.
    """
    with LOCK:
        fig, (top, bottom) = plt.subplots(
            2, 1, figsize=(8, 5), dpi=DPI, sharex=True, gridspec_kw={"height_ratios": [3, 1]}
        )
        try:
            offsets = {"real edit": (-0.15, real, "tab:red"), "controls": (0.15, control, "tab:grey")}
            for label, (shift, rows, colour) in offsets.items():
                xs = [layer + shift for layer, row in zip(layers, rows, strict=True) if row[0] is not None]
                ys = [row[0] for row in rows if row[0] is not None]
                low = [row[0] - row[1] for row in rows if row[0] is not None]
                high = [row[2] - row[0] for row in rows if row[0] is not None]
                top.errorbar(xs, ys, yerr=[low, high], fmt="o", color=colour, capsize=3, label=label)
                bottom.bar([layer + shift for layer in layers], [row[3] for row in rows], width=0.3, color=colour)
            empty = [layer for layer, row in zip(layers, real, strict=True) if row[3] == 0]
            top.scatter(empty, [0.0] * len(empty), marker="x", color="black", label="no executed trial")
            top.set_ylim(-0.05, 1.05)
            top.set_ylabel("success rate (target top-1)")
            top.set_title(title, fontsize=9)
            top.legend(fontsize=8)
            bottom.set_ylabel("n (trials | draws)")
            bottom.set_xlabel("edited layer (block output)")
            fig.tight_layout()
            return png(fig)
        finally:
            plt.close(fig)
