"""Soak: many mixed calls in one stdio session; memory, store and file descriptors must stay flat.

Spawns ``mcp-interp serve`` (``tiny`` by default), runs ``--warmup`` calls, records the server's
resident memory (VmRSS), open file descriptors and stored figures, runs ``--calls`` more mixed
calls (every tool, bad inputs included, figures and reports written, resources read back), and
prints the same figures again with the RSS growth in percent. Goals: RSS growth ≤ 5 % after
warm-up, the store within its bound (oldest evicted), no file-descriptor growth.

Usage: ``python scripts/soak.py [--model tiny] [--calls 500] [--warmup 60] [--store-max 40]``.
Exit status 1 when a goal is missed (the CI test runs a reduced size through ``soak()``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--store-max", type=int, default=40)
    args = parser.parse_args()
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
