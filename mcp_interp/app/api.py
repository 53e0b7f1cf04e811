"""The public Python API: every tool as a method of ``Session``, no MCP client or transport involved.

    from mcp_interp import Session
    s = Session("smollm2-135m")
    r = s.patch_heads(clean_prompts=[...], corrupt_prompts=[...], correct=" Mary", incorrect=" John")
    r.heads[0].score                      # a PatchHeadsResult, the same object the tool's structured content is

It shares one implementation with the tools: a method calls the server's own ``call_tool`` (argument validation,
the error boundary, the ledger) with a minimal context that gives what a tool reads from one (the lifespan Toolkit,
progress reports, resource announcements — the last two do nothing here), and validates the structured content into
the tool's declared result type (``Annotated[CallToolResult, XResult]``). A tool error raises ``ToolCallError`` with
the tool's message. Every call is recorded in ``ledger`` (``export_investigation`` reruns them through this class).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import typing
from pathlib import Path
from typing import Any, cast

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel

from mcp_interp.core.engine.backend.options import LoadOptions
from mcp_interp.errors import ToolCallError
from mcp_interp.host import ModelHost
from mcp_interp.mcp.server import FAMILIES, build_server
from mcp_interp.mcp.toolkit import Toolkit
from mcp_interp.names import EMBEDDED_NAME
from mcp_interp.state.folders import default_output_dir
from mcp_interp.state.ledger import Ledger
from mcp_interp.state.store import parse_uri

NOT_METHODS = frozenset({"job_status", "job_cancel"})  # about background jobs, which a method never starts


class _Quiet:
    """What a tool's context reaches for beyond the toolkit: progress and announcements go nowhere."""

    async def report_progress(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def send_resource_list_changed(self) -> None:
        return None


class _Request:
    def __init__(self, toolkit: Toolkit) -> None:
        self.lifespan_context = toolkit
        self.session = _Quiet()


def _context(toolkit: Toolkit) -> Context[Toolkit, Any]:
    """The context a tool receives when called from Python: ``Toolkit.of(ctx)`` and ``ctx.report_progress`` work."""
    return Context(request_context=cast(Any, _Request(toolkit)))


def result_types() -> dict[str, tuple[type[BaseModel], str, inspect.Signature]]:
    """Each tool's declared result type, docstring and Python signature (without the context and ``background``)."""
    found = {}
    for family in FAMILIES:
        for fn in family.tools:
            hints = typing.get_type_hints(fn, include_extras=True)
            declared = hints["return"].__metadata__[0]
            signature = inspect.signature(fn)
            parameters = [
                p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation))
                for p in signature.parameters.values()
                if p.name not in ("ctx", "background")
            ]
            found[fn.__name__] = (declared, fn.__doc__ or "", signature.replace(parameters=parameters))
    return found


RESULT_TYPES = result_types()


class Session:
    """One loaded model and every tool as a method returning the tool's pydantic result.

    ``model``: ``smollm2-135m`` (the embedded default), ``tiny``, a hub name or a local folder (a ``compile-rasp``
    folder too), as ``mcp-interp --model``; ``output_dir``: where figures and stored results go (default: the server's
    output folder); ``reveal_ground_truth``: a compiled program's ground truth in ``model_info``."""

    def __init__(
        self,
        model: str = EMBEDDED_NAME,
        output_dir: str | Path | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        host: ModelHost | None = None,
        reveal_ground_truth: bool = False,
    ) -> None:
        self.host = host or ModelHost(
            model, Path(output_dir) if output_dir is not None else default_output_dir(), device=device, dtype=dtype,
            options=LoadOptions(reveal_ground_truth=reveal_ground_truth),
        )  # fmt: skip
        self.server = build_server(self.host)
        self.toolkit = Toolkit(self.host)
        # The calls run on an event loop of the session's own thread, not the caller's: a caller that already runs
        # one (Jupyter's kernel, an async application) cannot run another in its thread.
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-interp-api", daemon=True)
        self._thread.start()
        self.host.start_loading()

    @property
    def ledger(self) -> Ledger:
        """Every call made through this session, in order (the server's ledger: ``mcp_interp.state.ledger``)."""
        return self.host.ledger

    @property
    def fingerprint(self) -> str:
        """The loaded weights' fingerprint (waits for the model)."""
        return self.host.wait_loaded().fingerprint

    def call(self, tool: str, **arguments: Any) -> Any:
        """Call the tool ``tool`` with ``arguments`` (as a client would send them); its typed result."""
        if tool not in RESULT_TYPES or tool in NOT_METHODS:
            raise ToolCallError(
                tool, f"Unknown tool {tool!r}; the tools are {sorted(set(RESULT_TYPES) - NOT_METHODS)}."
            )
        if arguments.pop("background", False):
            raise ToolCallError(tool, "`background` is for MCP clients; a Python call runs in the foreground.")
        result = asyncio.run_coroutine_threadsafe(self._call(tool, arguments), self._loop).result()
        if result.is_error:
            text = "\n".join(block.text for block in result.content if isinstance(block, TextContent))
            raise ToolCallError(tool, text)
        return RESULT_TYPES[tool][0].model_validate(result.structured_content)

    async def _call(self, tool: str, arguments: dict[str, Any]) -> CallToolResult:
        try:
            result = await self.server.call_tool(tool, arguments, _context(self.toolkit))
        except ToolError as exc:
            raise ToolCallError(tool, str(exc)) from exc
        assert isinstance(result, CallToolResult)
        return result

    def read(self, uri: str) -> bytes:
        """The stored bytes behind a URI a result names (``figure://…`` a PNG, ``direction://…`` JSON, …); a URI
        that is not stored (never, or evicted) raises ``LookupError``."""
        stored = parse_uri(uri)
        return self.host.store.get(stored.kind, stored.id)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def _method(tool: str) -> Any:
    result_type, doc, signature = RESULT_TYPES[tool]

    @functools.wraps(Session.call)
    def method(self: Session, **arguments: Any) -> Any:
        return self.call(tool, **arguments)

    method.__name__ = method.__qualname__ = tool
    method.__doc__ = doc
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *signature.parameters.values()],
        return_annotation=result_type,
    )
    return method


for _tool in RESULT_TYPES:
    if _tool not in NOT_METHODS:
        setattr(Session, _tool, _method(_tool))
