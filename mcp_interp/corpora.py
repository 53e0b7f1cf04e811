"""The prompt corpora shipped with the package (``prompts/`` in a checkout, inside the wheel).

In a wheel the folder is installed as ``mcp_interp/prompts``; in an editable install from a
checkout it is the top-level ``prompts/`` next to the package. Both are looked up here so
tools, tests and the demo read the same files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def prompts_dir() -> Path:
    package = Path(__file__).resolve().parent
    for candidate in (package / "prompts", package.parent / "prompts"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"prompt corpora not found next to {package} (looked for prompts/)")


@dataclass(frozen=True)
class MinimalPair:
    clean: str
    corrupt: str
    correct: str
    incorrect: str


def ioi_pairs() -> list[MinimalPair]:
    """The 8 IOI minimal pairs (4 name pairs × which name gives)."""
    data = json.loads((prompts_dir() / "ioi.json").read_text(encoding="utf-8"))
    return [MinimalPair(**pair) for pair in data["pairs"]]


def ioi_arguments() -> dict[str, Any]:
    """The IOI clean prompts with their answers, as arguments of `logit_diff`."""
    pairs = ioi_pairs()
    return {
        "prompts": [p.clean for p in pairs],
        "correct": [p.correct for p in pairs],
        "incorrect": [p.incorrect for p in pairs],
    }
