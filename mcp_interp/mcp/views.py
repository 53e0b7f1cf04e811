"""MCP Apps views: interactive HTML renderings of tool results (``ui://mcp-interp/<view>``, MIME type
``text/html;profile=mcp-app``), for hosts that implement the ``io.modelcontextprotocol/ui`` extension.

A tool names its view with ``Family.tool(view=...)``; the host fetches the resource, renders it in a
sandboxed iframe and hands it the same structured result the model sees. The HTML files are built from
``web/src`` by ``scripts/build_views.py`` (committed, checked to be up to date) and fetch nothing: every
script and style is inline. Hosts without Apps ignore the link and keep the PNG figures.
"""

from __future__ import annotations

from functools import partial

from mcp_interp.corpora import views_dir
from mcp_interp.mcp.family import Family, view_uri

family = Family("views")

MIME_TYPE = "text/html;profile=mcp-app"
VIEWS = {
    "heads-heatmap": "Layers × heads heatmap of patch_heads or induction scores; click a head for its attention.",
    "layer-position": "Layer × token map of a patch result, with the tokens on the axis.",
    "attention": "One head's query × key attention pattern, with a head selector.",
    "logit-lens": "Top-k tokens after every layer, the target's rank highlighted.",
    "circuit-graph": "Edges of edge_attribution or find_circuit by layer, with a k slider and measured faithfulness.",
    "attribution-graph": "An attribution graph's top nodes by layer × position, a pruning slider, pinned features.",
}


def view_html(view: str) -> str:
    return (views_dir() / f"{view}.html").read_text(encoding="utf-8")


for _view, _description in VIEWS.items():
    family.resource(
        view_uri(_view),
        name=f"view-{_view}",
        description=f"MCP Apps view: {_description}",
        mime_type=MIME_TYPE,
        meta={"ui": {"prefersBorder": True}},
    )(partial(view_html, _view))
