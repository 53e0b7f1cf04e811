"""Job tools: ``job_status`` and ``job_cancel`` follow the ``job://`` handle a long tool returns when called with
``background: true`` (the queue is ``mcp.queue``; each principal sees only its own jobs, ``mcp.workspace``)."""

from __future__ import annotations

from typing import Annotated, NoReturn

from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from mcp_interp.errors import InputError, NotFound
from mcp_interp.mcp.family import Family
from mcp_interp.mcp.toolkit import ToolContext, Toolkit, error_boundary
from mcp_interp.schemas.jobs import JobStatus

family = Family("jobs")
CONTROLS_JOBS = ToolAnnotations(
    read_only_hint=False, idempotent_hint=True, open_world_hint=False, destructive_hint=False
)

JobUri = Annotated[str, Field(description="job://…")]


def status_summary(status: JobStatus) -> str:
    progress = ""
    if status.progress is not None and status.progress.total:
        progress = f", step {status.progress.done:g} of {status.progress.total:g}: {status.progress.message}"
    where = f", {status.queue_position} ahead" if status.queue_position else ""
    done = f"; result in `result`{f' and {status.result_uri}' if status.result_uri else ''}" if status.result else ""
    error = f": {status.error}" if status.error else ""
    kept = "; its best result so far in `partial`" if status.partial else ""
    elsewhere = " (on another server)" if status.server else ""
    return f"{status.tool} {status.job_uri}: {status.state}{elsewhere}{where}{progress}{done}{error}{kept}"


@family.tool(model=False)
async def job_status(job: JobUri, ctx: ToolContext) -> Annotated[CallToolResult, JobStatus]:
    """A job's state, progress, elapsed time and, once done, its result."""
    kit = Toolkit.of(ctx)
    with error_boundary():
        try:
            status = kit.jobs.status(job)
        except NotFound as exc:
            raise_input(exc)
    return kit.finish(status, status_summary(status), [])


@family.tool(annotations=CONTROLS_JOBS, model=False)
async def job_cancel(job: JobUri, ctx: ToolContext) -> Annotated[CallToolResult, JobStatus]:
    """Cancel a job: a queued one never runs; a running one stops within 2 s, keeping its best result in `partial`."""
    kit = Toolkit.of(ctx)
    with error_boundary():
        try:
            status = await kit.jobs.cancel(job)
        except NotFound as exc:
            raise_input(exc)
    return kit.finish(status, status_summary(status), [])


def raise_input(exc: NotFound) -> NoReturn:
    raise InputError(str(exc)) from None


@family.resource(
    "job://{job_id}",
    name="job",
    description="A job's record (JSON: the same as job_status).",
    mime_type="application/json",
)
def job_record(job_id: str, ctx: ToolContext) -> str:
    kit = Toolkit.of(ctx)
    with error_boundary():
        try:
            return kit.jobs.status(f"job://{job_id}").model_dump_json()
        except NotFound as exc:
            raise ResourceNotFoundError(str(exc)) from exc
