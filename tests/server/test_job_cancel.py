"""A long job says how far it is within a step, and a cancel answers within 2 s at any step, keeping what it measured.

The issue's case: a node `find_circuit` on SmolLM2 showed one progress message for 8 minutes (one bisection step is
an exact ablated forward over every pair) and `job_cancel` blocked for 247 s, losing the search. Here `tiny`'s
batched forwards are slowed to ``BLOCK_S`` per transformer block (a plain torch pre-hook, like a large model's
block), so one ablated run takes seconds: a cancel must interrupt it mid-forward — the model is free again before
the forward in flight could have ended — and the partial search must be the prefix of the same search run to its
end. A single prompt's forward (the probe that the model is free) is not slowed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import torch
from mcp import Client

import mcp_interp.core.circuits.faithfulness as faithfulness
from mcp_interp.core.circuits.attribution import graph_of
from mcp_interp.core.circuits.faithfulness import Ablator
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.patching.pairs import prepare_pairs
from mcp_interp.host import ModelHost
from mcp_interp.mcp.server import build_server
from tests.helpers import IOI_CLEAN, IOI_CORRUPT

pytestmark = pytest.mark.anyio

PAIRS = {
    "clean_prompts": IOI_CLEAN,
    "corrupt_prompts": IOI_CORRUPT,
    "correct": ["mary", "tom", "dan"],
    "incorrect": ["john", "james", "sid"],
}
PROBE = {"prompts": IOI_CLEAN[:1], "correct": "mary", "incorrect": "john"}  # one row: never slowed
BLOCK_S = 2.0  # seconds added before every transformer block of a batched forward while slowed (tiny has 3 blocks)


class Slowed:
    """``tiny``'s forwards of two rows or more delayed by ``BLOCK_S`` per block while ``on`` (hooks removed after)."""

    def __init__(self, model: LoadedModel) -> None:
        self.on = False
        self.handles = [block.register_forward_pre_hook(self.delay) for block in model.backend.bridge.blocks]

    def delay(self, _: Any, args: tuple[Any, ...]) -> None:
        if self.on and args and isinstance(args[0], torch.Tensor) and args[0].shape[0] > 1:
            time.sleep(BLOCK_S)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@pytest.fixture
def slowed(tiny: LoadedModel) -> Iterator[Slowed]:
    slow = Slowed(tiny)
    try:
        yield slow
    finally:
        slow.remove()


async def status_of(client: Client, job: str) -> dict[str, Any]:
    status = (await client.call_tool("job_status", {"job": job})).structured_content
    assert status is not None
    return status


async def next_bisection(client: Client, job: str, seen: set[str]) -> None:
    """Wait for a bisection step not in ``seen`` ("bisection: k = …, faithfulness …") to be done; add it."""
    deadline = time.monotonic() + 120
    while True:
        status = await status_of(client, job)
        assert status["state"] in ("queued", "running"), status
        message = (status["progress"] or {}).get("message") or ""
        if message.startswith("bisection") and "faithfulness" in message and message not in seen:
            seen.add(message)
            return
        assert time.monotonic() < deadline, status
        await anyio.sleep(0.05)


async def test_cancel_mid_forward_answers_within_2_s_and_keeps_the_search_so_far(
    tiny_client: Client, slowed: Slowed, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = (await tiny_client.call_tool("find_circuit", PAIRS)).structured_content
    assert whole is not None and len(whole["search"]) >= 4, whole
    monkeypatch.setattr(faithfulness, "CHUNK_SECONDS", 1e9)  # every ablated run one forward of all three pairs
    started = (await tiny_client.call_tool("find_circuit", {**PAIRS, "background": True})).structured_content
    assert started is not None
    job = started["job"]["job_uri"]
    bisected: set[str] = set()
    await next_bisection(tiny_client, job, bisected)
    slowed.on = True  # from here each bisection step is one forward of 3 × BLOCK_S
    await next_bisection(tiny_client, job, bisected)
    await anyio.sleep(BLOCK_S * 1.5)  # halfway through the next step's forward (in its second block)
    asked = time.perf_counter()
    cancelled = (await tiny_client.call_tool("job_cancel", {"job": job})).structured_content
    answered = time.perf_counter() - asked
    free = await timed_probe(tiny_client)
    assert answered < 2.0, f"job_cancel took {answered:.2f} s"
    # interrupted at the next block: the forward in flight had 1.5 × BLOCK_S (3 s) left
    assert free < 2.0, f"the model was free only {free:.2f} s after the cancel"
    assert cancelled is not None and cancelled["state"] == "cancelled", cancelled
    partial = cancelled["partial"]
    assert partial is not None and partial["stage"] == "bisection", partial
    search = partial["search"]
    assert 2 <= len(search) < len(whole["search"]), (search, whole["search"])
    for kept, full in zip(search, whole["search"], strict=False):  # the same search, cut where it was cancelled
        assert kept["k"] == full["k"] and kept["faithfulness"] == pytest.approx(full["faithfulness"], abs=1e-6)
    # the best so far: the smallest k measured that reaches the target (None before any does)
    best = min((step["k"] for step in search if step["faithfulness"] >= whole["target"]), default=None)
    assert partial["best_k"] == best and len(partial.get("best_edges") or []) == (best or 0), partial
    final = await status_of(tiny_client, job)
    assert final["state"] == "cancelled" and final["partial"] == partial  # the record keeps it


async def timed_probe(client: Client) -> float:
    asked = time.perf_counter()
    ok = await client.call_tool("logit_diff", PROBE)
    assert not ok.is_error, ok.content
    return time.perf_counter() - asked


async def test_a_long_bisection_step_says_how_far_it_is(tiny_client: Client, slowed: Slowed) -> None:
    """With every ablated run taking seconds, a bisection step reports pairs done within the step (``Progress``):
    the progress message never stands still for 10 s, and done never passes total."""
    started = (await tiny_client.call_tool("find_circuit", {**PAIRS, "background": True})).structured_content
    assert started is not None
    job = started["job"]["job_uri"]
    await next_bisection(tiny_client, job, set())
    slowed.on = True
    changed, seen, within = time.monotonic(), None, []
    deadline = changed + 60
    while time.monotonic() < deadline and len(within) < 3:
        status = await status_of(tiny_client, job)
        progress = status["progress"]
        assert progress["done"] <= progress["total"], progress
        if progress["message"] != seen:
            now = time.monotonic()
            assert now - changed < 10.0, f"progress stood at {seen!r} for {now - changed:.1f} s"
            changed, seen = now, progress["message"]
            if "pairs" in seen:
                within.append(seen)
        await anyio.sleep(0.1)
    await tiny_client.call_tool("job_cancel", {"job": job})
    assert len(within) >= 3, within  # in-step messages ("…: pairs 1/3")


def test_chunked_ablated_runs_equal_the_whole_run(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ablated run split into chunks of pairs (one pair each here) gives each pair's metric as the whole run does,
    and says after each chunk but the last how many pairs are done."""
    pairs = prepare_pairs(tiny, IOI_CLEAN, IOI_CORRUPT, PAIRS["correct"], PAIRS["incorrect"])
    graph = graph_of(tiny.backend)
    circuit = {(0, r) for r in range(len(graph.readers))} | {(w, len(graph.readers) - 1) for w in range(5)}
    with tiny.backend.edge_points():
        ablator = Ablator(tiny.backend, graph, pairs, "corrupt")
        whole = ablator.run(circuit)
        monkeypatch.setattr(faithfulness, "CHUNK_SECONDS", 0.0)  # one pair per chunk
        runs, said = ablator.run_chunked(circuit), []
        while True:
            try:
                said.append(next(runs))
            except StopIteration as finished:
                chunked = finished.value
                break
    assert said == [(1, 3), (2, 3)]
    assert chunked.shape == whole.shape == (3,)
    assert torch.allclose(chunked, whole, atol=1e-6), (chunked, whole)
    assert float((whole - ablator.clean_m).abs().max()) > 1e-3  # the ablation moved the metric: not a trivial run


async def test_a_cancelled_foreground_call_frees_the_model_within_one_block(
    tiny_session: ModelHost, slowed: Slowed
) -> None:
    """A foreground `patch_heads` whose forwards take 3 × BLOCK_S, cancelled by its client halfway through one: the
    next call answers once the block in flight ends, not after the forward (the step) in flight."""
    async with Client(build_server(tiny_session), mode="legacy") as client:
        await client.call_tool("logit_diff", PROBE)
        slowed.on = True
        with anyio.move_on_after(BLOCK_S * 1.5) as scope:
            await client.call_tool("patch_heads", {**PAIRS, "method": "exact"})
        assert scope.cancelled_caught
        free = await timed_probe(client)
    assert free < BLOCK_S, f"the model was free only {free:.2f} s after the cancel"
