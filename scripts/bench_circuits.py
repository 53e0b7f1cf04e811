"""Benchmark: the circuits family on the embedded model, 8 IOI pairs, one process.

Times ``edge_attribution`` (EAP; EAP-IG with 5 steps) and ``path_patch`` (every later query head from
L23H3, the head the other tools single out on IOI), prints the top edges, the embeddings' EAP-IG
completeness error, and the strongest paths. Goals (issue "circuits"): EAP over all edges ≤ 10 s,
EAP-IG with 5 steps ≤ 45 s. (Faithfulness and ``find_circuit`` are not built yet.)

Usage: ``python scripts/bench_circuits.py [--model smollm2-135m]``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from mcp_interp.core.circuits.job import EdgeAttributionJob
from mcp_interp.core.circuits.path import PathPatchJob
from mcp_interp.core.jobs import drain
from mcp_interp.corpora import ioi_pairs
from mcp_interp.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = load_model(args.model)
    pairs = ioi_pairs()
    inputs = (
        [p.clean for p in pairs],
        [p.corrupt for p in pairs],
        [p.correct for p in pairs],
        [p.incorrect for p in pairs],
    )
    print(f"model {model.name}, {len(pairs)} IOI pairs, torch threads {torch.get_num_threads()}")
    drain(EdgeAttributionJob(model, *inputs, top_k=5))  # warm-up
    for method, steps in (("eap", 1), ("eap-ig", 5)):
        job = EdgeAttributionJob(model, *inputs, method=method, ig_steps=steps, top_k=10)
        started = time.perf_counter()
        drain(job)
        seconds = time.perf_counter() - started
        assert job.result is not None
        print(
            f"\n{method} ({steps} gradient run{'s' if steps > 1 else ''}): {seconds:.2f} s, {job.result.n_edges} edges"
        )
        for edge in job.result.edges[:8]:
            print(f"  {edge.writer:>7} → {edge.reader:<12} {edge.score:+.3f}")
        if job.result.embed_total_vs_gap is not None:
            print(f"  embeddings' total − gap: {job.result.embed_total_vs_gap:+.3f}")
    path = PathPatchJob(model, *inputs, sender="L23H3")
    started = time.perf_counter()
    drain(path)
    assert path.result is not None
    print(f"\npath_patch L23H3 → every later query head: {time.perf_counter() - started:.2f} s")
    for receiver in path.result.receivers[:5]:
        print(f"  {receiver.receiver:<10} recovered {receiver.recovered:+.3f}")


if __name__ == "__main__":
    main()
