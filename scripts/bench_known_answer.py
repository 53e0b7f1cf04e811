"""Benchmark: do the methods find the circuit a compiled RASP program is known to compute?

Each program in ``examples/rasp/`` is compiled by tracr (``core.known.compile``) and booted as the server boots it.
For every input position whose change can flip the answer, a family of clean/corrupt pairs is drawn and its known
circuit derived from the RASP program alone (``core.known.families``). Each method then runs on the family, as its tool
would, and its answer is scored against the known circuit:

* exact patching (attn_out and mlp_out, every layer × position): found = cells with |recovered| ≥ 0.1; known = the
  cells computing a unit of the known circuit; also the largest |score − RASP-level patching's prediction| over all
  cells (0 when the model implements the program exactly);
* patch_heads (exact): heads with |score| ≥ 0.1 against the circuit's heads;
* attribution patching (attn_out and mlp_out): cells with |estimate| ≥ 0.1;
* EAP and EAP-IG (``edge_attribution``, 5 steps): edges with |score| ≥ 0.1 · the mean clean − corrupt gap;
* find_circuit (target 0.8) with granularity edge and node: its circuit's edges, its nodes' components;
* explain (the family's first pair): heads with |recovered| ≥ 0.1 and its top attention / MLP cells with
  |recovered| ≥ 0.1.

Precision and recall per family (``families.precision_recall``), averaged over families. Faithfulness: the exact
circuit ablation of ``circuit_faithfulness`` (corrupt writes on every edge outside the circuit; 1 = the circuit alone
restores the clean metric) of what the method found — its edges, or for a node-level answer every edge among its
components (``families.induced_edges``). The known circuit's own faithfulness is the first row.

Random baselines (``ablate`` on the family's first pair, energy-matched random directions at the last position): the
output node's direction e(out:correct) − e(out:incorrect) in the last layer's residual stream must beat random
(p < 0.05); a direction inside the residual dimensions of a node outside the circuit must not.

Usage: ``python scripts/bench_known_answer.py [--programs reverse sort …] [--pairs 6] [--json out.json]``.
Prints the table docs/known-answers.md shows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

import mcp_interp.core.engine.backend.loader.load  # noqa: F401  # first: the loader and LoadedModel import each other
from mcp_interp.core.circuits.faithfulness_job import CircuitFaithfulnessJob, FindCircuitJob
from mcp_interp.core.circuits.job import EdgeAttributionJob
from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.explain.job import ExplainJob
from mcp_interp.core.heads.patch_heads import PatchHeadsJob
from mcp_interp.core.known.compile import compile_program, read_program_file, write_folder
from mcp_interp.core.known.families import (
    PairFamily,
    cell_units,
    head_units,
    induced_edges,
    make_family,
    precision_recall,
    rasp_score,
)
from mcp_interp.core.localize.ablate import ablate
from mcp_interp.core.localize.patch import PatchJob
from mcp_interp.schemas.common import DirectionRef, Intervention

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "rasp"
THRESHOLD = 0.1
METHODS = [
    "known circuit", "exact patching", "patch_heads", "attribution patching", "EAP", "EAP-IG",
    "find_circuit (edges)", "find_circuit (nodes)", "explain",
]  # fmt: skip


def cells_of(job: PatchJob) -> dict[tuple[str, int, int], float]:
    """(half, layer, position) → score of a finished attn_out or mlp_out patching job."""
    assert job.result is not None and job.result.scores is not None
    half = "attn" if job.component == "attn_out" else "mlp"
    return {
        (half, layer, position): float(score)
        for layer, row in enumerate(job.result.scores)
        for position, score in enumerate(row)
        if score is not None
    }


def faithfulness(model: Any, family: PairFamily, edges: set[tuple[str, str]]) -> float | None:
    """circuit_faithfulness of an edge set (None for an empty one, which restores nothing by construction)."""
    if not edges:
        return None
    job = CircuitFaithfulnessJob(model=model, **family.inputs(), edges=[{"writer": w, "reader": r} for w, r in
                                 sorted(edges)], random_circuits=19)  # fmt: skip
    drain(job)
    assert job.result is not None
    return float(job.result.faithfulness.value)


def components_of_cells(cells: set[tuple[str, int, int]], truth_cells: dict[tuple[str, int], list[str]],
                        n_heads: int) -> set[str]:  # fmt: skip
    """The components a cell-level answer names: an MLP cell its MLP, an attention cell every head of the layer that
    computes something (attn_out does not tell heads apart)."""
    out: set[str] = set()
    for half, layer, _ in cells:
        if half == "mlp":
            out.add(f"L{layer}MLP")
        else:
            out.update(f"L{layer}H{h}" for h in range(n_heads))
    return out


def run_family(model: Any, compiled: Any, truth: list[dict[str, Any]], family: PairFamily, graph_edges: list[Any],
               misses: dict[str, list[str]], name: str) -> dict[str, dict[str, float | None]]:  # fmt: skip
    program = compiled.program
    inputs = family.inputs()
    known_cells = {c for c in family.model.cells if c[0] != "embed"}
    known_heads = {h for h in family.model.components if not h.endswith("MLP")}
    known_components = set(family.model.components)
    units_by_cell, units_by_head = cell_units(truth), head_units(truth)
    n_heads = int(model.cfg.n_heads)
    rows: dict[str, dict[str, float | None]] = {}
    where = f"{name} (position {family.position})"

    rows["known circuit"] = {"precision": 1.0, "recall": 1.0,
                             "faithfulness": faithfulness(model, family, set(family.model.edges))}  # fmt: skip

    # exact patching, and RASP-level patching's prediction of every cell
    exact: dict[tuple[str, int, int], float] = {}
    for component in ("attn_out", "mlp_out"):
        job = PatchJob(model=model, **inputs, component=component)
        drain(job)
        exact.update(cells_of(job))
    worst, undefined = 0.0, 0
    for (half, layer, position), score in exact.items():
        predicted = rasp_score(program, family, units_by_cell.get((half, layer), []), position)
        if predicted is None:
            undefined += 1
            continue
        worst = max(worst, abs(score - predicted))
    found = {c for c, s in exact.items() if abs(s) >= THRESHOLD}
    precision, recall = precision_recall(found, known_cells)
    for cell in sorted(known_cells - found):
        single = rasp_score(program, family, units_by_cell.get(cell[:2], []), cell[2])
        if single is None:
            why = "RASP leaves the patched program undefined"
        elif abs(single) < THRESHOLD:
            why = f"its single-cell RASP patch recovers {single:.2f}: the unit matters only jointly"
        else:
            why = f"RASP predicts {single:.2f}, measured {exact.get(cell, 0.0):.2f}"
        misses["exact patching"].append(f"{where}: L{cell[1]} {cell[0]} at position {cell[2]} ({why})")
    rows["exact patching"] = {"precision": precision, "recall": recall, "max_rasp_error": worst,
                              "undefined_cells": float(undefined),
                              "faithfulness": faithfulness(model, family, induced_edges(
                                  graph_edges, components_of_cells(found, units_by_cell, n_heads)))}  # fmt: skip

    heads_job = PatchHeadsJob(model=model, **inputs)
    drain(heads_job)
    assert heads_job.result is not None
    found_heads = {h.head for h in heads_job.result.heads if h.score is not None and abs(h.score) >= THRESHOLD}
    found_heads &= set(units_by_head) | found_heads
    precision, recall = precision_recall(found_heads, known_heads)
    for head in sorted(known_heads - found_heads):
        misses["patch_heads"].append(f"{where}: {head} (patched at every position at once)")
    rows["patch_heads"] = {
        "precision": precision,
        "recall": recall,
        "faithfulness": faithfulness(
            model, family, induced_edges(graph_edges, found_heads | {c for c in known_components if c.endswith("MLP")})
        ),
    }

    attribution: dict[tuple[str, int, int], float] = {}
    for component in ("attn_out", "mlp_out"):
        job = PatchJob(model=model, **inputs, component=component, method="attribution")
        drain(job)
        attribution.update(cells_of(job))
    found = {c for c, s in attribution.items() if abs(s) >= THRESHOLD}
    precision, recall = precision_recall(found, known_cells)
    for cell in sorted(known_cells - found):
        misses["attribution patching"].append(
            f"{where}: L{cell[1]} {cell[0]} at position {cell[2]} (estimate {attribution.get(cell, 0.0):+.2f}, exact "
            f"{exact.get(cell, 0.0):+.2f})"
        )
    rows["attribution patching"] = {
        "precision": precision,
        "recall": recall,
        "faithfulness": faithfulness(
            model, family, induced_edges(graph_edges, components_of_cells(found, units_by_cell, n_heads))
        ),
    }

    known_edges = set(family.model.edges)
    for label, method in (("EAP", "eap"), ("EAP-IG", "eap-ig")):
        job = EdgeAttributionJob(model=model, **inputs, method=method, ig_steps=5, top_k=len(graph_edges))
        drain(job)
        assert job.result is not None
        gap = job.result.clean_logit_diff.value - job.result.corrupt_logit_diff.value
        scores = {(e.writer, e.reader): e.score for e in job.result.edges}
        found_edges = {e for e, s in scores.items() if abs(s) >= THRESHOLD * abs(gap)}
        precision, recall = precision_recall(found_edges, known_edges)
        for edge in sorted(known_edges - found_edges):
            misses[label].append(f"{where}: {edge[0]} → {edge[1]} (score {scores.get(edge, 0.0):+.3f}, gap {gap:.2f})")
        rows[label] = {"precision": precision, "recall": recall,
                       "faithfulness": faithfulness(model, family, found_edges)}  # fmt: skip

    for granularity in ("edge", "node"):
        finder = FindCircuitJob(model=model, **inputs, granularity=granularity, random_circuits=19)
        drain(finder)
        assert finder.result is not None and finder.circuit is not None and finder.graph is not None
        graph = finder.graph
        edges = {(str(graph.writers[w]), str(graph.readers[r])) for w, r in finder.circuit}
        label = f"find_circuit ({granularity}s)"
        if granularity == "edge":
            precision, recall = precision_recall(edges, known_edges)
            missed = known_edges - edges
        else:
            nodes = {n.node for n in finder.result.nodes} - {"embed", "logits"}
            precision, recall = precision_recall(nodes, known_components)
            missed = {(n, "") for n in known_components - nodes}
        for item in sorted(missed):
            misses[label].append(f"{where}: {' → '.join(x for x in item if x)}")
        rows[label] = {"precision": precision, "recall": recall,
                       "faithfulness": float(finder.result.faithfulness.value)}  # fmt: skip

    explain = ExplainJob(model=model, prompt=family.clean_prompts[0], answer=family.correct[0],
                         baseline=family.incorrect[0], corrupt=family.corrupt_prompts[0], top_k=10)  # fmt: skip
    drain(explain)
    assert explain.result is not None
    named: set[str] = {h.head for h in explain.result.causal_heads or [] if abs(h.recovered_fraction or 0) >= THRESHOLD}
    for cell in [*(explain.result.top_mlps or []), *(explain.result.top_attention or [])]:
        if cell.score is not None and abs(cell.score) >= THRESHOLD:
            half = "mlp" if cell in (explain.result.top_mlps or []) else "attn"
            named |= components_of_cells({(half, cell.layer, cell.position or 0)}, units_by_cell, n_heads)
    named = {c for c in named if c.endswith("MLP") or c in units_by_head or c in known_heads}
    precision, recall = precision_recall(named, known_components)
    for component in sorted(known_components - named):
        misses["explain"].append(f"{where}: {component} (one pair; attn_out/mlp_out maps only at carrying positions)")
    rows["explain"] = {"precision": precision, "recall": recall,
                       "faithfulness": faithfulness(model, family, induced_edges(graph_edges, named))}  # fmt: skip
    return rows


def random_baselines(model: Any, truth: list[dict[str, Any]], family: PairFamily) -> list[dict[str, Any]]:
    """ablate's energy-matched random-direction baseline on a known-relevant and a known-irrelevant direction."""
    n_layers, d_model = int(model.cfg.n_layers), int(model.cfg.d_model)
    by_label = {e["label"]: e for e in truth}
    output = next(e for e in truth if e["output"])
    index = dict(zip(output["residual_labels"], output["residual_dims"], strict=True))
    relevant = torch.zeros(d_model)
    relevant[index[f"{output['label']}:{family.correct[0]}"]] += 1.0
    relevant[index[f"{output['label']}:{family.incorrect[0]}"]] -= 1.0
    outside = [e for e in truth if e["residual_dims"] and e["label"] not in family.circuit.nodes
               and e["writes"] != ["embed"]]  # fmt: skip
    out = []
    candidates = [("relevant", output["label"], relevant)]
    if outside:
        irrelevant = torch.zeros(d_model)
        irrelevant[outside[0]["residual_dims"]] = 1.0
        candidates.append(("irrelevant", outside[0]["label"], irrelevant))
    else:  # every computed node is in the circuit: a dimension no sublayer writes (the tokens' PAD direction)
        pad = by_label["tokens"]["residual_dims"][-1]
        irrelevant = torch.zeros(d_model)
        irrelevant[pad] = 1.0
        candidates.append(("irrelevant", "tokens (an unused value)", irrelevant))
    for kind, what, vector in candidates:
        intervention = Intervention(
            ablate=[DirectionRef(layer=n_layers - 1, direction=(vector / vector.norm()).tolist())], positions="last"
        )
        result = ablate(model, family.clean_prompts[:1], intervention, family.correct[0], family.incorrect[0],
                        random_draws=200)  # fmt: skip
        baseline = result.random_baseline
        assert baseline is not None
        out.append({"kind": kind, "node": what, "p": baseline.p_value, "p_floor": getattr(baseline, "p_floor", None),
                    "verdict": baseline.verdict, "real": baseline.real})  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", nargs="*", default=None, help="Program names in examples/rasp (default: all).")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--families", type=int, default=2, help="Most families (changed positions) per program.")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    files = sorted(EXAMPLES.glob("*.py"))
    if args.programs:
        files = [f for f in files if f.stem in args.programs]
    per_method: dict[str, list[dict[str, float | None]]] = defaultdict(list)
    misses: dict[str, list[str]] = defaultdict(list)
    baselines: list[dict[str, Any]] = []
    programs: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for file in files:
            t0 = time.perf_counter()
            source = read_program_file(file)
            compiled = compile_program(source, str(file))
            facts = write_folder(compiled, Path(tmp) / file.stem, file)
            truth = json.loads((Path(tmp) / file.stem / "ground_truth.json").read_text())["nodes"]
            model = load_model(str(Path(tmp) / file.stem))
            from mcp_interp.core.circuits.attribution import graph_of

            graph = graph_of(model.backend)
            graph_edges = [(str(graph.writers[w]), str(graph.readers[r])) for w, r in graph.edges]
            values = sorted(source.vocab, key=str)
            families = []
            for position in reversed(range(source.max_seq_len)):
                family = make_family(compiled.program, values, source.max_seq_len, position, truth, pairs=args.pairs)
                if family is not None:
                    families.append(family)
                if len(families) == args.families:
                    break
            for family in families:
                rows = run_family(model, compiled, truth, family, graph_edges, misses, file.stem)
                for method, row in rows.items():
                    per_method[method].append(row)
                for row in random_baselines(model, truth, family):
                    baselines.append({"program": file.stem, "position": family.position, **row})
            config = facts["bridge_config"]
            programs.append({"program": file.stem, "layers": config["n_layers"], "heads": config["n_heads"],
                             "d_model": config["d_model"], "families": [f.position for f in families],
                             "seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
            print(f"{file.stem}: {config['n_layers']} layers × {config['n_heads']} heads, d_model {config['d_model']}, "
                  f"families at positions {[f.position for f in families]}, {time.perf_counter() - t0:.1f} s",
                  flush=True)  # fmt: skip
    print(f"\n{len(files)} programs, {sum(len(p['families']) for p in programs)} families, "
          f"{time.perf_counter() - started:.0f} s\n")  # fmt: skip
    print("| method | precision | recall | faithfulness | families |")
    print("| --- | --- | --- | --- | --- |")
    table = []
    for method in METHODS:
        rows = per_method[method]
        if not rows:
            continue
        mean = {k: statistics.fmean(r[k] for r in rows if r.get(k) is not None) if any(r.get(k) is not None
                for r in rows) else None for k in ("precision", "recall", "faithfulness")}  # fmt: skip
        table.append({"method": method, **mean, "families": len(rows)})
        cells = " | ".join(
            "–" if mean[k] is None else f"{mean[k]:.2f}" for k in ("precision", "recall", "faithfulness")
        )
        print(f"| {method} | {cells} | {len(rows)} |")
    worst = max(r["max_rasp_error"] or 0.0 for r in per_method["exact patching"])
    print(f"\nexact patching vs RASP-level patching, every cell of every family: max |difference| {worst:.2e}")
    print("\nrandom baselines (ablate, energy-matched random directions, last layer, last position):")
    for row in baselines:
        print(f"  {row['program']} pos {row['position']} {row['kind']:>10} ({row['node']}): real {row['real']:+.3f}, "
              f"p = {row['p']:.3g}: {row['verdict']}")  # fmt: skip
    print("\nmisses:")
    for method, items in misses.items():
        print(f"  {method}: {len(items)}")
        for item in items[:12]:
            print(f"    {item}")
    if args.json:
        args.json.write_text(json.dumps({"programs": programs, "table": table, "baselines": baselines,
                                         "misses": misses, "max_rasp_error": worst}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
