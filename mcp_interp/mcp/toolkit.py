"""What every tool family's adapter uses: the model, its thread, progress, figures, results, errors.

One ``Toolkit`` lives as long as the server (it is the lifespan context), and one more per principal
(``mcp.workspace``): a tool reaches the toolkit of the principal its request was authenticated as with
``Toolkit.of(ctx)``, whose ``workspace`` holds that principal's store, ledger and jobs and whose model work
runs in that principal's turn. Each method is a step every tool would otherwise write again:

* ``model`` — wait for the model while it loads, telling the client how long so far;
* ``call`` / ``run`` / ``run_job`` — core work on the model thread under the model lock (``run``
  adds provenance; ``run_job`` drives a long job step by step with MCP progress, so a cancelled
  request stops at the next step boundary);
* ``figure`` / ``draw`` / ``store`` — render (a family's ``Plot``) on the figure thread, store, and link as a
  resource;
* ``finish`` — summary text plus structured content (clients such as Claude Code read only the
  structured part, so the summary repeats nothing the JSON lacks).

It is also the one error boundary: ``InterpError`` (core's caller-facing errors) becomes a tool
error with its text verbatim; any other exception is a bug in mcp-interp and becomes a tool error
with a short message while its traceback goes to the server log (stderr). Arguments that fail the
input schema never reach a tool: ``argument_errors.Server`` tells the client what to pass.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.types import CallToolResult, ResourceLink, TextContent
from pydantic import BaseModel

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import Job, Pause, Progress
from mcp_interp.errors import InputError, InterpError, NotFound, NumericalError
from mcp_interp.figures import Plot
from mcp_interp.host import ModelHost
from mcp_interp.mcp.queue import JobQueue, current_job
from mcp_interp.mcp.results import DEFAULT_TOP, compact, cut_note, summary_text
from mcp_interp.mcp.workspace import Workspace, Workspaces, principal_of
from mcp_interp.schemas.common import Measurement, Provenance
from mcp_interp.state.store import MIME_TYPES, URI_PATTERN

log = logging.getLogger(__name__)

R = TypeVar("R", bound=BaseModel)
T = TypeVar("T")
J = TypeVar("J", bound="Job[Any]")


@contextmanager
def error_boundary() -> Iterator[None]:
    """Core's caller-facing errors → tool errors verbatim; anything else → a short tool error, traceback logged."""
    try:
        yield
    except (ToolError, ResourceError):
        raise
    except InterpError as exc:
        raise ToolError(str(exc)) from exc
    except Exception as exc:
        log.exception("internal error in mcp-interp")
        raise ToolError(
            f"Internal error in mcp-interp ({type(exc).__name__}); the server's log (stderr) has the traceback. "
            "The server is still running and no stored result was lost."
        ) from exc


class Toolkit:
    def __init__(self, host: ModelHost, workspaces: Workspaces | None = None, principal: str | None = None) -> None:
        self.host = host
        self.workspaces = workspaces or Workspaces(host)
        self.workspace: Workspace = self.workspaces.of(principal)
        self._principals: dict[str, Toolkit] = {}  # the root toolkit's: one per named principal

    @property
    def jobs(self) -> JobQueue:
        return self.workspace.jobs

    @staticmethod
    def of(ctx: ToolContext) -> Toolkit:
        """The toolkit of the principal whose request this is, from any tool's or resource's context."""
        return Toolkit.for_request(ctx.request_context)

    @staticmethod
    def for_request(request_context: Any) -> Toolkit:
        """The toolkit of a request's principal, from the SDK's request context (a tool's ``ctx.request_context``, or
        what a low-level handler gets): the server's lifespan toolkit, or the one of the principal the HTTP transport
        authenticated (``workspace.principal_of``)."""
        root: Toolkit = request_context.lifespan_context
        return root.for_principal(principal_of(getattr(request_context, "request", None)))

    def for_principal(self, principal: str | None) -> Toolkit:
        if principal is None:
            return self
        found = self._principals.get(principal)
        if found is None:
            found = self._principals[principal] = Toolkit(self.host, self.workspaces, principal)
        return found

    # --- the model and its thread ---------------------------------------------------------------

    async def model(self, ctx: ToolContext) -> LoadedModel:
        """The loaded model; while it loads, report progress about once a second instead of failing."""

        async def report_wait(seconds: float) -> None:
            message = f"waiting for model {self.host.shown_name} to finish loading ({seconds:.0f} s so far)"
            await self.report(ctx, 0, None, message)

        with error_boundary():
            return await self.host.model(on_wait=report_wait)

    async def call(self, fn: Callable[..., T], *args: Any, locked: bool = True) -> T:
        """``fn(*args)`` on the model thread under the model lock (``locked=False``: a worker thread, for work
        that runs no forward pass, so it never waits behind a long scan)."""
        with error_boundary():
            if locked:
                return await self.host.run_for(self.workspace.principal, partial(fn, *args))
            return await self.host.run_unlocked(fn, *args)

    async def report(self, ctx: ToolContext, done: float, total: float | None, message: str | None) -> None:
        """Progress: to the request as notifications/progress, or — inside a background job — to the job's record."""
        record = current_job.get()
        if record is not None:
            self.jobs.report(record, done, total, message)
        else:
            await ctx.report_progress(done, total, message)

    async def measure(
        self, ctx: ToolContext, result_type: type[R], fn: Callable[..., Measurement], *args: Any, locked: bool = True
    ) -> R:
        """``fn(model, *args)`` → a measurement, with provenance, run on the model thread: references an argument
        names (``direction://…``, SAE and transcoder folders) are resolved there, by the core function, through the
        one resolver (``core.engine.references``; a tool passes ``direction_lookup`` for direction:// URIs)."""
        model = await self.model(ctx)
        started = time.perf_counter()
        measurement = await self.call(fn, model, *args, locked=locked)
        return self.with_provenance(result_type, measurement, started)

    async def run(
        self,
        ctx: ToolContext,
        result_type: type[R],
        fn: Callable[..., Measurement],
        *args: Any,
        summary: Callable[[R], str],
        locked: bool = True,
        top: int = DEFAULT_TOP,
    ) -> CallToolResult:
        """The common tool body: ``measure``, then ``finish`` with the tool's one-line ``summary`` of the result."""
        result = await self.measure(ctx, result_type, fn, *args, locked=locked)
        return self.finish(result, summary(result), [], top=top)

    def direction_lookup(self, direction_id: str) -> bytes:
        """A stored direction's JSON by id (``NotFound``, a ``LookupError``, for an unknown one)."""
        return self.workspace.store.get("direction", direction_id)

    async def run_job(self, ctx: ToolContext, job: Job[Any]) -> None:
        """Drive a long job one step per model-thread hop, reporting MCP progress after each step.

        A cancelled request stops within the step in flight (at its next transformer block); the job is closed on the
        model thread. Inside a background job the job is kept on its record, so a cancelled one keeps its ``partial``.
        """
        record = current_job.get()
        if record is not None:
            record.job = job
        with error_boundary():
            total = job.total_steps()
            steps = 0  # the job's whole steps (its string messages); a ``Progress`` says where it stands itself

            async def progress(_: int, message: Any) -> None:
                nonlocal steps
                if isinstance(message, Pause):  # only a point where others got the model
                    return
                if isinstance(message, Progress):
                    await self.report(ctx, message.done, message.total, message.message)
                else:
                    steps += 1
                    await self.report(ctx, steps, total, str(message))

            await self.host.run_steps(job.steps(), progress, self.workspace.principal)

    async def measured_job(self, ctx: ToolContext, make_job: Callable[[LoadedModel], J]) -> tuple[J, float]:
        """The common body of a long tool: the job built on the loaded model, run with progress and cancellation;
        returns the finished job and when it started (for ``with_provenance``)."""
        model = await self.model(ctx)
        started = time.perf_counter()
        # Built on the model thread: a job's arguments may name references to load (a direction, an SAE), and no
        # load may block the event loop every other request is served on.
        job = await self.call(make_job, model)
        await self.run_job(ctx, job)
        return job, started

    def with_provenance(self, result_type: type[R], measurement: Measurement, started: float) -> R:
        """The measurement plus which weights produced it, a fresh run id and the wall time since ``started``."""
        provenance = Provenance(
            model=self.host.model_ref(), run_id=uuid.uuid4().hex, elapsed_s=round(time.perf_counter() - started, 6)
        )
        return result_type(**dict(measurement), **dict(provenance))

    # --- stored outputs -------------------------------------------------------------------------

    async def figure(self, title: str, render: Callable[..., bytes], *args: Any) -> tuple[str, ResourceLink]:
        """Render a PNG on the figure thread, store it, and return its ``figure://`` URI and a link."""
        with error_boundary():
            png = await self.host.render(render, *args)
        return self.store("figure", png, title)

    async def draw(self, plot: Plot) -> tuple[str, ResourceLink]:
        """``figure`` for the ``Plot`` a family says a result is drawn as."""
        return await self.figure(plot.name, plot.render, *plot.args)

    def store(self, kind: str, data: bytes, name: str, references: list[str] | None = None) -> tuple[str, ResourceLink]:
        """Store ``data`` as a new entry of ``kind`` (figure, report, artifact, …) that keeps the stored entries it
        ``references`` alive; its URI and a resource link."""
        stored = self.workspace.store.put(kind, data, references or ())
        link = ResourceLink(type="resource_link", uri=stored.uri, name=name, mime_type=MIME_TYPES[kind], size=len(data))
        return stored.uri, link

    def read(self, kind: str, entry_id: str) -> bytes:
        """A stored entry's bytes for a resource read; an unknown, evicted or malformed id is a resource error."""
        try:
            return self.workspace.store.get(kind, entry_id)
        except NotFound as exc:
            raise ResourceNotFoundError(str(exc)) from exc

    def read_entry(self, kind: str, entry_id: str) -> bytes:
        """A stored entry's bytes for a tool (a handle passed back in); unknown or evicted ids are input errors."""
        try:
            return self.workspace.store.get(kind, entry_id)
        except NotFound as exc:
            raise InputError(str(exc)) from None

    def finish(
        self, result: BaseModel, summary: str, links: list[ResourceLink], top: int = DEFAULT_TOP
    ) -> CallToolResult:
        """A result sized for a context window (``results.compact``: when anything is cut, the complete result is
        stored as ``result://`` and named), with a short summary and resource links as content. A result holding a
        non-finite number would violate its own schema: that is a tool error naming where, never a result."""
        with error_boundary():
            require_finite_result(result.model_dump(mode="python"), "")
        data, cut = compact(result, top)
        if cut:
            full = result.model_copy(update={"notes": [*getattr(result, "notes", [])]})
            handles = iter_uris(full.model_dump(mode="json"))  # the handles of rows cut here too, so they stay alive
            uri, link = self.store("result", full.model_dump_json().encode(), "complete result", handles)
            data["result_uri"] = uri
            data.setdefault("notes", []).append(cut_note(cut, uri))
            links = [*links, link]
        return CallToolResult(
            content=[TextContent(type="text", text=summary_text(summary)), *links], structured_content=data
        )


def require_finite_result(value: Any, path: str) -> None:
    """Raise ``NumericalError`` at the first NaN or infinity in a result (a JSON number cannot be either, and null
    would break the result's own schema)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise NumericalError(
            f"The measurement produced a non-finite number ({value}) at `{path or 'result'}`: the inputs are "
            "degenerate for it (e.g. identical clean and corrupt prompts, a zero gap, or a constant label). Change the "
            "inputs; the message of the measurement's own check, where it has one, says which."
        )
    if isinstance(value, dict):
        for key, sub in value.items():
            require_finite_result(sub, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list | tuple):
        for index, sub in enumerate(value):
            require_finite_result(sub, f"{path}[{index}]")


def iter_uris(value: Any) -> list[str]:
    """Every stored-entry URI a result names (its figures, directions, artifacts), so its stored copy keeps them."""
    if isinstance(value, str):
        return [value] if URI_PATTERN.fullmatch(value) else []
    if isinstance(value, dict):
        return [uri for sub in value.values() for uri in iter_uris(sub)]
    if isinstance(value, list):
        return [uri for sub in value for uri in iter_uris(sub)]
    return []


ToolContext = Context[Toolkit, Any]
"""What a tool or resource function here receives: the SDK context, typed with its lifespan (the Toolkit)."""


def tool_arguments(values: dict[str, Any]) -> dict[str, Any]:
    """A tool's own arguments from its ``locals()`` at its first line (all but the context and the result-shaping
    ``top`` and ``background``): the tools whose parameters are their job's fields pass them on as
    ``Job(model=model, **arguments)``."""
    return {name: value for name, value in values.items() if name not in ("ctx", "top", "background")}
