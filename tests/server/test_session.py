"""The session's lock and step runner: cancellation stops at a step boundary and frees the model."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import anyio
import pytest

from mcp_interp.host import ModelHost

pytestmark = pytest.mark.anyio


async def test_cancelled_scan_stops_at_next_step_and_releases_the_lock(tiny_session: ModelHost) -> None:
    ran: list[object] = []

    def slow_steps() -> Iterator[str]:
        try:
            for i in range(100):
                time.sleep(0.05)  # one "layer" of work
                ran.append(i)
                yield f"step {i}"
        finally:
            ran.append("closed")

    reported: list[int] = []

    async def on_step(done: int, message: str) -> None:
        reported.append(done)

    with anyio.move_on_after(0.3):
        await tiny_session.run_steps(slow_steps(), on_step)
    steps_run = [x for x in ran if isinstance(x, int)]
    assert ran[-1] == "closed", "the generator must be closed on cancellation"
    assert 3 <= len(steps_run) <= 8, steps_run  # stopped within a step of the deadline
    assert reported == list(range(1, len(reported) + 1))
    started = time.perf_counter()
    assert await tiny_session.run(lambda: 42) == 42
    assert time.perf_counter() - started < 0.5, "the model lock was not released"


async def test_model_work_is_serialised(tiny_session: ModelHost) -> None:
    inside = 0
    overlap = threading.Event()
    lock = threading.Lock()

    def work() -> None:
        nonlocal inside
        with lock:
            inside += 1
            if inside > 1:
                overlap.set()
        time.sleep(0.05)
        with lock:
            inside -= 1

    async with anyio.create_task_group() as group:
        for _ in range(6):
            group.start_soon(tiny_session.run, work)
    assert not overlap.is_set()


async def test_a_cancelled_scan_leaves_the_model_thread_out_of_inference_mode(tiny_session: ModelHost) -> None:
    import torch

    def scan() -> Iterator[str]:
        with torch.inference_mode():
            for i in range(100):
                time.sleep(0.02)
                yield f"step {i}"

    with anyio.move_on_after(0.2):
        await tiny_session.run_steps(scan())
    # The next job on the model thread must run with autograd available again.
    assert await tiny_session.run(torch.is_inference_mode_enabled) is False
    assert await tiny_session.run(torch.is_grad_enabled) is True
