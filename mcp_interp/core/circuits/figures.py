"""Figures of the circuits family: the layered edge graph and the faithfulness curve against k."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mcp_interp.figures import DPI, LOCK, plt, png


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
    with LOCK:
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
            return png(fig, description)
        finally:
            plt.close(fig)


def faithfulness_curve(
    ks: Sequence[int], values: Sequence[float | None], random_means: Sequence[float | None], title: str
) -> bytes:
    """Faithfulness (recovered fraction) of the top-k circuit against k, with the random circuits' mean."""
    with LOCK:
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
            return png(fig, description)
        finally:
            plt.close(fig)
