"""Many calls in flight: identical results to one-by-one, cheap calls never wait for a scan,
and a cancelled scan frees the model at its next step."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_interp.host import ModelHost
from mcp_interp.mcp.server import build_server
from tests.helpers import complete_result, stdio_params

pytestmark = pytest.mark.anyio

P = [
    "when mary and john went to the store , john gave a drink to",
    "when tom and james went to the park , james gave a ball to",
    "when dan and sid went to the shop , sid gave an apple to",
]
VOLATILE = {"run_id", "elapsed_s", "figure_uri", "figure_uris", "report_uri", "stage_seconds"}

CALLS: list[tuple[str, dict[str, Any]]] = [
    ("logit_diff", {"prompts": P, "correct": "mary", "incorrect": "john"}),
    ("logit_diff", {"prompts": P[:1], "correct": "john", "incorrect": "mary"}),
    ("kl", {"prompts": P[:1], "compare_prompts": [P[0].replace(", john", ", mary")]}),
    ("kl", {"prompts": P, "intervention": {"ablate": ["L1H1"], "method": "mean"}}),
    ("answer_rank", {"prompts": P, "correct": "mary"}),
    ("ablate_head", {"prompts": P, "heads": ["L0H1", "L2H2"], "correct": "mary", "incorrect": "john"}),
    ("ablate_head", {"prompts": P, "heads": "L1H0", "method": "resample", "seed": 3}),
    ("dla", {"prompt": P[1], "answer": "tom", "baseline": "james"}),
    ("logit_lens", {"prompt": P[2], "target": "dan"}),
    ("attention", {"prompt": P[0], "layer": 2, "head": 1}),
    ("induction", {"seq_len": 12, "n_seqs": 2}),
    (
        "patch_heads",
        {
            "clean_prompts": P[:1],
            "corrupt_prompts": [P[0].replace(", john", ", mary")],
            "correct": "mary",
            "incorrect": "john",
        },
    ),
    ("tokenize", {"texts": P}),
    ("model_info", {}),
    (
        "steer",
        {"prompt": P[0], "positive": "good", "negative": "bad", "layer": 1, "coefficient": 2.0, "max_new_tokens": 4},
    ),
    ("explain", {"prompt": P[0], "answer": "mary", "baseline": "john", "top_k": 2}),
]


def stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


async def one_by_one_then_all_at_once(client: Client) -> tuple[list[Any], list[Any], float]:
    sequential = []
    for name, args in CALLS:
        result = await client.call_tool(name, args)
        assert not result.is_error, (name, result.content)
        sequential.append(stable(await complete_result(client, result.structured_content)))  # with the grids
    concurrent: list[Any] = [None] * len(CALLS)

    async def call(i: int) -> None:
        result = await client.call_tool(CALLS[i][0], CALLS[i][1])
        assert not result.is_error, (CALLS[i][0], result.content)
        concurrent[i] = stable(await complete_result(client, result.structured_content))

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for i in range(len(CALLS)):
            group.start_soon(call, i)
    return sequential, concurrent, time.perf_counter() - started


async def test_sixteen_concurrent_calls_in_process_equal_sequential(tiny_client: Client) -> None:
    assert len(CALLS) == 16
    sequential, concurrent, seconds = await one_by_one_then_all_at_once(tiny_client)
    assert concurrent == sequential
    print(f"\n16 concurrent calls in-process: {seconds:.2f} s")


async def test_sixteen_concurrent_calls_over_stdio_equal_sequential(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MCP_INTERP_OUTPUT": str(tmp_path / "out")}
    async with Client(stdio_params("tiny", env), read_timeout_seconds=300) as client:
        sequential, concurrent, seconds = await one_by_one_then_all_at_once(client)
    assert concurrent == sequential
    print(f"\n16 concurrent calls over stdio: {seconds:.2f} s")


async def test_cheap_calls_are_not_stuck_behind_a_long_scan(tiny_session: ModelHost) -> None:
    """Calls that run no forward never wait for the model; model work waits one step of a running scan (0.1 s),
    not the scan (3 s): the scan gives the model up between its steps."""
    steps_run: list[int] = []

    def long_scan() -> Iterator[str]:
        for i in range(30):
            time.sleep(0.1)
            steps_run.append(i)
            yield f"layer {i}"

    async with Client(build_server(tiny_session)) as client, anyio.create_task_group() as group:
        await client.call_tool("model_info", {})  # model loaded
        await client.call_tool("logit_diff", {"prompts": P[:1], "correct": "mary", "incorrect": "john"})  # warm
        group.start_soon(tiny_session.run_steps, long_scan())
        await anyio.sleep(0.2)  # the scan now runs for ~3 s, one 0.1 s step at a time
        started = time.perf_counter()
        info = await client.call_tool("model_info", {})
        tokens = await client.call_tool("tokenize", {"texts": P})
        figure = tiny_session.store.put("figure", b"\x89PNG\r\n\x1a\n")
        await client.read_resource(figure.uri)
        cheap = time.perf_counter() - started
        blocked_started = time.perf_counter()
        await client.call_tool("logit_diff", {"prompts": P[:1], "correct": "mary", "incorrect": "john"})
        blocked = time.perf_counter() - blocked_started
        during = len(steps_run)
    assert not info.is_error and not tokens.is_error
    assert cheap < 0.5, f"cheap calls took {cheap:.2f} s behind a scan"
    assert during < 20, f"the scan had run {during} of 30 steps: the call did not come while it ran"
    assert blocked < 0.6, f"model work waited {blocked:.2f} s: more than one 0.1 s step of the scan"
    assert len(steps_run) == 30  # the scan itself ran to its end
