"""Figures of the lens family: the logit lens across layers, DLA, and one head's attention pattern; each with the
``Plot`` of a result (``logit_lens_plot``, ``dla_plot``, ``attention_plot``: what the tool and ``explain`` draw)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from mcp_interp.core.lens.logit_lens import layer_label
from mcp_interp.figures import DPI, LOCK, Plot, plt, png
from mcp_interp.schemas.lens import AttentionMeasurement, DLAMeasurement, LogitLensMeasurement


def logit_lens_figure(layers: Sequence[str], probs: Sequence[float], ranks: Sequence[int], target: str) -> bytes:
    """Target probability (top) and rank (bottom, log scale, 0 = top-1) after each layer."""
    with LOCK:
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
            return png(fig)
        finally:
            plt.close(fig)


def dla_figure(heads: Sequence[Sequence[float]], mlps: Sequence[float], quantity: str) -> bytes:
    """Head contributions as a layer × head heatmap and MLP contributions as bars, one colour scale."""
    n_layers, n_heads = len(heads), len(heads[0]) if heads else 0
    span = max([abs(v) for row in heads for v in row] + [abs(v) for v in mlps] + [1e-9])
    with LOCK:
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
            return png(fig)
        finally:
            plt.close(fig)


def attention_figure(pattern: Sequence[Sequence[float]], tokens: Sequence[str], title: str) -> bytes:
    """Query × key attention weights with token labels on both axes."""
    n = len(tokens)
    side = min(max(4.0, 1.5 + 0.3 * n), 14.0)
    labels = [repr(t)[1:-1] or "∅" for t in tokens]
    with LOCK:
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
            return png(fig)
        finally:
            plt.close(fig)


def logit_lens_plot(measurement: LogitLensMeasurement, name: str) -> Plot:
    """The target's probability and rank across layers."""
    rows = measurement.layers
    layers = [layer_label(r.layer) for r in rows]
    probs, ranks = [r.target_prob for r in rows], [r.target_rank for r in rows]
    return Plot(name, logit_lens_figure, (layers, probs, ranks, measurement.target))


def dla_plot(measurement: DLAMeasurement, name: str) -> Plot:
    """Layer × head heatmap of direct contributions plus the MLPs' bars."""
    return Plot(name, dla_figure, (measurement.heads, measurement.mlps, measurement.quantity))


def attention_plot(measurement: AttentionMeasurement) -> Plot:
    """One head's query × key pattern with token labels."""
    title = f"L{measurement.layer}H{measurement.head} attention"
    return Plot(title, attention_figure, (measurement.pattern, measurement.tokens, title))
