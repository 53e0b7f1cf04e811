"""Figures as PNG bytes: the style every family's renderers share (matplotlib, Agg backend: no display,
thread-safe with ``LOCK``), and the one figure several families draw, the layer × head heatmap.

Each family renders its own figures in ``core/<family>/figures.py`` with these helpers, and says which figure a
result is drawn as with a ``Plot`` (what the single tool and ``explain`` both draw, so their pictures agree).

Sizes are fixed by the data's shape (no ``bbox_inches="tight"``), so a figure's pixel size is
predictable: ``heatmap_size`` says what ``layer_head_heatmap`` will produce.
"""

from __future__ import annotations

import io
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DPI = 100
LOCK = threading.Lock()  # pyplot's state machine is not thread-safe


@dataclass(frozen=True)
class Plot:
    """A figure to draw: the name it is stored and linked under, its renderer (→ PNG bytes) and the renderer's
    arguments. A family says what to draw; the adapter renders it on the figure thread (``Toolkit.draw``)."""

    name: str
    render: Callable[..., bytes]
    args: tuple[Any, ...] = ()


def heatmap_size(n_rows: int, n_cols: int) -> tuple[int, int]:
    """(width, height) in pixels of a layer × head heatmap with this many rows and columns."""
    width_in = min(max(4.0, 1.6 + 0.45 * n_cols), 16.0)
    height_in = min(max(3.0, 1.2 + 0.22 * n_rows), 14.0)
    return round(width_in * DPI), round(height_in * DPI)


def layer_head_heatmap(
    grid: Sequence[Sequence[float | None]], title: str, colorbar_label: str, center: float = 0.0
) -> bytes:
    """Layers (rows) × heads (columns), diverging colormap centred at ``center``; None = not evaluated (grey)."""
    n_rows, n_cols = len(grid), len(grid[0]) if grid else 0
    values = [[math.nan if v is None else float(v) for v in row] for row in grid]
    finite = [abs(v - center) for row in values for v in row if math.isfinite(v)]
    span = max(finite, default=1.0) or 1.0
    width, height = heatmap_size(n_rows, n_cols)
    with LOCK:
        fig, ax = plt.subplots(figsize=(width / DPI, height / DPI), dpi=DPI)
        try:
            cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="#dddddd")
            image = ax.imshow(values, cmap=cmap, vmin=center - span, vmax=center + span, aspect="auto")
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.set_xticks(range(n_cols))
            step = max(1, math.ceil(n_rows / 16))
            ax.set_yticks(range(0, n_rows, step))
            ax.set_title(title, fontsize=9)
            fig.colorbar(image, ax=ax, label=colorbar_label)
            fig.tight_layout()
            return png(fig)
        finally:
            plt.close(fig)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; ValueError if ``data`` is not a PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def png(fig: Any, description: str | None = None) -> bytes:
    """The figure as PNG bytes; ``description`` goes into the PNG's ``Description`` text chunk (what
    the axes show, in words, for readers that cannot see the picture)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Description": description} if description else None)
    return buffer.getvalue()
