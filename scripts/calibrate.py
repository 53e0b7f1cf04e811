"""Simulate every verdict's size and power under its real null and write docs/calibration.md (``./run calibrate``).

One row per scenario of every verdict in ``stats.VERDICTS``: the null simulated (with the data's dependence and
confounds), the number of simulations, the size at α = 0.05 with its exact 95 % interval, the power on a stated
alternative, and the smallest p the test can reach at the defaults. The simulators live with the code they test
(``core/<family>/nulls.py``, ``core/engine/ablation/nulls.py``) and drive it; ``tests/test_calibration.py`` runs each
with few simulations and checks this table has a row for every verdict.

    ./run calibrate                       every simulator (about an hour on 2 CPU cores; the steering rows run SmolLM2)
    ./run calibrate --only steer_kl       one simulator (by name) rerun; the other rows kept from docs/calibration.json
    ./run calibrate --skip steer_kl       every simulator but those named (two processes can share the work)
    ./run calibrate --render              only render docs/calibration.md from docs/calibration.json
    ./run calibrate --scale 0.1           a tenth of the simulations (a quick look; writes the table all the same)
    ./run calibrate --only steer_concept --more 60 --seed 1
                                          60 more null simulations (and a sixth as many power ones) on fresh seeds,
                                          added to the saved rows (a row too noisy to read, made tighter)

Each simulator's rows are saved to ``docs/calibration.json`` (with its seconds) as soon as it finishes, and the table
is rendered from that file, so a rerun of one simulator replaces its rows only.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scipy.stats import binomtest

from mcp_interp.core.circuits import nulls as circuit_nulls
from mcp_interp.core.engine.ablation import nulls as ablation_nulls
from mcp_interp.core.engine.numbers import stats
from mcp_interp.core.engine.numbers.calibration import Calibration
from mcp_interp.core.features import nulls as feature_nulls
from mcp_interp.core.lens import nulls as lens_nulls
from mcp_interp.core.swap import nulls as swap_nulls

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "calibration.md"
SAVED = ROOT / "docs" / "calibration.json"  # every simulator's rows and seconds, by simulator name
SIZE_BOUND = 0.06


@dataclass(frozen=True)
class Entry:
    """A simulator, the verdict keys its rows cover, and its simulation counts: in this script (``sims``,
    ``power_sims``) and in the test suite (``quick``, ``quick_power``). ``model``: it runs the embedded model."""

    simulate: Callable[..., list[Calibration]]
    keys: tuple[str, ...]
    sims: int
    power_sims: int
    quick: int
    quick_power: int
    model: bool = False


REGISTRY: list[Entry] = [
    Entry(ablation_nulls.component_ablation, ("component_ablation",), 2000, 300, 150, 40),
    Entry(ablation_nulls.direction_ablation, ("direction_ablation",), 1000, 200, 100, 30),
    Entry(circuit_nulls.circuit_faithfulness, ("circuit_faithfulness",), 1000, 200, 150, 30),
    Entry(feature_nulls.probe_chance, ("probe_chance",), 600, 100, 60, 20),
    Entry(feature_nulls.probe_selective, ("probe_selective",), 600, 100, 60, 20),
    Entry(swap_nulls.swap_verdicts, tuple(swap_nulls.SWAP_KEYS.values()), 2000, 300, 200, 40),
    Entry(feature_nulls.naming_generation, ("naming_generation",), 4000, 500, 400, 60),
    Entry(feature_nulls.naming_detection, ("naming_detection",), 4000, 500, 400, 60),
    Entry(lens_nulls.steer_kl, ("steer_kl",), 500, 40, 8, 4, model=True),
    Entry(lens_nulls.steer_kl_isotropic, ("steer_kl",), 100, 20, 0, 0, model=True),
    Entry(lens_nulls.steer_concept, ("steer_concept",), 60, 20, 3, 2, model=True),
]


def covered() -> set[str]:
    return {key for entry in REGISTRY for key in entry.keys}


def percent(value: float) -> str:
    return f"{value:.3f}"


def row(c: Calibration) -> str:
    low, high = c.size_interval
    p_low, p_high = c.power_interval
    size = f"{percent(c.size)} [{percent(low)}, {percent(high)}]"
    if not c.gives_verdict:
        size += f" — {c.without_verdict}"
    elif c.size > SIZE_BOUND:
        above = binomtest(c.rejections, c.sims, SIZE_BOUND, alternative="greater").pvalue
        size += f" (above {SIZE_BOUND:g}, not significantly: binomial p = {above:.2f})"
    cells = [
        f"`{c.key}`",
        c.scenario,
        c.null,
        str(c.sims),
        size,
        c.alternative,
        f"{percent(c.power)} [{percent(p_low)}, {percent(p_high)}] of {c.power_sims}",
        f"{c.p_floor:.3g}",
    ]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def render(rows: list[Calibration], seconds: float, scale: float) -> str:
    head = [
        "# Calibration: every verdict's size and power under its real null",
        "",
        "Generated by `scripts/calibrate.py` (`./run calibrate`); do not edit by hand. Each row simulates one verdict",
        "of the package (`stats.VERDICTS`) with the code the tool runs — the pools, draws and tests are the package's",
        "own; only the model (or the data) is simulated, built to carry what real data carries: pool sizes, layers of",
        "different reach, shared tokens and targets, text lengths, post-selection. **Size**: the share of null",
        "datasets with p ≤ 0.05, with its exact (Clopper–Pearson) 95 % interval; a verdict's size must be ≤ 0.06.",
        "**Power**: the share of datasets from the stated alternative with p ≤ 0.05. **p_floor**: the smallest p the",
        "test can reach at the tool's defaults in that scenario (a result whose floor is above 0.05 says \"cannot",
        'resolve at α = 0.05"). How each null is built: the module docstrings of `core/engine/ablation/nulls.py`,',
        "`core/circuits/nulls.py`, `core/features/nulls.py`, `core/swap/nulls.py` and `core/lens/nulls.py`.",
        "",
        f"The simulations took {seconds / 60:.1f} min in all on this machine (2 CPU cores)"
        + ("." if scale == 1 else f", simulations × {scale:g}."),
        "",
        "| verdict | scenario | null | sims | size at 0.05 [95 % CI] | alternative | power [95 % CI] | p_floor |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    return "\n".join([*head, *(row(c) for c in rows), ""])


def run(entry: Entry, scale: float, seed: int = 0) -> list[Calibration]:
    sims, power = max(20, round(entry.sims * scale)), max(10, round(entry.power_sims * scale))
    return entry.simulate(sims, power, seed)


def save(name: str, rows: list[Calibration], seconds: float, scale: float, add: bool = False) -> dict[str, Any]:
    """Replace simulator ``name``'s rows in ``SAVED`` (``add``: add these simulations to the saved rows of the same
    scenarios instead), under a lock: two processes may share the work; the whole saved state back."""
    SAVED.touch()
    with SAVED.open("r+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        text = handle.read()
        state: dict[str, Any] = json.loads(text) if text.strip() else {}
        if add:
            rows, seconds = added(state[name], rows), state[name]["seconds"] + seconds
        state[name] = {"seconds": seconds, "scale": scale, "rows": [dataclasses.asdict(c) for c in rows]}
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(state, indent=1, ensure_ascii=False) + "\n")
    return state


def added(saved: dict[str, Any], more: list[Calibration]) -> list[Calibration]:
    """The saved rows with ``more``'s simulations and rejections added, scenario by scenario."""
    extra = {(c.key, c.scenario): c for c in more}
    out = []
    for row in saved["rows"]:
        c = Calibration(**row)
        m = extra[(c.key, c.scenario)]
        out.append(
            dataclasses.replace(
                c,
                sims=c.sims + m.sims,
                rejections=c.rejections + m.rejections,
                power_sims=c.power_sims + m.power_sims,
                power_rejections=c.power_rejections + m.power_rejections,
            )
        )
    return out


def saved_rows(state: dict[str, Any]) -> tuple[list[Calibration], float, float, list[str]]:
    """The rows in registry order, the seconds they took, the smallest scale among them, and the simulators missing."""
    rows: list[Calibration] = []
    missing: list[str] = []
    seconds, scale = 0.0, 1.0
    for entry in REGISTRY:
        got = state.get(entry.simulate.__name__)
        if got is None:
            missing.append(entry.simulate.__name__)
            continue
        rows += [Calibration(**row) for row in got["rows"]]
        seconds += got["seconds"]
        scale = min(scale, got["scale"])
    return rows, seconds, scale, missing


def main() -> int:
    names = [entry.simulate.__name__ for entry in REGISTRY]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every simulation count (default 1)")
    parser.add_argument("--only", nargs="+", choices=names, default=None, help="run only these simulators")
    parser.add_argument("--skip", nargs="+", choices=names, default=[], help="run every simulator but these")
    parser.add_argument("--more", type=int, default=0, help="add this many null simulations to the saved rows")
    parser.add_argument("--seed", type=int, default=0, help="the simulations' seed (another for --more)")
    parser.add_argument("--render", action="store_true", help="only render the table from docs/calibration.json")
    args = parser.parse_args()
    missing = set(stats.VERDICTS) - covered()
    if missing:
        print(f"verdicts without a simulator: {sorted(missing)}", file=sys.stderr)
        return 1
    state: dict[str, Any] = json.loads(SAVED.read_text(encoding="utf-8")) if SAVED.exists() else {}
    for entry in REGISTRY:
        name = entry.simulate.__name__
        if args.render or (args.only is not None and name not in args.only) or name in args.skip:
            continue
        begun = time.perf_counter()
        if args.more:
            if name not in state or args.seed == 0:
                parser.error(f"--more adds to saved rows on a fresh seed: run {name} first, and give --seed ≠ 0")
            new = entry.simulate(args.more, max(1, args.more // 6), args.seed)
        else:
            new = run(entry, args.scale, args.seed)
        for c in new:
            flag = "" if c.size <= SIZE_BOUND or not c.gives_verdict else "  <-- above the bound"
            print(f"{c.key:22} {c.scenario[:40]:40} size {c.size:.3f} of {c.sims}, power {c.power:.2f}{flag}")
        seconds = time.perf_counter() - begun
        print(f"  ({name}: {seconds:.0f} s)", flush=True)
        state = save(name, new, seconds, args.scale, add=bool(args.more))
    rows, seconds, scale, absent = saved_rows(state)
    if absent:
        print(f"not written: no saved rows yet for {absent}", file=sys.stderr)
        return 1
    TABLE.write_text(render(rows, seconds, scale), encoding="utf-8")
    print(f"wrote {TABLE.relative_to(ROOT)} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
