"""Every tool call into its principal's ledger (``state.ledger``, in the caller's ``Workspace``), from the one
place every call passes: ``argument_errors.Server.call_tool`` (over any transport, and for the public Python API, which
calls it too).

A call is recorded as it starts (tool, arguments as sent, each handle resolved to the call that made it with the
sha256 of its stored bytes, seeds) and closed when it ends: the weights and library versions, the wall time, the
result's key numbers and URIs — or its error, argument errors included. A ``background: true`` call is recorded as the
call that queued the job; ``settle_jobs`` fills in its result's numbers once the job is done (before the ledger is read
or exported), and the export reruns it in the foreground.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from mcp.types import CallToolResult, TextContent

from mcp_interp.host import ModelHost
from mcp_interp.mcp.toolkit import Toolkit
from mcp_interp.state.ledger import VERSIONED, Ledger, uris_at
from mcp_interp.state.store import Store, parse_uri

T = TypeVar("T")


def handle_hashes(store: Store, arguments: dict[str, Any]) -> dict[str, str | None]:
    """The sha256 of each stored URI in ``arguments`` (None for one not stored, for this principal)."""
    hashes: dict[str, str | None] = {}
    for uri in uris_at(arguments).values():
        try:
            stored = parse_uri(uri)
            hashes[uri] = hashlib.sha256(store.path(stored.kind, stored.id).read_bytes()).hexdigest()
        except (LookupError, OSError):
            hashes[uri] = None
    return hashes


def model_record(host: ModelHost) -> dict[str, Any] | None:
    """Which weights and libraries answered (None while the model is not loaded, or failed to load)."""
    if host.state != "ready":
        return None
    try:
        ref = host.model_ref()
    except Exception:
        return None
    return {
        "name": ref.name,
        "fingerprint": ref.fingerprint,
        "versions": {name: ref.versions.get(name, "unknown") for name in VERSIONED},
    }


async def recorded(kit: Toolkit, tool: str, arguments: dict[str, Any], call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, recorded in the ledger of ``kit``'s principal; its result or exception passes through unchanged."""
    host, ledger = kit.host, kit.workspace.ledger
    entry = ledger.open(
        tool, dict(arguments), handle_hashes(kit.workspace.store, arguments),
        datetime.now(UTC).isoformat(timespec="seconds"),
    )  # fmt: skip
    started = time.perf_counter()
    try:
        result = await call()
    except BaseException as exc:
        entry.elapsed_s = round(time.perf_counter() - started, 6)
        entry.model = model_record(host)
        ledger.close(entry, None, str(exc) or type(exc).__name__)
        raise
    entry.elapsed_s = round(time.perf_counter() - started, 6)
    entry.model = model_record(host)
    if isinstance(result, CallToolResult) and result.is_error:
        text = "\n".join(block.text for block in result.content if isinstance(block, TextContent))
        ledger.close(entry, None, text or "error")
    else:
        structured = result.structured_content if isinstance(result, CallToolResult) else None
        texts = [block.text for block in result.content if isinstance(block, TextContent)] if isinstance(
            result, CallToolResult
        ) else []  # fmt: skip
        ledger.close(entry, structured, None, texts[0] if texts else None)
    return result


def settle_jobs(kit: Toolkit) -> None:
    """Fill in the background calls whose jobs have finished since they were recorded."""
    ledger: Ledger = kit.workspace.ledger
    for entry in ledger.pending_jobs():
        try:
            status = kit.jobs.status(entry.job_uri or "")
        except LookupError:
            ledger.settle(entry, "lost", None, f"{entry.job_uri} is no longer stored")
            continue
        ledger.settle(entry, status.state, status.result, status.error)
