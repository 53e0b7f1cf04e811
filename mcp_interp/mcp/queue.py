"""Long work as jobs the assistant can see: a ``job://`` handle at once, the work queued behind the model.

A client with a 60 s tool timeout cannot wait for a 9-minute benchmark, and the SDK's Tasks extension runs a tool
inline, so the handle path is the one that works everywhere: a long tool called with ``background: true`` returns
a ``JobStatus`` at once, and ``job_status`` / ``job_cancel`` follow it. Jobs run one at a time, in the order they
were started (a FIFO; each holds the model lock for its whole run, so other model calls wait behind a running job
while ``model_info``, ``tokenize`` and resource reads do not). A job outlives the call that started it; its record
is stored (``job://{id}`` in the store), so after a restart its status says it was lost rather than nothing.
Progress a job reports goes to its record (``current_job``), not to a request that has ended.

**Cancel** answers within ``CANCEL_WAIT_S``: the step in flight is interrupted at its next transformer block
(``backend.interrupt``). If the job is still busy then (a step without blocks, a backward), the record says cancelled
all the same — nothing after that step runs, and its end frees the model. A cancelled (or failed) job keeps its best
result so far in ``partial``, when the job can say what that is (``core.engine.jobs.partial_of``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mcp.types import CallToolResult, TextContent

from mcp_interp.core.engine.jobs import partial_of
from mcp_interp.errors import NotFound
from mcp_interp.schemas.jobs import JobProgress, JobStatus
from mcp_interp.store import Store, parse_uri

log = logging.getLogger(__name__)

PERSIST_EVERY_S = 1.0  # progress is written to the stored record at most this often
CANCEL_WAIT_S = 1.5  # job_cancel waits at most this long for the job to stop before it answers
FINAL = ("done", "failed", "cancelled")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class JobRecord:
    status: JobStatus
    started: float | None = None  # perf_counter when it started running
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    persisted: float = 0.0
    job: Any = field(default=None, repr=False)  # the running core job (``Toolkit.run_job``), for its ``partial``


current_job: ContextVar[JobRecord | None] = ContextVar("current_job", default=None)


class JobQueue:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.records: dict[str, JobRecord] = {}
        self.waiting: list[str] = []  # queued job ids, in order
        self.durations: dict[str, float] = {}  # tool → seconds of its last finished run
        self._turn: asyncio.Lock | None = None

    def start(self, tool: str, run: Callable[[], Awaitable[CallToolResult]]) -> JobStatus:
        """Queue ``run`` (the tool's foreground body) as a job; its status at once."""
        entry = self.store.put("job", b"{}")
        status = JobStatus(job_uri=entry.uri, tool=tool, state="queued", created_at=now(),
                           estimate_s=self.durations.get(tool))  # fmt: skip
        record = JobRecord(status)
        self.records[entry.id] = record
        self.waiting.append(entry.id)
        self._persist(record, force=True)
        record.task = asyncio.get_running_loop().create_task(self._run(entry.id, record, run))
        return self.status(entry.uri)

    async def _run(self, job_id: str, record: JobRecord, run: Callable[[], Awaitable[CallToolResult]]) -> None:
        if self._turn is None:
            self._turn = asyncio.Lock()
        status = record.status
        try:
            async with self._turn:
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
        """The status of ``job://…``: from this server's memory, or — for a job a stopped server ran — its stored
        record, marked lost when it never finished."""
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

    def _stored(self, job_id: str) -> JobStatus:
        try:
            status = JobStatus.model_validate_json(self.store.get("job", job_id))
        except NotFound:
            raise
        except ValueError as exc:
            raise NotFound(f"job://{job_id} has no readable record ({str(exc)[:100]}).") from None
        if status.state in ("queued", "running"):
            status.state = "lost"
            status.error = "The server that ran this job stopped before it finished (a restart loses running jobs)."
            status.finished_at = status.finished_at or now()
            self.store.replace("job", job_id, status.model_dump_json().encode())
        return status

    async def cancel(self, uri: str) -> JobStatus:
        """Stop a job: a queued one never starts; a running one is interrupted at its next transformer block and
        keeps its best result so far (``partial``). Answers within ``CANCEL_WAIT_S``: a step that cannot be
        interrupted (no blocks) is left to end on its own, the job already recorded as cancelled."""
        entry = parse_uri(uri, "job")
        record = self.records.get(entry.id)
        task = record.task if record is not None else None
        if record is not None and task is not None and not task.done():
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

    async def shutdown(self) -> None:
        """Cancel every job not yet finished and wait for each to stop (a running one at its step boundary), so the
        server's end leaves no task behind and every record says how its job ended ("cancelled")."""
        unfinished = [r.task for r in self.records.values() if r.task is not None and not r.task.done()]
        for task in unfinished:
            task.cancel()
        for task in unfinished:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _persist(self, record: JobRecord, force: bool = False) -> None:
        moment = time.perf_counter()
        if not force and moment - record.persisted < PERSIST_EVERY_S:
            return
        record.persisted = moment
        entry = parse_uri(record.status.job_uri, "job")
        try:
            result = [record.status.result_uri] if record.status.result_uri else []
            self.store.replace("job", entry.id, record.status.model_dump_json().encode(), result)
        except OSError:
            log.warning("could not write the record of %s", record.status.job_uri)
