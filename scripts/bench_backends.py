"""Benchmark: the engines behind the seam on the embedded model, each against the in-memory transformers backend
measured in the same run.

Exact ``patch_heads`` (every head: 30 layers × 9 = 270, the 8 IOI pairs of ``mcp_interp/data/corpora/ioi.json``) on

* ``transformers`` in memory (the block engines: the Llama suffix sweep);
* ``--backend inspect`` (TransformerLens' RemoteBridge on Inspect's HF provider: each cell a whole forward with the
  patched z set, one row per request);
* ``transformers`` with ``--device-map auto --max-memory '{"cpu": "300MiB"}' --offload-folder <tmp>`` (about half
  of the model on disk, materialised around each call).

Each engine runs in a process of its own (so each peak RSS is its own, ``ru_maxrss``), after one warm-up call. Printed:
wall time, the ratio to the in-memory time, the max |difference| of the grids, and the peak RSS.

Usage: ``python scripts/bench_backends.py [--pairs 8] [--engines transformers inspect offload]``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time

ENGINES = ("transformers", "inspect", "offload")


def measure(engine: str, n_pairs: int) -> dict[str, object]:
    """One engine's exact patch_heads (in this process): grid, seconds, engine label, peak RSS."""
    import torch

    from mcp_interp.core.engine.backend.loader.load import load_model
    from mcp_interp.core.engine.backend.options import LoadOptions
    from mcp_interp.core.engine.jobs import drain
    from mcp_interp.core.heads.patch_heads import PatchHeadsJob
    from mcp_interp.corpora import ioi_pairs

    with tempfile.TemporaryDirectory() as folder:
        options = {
            "transformers": LoadOptions(),
            "inspect": LoadOptions(backend="inspect"),
            "offload": LoadOptions(device_map="auto", max_memory={"cpu": "300MiB"}, offload_folder=folder),
        }[engine]
        model = load_model("smollm2-135m", options=options)

        def run(pairs: int) -> tuple[list[list[float]], float, str]:
            chosen = ioi_pairs()[:pairs]
            job = PatchHeadsJob(
                model=model,
                clean_prompts=[p.clean for p in chosen],
                corrupt_prompts=[p.corrupt for p in chosen],
                correct=[p.correct for p in chosen],
                incorrect=[p.incorrect for p in chosen],
            )
            started = time.perf_counter()
            drain(job)
            assert job.result is not None
            return job.result.patched_logit_diff, time.perf_counter() - started, str(job.engine)

        run(1)  # warm-up (kernels, allocator, page cache), as in a running server
        grid, seconds, label = run(n_pairs)
        placement = model.backend.placement() or {}
    return {
        "grid": grid,
        "seconds": seconds,
        "engine": label,
        "on_disk": sum(device == "disk" for device in placement.values()),
        "modules": len(placement),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.pairs)))
        return
    results = {}
    for engine in dict.fromkeys(["transformers", *args.engines]):
        out = subprocess.run(
            [sys.executable, __file__, "--child", engine, "--pairs", str(args.pairs)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        results[engine] = json.loads(out.stdout.strip().splitlines()[-1])
    import torch

    reference = results["transformers"]
    grid = torch.tensor(reference["grid"], dtype=torch.float64)
    print(
        f"exact patch_heads: 270 heads × {args.pairs} IOI pairs on SmolLM2-135M, torch threads {reference['threads']}"
    )
    print(f"{'engine':<38}{'seconds':>9}{'× in-memory':>13}{'max |Δ|':>11}{'peak RSS':>11}")
    for engine, result in results.items():
        labels = {"transformers": "transformers, in memory", "inspect": "inspect (RemoteBridge, Inspect HF)"}
        label = labels.get(engine, f"transformers, {result['on_disk']}/{result['modules']} modules on disk")
        difference = float((torch.tensor(result["grid"], dtype=torch.float64) - grid).abs().max())
        ratio = result["seconds"] / reference["seconds"]
        print(f"{label:<38}{result['seconds']:9.2f}{ratio:12.2f}x{difference:11.2e}{result['peak_rss_mb']:9.0f} MB")
        print(f"{'':<38}engine: {result['engine']}")


if __name__ == "__main__":
    main()
