"""Benchmark: `explain` end to end through a real MCP client (stdio), on the embedded model.

Spawns ``python -m mcp_interp serve``, waits for the model (not timed: that is the cold start,
measured by bench_spine.py), then times ``explain`` on the IOI prompt with its corrupt partner
— the goal is ≤ 20 s on 2 CPU cores — and prints the time per stage as the server reports it,
plus the findings. Run twice in the same server (first and second call).

Usage: ``python scripts/bench_explain.py [--model smollm2-135m]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import anyio
from mcp import Client, StdioServerParameters

from mcp_interp.corpora import ioi_pairs


async def bench(model: str) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "mcp_interp", "serve", "--model", model], env=env
    )
    pair = ioi_pairs()[0]
    args = {"prompt": pair.clean, "answer": pair.correct, "baseline": pair.incorrect, "corrupt": pair.corrupt}
    async with Client(params, read_timeout_seconds=900) as client:
        await client.call_tool("model_info", {})  # wait for the model to load
        for attempt in ("first call", "second call"):
            started = time.perf_counter()
            result = await client.call_tool("explain", args)
            wall = time.perf_counter() - started
            if result.is_error:
                raise SystemExit(f"explain failed: {result.content}")
            data = result.structured_content
            stages = ", ".join(f"{k} {v:.2f} s" for k, v in data["stage_seconds"].items())
            print(f"explain {attempt}: {wall:.2f} s through the MCP client (goal ≤ 20 s); stages: {stages}")
    print("\nfindings:\n  " + "\n  ".join(data["findings"]))
    print(f"report: {data['report_uri']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    anyio.run(bench, parser.parse_args().model)


if __name__ == "__main__":
    main()
