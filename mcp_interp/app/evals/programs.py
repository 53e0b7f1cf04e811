"""The programs the ``known_answer`` eval serves: compiled once into a cache, each with its scoring data beside it.

Two sets:

* ``shipped``: the eight programs of ``examples/rasp/`` (in the wheel as ``mcp_interp/data/rasp_examples``),
  compiled by ``compile_rasp``. Their reference is tracr's own RASP evaluator on the program.
* ``generated``: ``generate_rasp(seed)``'s programs, drawn from a grammar (``core.known.generate``) so that no agent
  and no model behind one has read about them. Their reference is the ``reference.py`` written beside them.

Each program's cache entry is ``<cache>/<kind>-<key>-<hash>/``: ``model/`` (the folder the server serves, its truth
hidden) and ``scoring.json`` (outside the served folder: the true components, the model's sizes, the input space,
and a pool of ``POOL`` random inputs with the reference's output at every position, as output tokens; null where the
program is undefined). ``hash`` covers the program's source (or the generator's), the compiler's, the package's
and tracr's versions, so an edit recompiles. Compiling takes seconds; it happens once per program and machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mcp_interp.core.known.agent_score import candidate_inputs, truth_components
from mcp_interp.state.folders import default_output_dir
from mcp_interp.version import __version__

Kind = Literal["shipped", "generated"]
POOL = 200  # random inputs per program, of which the first ≥ 50 the agent never sent are scored
SHIPPED_DATA = Path(__file__).resolve().parents[1] / "data" / "rasp_examples"  # in the wheel
SHIPPED_REPO = Path(__file__).resolve().parents[3] / "examples" / "rasp"  # in a checkout


def shipped_folder() -> Path:
    return SHIPPED_DATA if SHIPPED_DATA.is_dir() else SHIPPED_REPO


def shipped_names() -> list[str]:
    return sorted(p.stem for p in shipped_folder().glob("*.py"))


def cache_root() -> Path:
    """``$MCP_INTERP_EVAL_CACHE``, or ``known_answer/`` in the output folder."""
    override = os.environ.get("MCP_INTERP_EVAL_CACHE")
    return Path(override).expanduser() if override else default_output_dir() / "known_answer"


@dataclass(frozen=True)
class Program:
    """A compiled program ready to serve and score."""

    kind: Kind
    key: str  # the shipped program's name or the generated seed
    model: Path  # the folder ``serve --model`` takes
    scoring: Path  # scoring.json

    def load_scoring(self) -> dict[str, Any]:
        return json.loads(self.scoring.read_text(encoding="utf-8"))


def _token(value: Any) -> str | None:
    """A reference value as the output token the served model prints (1.0, the mean of equal values, is "1")."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _version_stamp(*sources: str) -> str:
    """A hash of what decides a cached program: the sources given (the program file, or the generator), the compiler's
    own source, the package's and tracr's versions."""
    from mcp_interp.core.known import compile as compiler

    parts = [*sources, Path(compiler.__file__).read_text(encoding="utf-8"), __version__, compiler.tracr_version()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:10]


def _write_json_atomically(path: Path, data: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name, dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=1)
    os.replace(tmp, path)


def _scoring(model: Path, reference: Any, input_values: Sequence[Any], max_seq_len: int, seed: int) -> dict[str, Any]:
    """scoring.json's content: ``reference(values) -> list`` on the pool of inputs (values as the program takes them,
    shown to the agent and to the submission as their tokens)."""
    compiled = json.loads((model / "compiled_program.json").read_text(encoding="utf-8"))
    truth = json.loads((model / "ground_truth.json").read_text(encoding="utf-8"))
    by_token = {str(v): v for v in input_values}
    tokens = sorted(by_token)
    cases = []
    for case in candidate_inputs(tokens, max_seq_len, POOL, seed):
        try:
            expected = [_token(v) for v in reference([by_token[t] for t in case])]
        except Exception:  # undefined as a whole on this input (a categorical Aggregate over different values)
            continue
        if any(e is not None for e in expected):
            cases.append({"input": list(case), "expected": expected})
    fields = compiled["bridge_config"]
    return {
        "n_layers": fields["n_layers"],
        "n_heads": fields["n_heads"],
        "bos": compiled["program"]["compiler_bos"],
        "input_values": tokens,
        "max_seq_len": max_seq_len,
        "truth": sorted(truth_components(truth["nodes"])),
        "cases": cases,
    }


def shipped(name: str, root: Path | None = None) -> Program:
    """``examples/rasp/<name>.py`` compiled and scored (cached)."""
    from mcp_interp.core.known.compile import compile_program, read_program_file, write_folder

    file = shipped_folder() / f"{name}.py"
    if not file.is_file():
        raise ValueError(f"no shipped program {name!r}; the shipped programs are {', '.join(shipped_names())}")
    entry = (root or cache_root()) / f"shipped-{name}-{_version_stamp(file.read_text(encoding='utf-8'))}"
    program = Program("shipped", name, entry / "model", entry / "scoring.json")
    if program.scoring.is_file():
        return program
    from tracr.rasp import rasp

    source = read_program_file(file)
    compiled = compile_program(source, origin=file.name)
    entry.mkdir(parents=True, exist_ok=True)
    write_folder(compiled, program.model, file)
    scoring = _scoring(program.model, lambda xs: rasp.evaluate(compiled.program, xs), sorted(source.vocab, key=str),
                       source.max_seq_len, seed=0)  # fmt: skip
    _write_json_atomically(program.scoring, scoring)
    return program


def generated(seed: int, root: Path | None = None) -> Program:
    """``generate-rasp --seed`` 's program compiled and scored (cached)."""
    from mcp_interp.core.known import generate as generator
    from mcp_interp.core.known.generate import generate_rasp, load_reference

    stamp = _version_stamp(str(seed), Path(generator.__file__).read_text(encoding="utf-8"))  # the draw is the grammar's
    entry = (root or cache_root()) / f"generated-{seed}-{stamp}"
    program = Program("generated", str(seed), entry / "model", entry / "scoring.json")
    if program.scoring.is_file():
        return program
    entry.mkdir(parents=True, exist_ok=True)
    facts = generate_rasp(seed, program.model)
    task = facts["task"]
    reference = load_reference((program.model / "reference.py").read_text(encoding="utf-8"))
    scoring = _scoring(program.model, reference, task["input_values"], task["max_seq_len"], seed=seed)
    _write_json_atomically(program.scoring, scoring)
    return program
