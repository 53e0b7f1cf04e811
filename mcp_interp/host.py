"""The one loaded model and everything that lives as long as it.

The model loads in a background thread started by the server's lifespan, so ``initialize``
and ``tools/list`` answer at once; a tool call that arrives while it loads waits (reporting
progress) instead of failing. All model work goes through ``run_for`` / ``run_steps``, one unit at a
time on the one model thread, so two experiments never interleave hooks on the same model. Who goes
next is ``turns.Turns``: principals in turn, and a job gives the model up between its steps, so a short
call waits at most one step of someone else's job — at a step boundary where the model is at rest
(``Backend.at_rest``: no edge points, frozen weights or inference mode a step left on), else the job
keeps its turn. The turns use a thread lock rather than an asyncio one so a Session can outlive an
event loop (in-process clients in tests, ``mcp-interp call``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import anyio
import anyio.to_thread

from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.loader.program import served_name
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.options import LoadOptions
from mcp_interp.errors import InterpError, ModelLoadError
from mcp_interp.schemas.common import ModelRef
from mcp_interp.state.ledger import Ledger
from mcp_interp.state.store import Store
from mcp_interp.state.turns import Ticket, Turns

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

WaitCallback = Callable[[float], Awaitable[None]]
StepCallback = Callable[[int, Any], Awaitable[None]]
_DONE = object()

_VERSIONED = ("mcp-interp", "torch", "transformers", "transformer-lens", "mcp")


async def on_thread(executor: ThreadPoolExecutor, fn: Callable[[], T], stop: threading.Event | None = None) -> T:
    """Await ``fn()`` run on ``executor``'s thread.

    If the caller is cancelled while ``fn`` runs, set ``stop`` (the backend then raises ``Interrupted`` before its
    next transformer block, ``backend.interrupt``) and wait (shielded) for ``fn`` to end before re-raising: the
    caller's lock must not be released while its work still runs. Work without blocks to interrupt (a backward, a
    fit) runs to its end.
    """
    future = asyncio.wrap_future(executor.submit(fn))
    try:
        return await asyncio.shield(future)
    except BaseException:
        if stop is not None:
            stop.set()
        with anyio.CancelScope(shield=True):
            while not future.done():
                await anyio.sleep(0.01)
        if not future.cancelled():
            future.exception()  # retrieved: the interrupt it ended with is expected, not an unhandled error
        raise


def load_with_options(name: str, device: str, dtype: str, options: LoadOptions) -> LoadedModel:
    return load_model(name, device, dtype, options)


def library_versions() -> dict[str, str]:
    versions = {}
    for dist in _VERSIONED:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    return versions


class ModelHost:
    def __init__(
        self,
        model_name: str,
        output_dir: Path,
        device: str = "cpu",
        dtype: str = "float32",
        loader: Callable[[str, str, str], LoadedModel] | None = None,
        options: LoadOptions | None = None,
    ) -> None:
        self.model_name = model_name  # what the loader is given (a compiled program's folder, say)
        self.device = device
        self.dtype = dtype
        self.options = options or LoadOptions()
        # what clients are told: a compiled program's folder stays hidden with its ground truth
        self.shown_name = served_name(model_name, self.options.reveal_ground_truth)
        self.store = Store(output_dir)
        self.ledger = Ledger()  # every tool call in this session (not in the store: eviction never drops it)
        self._loader = loader or partial(load_with_options, options=self.options)
        self._model: LoadedModel | None = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.turns = Turns()  # the model's time: one unit of work at a time, principals in turn
        # One long-lived thread for all model work and one for figures, instead of a rotating
        # pool: torch's allocations stay in one malloc arena and matplotlib opens its fonts once
        # (it caches them per thread), so a long session's memory and file descriptors stay flat.
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mcp-interp-model")
        self._figure_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mcp-interp-figures")
        self._loading_since = 0.0
        self._versions = library_versions()

    # --- loading ---------------------------------------------------------------------------

    def start_loading(self) -> None:
        """Begin loading in the background (idempotent: later calls do nothing)."""
        with self._start_lock:
            if self._thread is not None:
                return
            self._loading_since = time.perf_counter()
            self._thread = threading.Thread(target=self._load, name="mcp-interp-load", daemon=True)
            self._thread.start()

    def _load(self) -> None:
        try:
            log.info("loading model %s on %s (%s)", self.model_name, self.device, self.dtype)
            self._model = self._loader(self.model_name, self.device, self.dtype)
            log.info("model %s ready in %.1f s", self.model_name, self._model.load_seconds)
        except BaseException as exc:
            log.error("model %s failed to load: %s", self.model_name, exc)
            self._error = exc
        finally:
            self._ready.set()

    @property
    def state(self) -> str:
        if not self._ready.is_set():
            return "loading" if self._thread else "not started"
        return "failed" if self._error else "ready"

    def wait_loaded(self, timeout: float | None = None) -> LoadedModel:
        """Block until loaded (for scripts and tests); raise the load error if it failed."""
        self.start_loading()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"model {self.shown_name} still loading after {timeout} s")
        return self._loaded()

    async def model(self, on_wait: WaitCallback | None = None) -> LoadedModel:
        """The loaded model; while it loads, call ``on_wait(seconds_so_far)`` about once a second."""
        self.start_loading()
        while not self._ready.is_set():
            if on_wait is not None:
                await on_wait(time.perf_counter() - self._loading_since)
            with anyio.move_on_after(1.0):
                while not self._ready.is_set():
                    await anyio.sleep(0.05)
        return self._loaded()

    def close(self) -> None:
        """Release the loaded model's backend (a vLLM engine's worker processes), once whatever is loading has
        finished. A one-shot ``call`` ends with ``os._exit``, which runs no ``atexit`` hook: without this, vLLM's
        pipeline-stage workers outlive the process and hold its stdout open (seen: the answer printed in 0.8 s, the
        caller's read still waiting 20 min later)."""
        if self._thread is not None:
            self._ready.wait()
        model, self._model = self._model, None
        if model is not None:
            model.backend.close()

    def _loaded(self) -> LoadedModel:
        if self._error is not None:
            if isinstance(self._error, InterpError):
                raise ModelLoadError(self._shown(self._error))
            raise ModelLoadError(
                f"The model {self.shown_name!r} failed to load: {type(self._error).__name__}: "
                f"{self._shown(self._error)}. "
                "Run `mcp-interp doctor` for what is missing and how to fix it."
            )
        assert self._model is not None
        return self._model

    def _shown(self, error: BaseException) -> str:
        """A load error's text as a client may see it: a hidden program's folder replaced by its served name."""
        text = str(error)
        return text if self.shown_name == self.model_name else text.replace(self.model_name, self.shown_name)

    # --- running ---------------------------------------------------------------------------

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``run_for`` the one principal of stdio and the public API."""
        return await self.run_for(None, partial(fn, *args, **kwargs))

    async def run_for(self, principal: str | None, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the model thread in ``principal``'s turn; a cancelled caller interrupts it at the next
        transformer block."""
        ticket = await self.turns.take(principal)
        try:
            return await self._on_model_thread(fn)
        finally:
            self.turns.release(ticket)

    async def _on_model_thread(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the model thread as one unit of work with its own stop event, which the backend watches."""
        stop = threading.Event()
        return await on_thread(self._model_thread, partial(self._watched, fn, stop), stop)

    def _watched(self, fn: Callable[[], T], stop: threading.Event) -> T:
        backend = self._model.backend if self._model is not None else None
        if backend is None:
            return fn()
        with backend.interrupt.running(stop):
            return fn()

    async def render(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a figure renderer on the figure thread (matplotlib caches fonts per thread)."""
        return await on_thread(self._figure_thread, partial(fn, *args, **kwargs))

    async def run_unlocked(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` in a worker thread without the model lock: for work that runs no forward pass
        (tokenizing, reading the config), so it is never stuck behind a long scan."""
        return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs))

    async def run_steps(
        self, steps: Iterator[Any], on_step: StepCallback | None = None, principal: str | None = None
    ) -> int:
        """Drive a generator of work steps, one model-thread hop per step, each in ``principal``'s turn.

        Between two steps the model goes to whoever waits next (``turns``) — when the step left the model at rest;
        a step that returns inside a mode (edge points, frozen weights, inference mode) keeps the turn, so no one
        else's work ever runs in it. After each step the caller hears ``on_step(n_done, message)`` (a message is a
        string or a ``Progress``). A cancelled request interrupts the step in flight at its next transformer block
        (``backend.interrupt``; a step without blocks, such as a backward, runs to its end), the generator is closed
        on the model thread and the turn released, so the next call runs at once. Returns the number of steps run.
        """
        done = 0
        ticket: Ticket | None = await self.turns.take(principal)
        try:
            while True:
                if ticket is None:
                    ticket = await self.turns.take(principal)
                message, at_rest = await self._on_model_thread(partial(self._step, steps))
                if message is _DONE:
                    return done
                done += 1
                if at_rest:
                    self.turns.release(ticket)
                    ticket = None
                if on_step is not None:
                    await on_step(done, message)
        finally:
            try:
                steps_close = getattr(steps, "close", None)
                if steps_close is not None:
                    # Close on the model thread, in a turn of its own if it gave its turn up: the generator's `with
                    # torch.inference_mode()` (and any other thread-local state) must be exited on the thread that
                    # entered it, and no other work may run while it winds down.
                    with anyio.CancelScope(shield=True):
                        if ticket is None:
                            ticket = await self.turns.take(principal)
                        await on_thread(self._model_thread, steps_close)
            finally:
                if ticket is not None:
                    self.turns.release(ticket)

    def _step(self, steps: Iterator[Any]) -> tuple[Any, bool]:
        """One step on the model thread, and whether it left the model at rest (others' work may run next)."""
        message = next(steps, _DONE)
        return message, self._model is None or self._model.backend.at_rest()

    def model_ref(self) -> ModelRef:
        model = self._loaded()
        return ModelRef(
            name=model.name,
            source=model.source,
            fingerprint=model.fingerprint,
            dtype=model.dtype,
            device=model.device,
            backend=model.backend.name,
            versions=self._versions,
        )
