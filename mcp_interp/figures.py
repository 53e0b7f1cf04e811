"""Figures as PNG bytes (matplotlib, Agg backend: no display, thread-safe with a lock).

Sizes are fixed by the data's shape (no ``bbox_inches="tight"``), so a figure's pixel size is
predictable: ``heatmap_size`` says what ``layer_head_heatmap`` will produce.
"""

from __future__ import annotations

import io
import math
import threading
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DPI = 100
_LOCK = threading.Lock()  # pyplot's state machine is not thread-safe


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
    with _LOCK:
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
            return _png(fig)
        finally:
            plt.close(fig)


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
    with _LOCK:
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
            return _png(fig, f"{title}. Rows: {row_label}. Columns (token@position): {' | '.join(labels)}")
        finally:
            plt.close(fig)


def cell_bars(labels: Sequence[str], values: Sequence[float | None], title: str, value_label: str) -> bytes:
    """Horizontal bars, one per labelled cell (e.g. MLP neurons), red positive, blue negative."""
    numbers = [0.0 if v is None or not math.isfinite(v) else float(v) for v in values]
    with _LOCK:
        fig, ax = plt.subplots(figsize=(8, min(max(3.0, 1.0 + 0.25 * len(labels)), 16.0)), dpi=DPI)
        try:
            ax.barh(range(len(labels)), numbers, color=["tab:red" if v > 0 else "tab:blue" for v in numbers])
            ax.set_yticks(range(len(labels)), labels, fontsize=7)
            ax.set_ylim(len(labels) - 0.5, -0.5)
            ax.axvline(0, color="black", linewidth=0.5)
            ax.set_xlabel(value_label)
            ax.set_title(title, fontsize=9)
            fig.tight_layout()
            return _png(fig)
        finally:
            plt.close(fig)


def layered_graph(
    nodes: Sequence[tuple[str, float, float]],
    edges: Sequence[tuple[str, str, float, str]],
    title: str,
    n_columns: int,
) -> bytes:
    """Nodes at (x, y) (x = the column: embeddings, each layer's attention and MLP, logits), edges as
    straight lines from writer to reader: width ∝ |score|, red positive, blue negative, each labelled
    at its end with the reader's input (q/k/v/in) when it has one."""
    place = {name: (x, y) for name, x, y in nodes}
    span = max((abs(score) for _, _, score, _ in edges), default=1.0) or 1.0
    width_in = min(max(6.0, 1.5 + 0.32 * n_columns), 20.0)
    rows = max((y for _, _, y in nodes), default=1) - min((y for _, _, y in nodes), default=0)
    height_in = min(max(4.0, 1.5 + 0.45 * (rows + 1)), 12.0)
    with _LOCK:
        fig, ax = plt.subplots(figsize=(width_in, height_in), dpi=DPI)
        try:
            for source, target, score, label in sorted(edges, key=lambda e: abs(e[2])):
                (x0, y0), (x1, y1) = place[source], place[target]
                colour = "tab:red" if score > 0 else "tab:blue"
                ax.plot([x0, x1], [y0, y1], color=colour, alpha=0.65, linewidth=0.4 + 4.0 * abs(score) / span)
                if label:
                    ax.annotate(label, (x1, y1), xytext=(-6, 2), textcoords="offset points", fontsize=6, color=colour)
            for name, x, y in nodes:
                ax.scatter([x], [y], s=60, color="white", edgecolors="black", zorder=3)
                ax.annotate(name, (x, y), xytext=(3, -9), textcoords="offset points", fontsize=6, zorder=4)
            ax.invert_yaxis()
            ax.set_yticks([])
            ax.set_xlabel("embed | layer l: attention (x = 2l+1), MLP (x = 2l+2) | logits")
            ax.set_title(title + "  (red: toward clean, blue: against; width ∝ |score|)", fontsize=9)
            fig.tight_layout()
            description = f"{title}. Edges (writer → reader: score): " + "; ".join(
                f"{s} → {t}{'.' + lab if lab else ''}: {v:+.4g}" for s, t, v, lab in edges
            )
            return _png(fig, description)
        finally:
            plt.close(fig)


def faithfulness_curve(
    ks: Sequence[int], values: Sequence[float | None], random_means: Sequence[float | None], title: str
) -> bytes:
    """Faithfulness (recovered fraction) of the top-k circuit against k, with the random circuits' mean."""
    with _LOCK:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=DPI)
        try:

            def line(ys: Sequence[float | None], **style: Any) -> None:
                points = [(k, y) for k, y in zip(ks, ys, strict=True) if y is not None]
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", **style)

            line(values, color="tab:red", label="top-k circuit (exact)")
            line(random_means, color="tab:grey", linestyle="--", label="random circuits, same k (mean)")
            ax.axhline(1.0, color="black", linewidth=0.5)
            ax.axhline(0.0, color="black", linewidth=0.5)
            ax.set_xscale("log")
            ax.set_xlabel("edges in the circuit (k)")
            ax.set_ylabel("recovered fraction of the gap")
            ax.set_title(title, fontsize=9)
            ax.legend(fontsize=8)
            fig.tight_layout()
            description = f"{title}. " + "; ".join(
                f"k={k}: {v if v is None else round(v, 4)} (random {r if r is None else round(r, 4)})"
                for k, v, r in zip(ks, values, random_means, strict=True)
            )
            return _png(fig, description)
        finally:
            plt.close(fig)


def probe_accuracy(
    layers: Sequence[int],
    accuracy: Sequence[float],
    ci_low: Sequence[float],
    ci_high: Sequence[float],
    control: Sequence[float | None],
    chance: float,
    title: str,
) -> bytes:
    """Held-out probe accuracy by layer with its exact 95 % interval, the control task's accuracy and chance."""
    with _LOCK:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=DPI)
        try:
            ax.fill_between(layers, ci_low, ci_high, color="tab:blue", alpha=0.2, label="exact 95 % interval")
            ax.plot(layers, accuracy, marker="o", color="tab:blue", label="held-out accuracy")
            points = [(layer, c) for layer, c in zip(layers, control, strict=True) if c is not None]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="s", color="tab:orange",
                        linestyle="--", label="control task")  # fmt: skip
            ax.axhline(chance, color="grey", linestyle=":", label=f"chance ({chance:.2f})")
            ax.set_ylim(0.0, 1.02)
            ax.set_xlabel("layer (resid_post)")
            ax.set_ylabel("accuracy")
            ax.set_title(title, fontsize=9)
            ax.legend(fontsize=8, loc="lower right")
            fig.tight_layout()
            description = f"{title}. " + "; ".join(
                f"L{layer}: {a:.3f} [{lo:.3f}, {hi:.3f}] control {'-' if c is None else round(c, 3)}"
                for layer, a, lo, hi, c in zip(layers, accuracy, ci_low, ci_high, control, strict=True)
            )
            return _png(fig, description)
        finally:
            plt.close(fig)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; ValueError if ``data`` is not a PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _png(fig: Any, description: str | None = None) -> bytes:
    """The figure as PNG bytes; ``description`` goes into the PNG's ``Description`` text chunk (what
    the axes show, in words, for readers that cannot see the picture)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Description": description} if description else None)
    return buffer.getvalue()


def logit_lens_figure(layers: Sequence[str], probs: Sequence[float], ranks: Sequence[int], target: str) -> bytes:
    """Target probability (top) and rank (bottom, log scale, 0 = top-1) after each layer."""
    with _LOCK:
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), dpi=DPI, sharex=True)
        try:
            x = list(range(len(layers)))
            top.plot(x, probs, marker="o", markersize=3)
            top.set_ylabel(f"P({target!r})")
            top.set_ylim(0, 1)
            top.set_title(f"logit lens: {target!r} across layers", fontsize=9)
            bottom.plot(x, [r + 1 for r in ranks], marker="o", markersize=3, color="tab:red")
            bottom.set_yscale("log")
            bottom.set_ylabel("rank + 1 (1 = top-1)")
            step = max(1, math.ceil(len(layers) / 16))
            bottom.set_xticks(x[::step], [layers[i] for i in x[::step]])
            bottom.set_xlabel("layer (residual after the block)")
            fig.tight_layout()
            return _png(fig)
        finally:
            plt.close(fig)


def dla_figure(heads: Sequence[Sequence[float]], mlps: Sequence[float], quantity: str) -> bytes:
    """Head contributions as a layer × head heatmap and MLP contributions as bars, one colour scale."""
    n_layers, n_heads = len(heads), len(heads[0]) if heads else 0
    span = max([abs(v) for row in heads for v in row] + [abs(v) for v in mlps] + [1e-9])
    with _LOCK:
        fig, (left, right) = plt.subplots(
            1, 2, figsize=(9, max(3.0, 1.2 + 0.22 * n_layers)), dpi=DPI, gridspec_kw={"width_ratios": [3, 1]}
        )
        try:
            image = left.imshow(heads, cmap="RdBu_r", vmin=-span, vmax=span, aspect="auto")
            left.set_xlabel("head")
            left.set_ylabel("layer")
            left.set_xticks(range(n_heads))
            left.set_title(f"direct contribution to {quantity}", fontsize=9)
            fig.colorbar(image, ax=left, label="logits")
            right.barh(range(n_layers), mlps, color=["tab:red" if v > 0 else "tab:blue" for v in mlps])
            right.set_ylim(n_layers - 0.5, -0.5)
            right.set_xlim(-span, span)
            right.axvline(0, color="black", linewidth=0.5)
            right.set_title("MLPs", fontsize=9)
            right.set_xlabel("logits")
            fig.tight_layout()
            return _png(fig)
        finally:
            plt.close(fig)


def attention_figure(pattern: Sequence[Sequence[float]], tokens: Sequence[str], title: str) -> bytes:
    """Query × key attention weights with token labels on both axes."""
    n = len(tokens)
    side = min(max(4.0, 1.5 + 0.3 * n), 14.0)
    labels = [repr(t)[1:-1] or "∅" for t in tokens]
    with _LOCK:
        fig, ax = plt.subplots(figsize=(side + 1, side), dpi=DPI)
        try:
            image = ax.imshow(pattern, cmap="Blues", vmin=0, vmax=1)
            ax.set_xticks(range(n), labels, rotation=90, fontsize=7)
            ax.set_yticks(range(n), labels, fontsize=7)
            ax.set_xlabel("key (attended to)")
            ax.set_ylabel("query")
            ax.set_title(title, fontsize=9)
            fig.colorbar(image, ax=ax, label="attention weight")
            fig.tight_layout()
            return _png(fig)
        finally:
            plt.close(fig)


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
    with _LOCK:
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
            return _png(fig)
        finally:
            plt.close(fig)


def token_feature_heatmap(
    values: Sequence[Sequence[float]], tokens: Sequence[str], features: Sequence[int], title: str
) -> bytes:
    """Tokens (rows, "' John'@9") × SAE features (columns, by id), sequential colormap from 0 (white) to
    the largest activation: feature activations are ≥ 0."""
    n_rows, n_cols = len(tokens), len(features)
    peak = max((float(v) for row in values for v in row if math.isfinite(v)), default=0.0)
    width_in = min(max(5.0, 2.4 + 0.3 * n_cols), 18.0)
    height_in = min(max(3.5, 1.8 + 0.2 * n_rows), 16.0)
    labels = [f"{repr(t)[1:-1] or '∅'}@{i}" for i, t in enumerate(tokens)]
    grid = [list(row) for row in values] if n_cols else [[math.nan] for _ in tokens]
    with _LOCK:
        fig, ax = plt.subplots(figsize=(width_in, height_in), dpi=DPI)
        try:
            image = ax.imshow(grid, cmap="Reds", vmin=0.0, vmax=peak or 1.0, aspect="auto", interpolation="nearest")
            ax.set_xticks(range(n_cols), [str(f) for f in features], rotation=90, fontsize=7)
            ax.set_xlabel("SAE feature (id)")
            step = max(1, math.ceil(n_rows / 64))
            ticks = list(range(0, n_rows, step))
            ax.set_yticks(ticks, [labels[i] for i in ticks], fontsize=7)
            ax.set_ylabel("token (position)")
            ax.set_title(title, fontsize=9)
            fig.colorbar(image, ax=ax, label="feature activation")
            fig.tight_layout()
            description = (
                f"{title}. Rows (token@position): {' | '.join(labels)}. Columns (feature ids): "
                f"{', '.join(str(f) for f in features) or 'none (no feature fired)'}. Colour: activation, 0 (white) "
                f"to {peak:.4g}."
            )
            return _png(fig, description)
        finally:
            plt.close(fig)
