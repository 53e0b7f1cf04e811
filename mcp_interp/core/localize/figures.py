"""Figures of the localize family: the layers × tokens patching map and the bars of single cells; ``patch_plot`` is
the one a ``patch`` result is drawn as (by the tool and by ``explain``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib

from mcp_interp.figures import DPI, LOCK, Plot, plt, png
from mcp_interp.schemas.localize import PatchMeasurement


def layer_position_heatmap(
    grid: Sequence[Sequence[float | None]],
    tokens: Sequence[str],
    title: str,
    colorbar_label: str,
    row_label: str = "layer",
    row_names: Sequence[str] | None = None,
) -> bytes:
    """Rows (layers, or layer·head) × token positions, diverging colormap centred at 0, the tokens
    on the x axis ("' John'@9"); None = not requested (grey)."""
    n_rows, n_cols = len(grid), len(tokens)
    values = [[math.nan if v is None else float(v) for v in row] for row in grid]
    finite = [abs(v) for row in values for v in row if math.isfinite(v)]
    span = max(finite, default=1.0) or 1.0
    width_in = min(max(5.0, 2.2 + 0.42 * n_cols), 18.0)
    height_in = min(max(3.5, 1.8 + 0.2 * n_rows), 16.0)
    labels = [f"{repr(t)[1:-1] or '∅'}@{i}" for i, t in enumerate(tokens)]
    with LOCK:
        fig, ax = plt.subplots(figsize=(width_in, height_in), dpi=DPI)
        try:
            cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="#dddddd")
            image = ax.imshow(values, cmap=cmap, vmin=-span, vmax=span, aspect="auto")
            ax.set_xticks(range(n_cols), labels, rotation=90, fontsize=7)
            ax.set_xlabel("token (position)")
            ax.set_ylabel(row_label)
            step = max(1, math.ceil(n_rows / 32))
            ticks = list(range(0, n_rows, step))
            ax.set_yticks(ticks, [row_names[i] if row_names else str(i) for i in ticks], fontsize=7)
            ax.set_title(title, fontsize=9)
            fig.colorbar(image, ax=ax, label=colorbar_label)
            fig.tight_layout()
            return png(fig, f"{title}. Rows: {row_label}. Columns (token@position): {' | '.join(labels)}")
        finally:
            plt.close(fig)


def cell_bars(labels: Sequence[str], values: Sequence[float | None], title: str, value_label: str) -> bytes:
    """Horizontal bars, one per labelled cell (e.g. MLP neurons), red positive, blue negative."""
    numbers = [0.0 if v is None or not math.isfinite(v) else float(v) for v in values]
    with LOCK:
        fig, ax = plt.subplots(figsize=(8, min(max(3.0, 1.0 + 0.25 * len(labels)), 16.0)), dpi=DPI)
        try:
            ax.barh(range(len(labels)), numbers, color=["tab:red" if v > 0 else "tab:blue" for v in numbers])
            ax.set_yticks(range(len(labels)), labels, fontsize=7)
            ax.set_ylim(len(labels) - 0.5, -0.5)
            ax.axvline(0, color="black", linewidth=0.5)
            ax.set_xlabel(value_label)
            ax.set_title(title, fontsize=9)
            fig.tight_layout()
            return png(fig)
        finally:
            plt.close(fig)


def patch_plot(result: PatchMeasurement, model_name: str) -> Plot:
    """The heatmap of a ``patch`` result: layers × tokens (heads × tokens for heads_by_pos; bars for neurons)."""
    title = f"patch {result.component} {result.direction} ({result.method}, {result.metric}): {model_name}"
    label = "recovered fraction" if result.direction == "denoise" else "destroyed fraction"
    tokens = [t.clean_token if not t.differs_in_pairs else f"{t.clean_token}/{t.corrupt_token}" for t in result.tokens]
    if result.scores is not None:
        return Plot(title, layer_position_heatmap, (result.scores, tokens, title, label))
    if result.head_scores is not None:
        rows, names = [], []
        for layer, heads in enumerate(result.head_scores):
            for head, row in enumerate(heads):
                if any(v is not None for v in row):
                    rows.append(row)
                    names.append(f"L{layer}H{head}")
        return Plot(title, layer_position_heatmap, (rows, tokens, title, label, "head", names))
    labels = [cell.label for cell in result.cells]
    return Plot(title, cell_bars, (labels, [c.score for c in result.cells], title, label))
