"""Long work as jobs the assistant can see: a ``job://`` handle at once, the work queued behind the model.

A client with a 60 s tool timeout cannot wait for a 9-minute benchmark, and the SDK's Tasks extension runs a tool
inline, so the handle path is the one that works everywhere: a long tool called with ``background: true`` returns
a ``JobStatus`` at once, and ``job_status`` / ``job_cancel`` follow it. Each principal has its own queue
(``mcp.workspace``): its jobs run at most ``max_jobs`` at a time (``limits``; the rest wait, first come first served),
and every job gives the model up between its steps (``host.run_steps`` and ``turns``), so other calls — and other
principals' jobs — run between them. A job outlives the call that started it; its record is stored (``job://{id}`` in
the principal's store), so after a restart its status says it was lost rather than nothing. Progress a job reports goes
to its record (``current_job``), not to a request that has ended.

**Servers sharing a store.** A stored record names its owner (the principal), the server that runs it and a heartbeat
that server renews every ``heartbeat_s()`` while the job is queued or running. Another server reading the record says
the job runs there ("running (on another server)", ``JobStatus.server``) while the heartbeat is fresh, and "lost" only
once it is ``STALE_BEATS`` beats old. Records are written under the store's lock, read-compare-write
(``Store.update``): another server never overwrites a finished record, and marks one lost only if its heartbeat is
still the stale one it read. A ``job_cancel`` there asks the running server (``cancel_requested`` in the record), which
cancels at its next beat.

**Cancel** answers within ``CANCEL_WAIT_S``: the step in flight is interrupted at its next transformer block
(``backend.interrupt``). If the job is still busy then (a step without blocks, a backward), the record says cancelled
all the same — nothing after that step runs, and its end frees the model. A cancelled (or failed) job keeps its best
result so far in ``partial``, when the job can say what that is (``core.engine.jobs.partial_of``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mcp.types import CallToolResult, TextContent

import mcp_interp.state.limits as limits
from mcp_interp.core.engine.jobs import partial_of
from mcp_interp.errors import NotFound
from mcp_interp.schemas.jobs import JobProgress, JobStatus
from mcp_interp.state.store import Store, parse_uri

log = logging.getLogger(__name__)

PERSIST_EVERY_S = 1.0  # progress is written to the stored record at most this often
CANCEL_WAIT_S = 1.5  # job_cancel waits at most this long for the job to stop before it answers
FINAL = ("done", "failed", "cancelled", "lost")
HEARTBEAT_ENV = "MCP_INTERP_JOB_HEARTBEAT_S"
HEARTBEAT_S = 1.0  # how often a server renews the records of its unfinished jobs
STALE_BEATS = 10  # a heartbeat this many beats old: the server that ran the job is gone


def heartbeat_s() -> float:
    """Seconds between heartbeats (``MCP_INTERP_JOB_HEARTBEAT_S``; every server sharing a store should agree)."""
    raw = os.environ.get(HEARTBEAT_ENV)
    return max(0.05, float(raw)) if raw else HEARTBEAT_S


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class JobRecord:
    status: JobStatus
    started: float | None = None  # perf_counter when it started running
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    persisted: float = 0.0
    job: Any = field(default=None, repr=False)  # the running core job (``Toolkit.run_job``), for its ``partial``


@dataclass
class StoredJob:
    """A job record as stored: its status, who owns it, which server runs it and when that server last beat."""

    status: JobStatus
    owner: str | None = None
    server: str | None = None  # None: a record from before servers named themselves (read as stale)
    heartbeat: float | None = None  # unix time
    cancel_requested: bool = False

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "owner": self.owner,
                "server": self.server,
                "heartbeat": self.heartbeat,
                "cancel_requested": self.cancel_requested,
                "status": self.status.model_dump(mode="json"),
            }
        ).encode()

    @staticmethod
    def parse(data: bytes) -> StoredJob:
        """A stored record; a bare ``JobStatus`` (records written before servers named themselves) reads as one with
        no server and no heartbeat."""
        raw = json.loads(data)
        if isinstance(raw, dict) and "status" in raw:
            return StoredJob(
                JobStatus.model_validate(raw["status"]),
                raw.get("owner"),
                raw.get("server"),
                raw.get("heartbeat"),
                bool(raw.get("cancel_requested")),
            )
        return StoredJob(JobStatus.model_validate(raw))

    def fresh(self) -> bool:
        """Whether the server that runs it beat within ``STALE_BEATS`` beats."""
        return self.heartbeat is not None and time.time() - self.heartbeat < STALE_BEATS * heartbeat_s()


current_job: ContextVar[JobRecord | None] = ContextVar("current_job", default=None)


class JobQueue:
    """One principal's jobs on this server (``server`` names it to others sharing the store)."""

    def __init__(self, store: Store, principal: str | None = None, server: str = "") -> None:
        self.store = store
        self.principal = principal
        self.server = server
        self.records: dict[str, JobRecord] = {}
        self.waiting: list[str] = []  # queued job ids, in order
        self.durations: dict[str, float] = {}  # tool → seconds of its last finished run
        self._slots: asyncio.Semaphore | None = None
        self._beating: asyncio.Task[None] | None = None

    def start(self, tool: str, run: Callable[[], Awaitable[CallToolResult]]) -> JobStatus:
        """Queue ``run`` (the tool's foreground body) as a job; its status at once."""
        entry = self.store.put("job", b"{}")
        status = JobStatus(job_uri=entry.uri, tool=tool, state="queued", created_at=now(),
                           estimate_s=self.durations.get(tool))  # fmt: skip
        record = JobRecord(status)
        self.records[entry.id] = record
        self.waiting.append(entry.id)
        self._persist(record, force=True)
        loop = asyncio.get_running_loop()
        record.task = loop.create_task(self._run(entry.id, record, run))
        if self._beating is None or self._beating.done():
            self._beating = loop.create_task(self._beat())
        return self.status(entry.uri)

    async def _run(self, job_id: str, record: JobRecord, run: Callable[[], Awaitable[CallToolResult]]) -> None:
        if self._slots is None:  # this principal's jobs at once; the rest wait their turn, in order
            self._slots = asyncio.Semaphore(max(1, limits.current().max_jobs))
        status = record.status
        try:
            async with self._slots:
                self.waiting.remove(job_id)
                status.state, status.started_at, record.started = "running", now(), time.perf_counter()
                self._persist(record, force=True)
                token = current_job.set(record)
                try:
                    result = await run()
                finally:
                    current_job.reset(token)
            if status.state == "cancelled":  # job_cancel stopped waiting and answered; this is the step's end
                pass
            elif result.is_error:
                status.state = "failed"
                status.error = "\n".join(block.text for block in result.content if isinstance(block, TextContent))
                status.partial = partial_of(record.job)
            else:
                status.state, status.result = "done", result.structured_content
                status.result_uri = (result.structured_content or {}).get("result_uri")
        except asyncio.CancelledError:
            status.state = "cancelled"
            status.partial = partial_of(record.job)
            with contextlib.suppress(ValueError):
                self.waiting.remove(job_id)
        except Exception as exc:  # a tool's own errors come back as is_error results; this is a bug
            log.exception("job %s (%s) failed", job_id, status.tool)
            status.state, status.error = "failed", f"Internal error in mcp-interp ({type(exc).__name__}); see the log."
            status.partial = partial_of(record.job)
        finally:
            status.finished_at = status.finished_at or now()
            if record.started is not None:
                status.elapsed_s = round(time.perf_counter() - record.started, 3)
                if status.state == "done":
                    self.durations[status.tool] = status.elapsed_s
            self._persist(record, force=True)

    def report(self, record: JobRecord, done: float, total: float | None, message: str | None) -> None:
        """A running job's progress (what a foreground call would send as notifications/progress)."""
        record.status.progress = JobProgress(done=done, total=total, message=message)
        self._persist(record)

    def status(self, uri: str) -> JobStatus:
        """The status of ``job://…``: from this server's memory, or from its stored record — a job another server
        sharing the store runs (``server`` set while its heartbeat is fresh), or one whose server stopped ("lost")."""
        entry = parse_uri(uri, "job")
        record = self.records.get(entry.id)
        if record is None:
            return self._stored(entry.id)
        status = record.status.model_copy(deep=True)
        if status.state == "queued":
            status.queue_position = self.waiting.index(entry.id)
        if status.state == "running" and record.started is not None:
            status.elapsed_s = round(time.perf_counter() - record.started, 3)
        return status

    def _read(self, job_id: str) -> StoredJob:
        """The stored record of a job this server does not run; ``NotFound`` ("unknown job") for an id never started
        by this principal — the same words for another principal's job, whose record lives in another store."""
        try:
            data = self.store.get("job", job_id)
        except NotFound:
            if self.store.evicted("job", job_id) is not None:
                raise
            raise NotFound(f"Unknown job job://{job_id}: no job with this id was started here by you.") from None
        try:
            return StoredJob.parse(data)
        except ValueError as exc:
            raise NotFound(f"job://{job_id} has no readable record ({str(exc)[:100]}).") from None

    def _stored(self, job_id: str) -> JobStatus:
        stored = self._read(job_id)
        status = stored.status
        if status.state not in ("queued", "running"):
            return status
        if stored.server != self.server and stored.fresh():
            status.server = stored.server
            return status
        seen = stored.heartbeat

        def mark_lost(current: bytes | None) -> bytes | None:
            """Lost only if the record is still unfinished with the heartbeat read above (compare-and-swap)."""
            if current is None:
                return None
            now_stored = StoredJob.parse(current)
            if now_stored.status.state in FINAL or now_stored.heartbeat != seen:
                return None
            lost = now_stored.status
            lost.state, lost.finished_at = "lost", lost.finished_at or now()
            lost.error = "The server that ran this job stopped before it finished (its heartbeat stopped)."
            return StoredJob(lost, now_stored.owner, now_stored.server, now_stored.heartbeat).to_bytes()

        with contextlib.suppress(OSError, ValueError):
            self.store.update("job", job_id, mark_lost)
        return StoredJob.parse(self.store.get("job", job_id)).status

    async def cancel(self, uri: str) -> JobStatus:
        """Stop a job: a queued one never starts; a running one is interrupted at its next transformer block and
        keeps its best result so far (``partial``). Answers within ``CANCEL_WAIT_S``: a step that cannot be
        interrupted (no blocks) is left to end on its own, the job already recorded as cancelled. A job another server
        runs is asked to stop through its record; that server cancels it at its next heartbeat."""
        entry = parse_uri(uri, "job")
        record = self.records.get(entry.id)
        if record is None:
            return await self._cancel_elsewhere(entry.id)
        task = record.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=CANCEL_WAIT_S)
            status = record.status
            if not task.done() and status.state not in FINAL:
                status.state, status.finished_at = "cancelled", now()
                status.partial = partial_of(record.job)
                if record.started is not None:
                    status.elapsed_s = round(time.perf_counter() - record.started, 3)
                self._persist(record, force=True)
        return self.status(uri)

    async def _cancel_elsewhere(self, job_id: str) -> JobStatus:
        status = self._stored(job_id)
        if status.server is None:  # finished, lost, or never this server's to stop
            return status

        def request(current: bytes | None) -> bytes | None:
            if current is None:
                return None
            stored = StoredJob.parse(current)
            if stored.status.state in FINAL:
                return None
            stored.cancel_requested = True
            return stored.to_bytes()

        self.store.update("job", job_id, request)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            status = self._stored(job_id)
            if status.state in FINAL:
                break
        return status

    async def _beat(self) -> None:
        """While this queue has unfinished jobs: renew their records' heartbeats, and cancel those another server
        asked to stop."""
        while any(r.status.state not in FINAL for r in self.records.values()):
            await asyncio.sleep(heartbeat_s())
            for job_id, record in list(self.records.items()):
                if record.status.state in FINAL:
                    continue
                asked = False
                with contextlib.suppress(NotFound, OSError, ValueError):
                    asked = StoredJob.parse(self.store.get("job", job_id)).cancel_requested
                if asked:
                    log.info("job %s: cancelled at the request of another server", record.status.job_uri)
                    await self.cancel(record.status.job_uri)
                else:
                    self._persist(record, force=True)

    async def shutdown(self) -> None:
        """Cancel every job not yet finished and wait for each to stop (a running one at its step boundary), so the
        server's end leaves no task behind and every record says how its job ended ("cancelled")."""
        unfinished = [r.task for r in self.records.values() if r.task is not None and not r.task.done()]
        for task in unfinished:
            task.cancel()
        for task in unfinished:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._beating is not None:
            self._beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beating

    def _persist(self, record: JobRecord, force: bool = False) -> None:
        """Write the record with a fresh heartbeat, under the store's lock: never over a record another server
        finished, and keeping a cancel another server asked for."""
        moment = time.perf_counter()
        if not force and moment - record.persisted < PERSIST_EVERY_S:
            return
        record.persisted = moment
        entry = parse_uri(record.status.job_uri, "job")

        def write(current: bytes | None) -> bytes | None:
            asked = False
            if current is not None and current != b"{}":
                with contextlib.suppress(ValueError):
                    stored = StoredJob.parse(current)
                    if stored.server not in (None, self.server) and stored.status.state in FINAL:
                        return None
                    asked = stored.cancel_requested
            return StoredJob(record.status, self.principal, self.server, time.time(), asked).to_bytes()

        try:
            result = [record.status.result_uri] if record.status.result_uri else []
            self.store.update("job", entry.id, write, result)
        except OSError:
            log.warning("could not write the record of %s", record.status.job_uri)
