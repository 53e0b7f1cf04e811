"""The scripted baseline's scores on the known-answer eval, into docs/agents.md (between its generated markers).

Runs ``inspect eval mcp_interp/known_answer -T solver=baseline`` through Inspect's Python API on the shipped programs
and on ``--generated`` programs of ``generate-rasp`` (seeds 0 …), reads the logs, and writes one row per shipped
program and the generated programs' means (with standard errors, and by depth). The baseline calls no model; Inspect
still needs one named, so ``mockllm/model`` is.

Usage: ``python scripts/known_answer_baseline.py [--generated 100] [--max-samples 2] [--log-dir DIR] [--no-write]``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from inspect_ai import eval as inspect_eval
from inspect_ai.log import EvalLog, read_eval_log

from mcp_interp.app.evals.known_answer import known_answer

DOC = Path(__file__).resolve().parents[1] / "docs" / "agents.md"
START, END = "<!-- baseline:start (scripts/known_answer_baseline.py) -->", "<!-- baseline:end -->"
METRICS = ("overall", "f1", "precision", "recall", "iou", "agreement", "exact")


def run(programs: str, count: int | None, log_dir: Path, max_samples: int) -> tuple[EvalLog, float]:
    started = time.monotonic()
    task = known_answer(programs=programs, count=count, solver="baseline")  # type: ignore[arg-type]
    [log] = inspect_eval(task, model="mockllm/model", log_dir=str(log_dir), max_samples=max_samples, display="none")
    return read_eval_log(log.location), time.monotonic() - started


def rows(log: EvalLog) -> list[dict[str, Any]]:
    out = []
    for sample in log.samples or []:
        score = (sample.scores or {}).get("known_answer_scorer")
        if score is None:
            out.append({"id": sample.id, "error": str(sample.error.message if sample.error else "not scored")})
            continue
        scoring = json.loads(Path(sample.metadata["scoring"]).read_text(encoding="utf-8"))
        task_file = Path(sample.metadata["model"]) / "task.json"
        depth = json.loads(task_file.read_text(encoding="utf-8"))["depth"] if task_file.is_file() else None
        out.append({"id": sample.id, **score.value, "truth": scoring["truth"], "claimed": score.metadata["claimed"],
                    "held_out": score.metadata["held_out"], "depth": depth, "layers": scoring["n_layers"]})  # fmt: skip
    return out


def mean_se(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values) / math.sqrt(len(values)):.3f}"


def table(shipped: list[dict[str, Any]], generated: list[dict[str, Any]], seconds: dict[str, float]) -> str:
    lines = ["| program | layers | true components | claimed | F1 | IoU | agreement | exact | overall |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in shipped:
        if "error" in r:
            lines.append(f"| {r['id']} | error: {r['error'][:80]} | | | | | | | |")
            continue
        lines.append(
            f"| {r['id'].removeprefix('shipped-')} | {r['layers']} | {' '.join(r['truth'])} | {' '.join(r['claimed'])} "
            f"| {r['f1']:.3f} | {r['iou']:.3f} | {r['agreement']:.3f} | {r['exact']:.3f} | {r['overall']:.3f} |"
        )
    ok = [r for r in shipped if "error" not in r]
    lines.append("| **mean of the 8** | | | | " + " | ".join(mean_se([r[m] for r in ok]) for m in
                 ("f1", "iou", "agreement", "exact", "overall")) + " |")  # fmt: skip
    scored = [r for r in generated if "error" not in r]
    lines += ["", f"Generated programs (seeds 0–{len(generated) - 1}): {len(scored)} of {len(generated)} scored "
              "(mean ± standard error over programs).", "",
              "| programs | n | precision | recall | F1 | IoU | agreement | exact | overall |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in scored:
        groups[f"depth {r['depth']}"].append(r)
    for name, group in [("all", scored), *sorted(groups.items())]:
        lines.append(f"| {name} | {len(group)} | " + " | ".join(mean_se([r[m] for r in group]) for m in
                     ("precision", "recall", "f1", "iou", "agreement", "exact", "overall")) + " |")  # fmt: skip
    failed = [r for r in generated if "error" in r]
    if failed:
        lines += ["", "Not scored: " + "; ".join(f"{r['id']}: {r['error'][:100]}" for r in failed)]
    lines += ["", f"Measured by `scripts/known_answer_baseline.py`: the shipped run took {seconds['shipped']:.0f} s, "
              f"the generated run {seconds['generated']:.0f} s (compiling included, on this machine, 2 samples at "
              "once)."]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generated", type=int, default=100)
    parser.add_argument("--max-samples", type=int, default=2)
    parser.add_argument("--log-dir", type=Path, default=None)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="known-answer-baseline-"))
    shipped_log, shipped_s = run("shipped", None, log_dir / "shipped", args.max_samples)
    generated_log, generated_s = run("generated", args.generated, log_dir / "generated", args.max_samples)
    text = table(rows(shipped_log), rows(generated_log), {"shipped": shipped_s, "generated": generated_s})
    print(text)
    print(f"logs: {log_dir} (inspect view --log-dir {log_dir})")
    if not args.no_write:
        doc = DOC.read_text(encoding="utf-8")
        head, rest = doc.split(START)
        _, tail = rest.split(END)
        DOC.write_text(f"{head}{START}\n{text}\n{END}{tail}", encoding="utf-8")


if __name__ == "__main__":
    main()
