"""Benchmark: from a cold start to the default ``causal_swap_benchmark`` result, through a real MCP client (stdio).

The goal (issue 11): on the embedded model the default benchmark — Jacobian lens fitted on first need, concept
position, ``capitals_languages`` — executes ≥ 40 % of its capable trial slots from ≥ 6 independent prompts within
10 minutes of a cold start, fit included. The server gets an empty cache folder (so it converts the weights and
fits the lens, as on a fresh machine) unless ``--cache`` names one. Prints progress every 30 s and the outcome
against those three goals. Takes about 10 minutes on 2 CPU cores; run nothing else meanwhile (two torch processes
on two cores oversubscribe and crawl).

Usage: ``python scripts/bench_swap_cold.py [--cache DIR]`` (``./run bench swap_cold``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

import anyio
from mcp import Client, StdioServerParameters


async def bench(cache: str) -> None:
    started = time.perf_counter()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MCP_INTERP_CACHE": cache, "MCP_INTERP_OUTPUT": f"{cache}/out"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_interp", "serve"], env=env)
    shown = [0.0]

    async def progress(done: float, total: float | None, message: str | None) -> None:
        now = time.perf_counter() - started
        if now - shown[0] >= 30:
            print(f"[{now:6.1f} s] {done:.0f}/{total or 0:.0f} {message}", flush=True)
            shown[0] = now

    async with Client(params, read_timeout_seconds=3600) as client:
        result = await client.call_tool("causal_swap_benchmark", {}, progress_callback=progress)
    elapsed = time.perf_counter() - started
    if result.is_error:
        raise SystemExit(f"tool error: {result.content}")
    out: dict[str, Any] = result.structured_content or {}
    summary = out["summary"]
    counts = summary["status_counts"]
    slots = sum(counts.values())
    executed = counts["executed"] / slots if slots else 0.0
    real, control = summary["real"], summary["control"]
    print(f"cold start → result: {elapsed:.1f} s (goal ≤ 600 s)")
    print(f"executed {counts['executed']} of {slots} capable slots = {executed:.1%} (goal ≥ 40 %)")
    print(f"independent prompts: {summary['n_independent_prompts']} (goal ≥ 6)")
    print(
        f"real {real['successes']}/{real['n']} [{real['ci_low']:.4f}, {real['ci_high']:.4f}], control "
        f"{control['successes']}/{control['n']} [{control['ci_low']:.4f}, {control['ci_high']:.4f}], paired p "
        f"{summary['paired']['p_value']:.3g} (by prompt {summary['paired']['by_prompt']['p_value']:.3g})"
    )
    for note in out["notes"]:
        print(f"  note: {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", help="Cache folder for the server (default: a new, empty one).")
    args = parser.parse_args()
    if args.cache:
        anyio.run(bench, args.cache)
        return
    with tempfile.TemporaryDirectory(prefix="mcp-interp-cold-") as cache:
        anyio.run(bench, cache)


if __name__ == "__main__":
    main()
