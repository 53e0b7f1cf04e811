"""The model's time, served in turn: who runs next when several callers wait for the one loaded model.

One model serves every caller, one unit of work at a time (a call, or one step of a job). When the model comes free,
the next unit goes to the principal served least recently among those waiting, and within a principal to the unit that
has waited longest. So principals take turns, and a job, which asks again after every step, yields to every call that
queued while its step ran: a short call waits at most one job step (plus the units of principals ahead of it in the
turn), never a whole job. Over stdio there is one principal and this is first come, first served.

A thread lock guards the state rather than an asyncio one so the turns outlive any one event loop (the public Python
API runs its own); waiting is polling (``take`` sleeps ``POLL_S`` between tries), so a waiter that is cancelled simply
leaves the line.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

import anyio

POLL_S = 0.005


@dataclass(eq=False)
class Ticket:
    """One unit of work waiting for (or holding) the model."""

    principal: str | None
    number: int = field(default=0)


class Turns:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[Ticket] = []
        self._holder: Ticket | None = None
        self._numbers = itertools.count()
        self._served: dict[str | None, int] = {}  # principal → when it was last given the model (a count of grants)
        self._grants = itertools.count()

    async def take(self, principal: str | None) -> Ticket:
        """Wait for the model's turn of ``principal``; the ticket to ``release``. A cancelled waiter leaves the line."""
        ticket = Ticket(principal)
        with self._lock:
            ticket.number = next(self._numbers)
            self._waiting.append(ticket)
        try:
            while not self._try(ticket):
                await anyio.sleep(POLL_S)
        except BaseException:
            with self._lock:
                if ticket in self._waiting:
                    self._waiting.remove(ticket)
                elif self._holder is ticket:  # granted just as the wait was cancelled
                    self._holder = None
            raise
        return ticket

    def _try(self, ticket: Ticket) -> bool:
        with self._lock:
            if self._holder is not None or self._next() is not ticket:
                return False
            self._waiting.remove(ticket)
            self._holder = ticket
            self._served[ticket.principal] = next(self._grants)
            return True

    def _next(self) -> Ticket | None:
        """The principal served least recently (never served: first), then its longest-waiting unit."""
        if not self._waiting:
            return None
        return min(self._waiting, key=lambda t: (self._served.get(t.principal, -1), t.number))

    def release(self, ticket: Ticket) -> None:
        with self._lock:
            if self._holder is ticket:
                self._holder = None

    def waiting(self) -> int:
        """Units waiting now (for tests and logs)."""
        with self._lock:
            return len(self._waiting)
