"""A tool family's declarations: its tools, resources and prompts, registered on the server by ``server.py``.

``Family.tool`` is where a tool gets what every tool has: MCP Apps view metadata, the resources-changed announcement
after a call that stored something (``announcing``), the background form that queues the call as a job
(``in_background``, its output schema admitting the job handle) and compacted schemas (``schema_shaping``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mcp.server import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from mcp_interp.mcp.schema_shaping import admit_job_handles, compact_tool_schemas
from mcp_interp.mcp.sdk_internals import refuse_unknown_arguments
from mcp_interp.mcp.toolkit import Toolkit

F = TypeVar("F", bound=Callable[..., Any])

READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False, destructive_hint=False)
WRITES_CACHE = ToolAnnotations(
    read_only_hint=False, idempotent_hint=True, open_world_hint=False, destructive_hint=False
)


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

    def tool(
        self,
        annotations: ToolAnnotations = READ_ONLY,
        view: str | None = None,
        background: bool = False,
        model: bool = True,
    ) -> Callable[[F], F]:
        """Declare a tool; ``view`` names the MCP Apps view (``ui://mcp-interp/<view>``) hosts may render its
        result in (``_meta.ui.resourceUri``, and the older flat key ``ui/resourceUri`` for hosts that read it).
        ``background``: the tool takes ``background: true`` to run as a job (``queue``) and return its handle at
        once; its published output schema then admits that handle (``schema_shaping.admit_job_handles``).
        ``model=False``: the tool never touches the model, so its calls answer while the model loads; every other
        tool's call first waits for the model (``waiting_for_model``)."""
        meta = None if view is None else {"ui": {"resourceUri": view_uri(view)}, "ui/resourceUri": view_uri(view)}

        def declare(fn: F) -> F:
            self.tools.append(fn)
            body = waiting_for_model(fn) if model else fn
            target = announcing(in_background(body) if background else body)

            def add(server: MCPServer[Any]) -> None:
                server.add_tool(target, description=one_line(fn.__doc__), annotations=annotations, meta=meta)
                refuse_unknown_arguments(server, fn.__name__)  # nothing accepted and ignored: one rule, every tool
                if background:
                    admit_job_handles(server, fn.__name__)
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


def waiting_for_model(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``fn`` that first waits for the model while it loads (reporting progress about once a second), or fails with
    the load's own error: one rule for every tool, so no tool body ever reaches for a model that is not there yet —
    in the foreground or, queued with ``background: true``, when its job starts."""

    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> Any:
        ctx = kwargs.get("ctx")
        if ctx is not None:
            await Toolkit.of(ctx).model(ctx)
        return await fn(*args, **kwargs)

    return run


def announcing(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``fn`` that, when its call stored something (a figure, a result, …), tells the client the resources list
    changed — on 2025-era connections as ``notifications/resources/list_changed``, on 2026-07-28 ones on the
    subscription bus; each is a no-op where it does not apply, and a client that cannot take it costs nothing."""

    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> Any:
        ctx = kwargs.get("ctx")
        store = Toolkit.of(ctx).workspace.store if ctx is not None else None
        before = store.version if store is not None else 0
        result = await fn(*args, **kwargs)
        if ctx is not None and store is not None and store.version != before:
            for notify in (ctx.session.send_resource_list_changed, ctx.notify_resources_changed):
                with contextlib.suppress(Exception):
                    await notify()
        return result

    return run


def in_background(fn: Callable[..., Awaitable[CallToolResult]]) -> Callable[..., Awaitable[CallToolResult]]:
    """``fn`` that, called with ``background=True``, queues its own foreground run as a job and returns the job's
    status at once (the same arguments, the same code path, the result kept for ``job_status``)."""

    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> CallToolResult:
        if not kwargs.get("background"):
            return await fn(*args, **kwargs)
        kit = Toolkit.of(kwargs["ctx"])
        status = kit.jobs.start(fn.__name__, lambda: fn(*args, **{**kwargs, "background": False}))
        estimate = f" The last run of {fn.__name__} here took {status.estimate_s:.0f} s." if status.estimate_s else ""
        text = f"{fn.__name__} queued as {status.job_uri} (position {status.queue_position}).{estimate}"
        data = {"job": status.model_dump(mode="json"), "notes": [f"Follow it with job_status('{status.job_uri}')."]}
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)

    return run


def one_line(docstring: str | None) -> str:
    """A tool's docstring as its listed description: one line, the source's wrapping and indentation dropped (each
    wrapped line cost a newline and four spaces of every client's context, and no client shows the wrap)."""
    return " ".join((docstring or "").split())
