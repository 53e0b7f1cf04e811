"""The stop signal of the model work in flight, checked before every transformer block.

Torch cannot be stopped from outside a call, and one step of a long job can be one exact forward over every pair
(find_circuit's bisection on SmolLM2 with answer sets: minutes). So the host gives each unit of model work its own
``threading.Event`` (``Interrupt.running``), sets it when the unit's caller is cancelled, and the backend raises
``Interrupted`` before the next block: a cancelled call or job frees the model within one block's forward.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from mcp_interp.errors import Interrupted


class Interrupt:
    """The stop event of the unit of work running now (None between units)."""

    def __init__(self) -> None:
        self.current: threading.Event | None = None

    @contextlib.contextmanager
    def running(self, stop: threading.Event) -> Iterator[None]:
        """``stop`` watched for the duration (on the model thread, around one unit of work)."""
        previous, self.current = self.current, stop
        try:
            yield
        finally:
            self.current = previous

    def check(self, *_: Any) -> None:
        """A forward pre-hook: raise ``Interrupted`` once the work in flight was cancelled."""
        event = self.current
        if event is not None and event.is_set():
            raise Interrupted
