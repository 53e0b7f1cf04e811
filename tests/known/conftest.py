"""Compiled RASP programs, compiled by tracr once per test session (jax's import and each compilation take seconds)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.model import LoadedModel

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "rasp"
# One selector width (a head and its MLP), two heads in one layer feeding an MLP, two attention layers in a chain.
PROGRAMS = ("histogram", "two_branch", "shift_two")


@dataclass
class Program:
    name: str
    compiled: Any  # core.known.compile.Compiled: tracr's assembled model, its graph, the RASP program
    folder: Path
    model: LoadedModel
    truth: list[dict[str, Any]]
    values: list[Any]


@pytest.fixture(scope="session")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Program]:
    pytest.importorskip("tracr", reason="the known-answer tests need mcp-interp[tracr] (in the dev extra)")
    from mcp_interp.core.known.compile import compile_program, read_program_file, write_folder

    out: dict[str, Program] = {}
    root = tmp_path_factory.mktemp("compiled")
    for name in PROGRAMS:
        source = read_program_file(EXAMPLES / f"{name}.py")
        compiled = compile_program(source, name)
        folder = root / name
        write_folder(compiled, folder, EXAMPLES / f"{name}.py")
        truth = json.loads((folder / "ground_truth.json").read_text(encoding="utf-8"))["nodes"]
        out[name] = Program(name, compiled, folder, load_model(str(folder)), truth, sorted(source.vocab, key=str))
    return out
