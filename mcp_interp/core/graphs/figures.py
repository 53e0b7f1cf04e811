"""The attribution graph's figure: the pruned graph's top nodes by layer (rows) × token position (columns)."""

from __future__ import annotations

from collections.abc import Sequence

from mcp_interp.figures import DPI, LOCK, plt, png
from mcp_interp.schemas.graphs import GraphLink, GraphNode

KIND_COLOURS = {"feature": "#f4a259", "error": "#9e9e9e", "token": "#8ab6d6", "logit": "#7bc47f"}


def node_places(nodes: Sequence[GraphNode], n_layers: int) -> dict[str, tuple[float, float]]:
    """(x, y) of each node: x = position (nodes sharing a layer and position spread across the cell), y = layer
    (tokens at −1, logits at n_layers)."""
    cells: dict[tuple[int, int], list[GraphNode]] = {}
    for node in nodes:
        row = -1 if node.kind == "token" else n_layers if node.kind == "logit" else int(node.layer or 0)
        cells.setdefault((row, node.position), []).append(node)
    places = {}
    for (row, position), members in cells.items():
        for i, node in enumerate(members):
            offset = 0.0 if len(members) == 1 else (i / (len(members) - 1) - 0.5) * 0.7
            places[node.node_id] = (position + offset, float(row))
    return places


def attribution_graph_figure(
    nodes: Sequence[GraphNode], links: Sequence[GraphLink], tokens: Sequence[str], n_layers: int, title: str
) -> bytes:
    """Nodes coloured by kind (features orange, errors grey, tokens blue, logits green), area ∝ influence; links
    red (positive) or blue (negative), width ∝ |weight| relative to the largest link into the same target."""
    places = node_places(nodes, n_layers)
    strongest: dict[str, float] = {}
    for link in links:
        strongest[link.target] = max(strongest.get(link.target, 0.0), abs(link.weight))
    width_in = min(max(6.0, 1.5 + 0.9 * len(tokens)), 22.0)
    height_in = min(max(4.5, 1.5 + 0.22 * (n_layers + 2)), 14.0)
    with LOCK:
        fig, ax = plt.subplots(figsize=(width_in, height_in), dpi=DPI)
        try:
            for link in sorted(links, key=lambda e: abs(e.weight)):
                if link.source not in places or link.target not in places:
                    continue
                (x0, y0), (x1, y1) = places[link.source], places[link.target]
                share = abs(link.weight) / (strongest[link.target] or 1.0)
                colour = "tab:red" if link.weight > 0 else "tab:blue"
                ax.plot([x0, x1], [y0, y1], color=colour, alpha=0.25 + 0.5 * share, linewidth=0.3 + 2.7 * share)
            top = max((n.influence for n in nodes), default=1.0) or 1.0
            for node in nodes:
                x, y = places[node.node_id]
                size = 25 + 260 * node.influence / top
                ax.scatter(
                    [x], [y], s=size, color=KIND_COLOURS[node.kind], edgecolors="black", linewidths=0.5, zorder=3
                )
                label = f"f{node.feature}" if node.kind == "feature" else node.label if node.kind == "logit" else ""
                if label:
                    ax.annotate(label, (x, y), xytext=(4, 3), textcoords="offset points", fontsize=6, zorder=4)
            ax.set_xticks(range(len(tokens)))
            ax.set_xticklabels([repr(t) for t in tokens], rotation=45, ha="right", fontsize=7)
            step = max(1, n_layers // 15)
            ax.set_yticks([-1, *range(0, n_layers, step), n_layers])
            ax.set_yticklabels(["tokens", *(str(i) for i in range(0, n_layers, step)), "logits"], fontsize=7)
            ax.set_ylim(-1.8, n_layers + 0.8)
            ax.set_xlim(-0.8, len(tokens) - 0.2)
            ax.set_ylabel("layer")
            ax.set_title(title + "  (orange: features, grey: errors; red/blue: +/− direct effect)", fontsize=9)
            fig.tight_layout()
            description = f"{title}. Nodes: " + "; ".join(
                f"{n.node_id} ({n.kind}, influence {n.influence:.3g})" for n in nodes
            )
            return png(fig, description)
        finally:
            plt.close(fig)
