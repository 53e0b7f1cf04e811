"""The session's record: the ``ledger://`` resource (every tool call, paged) and ``export_investigation`` (a script
that reruns the calls through the public Python API and checks every key number)."""

from __future__ import annotations

import json
from typing import Annotated

from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.types import CallToolResult, TextContent
from pydantic import Field

from mcp_interp import investigation
from mcp_interp.errors import InputError
from mcp_interp.mcp.family import Family
from mcp_interp.mcp.recording import model_record, settle_jobs
from mcp_interp.mcp.toolkit import ToolContext, Toolkit, error_boundary
from mcp_interp.schemas.investigation import ExportResult

family = Family("investigation")


@family.tool()
async def export_investigation(
    ctx: ToolContext,
    format: Annotated[str, Field(description="'py': a Python script.")] = "py",
    calls: Annotated[
        list[int] | None, Field(description="Ledger call ids to rerun (with the calls that made their handles); all.")
    ] = None,
) -> Annotated[CallToolResult, ExportResult]:
    """This session's calls (ledger://) as a script that reruns them through `mcp_interp.Session`, checks the
    weights' fingerprint and every recorded key number; exits 1 naming a call that does not match."""
    kit = Toolkit.of(ctx)
    settle_jobs(kit)
    with error_boundary():
        investigation.check_format(format)
        entries, notes = investigation.select(kit.session.ledger, calls)
        if not entries:
            raise InputError("The ledger holds no call to rerun yet: call a tool first, then export.")
        model = model_record(kit.session) or next((e.model for e in entries if e.model), None)
        if model is None:
            raise InputError("The model has not loaded, so there is no fingerprint to check: call model_info first.")
        text = investigation.script(entries, model["name"], model["fingerprint"], model["versions"], notes)
    uri, link = kit.store("notebook", text.encode(), "investigation script")
    result = ExportResult(
        notebook_uri=uri,
        format=format,
        calls=[e.call for e in entries],
        model_name=model["name"],
        fingerprint=model["fingerprint"],
        key_numbers=sum(len(e.key_numbers) for e in entries),
        notes=notes,
    )
    summary = (
        f"export_investigation: {len(entries)} calls, {result.key_numbers} key numbers checked, as {uri} "
        f"(python script.py [--json]; exit 1 names a call that does not match)."
    )
    return CallToolResult(
        content=[TextContent(type="text", text=summary), link], structured_content=result.model_dump(mode="json")
    )


@family.resource(
    "ledger://{page}",
    name="ledger",
    description="Every tool call of this session, oldest first, 50 a page (ledger://0, ledger://1, …): arguments, "
    "handles and the calls that made them, seeds, model fingerprint, versions, key numbers, result_uri, errors.",
    mime_type="application/json",
)
def ledger(page: str, ctx: ToolContext) -> str:
    try:
        number = int(page)
    except ValueError:
        raise ResourceNotFoundError(f"ledger pages are numbered from 0 (ledger://0); got {page!r}.") from None
    kit = Toolkit.of(ctx)
    settle_jobs(kit)
    content = kit.session.ledger.page(number)
    if number < 0 or number >= content["pages"]:
        raise ResourceNotFoundError(f"The ledger has pages 0–{content['pages'] - 1}; got {number}.")
    return json.dumps(content)


@family.resource(
    "notebook://{notebook_id}",
    name="notebook",
    description="A Python script written by `export_investigation`: it reruns an investigation, checks its numbers.",
    mime_type="text/x-python",
)
def notebook(notebook_id: str, ctx: ToolContext) -> str:
    return Toolkit.of(ctx).read("notebook", notebook_id).decode("utf-8")
