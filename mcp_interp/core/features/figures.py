"""Figures of the features family: probe accuracy by layer and the SAE token × feature heatmap."""

from __future__ import annotations

import math
from collections.abc import Sequence

from mcp_interp.figures import DPI, LOCK, plt, png


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
    with LOCK:
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
            return png(fig, description)
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
    with LOCK:
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
            return png(fig, description)
        finally:
            plt.close(fig)
