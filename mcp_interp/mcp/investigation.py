"""The session's record: the ``ledger://`` resource (every tool call, paged) and ``export_investigation`` (a script or
notebook that reruns the calls through the public Python API and checks every number, text and argument, or a Markdown
report of the claims made from their verdicts)."""

from __future__ import annotations

import json
from typing import Annotated

from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.types import CallToolResult, TextContent
from pydantic import Field

import mcp_interp.investigation as investigation
from mcp_interp.errors import InputError
from mcp_interp.investigation.notebook import notebook as notebook_text
from mcp_interp.investigation.report import check_claims
from mcp_interp.investigation.report import report as report_text
from mcp_interp.investigation.script import script as script_text
from mcp_interp.mcp.family import Family
from mcp_interp.mcp.recording import model_record, settle_jobs
from mcp_interp.mcp.toolkit import ToolContext, Toolkit, error_boundary
from mcp_interp.schemas.investigation import Claim, ExportResult

family = Family("investigation")


@family.tool()
async def export_investigation(
    ctx: ToolContext,
    format: Annotated[str, Field(description="'py' script, 'ipynb' notebook, or 'md' report of `claims`.")] = "py",
    calls: Annotated[
        list[int] | None, Field(description="Ledger call ids to export (with the calls that made their handles); all.")
    ] = None,
    claims: Annotated[list[Claim] | None, Field(description="md: your conclusions.")] = None,
) -> Annotated[CallToolResult, ExportResult]:
    """This session's calls (ledger://) as a script or notebook rerunning them via `mcp_interp.Session`, checking
    the fingerprint, every number and argument (fails naming a mismatch); or a report: claims beside their evidence."""
    kit = Toolkit.of(ctx)
    settle_jobs(kit)
    with error_boundary():
        investigation.check_format(format)
        if claims and format != "md":
            raise InputError("`claims` go in the Markdown report: pass format='md' with them.")
        entries, notes = investigation.select(kit.workspace.ledger, calls)
        if not entries:
            raise InputError("The ledger holds no call to export yet: call a tool first, then export.")
        checked = check_claims([c.model_dump() for c in claims or []], entries)
        model = model_record(kit.host) or next((e.model for e in entries if e.model), None)
        if model is None:
            raise InputError("The model has not loaded, so there is no fingerprint to check: call model_info first.")
        name, fingerprint = model["name"], model["fingerprint"]
        if format == "md":
            text = report_text(entries, checked, name, fingerprint, notes)
        elif format == "ipynb":
            text = notebook_text(entries, name, fingerprint, model["versions"], notes)
        else:
            text = script_text(entries, name, fingerprint, model["versions"], notes)
    kind = {"py": "script", "ipynb": "notebook", "md": "report"}[format]
    uri, link = kit.store(kind, text.encode(), f"investigation {kind}")
    result = ExportResult(
        script_uri=uri if format == "py" else None,
        notebook_uri=uri if format == "ipynb" else None,
        report_uri=uri if format == "md" else None,
        format=format,
        calls=[e.call for e in entries],
        model_name=name,
        fingerprint=fingerprint,
        key_numbers=sum(len(e.key_numbers) for e in entries),
        claims=len(checked),
        notes=notes,
    )
    how = {
        "py": "python script.py [--json]; exit 1 names a call that does not match",
        "ipynb": "jupyter execute it; its last cell fails naming a call that does not match",
        "md": f"{len(checked)} claims with their evidence",
    }[format]
    summary = (
        f"export_investigation: {len(entries)} calls, {result.key_numbers} key numbers recorded, as {uri} ({how})."
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
    content = kit.workspace.ledger.page(number)
    if number < 0 or number >= content["pages"]:
        raise ResourceNotFoundError(f"The ledger has pages 0–{content['pages'] - 1}; got {number}.")
    return json.dumps(content)


@family.resource(
    "script://{script_id}",
    name="script",
    description="A Python script written by `export_investigation`: it reruns an investigation, checks its numbers.",
    mime_type="text/x-python",
)
def script(script_id: str, ctx: ToolContext) -> str:
    return Toolkit.of(ctx).read("script", script_id).decode("utf-8")


@family.resource(
    "notebook://{notebook_id}",
    name="notebook",
    description="A Jupyter notebook written by `export_investigation`: one cell per call, rerun and checked.",
    mime_type="application/x-ipynb+json",
)
def notebook(notebook_id: str, ctx: ToolContext) -> str:
    return Toolkit.of(ctx).read("notebook", notebook_id).decode("utf-8")
