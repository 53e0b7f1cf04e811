"""The session's ledger (issue 35 §1) and the public Python API (§2).

Ledger: calls on `tiny` over an in-process MCP client are read back from ledger:// and checked against the results the
client received — arguments as sent, the weights' fingerprint, result_uri, every key number recomputed here from the
structured content by the definition (top-level numbers, top-level Scores' means, p-value-bearing objects' numbers); a
direction:// made by probe and passed to ablate resolves to probe's call with the sha256 of the stored bytes;
result:// eviction drops no entry; past the ledger's bound the oldest go and the page says so.

API: `ModelHost(...).logit_diff(...)` returns the LogitDiffResult whose numbers equal the tool's over MCP; a tool error
raises ToolCallError with the tool's own text; API calls are in the ledger too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_interp import Session as ApiSession
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.errors import ToolCallError
from mcp_interp.host import ModelHost
from mcp_interp.mcp.server import build_server
from mcp_interp.schemas.readouts import LogitDiffResult

pytestmark = pytest.mark.anyio

CLEAN = ["when mary and john went to the store , john gave a drink to"]
CORRUPT = ["when mary and john went to the store , mary gave a drink to"]
PAIR = {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT, "correct": "mary", "incorrect": "john"}
PROBE = {
    "texts": ["mary went", "john went", "tom went", "alice went", "kate went", "sam went"] * 4,
    "labels": [0, 1, 0, 1, 0, 1] * 4,
}


def test_wall_times_are_no_key_numbers_wherever_they_sit() -> None:
    """explain's ``stage_seconds`` and an attribution graph's ``forward_s`` differ on every rerun: a rerun that
    compared them would call a faithful export a mismatch (found on an exported explain call)."""
    from mcp_interp.state.ledger import key_numbers

    data = {"mean": 0.5, "elapsed_s": 1.2, "stage_seconds": {"dla": 0.1, "patch": 0.2},
            "runs": [{"forward_s": 2.0, "score": 3}], "sets": [[1, 2]]}  # fmt: skip
    assert key_numbers(data) == {"mean": 0.5, "runs[0].score": 3, "sets[0][0]": 1, "sets[0][1]": 2}


def expected_key_numbers(data: dict[str, Any]) -> dict[str, float]:
    """The definition, written out again: every number of the result by its JSON path (``a.b[3].c``), but the wall
    times (a field ending in ``_s`` or ``_seconds``, and what lies inside one) and what lies under ``model`` or
    ``notes``."""
    numbers: dict[str, float] = {}
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack += [(f"{path}.{k}" if path else k, v) for k, v in value.items() if k not in ("model", "notes")]
        elif isinstance(value, list):
            stack += [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        elif (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and not any(p.split("[")[0].endswith(("_s", "_seconds")) for p in path.split("."))
        ):
            numbers[path] = value
    return numbers


async def ledger_entries(client: Client) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    first = json.loads((await client.read_resource("ledger://0")).contents[0].text)
    entries = list(first["entries"])
    for page in range(1, first["pages"]):
        entries += json.loads((await client.read_resource(f"ledger://{page}")).contents[0].text)["entries"]
    return entries, first


async def test_the_ledger_records_every_call_with_its_numbers_and_handles(tiny_session: ModelHost) -> None:
    async with Client(build_server(tiny_session)) as client:
        sent = [
            ("logit_diff", {"prompts": CLEAN, "correct": "mary", "incorrect": "john"}),
            ("patch_heads", {**PAIR, "top": 3}),  # cut: its complete result is a result://
            ("probe", PROBE),
        ]
        results = [(await client.call_tool(name, arguments)).structured_content for name, arguments in sent]
        direction = results[2]["layers"][1]["direction_uri"]
        ablate = {"prompts": CLEAN, "targets": [{"layer": 1, "direction": direction}], "correct": "mary",
                  "incorrect": "john", "random_draws": 20}  # fmt: skip
        sent.append(("ablate", ablate))
        results.append((await client.call_tool("ablate", ablate)).structured_content)
        failed = await client.call_tool("logit_diff", {"prompts": [], "correct": "mary", "incorrect": "john"})
        stored = (await client.read_resource(direction)).contents[0].text
        entries, page = await ledger_entries(client)

    assert failed.is_error and page["total_calls"] == 5 and page["dropped_calls"] == 0 and page["notes"] == []
    assert [e["call"] for e in entries] == [1, 2, 3, 4, 5]
    for entry, (name, arguments), data in zip(entries, sent, results, strict=False):
        assert entry["tool"] == name and entry["arguments"] == arguments and entry["status"] == "ok"
        assert entry["model"]["fingerprint"] == data["model"]["fingerprint"] == tiny_session.model_ref().fingerprint
        assert entry["model"]["versions"]["torch"] == data["model"]["versions"]["torch"]
        assert entry["result_uri"] == data.get("result_uri")
        assert entry["key_numbers"] == expected_key_numbers(data)
        assert entry["key_numbers"]  # every one of these results has numbers to check
        assert entry["elapsed_s"] > 0
    assert entries[0]["key_numbers"]["logit_diff.value"] == results[0]["logit_diff"]["value"]
    assert entries[1]["result_uri"] is not None and entries[1]["result_uri"].startswith("result://")
    assert entries[2]["key_numbers"]["layers[1].accuracy"] == results[2]["layers"][1]["accuracy"]
    assert entries[2]["seeds"] == {} and entries[2]["made"]["layers[1].direction_uri"] == direction
    handle = entries[3]["handles"][direction]
    assert handle == {"made_by": 3, "sha256": hashlib.sha256(stored.encode()).hexdigest()}
    assert entries[3]["key_numbers"]["random_baseline.p_value"] == results[3]["random_baseline"]["p_value"]
    error_text = failed.content[0].text
    assert entries[4]["status"] == "error" and entries[4]["error"] == error_text and entries[4]["key_numbers"] == {}


async def test_evicting_results_drops_no_ledger_entry_and_the_bound_is_noted(
    tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCP_INTERP_STORE_MAX", "1")
    monkeypatch.setenv("MCP_INTERP_LEDGER_MAX", "3")
    session = ModelHost("tiny", tmp_path / "out", loader=lambda name, device, dtype: tiny)
    async with Client(build_server(session)) as client:
        uris = []
        arguments = {**PAIR, "top": 2, "heads": ["L0H0", "L1H1", "L2H2"], "positions": "last"}
        for _ in range(4):  # four cut results: the store keeps one
            uris.append((await client.call_tool("patch_heads", arguments)).structured_content["result_uri"])
            assert len(session.store.ids("result")) == 1
        await client.call_tool("tokenize", {"texts": ["mary"]})
        with pytest.raises(Exception, match="evicted"):
            await client.read_resource(uris[0])
        entries, page = await ledger_entries(client)
    assert session.store.evicted("result", uris[0].partition("://")[2]) is not None
    assert page["total_calls"] == 5 and page["kept_calls"] == 3 and page["dropped_calls"] == 2
    assert [e["call"] for e in entries] == [3, 4, 5]
    assert [e["result_uri"] for e in entries[:2]] == uris[2:]  # kept though their result:// entries were evicted
    assert page["notes"] == [
        "The ledger keeps the last 3 calls: the 2 oldest (calls 1–2) were dropped (raise MCP_INTERP_LEDGER_MAX to keep "
        "more)."
    ]


async def test_bad_ledger_pages_are_resource_errors(tiny_client: Client) -> None:
    await tiny_client.call_tool("tokenize", {"texts": ["mary"]})
    for uri in ("ledger://1", "ledger://x"):
        with pytest.raises(Exception, match="ledger"):
            await tiny_client.read_resource(uri)


def test_the_python_api_returns_the_tools_result_and_raises_its_errors(tiny: LoadedModel, tmp_path: Path) -> None:
    holder = ModelHost("tiny", tmp_path / "out", loader=lambda name, device, dtype: tiny)
    api = ApiSession(host=holder)
    arguments = {"prompts": CLEAN * 2, "correct": "mary", "incorrect": ["john", "store"]}
    result = api.logit_diff(**arguments)
    assert isinstance(result, LogitDiffResult) and api.fingerprint == tiny.fingerprint
    with pytest.raises(ToolCallError) as raised:
        api.logit_diff(prompts=[], correct="mary", incorrect="john")
    api.close()

    async def over_mcp() -> tuple[dict[str, Any], str]:
        async with Client(build_server(ModelHost("tiny", tmp_path / "mcp", loader=lambda *_: tiny))) as client:
            good = await client.call_tool("logit_diff", arguments)
            bad = await client.call_tool("logit_diff", {"prompts": [], "correct": "mary", "incorrect": "john"})
            return good.structured_content, bad.content[0].text

    live, error = anyio.run(over_mcp)
    mine = result.model_dump(mode="json")
    for volatile in ("run_id", "elapsed_s"):
        mine.pop(volatile), live.pop(volatile)
    assert mine == live and live["logit_diff"]["value"] != 0
    assert str(raised.value) == error and "No prompts" in error and raised.value.tool == "logit_diff"
    assert [(e.tool, e.status) for e in holder.ledger.entries] == [("logit_diff", "ok"), ("logit_diff", "error")]
    recorded = holder.ledger.entries[0].key_numbers  # every number of the result, by its JSON path, but wall times
    assert recorded["logit_diff.value"] == result.logit_diff.value
    per_example = result.logit_diff.per_example or []
    assert [recorded[f"logit_diff.per_example[{i}]"] for i in range(len(per_example))] == per_example
    assert len(per_example) == len(arguments["prompts"]) and "elapsed_s" not in recorded


async def test_a_background_call_gets_its_jobs_numbers_once_done(tiny_client: Client) -> None:
    queued = (await tiny_client.call_tool("patch_heads", {**PAIR, "background": True})).structured_content
    job = queued["job"]["job_uri"]
    for _ in range(600):
        status = (await tiny_client.call_tool("job_status", {"job": job})).structured_content
        if status["state"] not in ("queued", "running"):
            break
        await anyio.sleep(0.1)
    assert status["state"] == "done"
    entries, _ = await ledger_entries(tiny_client)
    first = entries[0]
    assert first["tool"] == "patch_heads" and first["arguments"] == {**PAIR, "background": True}
    assert first["job_uri"] == job and first["job_state"] == "done" and first["status"] == "ok"
    assert first["key_numbers"] == expected_key_numbers(status["result"]) and first["key_numbers"]
    assert {e["tool"] for e in entries[1:]} == {"job_status"}
