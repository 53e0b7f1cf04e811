"""Figures of the heads family: the layer × head heatmap of a head-patching result (``patch_heads``; ``explain``
draws the same one)."""

from __future__ import annotations

from mcp_interp.figures import Plot, layer_head_heatmap
from mcp_interp.schemas.heads import PatchHeadsMeasurement


def heads_plot(patching: PatchHeadsMeasurement, model_name: str, name: str | None = None) -> Plot:
    """The layer × head heatmap of a head-patching result, stored as ``name`` (default: its title)."""
    title = f"patch_heads {patching.direction} ({patching.method}) score: {model_name}"
    label = "recovered fraction" if patching.direction == "denoise" else "destroyed fraction"
    return Plot(name or title, layer_head_heatmap, (patching.scores, title, label))
