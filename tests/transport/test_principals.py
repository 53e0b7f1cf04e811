"""One HTTP server, many researchers (issue 45): a real server with two principals from a tokens file.

Neither principal can read, list, cancel or export the other's work (another's id gets exactly the error an id never
stored gets); one's short calls wait about one step of the other's running job; the Bearer scheme is read in any
case; bad token files are refused at start naming the line; a not-found error names no server path; two servers on one
store keep a running job "running (on another server)" and then "done", and call it "lost" only once its heartbeat is
stale.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ResourceTemplateReference

from tests.helpers import IOI_CLEAN, IOI_CORRUPT
from tests.transport.test_http import free_port, start

pytestmark = pytest.mark.anyio

TOKENS = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-fedcba9876543210xx"}
SECRET = "when mary and john went to the park , john gave a ball to"  # alice's prompt, which bob must never see
PAIRS = {"clean_prompts": IOI_CLEAN, "corrupt_prompts": IOI_CORRUPT, "correct": ["mary", "tom", "dan"],
         "incorrect": ["john", "james", "sid"]}  # fmt: skip
LONG_JOB = {  # find_circuit on 40 pairs: ~9 s on tiny alone, in steps well under a second
    "clean_prompts": [IOI_CLEAN[i % 3] for i in range(40)],
    "corrupt_prompts": [IOI_CORRUPT[i % 3] for i in range(40)],
    "correct": [["mary", "tom", "dan"][i % 3] for i in range(40)],
    "incorrect": [["john", "james", "sid"][i % 3] for i in range(40)],
}
SHORT = {"prompts": IOI_CLEAN[:1], "correct": "mary", "incorrect": "john"}


def tokens_file(folder: Path) -> Path:
    path = folder / "tokens"
    path.write_text("# the team\n" + "".join(f"{name} {token}\n" for name, token in TOKENS.items()))
    return path


@asynccontextmanager
async def connected(port: int, token: str, scheme: str = "Bearer") -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"{scheme} {token}"}, timeout=120)
    url = f"http://127.0.0.1:{port}/mcp"
    async with http, Client(streamable_http_client(url, http_client=http), read_timeout_seconds=120) as client:
        yield client


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def team(tmp_path: Path) -> Iterator[int]:
    process, port = start(tmp_path, "--auth-tokens", str(tokens_file(tmp_path)))
    yield port
    stop(process)


def text_of(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


async def read_error(client: Client, uri: str) -> str:
    """The error a resources/read of ``uri`` gets (the test fails if the read succeeds)."""
    try:
        await client.read_resource(uri)
    except Exception as exc:
        return str(exc)
    raise AssertionError(f"{uri} was readable")


def never_stored(uri: str) -> str:
    """A URI of the same kind whose id was never stored."""
    return f"{uri.partition('://')[0]}://{secrets.token_hex(16)}"


async def status(client: Client, job: str) -> dict[str, Any]:
    result = await client.call_tool("job_status", {"job": job})
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    return result.structured_content


async def started_job(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    started = await client.call_tool(tool, {**arguments, "background": True})
    assert not started.is_error and started.structured_content is not None, text_of(started)
    return str(started.structured_content["job"]["job_uri"])


async def wait_for(client: Client, job: str, states: tuple[str, ...], seconds: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        found = await status(client, job)
        if found["state"] in states:
            return found
        assert time.monotonic() < deadline, found
        await anyio.sleep(0.1)


async def test_neither_principal_reads_lists_cancels_or_exports_the_others_work(team: int) -> None:
    async with connected(team, TOKENS["alice"]) as alice, connected(team, TOKENS["bob"]) as bob:
        secret = await alice.call_tool("logit_diff", {"prompts": [SECRET], "correct": "mary", "incorrect": "john"})
        heads = await alice.call_tool("patch_heads", {**PAIRS, "top": 1})
        exported = await alice.call_tool("export_investigation", {})
        job = await started_job(alice, "find_circuit", LONG_JOB)
        assert not secret.is_error and not heads.is_error and not exported.is_error
        assert heads.structured_content is not None and exported.structured_content is not None
        alices = [
            heads.structured_content["figure_uri"],
            heads.structured_content["result_uri"],
            exported.structured_content["script_uri"],
            job,
        ]
        for uri in alices:  # alice reads her own (so the refusals below are about who asks)
            assert (await alice.read_resource(uri)).contents
        assert SECRET in (await alice.read_resource("ledger://0")).contents[0].text  # type: ignore[union-attr]

        await bob.call_tool("tokenize", {"texts": ["mary"]})
        for uri in alices:  # exactly the error of an id never stored, the id aside
            other = never_stored(uri)
            mine, never = await read_error(bob, uri), await read_error(bob, other)
            assert mine.replace(uri.partition("://")[2], "ID") == never.replace(other.partition("://")[2], "ID")
        listed = {str(r.uri) for r in (await bob.list_resources()).resources}
        assert not set(alices) & listed
        assert set(alices) <= {str(r.uri) for r in (await alice.list_resources()).resources}
        completed = await bob.complete(ResourceTemplateReference(type="ref/resource", uri="result://{result_id}"),
                                       {"name": "result_id", "value": ""})  # fmt: skip
        assert heads.structured_content["result_uri"].partition("://")[2] not in completed.completion.values
        for tool in ("job_status", "job_cancel"):
            refused = await bob.call_tool(tool, {"job": job})
            assert refused.is_error and "Unknown job" in text_of(refused), text_of(refused)
            never = await bob.call_tool(tool, {"job": never_stored(job)})
            assert text_of(refused).replace(job, "J") == text_of(never).replace(never_stored_id(text_of(never)), "J")
        assert (await status(alice, job))["state"] in ("queued", "running", "done")  # bob's cancel did nothing
        ledger = (await bob.read_resource("ledger://0")).contents[0].text  # type: ignore[union-attr]
        assert SECRET not in ledger and "patch_heads" not in ledger and "tokenize" in ledger
        bobs_export = await bob.call_tool("export_investigation", {})
        assert not bobs_export.is_error and bobs_export.structured_content is not None
        script = (await bob.read_resource(bobs_export.structured_content["script_uri"])).contents[0]
        assert SECRET not in script.text and "patch_heads" not in script.text  # type: ignore[union-attr]
        assert "tokenize" in script.text  # type: ignore[union-attr]
        await alice.call_tool("job_cancel", {"job": job})


def never_stored_id(text: str) -> str:
    """The job URI named in an unknown-job error."""
    match = re.search(r"job://[0-9a-f]{32}", text)
    assert match is not None, text
    return match.group(0)


async def timed_short_call(client: Client) -> float:
    asked = time.perf_counter()
    answer = await client.call_tool("logit_diff", SHORT)
    assert not answer.is_error, text_of(answer)
    return time.perf_counter() - asked


async def test_one_principals_short_calls_wait_about_one_step_of_the_others_job(team: int) -> None:
    """The guarantee, not the machine's speed: while alice's find_circuit runs, each of bob's short calls waits behind
    at most about one step of it. Measured in the same run: bob's call on the idle server, and the job's longest
    stretch without progress (watched through job_status, which never waits for the model) — a stretch that includes
    any call of bob's served inside it. A call that waited behind the whole job (or many of its steps) would take a
    multiple of that; one waiting one step takes about it. On a busy machine all three slow down together."""
    async with connected(team, TOKENS["alice"]) as alice, connected(team, TOKENS["bob"]) as bob:
        await bob.call_tool("logit_diff", SHORT)  # the model is loaded
        idle = max([await timed_short_call(bob) for _ in range(3)])
        job = await started_job(alice, "find_circuit", LONG_JOB)
        await wait_for(alice, job, ("running",))
        changes: list[float] = []  # when the job's progress was seen to change
        seconds: list[float] = []
        running = True

        async def watch() -> None:
            nonlocal running
            seen = None
            while running:
                found = await status(alice, job)
                now = time.perf_counter()
                if (found["state"], found.get("progress")) != seen:
                    seen = (found["state"], found.get("progress"))
                    changes.append(now)
                running = found["state"] == "running"
                await anyio.sleep(0.02)

        async def ask() -> None:
            while running and len(seconds) < 40:
                seconds.append(await timed_short_call(bob))
                await anyio.sleep(0.1)

        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            group.start_soon(ask)
        final = await wait_for(alice, job, ("done",))
    step = max(b - a for a, b in itertools.pairwise(changes))
    print(
        f"\nbob's logit_diff: idle {idle:.2f} s; while alice's find_circuit ran: {len(seconds)} calls, max "
        f"{max(seconds):.2f} s; the job's longest stretch without progress {step:.2f} s ({len(changes)} changes)"
    )
    assert len(seconds) >= 5, f"only {len(seconds)} of bob's calls came while alice's job ran"
    bound = 2 * idle + 1.5 * step
    assert len(changes) >= 10 and final["elapsed_s"] > 2 * bound, "the job was too short for a stalled call to show"
    assert max(seconds) <= bound, (
        f"a short call took {max(seconds):.2f} s behind another principal's job (idle {idle:.2f} s, the job's longest "
        f"step {step:.2f} s)"
    )


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer"])
async def test_the_bearer_scheme_is_read_in_any_case(team: int, scheme: str) -> None:
    async with connected(team, TOKENS["bob"], scheme) as bob:
        assert not (await bob.call_tool("tokenize", {"texts": ["mary"]})).is_error
    url = f"http://127.0.0.1:{team}/mcp"
    body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    accept = {"Accept": "application/json, text/event-stream"}
    for wrong in (f"{scheme} {TOKENS['bob'][:-1]}", f"Basic {TOKENS['bob']}", scheme, f"{scheme}{TOKENS['bob']}"):
        response = httpx2.post(url, json=body, headers={**accept, "Authorization": wrong}, timeout=30)
        assert response.status_code == 401, wrong


BAD_FILES = {
    "one field": ("alice\n", 1),
    "three fields": ("# team\nalice alice-token-0123456789abcdef extra\n", 2),
    "short token": ("alice short-token\n", 1),
    "bad name": ("bob bob-token-fedcba9876543210xx\n../alice alice-token-0123456789abcdef\n", 2),
    "name twice": ("alice alice-token-0123456789abcdef\nalice alice-token-0123456789abcdeg\n", 2),
    "token twice": ("alice alice-token-0123456789abcdef\n\nbob alice-token-0123456789abcdef\n", 3),
    "no principal": ("# nobody yet\n\n", None),
}


def test_bad_token_files_are_refused_at_start_naming_the_line(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MCP_INTERP_OUTPUT": str(tmp_path / "out")}
    env.pop("MCP_INTERP_AUTH_TOKEN", None)
    serve = [sys.executable, "-m", "mcp_interp", "serve", "--model", "tiny", "--transport", "http",
             "--port", str(free_port())]  # fmt: skip
    runs = {}
    try:
        for kind, (text, _) in BAD_FILES.items():
            path = tmp_path / kind.replace(" ", "-")
            path.write_text(text)
            runs[kind] = subprocess.Popen([*serve, "--auth-tokens", str(path)], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True)  # fmt: skip
        for spaced in (" " * 16, "sixteen-characters with-a-space"):  # from the environment
            spaced_env = {**env, "MCP_INTERP_AUTH_TOKEN": spaced}
            runs[f"token {spaced!r}"] = subprocess.Popen(
                serve, env=spaced_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        for kind, process in runs.items():
            _, stderr = process.communicate(timeout=60)  # refused before anything heavy loads: well under a second
            assert process.returncode == 2, (kind, stderr)
            assert "Traceback" not in stderr and "serving MCP" not in stderr, (kind, stderr)
            if kind in BAD_FILES:
                line = BAD_FILES[kind][1]
                assert (f"line {line}:" in stderr) if line else "names no principal" in stderr, (kind, stderr)
            else:
                assert "whitespace" in stderr, (kind, stderr)
    finally:
        for process in runs.values():
            if process.poll() is None:
                process.kill()


def test_an_empty_token_variable_counts_as_unset(tmp_path: Path) -> None:
    process, port = start(tmp_path, env_extra={"MCP_INTERP_AUTH_TOKEN": ""})
    try:
        body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        response = httpx2.post(f"http://127.0.0.1:{port}/mcp", json=body, timeout=30,
                               headers={"Accept": "application/json, text/event-stream"})  # fmt: skip
        assert response.status_code != 401  # loopback without a token: served
    finally:
        stop(process)


async def test_a_not_found_error_names_no_server_path(team: int, tmp_path: Path) -> None:
    async with connected(team, TOKENS["alice"]) as alice:
        errors = [await read_error(alice, f"{kind}://{secrets.token_hex(16)}") for kind in ("result", "figure")]
        for tool, arguments in (("job_status", {"job": f"job://{secrets.token_hex(16)}"}),
                                ("get_figure", {"uri": f"figure://{secrets.token_hex(16)}"})):  # fmt: skip
            refused = await alice.call_tool(tool, arguments)
            assert refused.is_error
            errors.append(text_of(refused))
    for error in errors:
        assert str(tmp_path) not in error and not re.search(r"(?<!:)/[A-Za-z]", error.replace("://", "")), error


def shared_servers(tmp_path: Path, heartbeat: str) -> tuple[tuple[subprocess.Popen[bytes], int], ...]:
    tokens = str(tokens_file(tmp_path))
    env = {"MCP_INTERP_JOB_HEARTBEAT_S": heartbeat}
    return start(tmp_path, "--auth-tokens", tokens, env_extra=env), start(
        tmp_path, "--auth-tokens", tokens, env_extra=env
    )


async def test_two_servers_on_one_store_keep_a_running_job_running_then_done(tmp_path: Path) -> None:
    (a, port_a), (b, port_b) = shared_servers(tmp_path, "0.2")
    try:
        async with connected(port_a, TOKENS["alice"]) as on_a, connected(port_b, TOKENS["alice"]) as on_b:
            job = await started_job(on_a, "find_circuit", LONG_JOB)
            await wait_for(on_a, job, ("running",))
            seen = []
            while (here := await status(on_a, job))["state"] == "running":
                there = await on_b.call_tool("job_status", {"job": job})
                assert there.structured_content is not None
                seen.append(there.structured_content["state"])
                if here["state"] == "running" and there.structured_content["state"] == "running":
                    assert there.structured_content["server"] and "(on another server)" in text_of(there)
                await anyio.sleep(0.5)  # > the stale time would be 10 beats = 2 s only if A stopped beating
            done_there = await wait_for(on_b, job, ("done",), seconds=30)
            assert done_there["result"] == (await status(on_a, job))["result"]
            async with connected(port_b, TOKENS["bob"]) as bob:
                refused = await bob.call_tool("job_status", {"job": job})
                assert refused.is_error and "Unknown job" in text_of(refused)
    finally:
        stop(a)
        stop(b)
    assert seen.count("running") >= 3 and "lost" not in seen, seen


async def test_a_job_whose_server_died_reads_running_until_its_heartbeat_is_stale_then_lost(tmp_path: Path) -> None:
    (a, port_a), (b, port_b) = shared_servers(tmp_path, "0.2")  # stale after 10 beats: 2 s
    try:
        async with connected(port_b, TOKENS["alice"]) as on_b:
            async with connected(port_a, TOKENS["alice"]) as on_a:
                job = await started_job(on_a, "find_circuit", LONG_JOB)
                await wait_for(on_a, job, ("running",))
                second = await started_job(on_a, "find_circuit", LONG_JOB)  # queued behind it (one job at a time)
                assert (await status(on_b, job))["server"]
                cancel = await on_b.call_tool("job_cancel", {"job": job})  # asked through the record
                assert cancel.structured_content is not None
                assert (await wait_for(on_a, job, ("cancelled",), seconds=10))["state"] == "cancelled"
                await wait_for(on_a, second, ("running",))
            a.send_signal(signal.SIGKILL)  # the server running it dies mid-job
            a.wait(timeout=30)
            died = time.monotonic()
            assert (await status(on_b, second))["state"] == "running"
            lost = await wait_for(on_b, second, ("lost",), seconds=30)
            waited = time.monotonic() - died
            assert (await status(on_b, job))["state"] == "cancelled"  # a finished record is never marked lost
    finally:
        stop(a)
        stop(b)
    assert 1.0 < waited < 6.0, f"lost after {waited:.1f} s (heartbeat 0.2 s, stale after 2 s)"
    assert "heartbeat" in (lost["error"] or "")


def test_an_mcp_session_opened_with_one_token_is_not_found_with_another(team: int) -> None:
    url = f"http://127.0.0.1:{team}/mcp"
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}  # fmt: skip
    opened = httpx2.post(url, json=initialize, headers={**accept, "Authorization": f"Bearer {TOKENS['alice']}"},
                         timeout=30)  # fmt: skip
    session = opened.headers.get("mcp-session-id")
    assert opened.status_code == 200 and session, (opened.status_code, opened.text[:200])
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    for name, expected in (("bob", 404), ("alice", 200)):
        headers = {**accept, "Authorization": f"Bearer {TOKENS[name]}", "mcp-session-id": session,
                   "mcp-protocol-version": "2025-06-18"}  # fmt: skip
        assert httpx2.post(url, json=ping, headers=headers, timeout=30).status_code == expected, name
