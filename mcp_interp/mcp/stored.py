"""Stored outputs every family produces: the ``figure://`` and ``report://`` resources and ``get_figure``
(for clients that drop resource links when structured content is present)."""

from __future__ import annotations

import base64
from typing import Annotated

from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ImageContent
from pydantic import Field

import mcp_interp.figures as figures
from mcp_interp.errors import NotFound
from mcp_interp.mcp.family import Family
from mcp_interp.mcp.toolkit import ToolContext, Toolkit
from mcp_interp.schemas.common import FigureInfo

family = Family("stored")


@family.tool(model=False)
async def get_figure(
    uri: Annotated[str, Field(description="figure://…")],
    ctx: ToolContext,
) -> Annotated[CallToolResult, FigureInfo]:
    """A stored figure as image content (for clients that do not read resources)."""
    kind, _, figure_id = uri.partition("://")
    try:
        if kind != "figure":
            raise NotFound(f"{uri[:100]!r} is not a figure URI; figure URIs look like figure://<32 hex>.")
        png = Toolkit.of(ctx).workspace.store.get("figure", figure_id)
        width, height = figures.png_size(png)
    except (NotFound, ValueError) as exc:
        raise ToolError(str(exc)) from exc
    info = FigureInfo(uri=uri, mime_type="image/png", bytes=len(png), width=width, height=height)
    return CallToolResult(
        content=[ImageContent(type="image", data=base64.b64encode(png).decode(), mime_type="image/png")],
        structured_content=info.model_dump(mode="json"),
    )


@family.resource(
    "figure://{figure_id}",
    name="figure",
    description="A PNG figure produced by a tool; its URI is in that tool's result.",
    mime_type="image/png",
)
def figure(figure_id: str, ctx: ToolContext) -> bytes:
    return Toolkit.of(ctx).read("figure", figure_id)


@family.resource(
    "report://{report_id}",
    name="report",
    description="A Markdown report written by `explain` (every number cited, every figure linked) or by "
    "`export_investigation` (each claim with its evidence).",
    mime_type="text/markdown",
)
def report(report_id: str, ctx: ToolContext) -> str:
    return Toolkit.of(ctx).read("report", report_id).decode("utf-8")


@family.resource(
    "result://{result_id}",
    name="result",
    description="The complete structured result of a tool call whose returned result was cut to fit (JSON).",
    mime_type="application/json",
)
def result(result_id: str, ctx: ToolContext) -> str:
    return Toolkit.of(ctx).read("result", result_id).decode("utf-8")


@family.resource(
    "circuit://{circuit_id}",
    name="circuit",
    description="A circuit found by `find_circuit`: every edge [writer, reader], its nodes, the pairs it was selected "
    "on (JSON); `circuit_faithfulness(circuit=…)` re-evaluates it.",
    mime_type="application/json",
)
def circuit(circuit_id: str, ctx: ToolContext) -> str:
    return Toolkit.of(ctx).read("circuit", circuit_id).decode("utf-8")
