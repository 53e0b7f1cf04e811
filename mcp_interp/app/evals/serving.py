"""How a known-answer sample serves its program: ``mcp-interp serve`` over stdio with the truth hidden, the same
for the agent (through Inspect's MCP client) and the scripted baseline (through the SDK's)."""

from __future__ import annotations

import os
from pathlib import Path

from inspect_ai.solver import TaskState

from mcp_interp.app.evals.programs import Program

PASSED_ENV = ("MCP_INTERP_OUTPUT", "PYTHONPATH", "HF_HOME", "HF_HUB_OFFLINE", "OMP_NUM_THREADS")


def server_env() -> dict[str, str]:
    """What the served process inherits beyond the MCP SDK's safe default: where output goes and how torch runs."""
    env = {name: os.environ[name] for name in PASSED_ENV if name in os.environ}
    env.setdefault("OMP_NUM_THREADS", "1")  # a compiled program is tiny; several samples run at once
    return env


def server_args(program: Program) -> list[str]:
    return ["-m", "mcp_interp", "serve", "--model", str(program.model), "--json-text"]


def program_of(state: TaskState) -> Program:
    m = state.metadata
    return Program(m["kind"], m["key"], Path(m["model"]), Path(m["scoring"]))
