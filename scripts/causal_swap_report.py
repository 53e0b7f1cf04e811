"""The full causal-swap benchmark on the country corpus, through a real MCP client (stdio).

Spawns ``python -m mcp_interp serve``, then runs ``causal_swap_benchmark`` for each requested
(lens, position) over the requested layers (default: every layer the lens covers) and prints,
per run: wall time, trial-status counts, the ledger size, real and control success with exact
95% intervals and ``n_independent_prompts``, the control spread across seeds, the paired sign
test, executed trials per layer, and the artifact path. ``--lens jacobian`` needs a fitted lens
(``mcp-interp fit-lens``).

Usage: ``python scripts/causal_swap_report.py [--lens logit,jacobian] [--positions last,concept]
[--layers 4,8,12] [--model smollm2-135m]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import anyio
from mcp import Client, StdioServerParameters


def rate(r: dict[str, Any]) -> str:
    shown = "n/a" if r["rate"] is None else f"{r['rate']:.3f}"
    interval = f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
    return f"{r['successes']}/{r['n']} = {shown} {interval} ({r['n_independent_prompts']} prompts)"


def report(label: str, wall: float, data: dict[str, Any]) -> None:
    s = data["summary"]
    spread = s["control_seed_spread"]
    print(f"\n== {label}: {wall:.1f} s")
    print(f"status counts: {s['status_counts']}; excluded trial slots: {s['excluded_trials']}")
    print(f"ledger: {len(data['exclusions'])} entries")
    for entry in data["exclusions"]:
        if entry["kind"] == "prompt":
            print(f"  prompt {entry['function']}/{entry['concept']}: {entry['reason']}")
    print(f"layers executed: {s['layers_executed']}")
    print(f"real:    {rate(s['real'])}")
    print(f"control: {rate(s['control'])}")
    print(f"real successes from prompts: {s['real_success_prompts']}; target already active: {s['target_was_active']}")
    if spread["mean"] is not None:
        print(
            f"control by seed: mean {spread['mean']:.3f}, sd {spread['sd']:.3f}, "
            f"range [{spread['min']:.3f}, {spread['max']:.3f}]"
        )
    p = s["paired"]
    print(
        f"paired exact conditional test: real successes {p['real_successes']} vs {p['expected_real_successes']:.2f} "
        f"expected if exchangeable with controls ({p['informative_trials']} informative trials); "
        f"p two-sided {p['p_value']:.3g}, real better {p['p_real_better']:.3g}"
    )
    c = p["by_prompt"]
    print(
        f"  by prompt ({c['method']}): statistic {c['statistic']:+.3f} vs {c['null_mean']:+.3f} under H0; prompts "
        f"real better {c['real_better']}, control better {c['control_better']}, ties {c['ties']}; "
        f"p two-sided {c['p_value']:.3g}"
    )
    per_layer = {row["layer"]: row["executed"] for row in s["by_layer"] if row["executed"]}
    print(f"executed per layer: {per_layer}")
    print(f"artifact: {data['artifact_path']}  figure: {data['figure_uri']}")
    for note in data["notes"]:
        print(f"note: {note}")


async def run(model: str, lenses: list[str], positions: list[str | int], layers: list[int] | None) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "mcp_interp", "serve", "--model", model], env=env
    )
    async with Client(params, read_timeout_seconds=7200) as client:
        await client.call_tool("model_info", {})  # wait for the model to load
        for lens in lenses:
            for position in positions:
                started = time.perf_counter()
                args: dict[str, Any] = {"corpus": "countries", "lens": lens, "position": position}
                if layers is not None:
                    args["layers"] = layers
                result = await client.call_tool("causal_swap_benchmark", args)
                wall = time.perf_counter() - started
                if result.is_error:
                    print(f"\n== {lens} lens, position {position}: error: {result.content}")
                    continue
                report(f"{lens} lens, position {position}", wall, result.structured_content)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--lens", default="logit", help="comma-separated: logit,jacobian")
    parser.add_argument("--positions", default="last,concept", help="comma-separated: last,concept or indices")
    parser.add_argument("--layers", default=None, help="comma-separated layers (default: all the lens covers)")
    args = parser.parse_args()
    positions: list[str | int] = [p if p in ("last", "concept") else int(p) for p in args.positions.split(",")]
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    anyio.run(run, args.model, args.lens.split(","), positions, layers)


if __name__ == "__main__":
    main()
