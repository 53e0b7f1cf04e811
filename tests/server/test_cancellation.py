"""Cancellation frees the model: a cancelled `steer`, `loss` or `sae_features` stops at its next step (one forward),
so the next call answers at once instead of after the whole job. Driven by a client speaking the protocol real
clients use (legacy mode: the request runs in its own task and a cancel reaches it)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

import mcp_interp.state.limits as limits
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.host import ModelHost
from mcp_interp.mcp.server import build_server
from tests.features.test_sae import random_weights, write_sae

pytestmark = pytest.mark.anyio

PROMPT = "when mary and john went to the store , john gave a drink to"
LOGIT_DIFF = {"prompts": [PROMPT], "correct": "mary", "incorrect": "john"}


async def timed_call(client: Client, tool: str, arguments: dict[str, Any]) -> float:
    started = time.perf_counter()
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return time.perf_counter() - started


async def cancel_after(client: Client, tool: str, arguments: dict[str, Any], delay: float) -> bool:
    """Start ``tool``, cancel it after ``delay`` s; True when it was still running then."""
    with anyio.move_on_after(delay) as scope:
        await client.call_tool(tool, arguments)
    return scope.cancelled_caught


def long_calls(tmp_path: Path) -> dict[str, dict[str, Any]]:
    sae = write_sae(tmp_path / "sae", random_weights(32, seed=1), hook="blocks.1.hook_resid_post")
    many = [PROMPT + " " + " ".join(["the store"] * (i % 7)) for i in range(120)]
    return {
        "steer": {"prompt": PROMPT, "coefficient": 2.0, "positive": "happy", "negative": "sad", "max_new_tokens": 300},
        "loss": {"texts": many, "intervention": {"ablate": ["L1H1"], "method": "mean"}},
        # longer texts: on tiny 120 short ones took 0.27 s in all, too short to time a cancel against a next call
        "sae_features": {"texts": [text + " the store" * 40 for text in many], "sae": sae, "features": [1, 2, 3]},
    }


@pytest.mark.parametrize("tool", ["steer", "loss", "sae_features"])
async def test_a_cancelled_long_call_frees_the_model_at_its_next_step(
    tiny: LoadedModel, tmp_path: Path, tool: str
) -> None:
    saved = limits.current()
    limits.configure(limits.Limits(max_new_tokens=300, max_prompts=200))
    try:
        session = ModelHost("tiny", tmp_path / "out", loader=lambda name, device, dtype: tiny)
        arguments = long_calls(tmp_path)[tool]
        async with Client(build_server(session), mode="legacy") as client:
            await timed_call(client, "logit_diff", LOGIT_DIFF)  # the model is loaded
            whole = await timed_call(client, tool, arguments)
            assert await cancel_after(client, tool, arguments, whole / 4), f"{tool} finished in under {whole / 4:.2f} s"
            after_cancel = await timed_call(client, "logit_diff", LOGIT_DIFF)
    finally:
        limits.configure(saved)
    # Without step-wise cancellation the next call would wait for the remaining ~3/4 of the job.
    assert after_cancel < whole / 4, f"{tool}: next call took {after_cancel:.2f} s after cancelling a {whole:.2f} s job"


@pytest.mark.embedded
async def test_cancelling_a_400_token_steer_on_the_embedded_model_frees_it_within_2_s(
    embedded: LoadedModel, tmp_path: Path
) -> None:
    """The issue's case: `steer` (400 tokens) cancelled after 1 s; the next `logit_diff` answers within 2 s."""
    saved = limits.current()
    limits.configure(limits.Limits(max_new_tokens=400))
    try:
        session = ModelHost("smollm2-135m", tmp_path / "out", loader=lambda name, device, dtype: embedded)
        steer = {"prompt": "The weather today is", "coefficient": 4.0, "positive": " happy", "negative": " sad"}
        ioi = {"prompts": ["When Mary and John went to the store, John gave a drink to"], "correct": " Mary"}
        async with Client(build_server(session), mode="legacy") as client:
            await timed_call(client, "logit_diff", {**ioi, "incorrect": " John"})
            assert await cancel_after(client, "steer", {**steer, "max_new_tokens": 400}, 1.0)
            after_cancel = await timed_call(client, "logit_diff", {**ioi, "incorrect": " John"})
    finally:
        limits.configure(saved)
    assert after_cancel < 2.0, f"the next call took {after_cancel:.2f} s after cancelling steer"
