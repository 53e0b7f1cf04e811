"""What every tool family's adapter uses: the model, its thread, progress, figures, results, errors.

One ``Toolkit`` lives as long as the server (it is the lifespan context, so a tool reaches it
with ``Toolkit.of(ctx)``). Each method is a step every tool would otherwise write again:

* ``model`` — wait for the model while it loads, telling the client how long so far;
* ``call`` / ``run`` / ``run_job`` — core work on the model thread under the model lock (``run``
  adds provenance; ``run_job`` drives a long job step by step with MCP progress, so a cancelled
  request stops at the next step boundary);
* ``figure`` / ``store`` — render on the figure thread, store, and link as a resource;
* ``finish`` — summary text plus structured content (clients such as Claude Code read only the
  structured part, so the summary repeats nothing the JSON lacks).

It is also the one error boundary: ``InterpError`` (core's caller-facing errors) becomes a tool
error with its text verbatim; any other exception is a bug in mcp-interp and becomes a tool error
with a short message while its traceback goes to the server log (stderr).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.types import CallToolResult, ResourceLink, TextContent, ToolAnnotations
from pydantic import BaseModel

from mcp_interp.core.engine.jobs import Job
from mcp_interp.core.features.directions import resolve_direction_refs
from mcp_interp.errors import InterpError
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.common import Measurement, Provenance
from mcp_interp.session import Session
from mcp_interp.store import MIME_TYPES, NotFound

log = logging.getLogger(__name__)

R = TypeVar("R", bound=BaseModel)
T = TypeVar("T")
J = TypeVar("J", bound="Job[Any]")
F = TypeVar("F", bound=Callable[..., Any])

READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False, destructive_hint=False)
WRITES_CACHE = ToolAnnotations(
    read_only_hint=False, idempotent_hint=True, open_world_hint=False, destructive_hint=False
)


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
    def __init__(self, session: Session) -> None:
        self.session = session

    @staticmethod
    def of(ctx: ToolContext) -> Toolkit:
        """The server's toolkit, from any tool's or resource's context (the server's typed lifespan context)."""
        return ctx.request_context.lifespan_context

    # --- the model and its thread ---------------------------------------------------------------

    async def model(self, ctx: ToolContext) -> LoadedModel:
        """The loaded model; while it loads, report progress about once a second instead of failing."""

        async def report_wait(seconds: float) -> None:
            await ctx.report_progress(
                0, None, f"waiting for model {self.session.model_name} to finish loading ({seconds:.0f} s so far)"
            )

        with error_boundary():
            return await self.session.model(on_wait=report_wait)

    async def call(self, fn: Callable[..., T], *args: Any, locked: bool = True) -> T:
        """``fn(*args)`` on the model thread under the model lock (``locked=False``: a worker thread, for work
        that runs no forward pass, so it never waits behind a long scan)."""
        runner = self.session.run if locked else self.session.run_unlocked
        with error_boundary():
            return await runner(fn, *args)

    async def run(
        self, ctx: ToolContext, result_type: type[R], fn: Callable[..., Measurement], *args: Any, locked: bool = True
    ) -> R:
        """The common tool body: ``fn(model, *args)`` → a measurement, returned with provenance.

        Interventions naming a stored direction (``direction://…``) get its vector here, on the model thread,
        so every tool that takes an ``intervention`` accepts one."""
        model = await self.model(ctx)
        started = time.perf_counter()

        def measure(model: LoadedModel, *args: Any) -> Measurement:
            return fn(model, *(resolve_direction_refs(arg, self.direction_lookup, model) for arg in args))

        measurement = await self.call(measure, model, *args, locked=locked)
        return self.with_provenance(result_type, measurement, started)

    def direction_lookup(self, direction_id: str) -> bytes:
        """A stored direction's JSON by id (``NotFound``, a ``LookupError``, for an unknown one)."""
        return self.session.store.get("direction", direction_id)

    async def run_job(self, ctx: ToolContext, job: Job[Any]) -> None:
        """Drive a long job one step per model-thread hop, reporting MCP progress after each step.

        A cancelled request stops at the next step boundary; the job is closed on the model thread.
        """
        with error_boundary():
            total = job.total_steps()

            async def progress(done: int, message: str) -> None:
                await ctx.report_progress(done, total, message)

            await self.session.run_steps(job.steps(), progress)

    async def measured_job(self, ctx: ToolContext, make_job: Callable[[LoadedModel], J]) -> tuple[J, float]:
        """The common body of a long tool: the job built on the loaded model, run with progress and cancellation;
        returns the finished job and when it started (for ``with_provenance``)."""
        model = await self.model(ctx)
        started = time.perf_counter()
        job = make_job(model)
        await self.run_job(ctx, job)
        return job, started

    def with_provenance(self, result_type: type[R], measurement: Measurement, started: float) -> R:
        """The measurement plus which weights produced it, a fresh run id and the wall time since ``started``."""
        provenance = Provenance(
            model=self.session.model_ref(), run_id=uuid.uuid4().hex, elapsed_s=round(time.perf_counter() - started, 6)
        )
        return result_type(**dict(measurement), **dict(provenance))

    # --- stored outputs -------------------------------------------------------------------------

    async def figure(self, title: str, render: Callable[..., bytes], *args: Any) -> tuple[str, ResourceLink]:
        """Render a PNG on the figure thread, store it, and return its ``figure://`` URI and a link."""
        with error_boundary():
            png = await self.session.render(render, *args)
        return self.store("figure", png, title)

    def store(self, kind: str, data: bytes, name: str) -> tuple[str, ResourceLink]:
        """Store ``data`` as a new entry of ``kind`` (figure, report, artifact); its URI and a resource link."""
        stored = self.session.store.put(kind, data)
        link = ResourceLink(type="resource_link", uri=stored.uri, name=name, mime_type=MIME_TYPES[kind], size=len(data))
        return stored.uri, link

    def read(self, kind: str, entry_id: str) -> bytes:
        """A stored entry's bytes for a resource read; an unknown or malformed id is a resource error."""
        try:
            return self.session.store.get(kind, entry_id)
        except NotFound as exc:
            raise ResourceError(str(exc)) from exc

    @staticmethod
    def finish(result: BaseModel, summary: str, links: list[ResourceLink]) -> CallToolResult:
        """A result with a one-paragraph summary and resource links as content, the result as structured content."""
        return CallToolResult(
            content=[TextContent(type="text", text=summary), *links],
            structured_content=result.model_dump(mode="json"),
        )


ToolContext = Context[Toolkit, Any]
"""What a tool or resource function here receives: the SDK context, typed with its lifespan (the Toolkit)."""


def tool_arguments(values: dict[str, Any]) -> dict[str, Any]:
    """A tool's own arguments from its ``locals()`` at its first line (everything but the context): the tools whose
    parameters are exactly their job's fields pass them on as ``Job(model=model, **arguments)``."""
    return {name: value for name, value in values.items() if name != "ctx"}


def view_uri(view: str) -> str:
    """The URI of an MCP Apps view shipped in ``mcp_interp/data/views/``."""
    return f"ui://mcp-interp/{view}"


class Family:
    """One tool family's tools and resources, declared where they are written and registered by ``server.py``.

    Tools stay plain decorated functions at module level (their signatures are the input schemas, their return
    annotations the output schemas); ``register`` hands them to the server, so adding a tool touches only its
    family's module.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.tools: list[Callable[..., Any]] = []
        self._registrations: list[Callable[[MCPServer[Any]], object]] = []

    def tool(self, annotations: ToolAnnotations = READ_ONLY, view: str | None = None) -> Callable[[F], F]:
        """Declare a tool; ``view`` names the MCP Apps view (``ui://mcp-interp/<view>``) hosts may render its
        result in (``_meta.ui.resourceUri``, and the older flat key ``ui/resourceUri`` for hosts that read it)."""
        meta = None if view is None else {"ui": {"resourceUri": view_uri(view)}, "ui/resourceUri": view_uri(view)}

        def declare(fn: F) -> F:
            self.tools.append(fn)

            def add(server: MCPServer[Any]) -> None:
                server.add_tool(fn, annotations=annotations, meta=meta)
                compact_tool_schemas(server, fn.__name__)

            self._registrations.append(add)
            return fn

        return declare

    def resource(self, uri: str, **options: Any) -> Callable[[F], F]:
        def declare(fn: F) -> F:
            self._registrations.append(lambda server: server.resource(uri, **options)(fn))
            return fn

        return declare

    def prompt(self, **options: Any) -> Callable[[F], F]:
        def declare(fn: F) -> F:
            self._registrations.append(lambda server: server.prompt(**options)(fn))
            return fn

        return declare

    def register(self, server: MCPServer[Any]) -> None:
        for add in self._registrations:
            add(server)


def compact_schema(schema: Any, shared: frozenset[str] = frozenset()) -> Any:
    """A JSON schema without pydantic's ``title`` keywords (they restate the property names) and, inside the
    definitions named in ``shared``, without descriptions (shared output types are described once, in the server's
    instructions and the README). Property *names* are kept whatever they are called, "title" included."""
    if isinstance(schema, list):
        return [compact_schema(item, shared) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and not isinstance(value, dict):
            continue
        if key == "properties":
            out[key] = {name: compact_schema(sub, shared) for name, sub in value.items()}
        elif key == "$defs":
            out[key] = {name: compact_schema(_undescribed(sub) if name in shared else sub, shared)
                        for name, sub in value.items()}  # fmt: skip
        else:
            out[key] = compact_schema(value, shared)
    return out


def _undescribed(schema: Any) -> Any:
    """``schema`` without its ``description`` keywords (property names are kept, whatever they are called)."""
    if isinstance(schema, list):
        return [_undescribed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        key: {name: _undescribed(sub) for name, sub in value.items()}
        if key in ("properties", "$defs")
        else _undescribed(value)
        for key, value in schema.items()
        if key != "description"
    }


SHARED_OUTPUT_TYPES = frozenset({"ModelRef", "Score"})


def compact_tool_schemas(server: MCPServer[Any], name: str) -> None:
    """Publish ``name``'s input and output schemas compacted (``compact_schema``). The SDK keeps both on its tool
    record and reads them live; there is no public setter, hence the one reach into ``_tool_manager`` —
    ``tests/server/test_surface.py`` fails if it stops taking effect."""
    tool = server._tool_manager.get_tool(name)
    assert tool is not None, name
    tool.parameters = compact_schema(tool.parameters)
    if tool.fn_metadata.output_schema is not None:
        tool.fn_metadata.output_schema = compact_schema(tool.fn_metadata.output_schema, SHARED_OUTPUT_TYPES)
        tool.__dict__.pop("output_schema", None)  # the record caches the schema it first read
