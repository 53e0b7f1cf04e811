"""Benchmark: the circuits family on the embedded model, 8 IOI pairs, one process.

Times ``edge_attribution`` (EAP; EAP-IG with 5 steps) and ``path_patch`` (every later query head from
L23H3, the head the other tools single out on IOI), prints the top edges, the embeddings' EAP-IG
completeness error, and the strongest paths. Goals (issue "circuits"): EAP over all edges ≤ 10 s,
EAP-IG with 5 steps ≤ 45 s, one exact faithfulness evaluation ≤ 5 s, ``find_circuit`` ≤ 90 s; also the
faithfulness curve of the top-k circuits against k with the random baseline.

Usage: ``python scripts/bench_circuits.py [--model smollm2-135m]``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch

from mcp_interp.core.circuits.faithfulness_job import CircuitFaithfulnessJob, FindCircuitJob
from mcp_interp.core.circuits.job import EdgeAttributionJob
from mcp_interp.core.circuits.path import PathPatchJob
from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.jobs import drain
from mcp_interp.corpora import ioi_pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = load_model(args.model)
    pairs = ioi_pairs()
    inputs: dict[str, Any] = {
        "clean_prompts": [p.clean for p in pairs],
        "corrupt_prompts": [p.corrupt for p in pairs],
        "correct": [p.correct for p in pairs],
        "incorrect": [p.incorrect for p in pairs],
    }
    print(f"model {model.name}, {len(pairs)} IOI pairs, torch threads {torch.get_num_threads()}")
    drain(EdgeAttributionJob(model=model, **inputs, top_k=5))  # warm-up
    for method, steps in (("eap", 1), ("eap-ig", 5)):
        job = EdgeAttributionJob(model=model, **inputs, method=method, ig_steps=steps, top_k=10)
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
    path = PathPatchJob(model=model, **inputs, sender="L23H3")
    started = time.perf_counter()
    drain(path)
    assert path.result is not None
    print(f"\npath_patch L23H3 → every later query head: {time.perf_counter() - started:.2f} s")
    for receiver in path.result.receivers[:5]:
        print(f"  {receiver.receiver:<10} recovered {receiver.recovered:+.3f}")

    single = CircuitFaithfulnessJob(model=model, **inputs, edges=[{"writer": "L23H3", "reader": "logits"}])
    started = time.perf_counter()
    drain(single)
    seconds = time.perf_counter() - started
    assert single.result is not None
    print(f"\ncircuit_faithfulness of one edge + 5 random circuits (6 exact evaluations): {seconds:.2f} s")
    curve = CircuitFaithfulnessJob(model=model, **inputs, top_k=200)
    started = time.perf_counter()
    drain(curve)
    assert curve.result is not None
    print(f"faithfulness curve (top-k by EAP; 5 random circuits per k): {time.perf_counter() - started:.2f} s")
    for point in curve.result.curve:
        print(f"  k = {point.k:>4}: top-k {point.faithfulness:+.3f}   random mean {point.random_mean:+.3f}")
    found = FindCircuitJob(model=model, **inputs, target=0.8)
    started = time.perf_counter()
    drain(found)
    assert found.result is not None
    print(
        f"\nfind_circuit (target 0.8): {time.perf_counter() - started:.2f} s, {found.result.n_edges} of "
        f"{found.result.total_edges} edges, faithfulness {found.result.faithfulness.value:+.3f}, random mean "
        f"{found.result.baseline.mean:+.3f} (p = {found.result.baseline.p_value:.3g} after "
        f"{found.result.baseline.draws_made} draws); bisection: {[(s.k, s.faithfulness) for s in found.result.search]}"
    )
    for edge in found.result.edges[:10]:
        print(f"  {edge.writer:>7} → {edge.reader:<12} {edge.score:+.3f}")


if __name__ == "__main__":
    main()
