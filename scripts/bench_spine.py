"""Benchmark of the server spine, measured in one run on this machine:

1. cold start: seconds from spawning ``mcp-interp serve`` (stdio) to the first answered tool
   call, (a) on a first-ever load (empty cache: the GGUF is dequantized and saved) and (b) on a
   cached load;
2. a warm ``logit_diff`` call over stdio on the 8 IOI prompts vs a bare TransformerBridge
   forward pass of the same batch in this process (median of repeats), and their ratio;
3. peak RSS (VmHWM) of the server process.

Usage: ``python scripts/bench_spine.py [--model smollm2-135m] [--repeats 20] [--skip-first-load]``.
Prints a table to stdout; nothing is asserted (goals are read off the ratio).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from mcp_interp.corpora import ioi_arguments


def children_of(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (from /proc; Linux only)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                found.append(int(entry.name))
    return found


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def serve_and_measure(model: str, cache: str, repeats: int) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MCP_INTERP_CACHE": cache}
    command = ["-m", "mcp_interp", "serve", "--model", model]
    params = StdioServerParameters(command=sys.executable, args=command, env=env)
    started = time.perf_counter()
    async with Client(params, read_timeout_seconds=900) as client:
        first = await client.call_tool("model_info", {})
        assert not first.is_error, first.content
        cold = time.perf_counter() - started
        load_seconds = first.structured_content["load_seconds"]
        args = ioi_arguments()
        await client.call_tool("logit_diff", args)  # warm-up
        walls = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            result = await client.call_tool("logit_diff", args)
            walls.append(time.perf_counter() - t0)
            assert not result.is_error
        server_pids = children_of(os.getpid())
        rss = max((peak_rss_mb(pid) for pid in server_pids), default=float("nan"))
    return {
        "cold": cold,
        "load_seconds": load_seconds,
        "call": statistics.median(walls),
        "rss": rss,
        "mean_ld": result.structured_content["logit_diff"]["value"],
    }


def bare_forward_seconds(model_name: str, cache: str, repeats: int) -> float:
    """Median wall time of one bridge forward on the same batch, no MCP, no metrics."""
    os.environ["MCP_INTERP_CACHE"] = cache
    import torch

    from mcp_interp.core.engine.backend.loader.load import load_model
    from mcp_interp.core.engine.text.tokens import encode

    model = load_model(model_name)
    batch = encode(model.tokenizer, ioi_arguments()["prompts"])
    with torch.inference_mode():
        model.bridge(batch.input_ids, return_type="logits")
        walls = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.bridge(batch.input_ids, return_type="logits")
            walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--skip-first-load", action="store_true", help="Only measure the cached load.")
    args = parser.parse_args()
    from mcp_interp.state.folders import cache_dir

    rows = []
    if not args.skip_first_load and args.model == "smollm2-135m":
        with tempfile.TemporaryDirectory(prefix="mcp-interp-bench-cache-") as empty:
            first = anyio.run(serve_and_measure, args.model, empty, 3)
        rows.append(
            (
                "cold start, first-ever load (GGUF → f32 cache)",
                f"{first['cold']:.1f} s",
                f"model load {first['load_seconds']:.1f} s",
            )
        )
    cache = str(cache_dir())
    warm = anyio.run(serve_and_measure, args.model, cache, args.repeats)
    rows.append(("cold start, cached load", f"{warm['cold']:.1f} s", f"model load {warm['load_seconds']:.1f} s"))
    bare = bare_forward_seconds(args.model, cache, args.repeats)
    rows.append(("warm logit_diff over stdio (8 IOI prompts, median)", f"{warm['call'] * 1000:.1f} ms", ""))
    rows.append(("bare bridge forward, same batch, in-process (median)", f"{bare * 1000:.1f} ms", ""))
    rows.append(("ratio stdio call / bare forward", f"{warm['call'] / bare:.2f}x", ""))
    rows.append(("server peak RSS (VmHWM)", f"{warm['rss']:.0f} MB", ""))
    rows.append(("mean IOI logit difference", f"{warm['mean_ld']:+.3f}", ""))
    width = max(len(r[0]) for r in rows)
    print(f"model {args.model}, {os.cpu_count()} CPUs, torch threads default")
    for name, value, extra in rows:
        print(f"  {name:<{width}}  {value:>10}  {extra}")


if __name__ == "__main__":
    main()
