"""Soak: many mixed calls in one stdio session; memory, store and file descriptors must stay flat. With ``--http``:
one HTTP server shared by several principals; latency, errors and isolation.

stdio (default): spawns ``mcp-interp serve`` (``tiny`` by default), runs ``--warmup`` calls, records the server's
resident memory (VmRSS), open file descriptors and stored figures, runs ``--calls`` more mixed
calls (every tool, bad inputs included, figures and reports written, resources read back), and
prints the same figures again with the RSS growth in percent. Goals: RSS growth ≤ 5 % after
warm-up, the store within its bound (oldest evicted), no file-descriptor growth.

``--http``: spawns ``mcp-interp serve --transport http --auth-tokens FILE`` with ``--principals`` N principals, each
its own client. Short calls are model calls without a figure (logit_diff, kl, answer_rank) and, every fourth, one that
draws a figure (dla, logit_lens, attention: figures render on one thread, ~0.7 s each on tiny), timed apart. (1) One
principal makes ``--calls`` M short calls alone; (2) all N make M each at once; (3) the first principal runs a
background ``find_circuit`` (restarted until the others are done) while the other N − 1 make M short calls each: the
latency behind another's job. (4) Each
principal tries to read every other principal's figure, complete result and job, and to follow and cancel that job:
every such read must be refused as an unknown id. Prints p50 / p95 / max of both phases, tool errors (goal 0) and the
cross-principal reads refused (goal: all). Goals: p95 of the model calls behind a job ≤ 2 s, 0 errors, every cross
read refused.

Usage: ``python scripts/soak.py [--model tiny] [--calls 500] [--warmup 60] [--store-max 40]`` or
``python scripts/soak.py --http [--principals 4] [--calls 25]``.
Exit status 1 when a goal is missed (the CI test runs a reduced size through ``soak()``).
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

P = [
    "when mary and john went to the store , john gave a drink to",
    "when tom and james went to the park , james gave a ball to",
    "when dan and sid went to the shop , sid gave an apple to",
]
C = [p.replace(", john", ", mary").replace(", james", ", tom").replace(", sid", ", dan") for p in P]
MIX: list[tuple[str, dict[str, Any]]] = [
    ("logit_diff", {"prompts": P, "correct": ["mary", "tom", "dan"], "incorrect": ["john", "james", "sid"]}),
    ("kl", {"prompts": P, "compare_prompts": C}),
    ("answer_rank", {"prompts": P, "correct": "mary"}),
    ("ablate_head", {"prompts": P, "heads": ["L1H1"], "method": "mean", "correct": "mary", "incorrect": "john"}),
    (
        "patch_heads",
        {
            "clean_prompts": P,
            "corrupt_prompts": C,
            "correct": ["mary", "tom", "dan"],
            "incorrect": ["john", "james", "sid"],
        },
    ),
    ("dla", {"prompt": P[0], "answer": "mary", "baseline": "john"}),
    ("logit_lens", {"prompt": P[1], "target": "tom"}),
    ("attention", {"prompt": P[2], "layer": 1, "head": 0}),
    ("explain", {"prompt": P[0], "answer": "mary", "baseline": "john", "corrupt": C[0], "top_k": 2}),
    ("tokenize", {"texts": P}),
    ("model_info", {}),
    ("logit_diff", {"prompts": P, "correct": "mary john", "incorrect": "tom"}),  # a tool error
    ("kl", {"prompts": ["a b c"], "compare_prompts": ["a b"]}),  # a tool error
]


@dataclass
class Sample:
    rss_mb: float
    fds: int
    figures: int
    reports: int


def server_pid() -> int:
    """The spawned server: the child of this process running mcp_interp."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and b"mcp_interp" in cmdline:
            return int(entry.name)
    raise RuntimeError("server process not found")


def sample(pid: int, out: Path) -> Sample:
    rss = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return Sample(
        rss_mb=rss / 1024,
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        figures=len(list((out / "figure").glob("*.png"))),
        reports=len(list((out / "report").glob("*.md"))),
    )


async def run(model: str, calls: int, warmup: int, store_max: int, out: Path) -> tuple[Sample, Sample, int]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "MCP_INTERP_OUTPUT": str(out),
        "MCP_INTERP_STORE_MAX": str(store_max),
        "MCP_INTERP_LOG_LEVEL": "WARNING",
    }
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "mcp_interp", "serve", "--model", model], env=env
    )
    errors = 0
    async with Client(params, read_timeout_seconds=600) as client:
        pid = server_pid()

        async def one(i: int) -> None:
            nonlocal errors
            name, args = MIX[i % len(MIX)]
            result = await client.call_tool(name, args)
            errors += result.is_error
            uri = (result.structured_content or {}).get("figure_uri")
            if uri and i % 3 == 0:
                await client.read_resource(uri)

        for i in range(warmup):
            await one(i)
        before = sample(pid, out)
        for i in range(warmup, warmup + calls):
            await one(i)
        after = sample(pid, out)
    return before, after, errors


def soak(model: str = "tiny", calls: int = 500, warmup: int = 60, store_max: int = 40) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mcp-interp-soak-") as folder:
        started = time.perf_counter()
        before, after, errors = anyio.run(run, model, calls, warmup, store_max, Path(folder))
        seconds = time.perf_counter() - started
    growth = 100.0 * (after.rss_mb - before.rss_mb) / before.rss_mb
    return {
        "before": before,
        "after": after,
        "rss_growth_pct": growth,
        "tool_errors": errors,
        "seconds": seconds,
        "store_max": store_max,
        "calls": calls,
        "warmup": warmup,
    }


SHORT_MIX: list[tuple[str, dict[str, Any]]] = [  # short model calls, no figure
    ("logit_diff", {"prompts": P, "correct": ["mary", "tom", "dan"], "incorrect": ["john", "james", "sid"]}),
    ("kl", {"prompts": P, "compare_prompts": C}),
    ("answer_rank", {"prompts": P, "correct": "mary"}),
]
FIGURE_MIX: list[tuple[str, dict[str, Any]]] = [  # short model calls that also draw a figure (~0.7 s each on tiny)
    ("dla", {"prompt": P[0], "answer": "mary", "baseline": "john"}),
    ("logit_lens", {"prompt": P[1], "target": "tom"}),
    ("attention", {"prompt": P[2], "layer": 1, "head": 0}),
]
N_JOB = 40  # pairs of the background find_circuit (~9 s alone on tiny)
JOB = {
    "clean_prompts": [P[i % 3] for i in range(N_JOB)],
    "corrupt_prompts": [C[i % 3] for i in range(N_JOB)],
    "correct": [["mary", "tom", "dan"][i % 3] for i in range(N_JOB)],
    "incorrect": [["john", "james", "sid"][i % 3] for i in range(N_JOB)],
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@asynccontextmanager
async def principal(port: int, token: str) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=600)
    url = f"http://127.0.0.1:{port}/mcp"
    async with http, Client(streamable_http_client(url, http_client=http), read_timeout_seconds=600) as client:
        yield client


ERRORS: list[str] = []  # the first words of each tool error (every call is valid: there should be none)
SLOWEST: dict[str, float] = {}  # tool → its slowest call


async def short_calls(client: Client, calls: int, offset: int, seconds: dict[str, list[float]]) -> int:
    """``calls`` short model calls, each timed (every fourth draws a figure, timed apart: ``seconds["model"]`` and
    ``seconds["figure"]``); the tool errors among them (every call is valid: goal 0)."""
    errors = 0
    for i in range(calls):
        kind = "figure" if (i + offset) % 4 == 3 else "model"
        mix = FIGURE_MIX if kind == "figure" else SHORT_MIX
        name, args = mix[(i + offset) % len(mix)]
        asked = time.perf_counter()
        result = await client.call_tool(name, args)
        seconds[kind].append(time.perf_counter() - asked)
        SLOWEST[name] = max(SLOWEST.get(name, 0.0), seconds[kind][-1])
        if result.is_error:
            errors += 1
            ERRORS.append(f"{name}: " + " ".join(getattr(b, "text", "") for b in result.content)[:200])
    return errors


async def refused(client: Client, uri: str) -> bool:
    """Whether reading another principal's ``uri`` is refused exactly as an id never stored."""
    try:
        await client.read_resource(uri)
    except Exception as exc:
        return "Unknown job" in str(exc) or "was ever stored here" in str(exc)
    return False


async def run_http(model: str, n: int, calls: int, out: Path) -> dict[str, Any]:
    tokens = {f"p{i}": secrets.token_hex(16) for i in range(n)}
    (out / "tokens").write_text("".join(f"{name} {token}\n" for name, token in tokens.items()))
    port = free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "MCP_INTERP_OUTPUT": str(out / "store"),
        "MCP_INTERP_LOG_LEVEL": "WARNING",
    }
    env.pop("MCP_INTERP_AUTH_TOKEN", None)
    server = subprocess.Popen(
        [sys.executable, "-m", "mcp_interp", "serve", "--model", model, "--transport", "http", "--port", str(port),
         "--auth-tokens", str(out / "tokens")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not listening(port):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.2)
        return await phases(port, list(tokens.values()), calls)
    finally:
        server.terminate()
        server.wait(timeout=60)


async def phases(port: int, tokens: list[str], calls: int) -> dict[str, Any]:
    single: dict[str, list[float]] = {"model": [], "figure": []}
    alone: dict[str, list[float]] = {"model": [], "figure": []}
    behind: dict[str, list[float]] = {"model": [], "figure": []}
    errors = 0
    made: list[dict[str, str]] = []
    async with contextlib_all(port, tokens) as clients:
        for client in clients:  # the model loaded, and each principal's own stored work to be refused to the others
            heads = await client.call_tool("patch_heads", {"clean_prompts": P, "corrupt_prompts": C, "top": 1,
                                                           "correct": ["mary", "tom", "dan"],
                                                           "incorrect": ["john", "james", "sid"]})  # fmt: skip
            job = await client.call_tool("patch_heads", {"clean_prompts": P, "corrupt_prompts": C, "correct": "mary",
                                                         "incorrect": "john", "background": True})  # fmt: skip
            data, queued = heads.structured_content or {}, job.structured_content or {}
            made.append({"figure": data["figure_uri"], "result": data["result_uri"], "job": queued["job"]["job_uri"]})

        errors += await short_calls(clients[0], calls, 0, single)  # one principal, nobody else

        async def alone_calls(i: int) -> None:
            nonlocal errors
            errors += await short_calls(clients[i], calls, i, alone)

        async with anyio.create_task_group() as group:
            for i in range(len(clients)):
                group.start_soon(alone_calls, i)

        others_done = anyio.Event()
        jobs_run = 0

        async def keep_a_job_running() -> None:
            nonlocal jobs_run
            while not others_done.is_set():
                started = await clients[0].call_tool("find_circuit", {**JOB, "background": True})
                uri = (started.structured_content or {})["job"]["job_uri"]
                jobs_run += 1
                while not others_done.is_set():
                    status = (await clients[0].call_tool("job_status", {"job": uri})).structured_content or {}
                    if status.get("state") not in ("queued", "running"):
                        break
                    await anyio.sleep(0.2)
                else:
                    await clients[0].call_tool("job_cancel", {"job": uri})

        async def behind_calls(i: int) -> None:
            nonlocal errors
            errors += await short_calls(clients[i], calls, i, behind)

        async with anyio.create_task_group() as group:
            group.start_soon(keep_a_job_running)
            await anyio.sleep(1.0)  # the job is running
            async with anyio.create_task_group() as callers:
                for i in range(1, len(clients)):
                    callers.start_soon(behind_calls, i)
            others_done.set()

        cross = refusals = 0
        for i, client in enumerate(clients):
            for j, theirs in enumerate(made):
                if i == j:
                    continue
                for uri in theirs.values():
                    cross += 1
                    refusals += await refused(client, uri)
                for tool in ("job_status", "job_cancel"):
                    cross += 1
                    answer = await client.call_tool(tool, {"job": theirs["job"]})
                    refusals += answer.is_error and "Unknown job" in str(answer.content)
    return {"single": single, "alone": alone, "behind": behind, "errors": errors, "cross": cross, "refused": refusals,
            "jobs": jobs_run}  # fmt: skip


@asynccontextmanager
async def contextlib_all(port: int, tokens: list[str]) -> AsyncIterator[list[Client]]:
    """A connected client per principal."""
    if not tokens:
        yield []
        return
    async with principal(port, tokens[0]) as first, contextlib_all(port, tokens[1:]) as rest:
        yield [first, *rest]


def quantiles(seconds: list[float]) -> tuple[float, float, float]:
    """p50, p95 and max (nearest-rank percentiles)."""
    ordered = sorted(seconds)
    p95 = ordered[min(len(ordered) - 1, max(0, -(-95 * len(ordered) // 100) - 1))]
    return statistics.median(ordered), p95, ordered[-1]


def soak_http(model: str = "tiny", principals: int = 4, calls: int = 25) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mcp-interp-soak-http-") as folder:
        started = time.perf_counter()
        found = anyio.run(run_http, model, principals, calls, Path(folder))
    found["seconds"] = time.perf_counter() - started
    found["load"] = os.getloadavg()[0]  # timings on a shared machine scale with its load
    return found


def main_http(args: argparse.Namespace) -> int:
    r = soak_http(args.model, args.principals, args.calls)
    print(
        f"soak over HTTP: {args.principals} principals x {args.calls} short calls on {args.model}, "
        f"{r['seconds']:.0f} s (load average {r['load']:.1f} on {os.cpu_count()} CPUs at the end)"
    )
    phases = (("single", "one principal alone"), ("alone", "all principals at once, no job"),
              ("behind", "behind another's find_circuit"))  # fmt: skip
    for phase, label in phases:
        for kind in ("model", "figure"):
            seconds = r[phase][kind]
            p50, p95, most = quantiles(seconds)
            print(
                f"  {label:32s} {kind:6s} calls {len(seconds):4d}: p50 {p50:.3f} s  p95 {p95:.3f} s  max {most:.3f} s"
            )
    print(f"  find_circuit jobs run meanwhile: {r['jobs']}; goal: p95 of model calls behind a job <= 2 s")
    print(f"  tool errors     {r['errors']} (goal 0)" + "".join(f"\n    {e}" for e in ERRORS[:5]))
    print("  slowest call per tool: " + ", ".join(f"{tool} {s:.2f} s" for tool, s in sorted(SLOWEST.items())))
    print(f"  cross-principal reads refused  {r['refused']} of {r['cross']} (goal: all)")
    ok = r["errors"] == 0 and r["refused"] == r["cross"] and quantiles(r["behind"]["model"])[1] <= 2.0
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--calls", type=int, default=None, help="500 over stdio; per principal over HTTP, 25")
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--store-max", type=int, default=40)
    parser.add_argument("--http", action="store_true", help="one HTTP server shared by --principals principals")
    parser.add_argument("--principals", type=int, default=4)
    args = parser.parse_args()
    if args.http:
        args.calls = args.calls or 25
        return main_http(args)
    args.calls = args.calls or 500
    r = soak(args.model, args.calls, args.warmup, args.store_max)
    b, a = r["before"], r["after"]
    print(
        f"soak: {args.calls} mixed calls after {args.warmup} warm-up calls on {args.model}, {r['seconds']:.0f} s, "
        f"{r['tool_errors']} deliberate tool errors"
    )
    print(f"  server RSS      {b.rss_mb:8.1f} MB -> {a.rss_mb:8.1f} MB  ({r['rss_growth_pct']:+.2f} %; goal <= 5 %)")
    print(f"  open fds        {b.fds:8d}    -> {a.fds:8d}       (goal: no growth)")
    print(f"  stored figures  {b.figures:8d}    -> {a.figures:8d}       (bound {args.store_max})")
    print(f"  stored reports  {b.reports:8d}    -> {a.reports:8d}       (bound {args.store_max})")
    ok = r["rss_growth_pct"] <= 5.0 and a.fds <= b.fds and a.figures <= args.store_max and a.reports <= args.store_max
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
