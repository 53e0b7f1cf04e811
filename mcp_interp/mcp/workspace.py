"""One principal's state, in one place: its ledger, its part of the store and its jobs.

Over HTTP with ``--auth-tokens`` each token names a principal (``app.tokens``); the request's ASGI scope carries the
name (``PRINCIPAL_SCOPE``, set by ``app.http.BearerAuth`` after the token is checked — never a header a client
chooses). Everything a principal makes lives in its ``Workspace``: the calls it made (``ledger://``,
``export_investigation``), what it stored (results, circuits, directions, graphs, figures, scripts — in a folder of its
own under the output folder, so another principal's id is simply not there: the same error as an id never stored) and
its jobs (``job_status`` and ``job_cancel`` of another principal's job say "unknown job"). The model is shared; its
time is served in turn (``turns``). Over stdio, and with a single ``--auth-token``, there is one principal (``None``):
its workspace is the host's own store and ledger, as before principals existed.
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass
from typing import Any

from mcp_interp.host import ModelHost
from mcp_interp.mcp.queue import JobQueue
from mcp_interp.state.folders import principal_dir
from mcp_interp.state.ledger import Ledger
from mcp_interp.state.store import Store

PRINCIPAL_SCOPE = "mcp_interp.principal"  # the ASGI scope key the HTTP transport sets to the token's principal


@dataclass
class Workspace:
    principal: str | None  # None: the one principal of stdio or of a single token
    store: Store
    ledger: Ledger
    jobs: JobQueue


def principal_of(request: Any) -> str | None:
    """The principal a request was authenticated as (None: no named principal). ``request`` is what the SDK hands a
    handler as the transport's request (over HTTP a Starlette request; absent over stdio and in the Python API)."""
    scope = getattr(request, "scope", None)
    name = scope.get(PRINCIPAL_SCOPE) if scope is not None else None
    return name if isinstance(name, str) and name else None


class Workspaces:
    """Every principal's workspace on one server, made on a principal's first request."""

    def __init__(self, host: ModelHost) -> None:
        self.host = host
        self.server = secrets.token_hex(6)  # this server, to others sharing its store (job records name it)
        self.default = Workspace(None, host.store, host.ledger, JobQueue(host.store, None, self.server))
        self.named: dict[str, Workspace] = {}

    def of(self, principal: str | None) -> Workspace:
        if principal is None:
            return self.default
        found = self.named.get(principal)
        if found is None:
            store = Store(principal_dir(self.host.store.root, principal))
            jobs = JobQueue(store, principal, self.server)
            found = self.named[principal] = Workspace(principal, store, Ledger(), jobs)
        return found

    def all(self) -> list[Workspace]:
        return [self.default, *self.named.values()]

    async def shutdown(self) -> None:
        """Every principal's unfinished jobs cancelled (the server is stopping)."""
        for workspace in self.all():
            with contextlib.suppress(Exception):
                await workspace.jobs.shutdown()
