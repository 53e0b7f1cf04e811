"""Fair turns on the model and a job store shared by servers (issue 45).

Turns: principals take turns, first come first served within one, a cancelled waiter leaves the line; a job gives the
model up between steps only where it is at rest. Shared store: a job another server runs reads "running" (with that
server's id) while its heartbeat is fresh and "lost" only once it is stale; a finished record is never overwritten —
not even by a server that read it stale just before it finished; a cancel from another server reaches the job.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.types import CallToolResult, TextContent

from mcp_interp.core.engine.jobs import per_step
from mcp_interp.host import ModelHost
from mcp_interp.mcp.queue import STALE_BEATS, JobQueue, StoredJob
from mcp_interp.state.store import Store
from mcp_interp.state.turns import Turns

pytestmark = pytest.mark.anyio

BEAT = 0.1  # seconds between heartbeats here: stale after STALE_BEATS × BEAT = 1 s


@pytest.fixture(autouse=True)
def quick_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_INTERP_JOB_HEARTBEAT_S", str(BEAT))


async def test_principals_take_turns_and_each_is_served_in_order() -> None:
    turns = Turns()
    granted: list[str] = []
    first = await turns.take("alice")

    async def wait(principal: str, label: str) -> None:
        ticket = await turns.take(principal)
        granted.append(label)
        await anyio.sleep(0.02)
        turns.release(ticket)

    async with anyio.create_task_group() as group:
        for principal, label in (("alice", "a1"), ("alice", "a2"), ("bob", "b1"), ("bob", "b2"), ("carol", "c1")):
            group.start_soon(wait, principal, label)
            await anyio.sleep(0.02)  # queued in this order
        assert turns.waiting() == 5
        turns.release(first)  # alice was served last: bob and carol (never served) go first, then in turn
    assert granted == ["b1", "c1", "a1", "b2", "a2"]


async def test_a_cancelled_waiter_leaves_the_line() -> None:
    turns = Turns()
    held = await turns.take("alice")
    with anyio.move_on_after(0.05):
        await turns.take("bob")
    assert turns.waiting() == 0
    turns.release(held)
    with anyio.fail_after(1):
        turns.release(await turns.take("carol"))


def slow_steps(log: list[str], n: int = 10) -> Iterator[str]:
    for i in range(n):
        time.sleep(0.1)
        log.append(f"step {i}")
        yield f"step {i}"


async def answered_during(tiny_session: ModelHost, steps: Iterator[str], log: list[str]) -> tuple[float, int]:
    """Start ``steps`` as a job, ask for a short unit of model work during its second step: how long it waited and
    how many steps had run when it was answered."""
    tiny_session.wait_loaded()
    answered: list[int] = []
    async with anyio.create_task_group() as group:
        group.start_soon(tiny_session.run_steps, steps, None, "alice")
        await anyio.sleep(0.15)
        asked = time.perf_counter()
        await tiny_session.run_for("bob", lambda: answered.append(len(log)))
        waited = time.perf_counter() - asked
    return waited, answered[0]


async def test_a_job_gives_the_model_up_between_steps_at_rest(tiny_session: ModelHost) -> None:
    log: list[str] = []
    waited, steps_done = await answered_during(tiny_session, slow_steps(log), log)
    assert waited < 0.25 and steps_done <= 3, (waited, steps_done)  # one 0.1 s step, not the job's 1 s


async def test_a_job_inside_a_mode_keeps_the_model_until_it_leaves_it(tiny_session: ModelHost) -> None:
    """Edge points held across yields: nobody else's forward may run with them on, so the call waits for the job."""
    backend = tiny_session.wait_loaded().backend

    def held(log: list[str]) -> Iterator[str]:
        with backend.edge_points():
            yield from slow_steps(log)

    log: list[str] = []
    waited, steps_done = await answered_during(tiny_session, held(log), log)
    assert steps_done == 10 and waited > 0.6, (waited, steps_done)
    log = []  # the same steps with the mode entered per step: at rest between them
    waited, steps_done = await answered_during(tiny_session, per_step(backend.edge_points, slow_steps(log)), log)
    assert waited < 0.25 and steps_done <= 3, (waited, steps_done)
    assert backend.at_rest()


def result(value: float) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text="ok")], structured_content={"value": value})


async def work(seconds: float) -> CallToolResult:
    await anyio.sleep(seconds)
    return result(seconds)


async def state_on(queue: JobQueue, uri: str) -> str:
    return queue.status(uri).state


async def test_another_server_sees_a_running_job_running_then_done(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a, b = JobQueue(store, "alice", "server-a"), JobQueue(Store(tmp_path), "alice", "server-b")
    started = a.start("slow", lambda: work(1.5 * STALE_BEATS * BEAT))  # runs past the time a stale beat would take
    seen = []
    while (here := a.status(started.job_uri)).state != "done":
        there = b.status(started.job_uri)
        seen.append((there.state, there.server))
        await anyio.sleep(0.1)
    assert here.state == "done"
    assert set(seen) <= {("queued", "server-a"), ("running", "server-a")} and len(seen) >= 10, seen
    done = b.status(started.job_uri)
    assert done.state == "done" and done.server is None and done.result == {"value": 1.5 * STALE_BEATS * BEAT}
    stored = StoredJob.parse(store.get("job", started.job_uri.partition("://")[2]))
    assert stored.owner == "alice" and stored.server == "server-a" and stored.heartbeat is not None
    await a.shutdown()


def write_record(store: Store, state: str, heartbeat: float | None, server: str | None = "server-a") -> str:
    from mcp_interp.schemas.jobs import JobStatus

    entry = store.put("job", b"{}")
    status = JobStatus(job_uri=entry.uri, tool="slow", state=state, created_at="2026-01-01T00:00:00+00:00")  # type: ignore[arg-type]
    store.replace("job", entry.id, StoredJob(status, "alice", server, heartbeat).to_bytes())
    return entry.uri


async def test_a_running_record_is_lost_only_once_its_heartbeat_is_stale(tmp_path: Path) -> None:
    store = Store(tmp_path)
    b = JobQueue(store, "alice", "server-b")
    fresh = write_record(store, "running", time.time() - 0.5 * STALE_BEATS * BEAT)
    stale = write_record(store, "running", time.time() - 2 * STALE_BEATS * BEAT)
    legacy = write_record(store, "running", None, server=None)
    assert (b.status(fresh).state, b.status(fresh).server) == ("running", "server-a")
    for uri in (stale, legacy):
        lost = b.status(uri)
        assert lost.state == "lost" and "heartbeat" in (lost.error or "")
        assert StoredJob.parse(store.get("job", uri.partition("://")[2])).status.state == "lost"  # written back
    await anyio.sleep(0.6 * STALE_BEATS * BEAT)  # now the fresh one's beat is stale too
    assert b.status(fresh).state == "lost"


async def test_a_finished_record_is_never_overwritten_even_by_a_server_that_read_it_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path)
    b = JobQueue(store, "alice", "server-b")
    done = write_record(store, "done", time.time() - 100)
    assert b.status(done).state == "done"
    # The race: B reads a stale "running", then server A writes "done" before B writes "lost".
    raced = write_record(store, "running", time.time() - 100)
    job_id = raced.partition("://")[2]
    original = store.update

    def a_finishes_first(kind: str, entry_id: str, change: Any, references: Any = ()) -> bool:
        finished = StoredJob.parse(store.get("job", job_id))
        finished.status.state, finished.heartbeat = "done", time.time()
        store.replace("job", job_id, finished.to_bytes())
        return original(kind, entry_id, change, references)

    monkeypatch.setattr(store, "update", a_finishes_first)
    assert b.status(raced).state == "done"
    monkeypatch.setattr(store, "update", original)
    assert StoredJob.parse(store.get("job", job_id)).status.state == "done"
    # The owner's own truth beats another server's guess: A, only paused, later finishes a job B called lost.
    a = JobQueue(store, "alice", "server-a")
    started = a.start("slow", lambda: work(2 * STALE_BEATS * BEAT))
    await anyio.sleep(0.2)
    a._beating.cancel()  # type: ignore[union-attr]  # A stops beating (a long pause), its job still runs
    await anyio.sleep(1.2 * STALE_BEATS * BEAT)
    assert b.status(started.job_uri).state == "lost"
    while a.status(started.job_uri).state != "done":
        await anyio.sleep(0.05)
    assert b.status(started.job_uri).state == "done"
    await a.shutdown()


async def test_a_cancel_from_another_server_stops_the_job(tmp_path: Path) -> None:
    a, b = JobQueue(Store(tmp_path), "alice", "server-a"), JobQueue(Store(tmp_path), "alice", "server-b")
    started = a.start("slow", lambda: work(30))
    while a.status(started.job_uri).state != "running":
        await anyio.sleep(0.02)
    asked = time.perf_counter()
    answer = await b.cancel(started.job_uri)
    took = time.perf_counter() - asked
    assert answer.state == "cancelled" and took < 2.0, (answer.state, took)
    assert a.status(started.job_uri).state == "cancelled"
    record = a.records[started.job_uri.partition("://")[2]]
    assert record.task is not None and record.task.done()
    await a.shutdown()


async def test_another_principals_job_is_unknown(tmp_path: Path) -> None:
    alice = JobQueue(Store(tmp_path / "principals" / "alice"), "alice", "server-a")
    bob = JobQueue(Store(tmp_path / "principals" / "bob"), "bob", "server-a")
    started = alice.start("slow", lambda: work(0.2))
    with pytest.raises(LookupError, match="Unknown job"):
        bob.status(started.job_uri)
    with pytest.raises(LookupError, match="Unknown job"):
        await bob.cancel(started.job_uri)
    while alice.status(started.job_uri).state != "done":
        await anyio.sleep(0.02)
    await alice.shutdown()
