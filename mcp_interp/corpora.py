"""The data shipped inside the package (``mcp_interp/data/``): prompt corpora and the Markdown
templates of the MCP prompts. Tools, tests and scripts read them through here, so a checkout and
an installed wheel resolve the same files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"


def corpora_dir() -> Path:
    """JSON corpora: ``ioi.json``, ``capitals_languages.json`` and ``countries.json`` (causal swap),
    ``lens_corpus.json`` (lens fits), ``subject_number.json`` (probes)."""
    return DATA_DIR / "corpora"


def views_dir() -> Path:
    """MCP Apps views (self-contained HTML), built from ``web/src`` by ``scripts/build_views.py``."""
    return DATA_DIR / "views"


def templates_dir() -> Path:
    """Markdown templates of the MCP prompts (``string.Template`` placeholders)."""
    return DATA_DIR / "prompt_templates"


@dataclass(frozen=True)
class MinimalPair:
    clean: str
    corrupt: str
    correct: str
    incorrect: str


def ioi_pairs() -> list[MinimalPair]:
    """The 8 IOI minimal pairs (4 name pairs × which name gives)."""
    data = json.loads((corpora_dir() / "ioi.json").read_text(encoding="utf-8"))
    return [MinimalPair(**pair) for pair in data["pairs"]]


def ioi_arguments() -> dict[str, Any]:
    """The IOI clean prompts with their answers, as arguments of `logit_diff`."""
    pairs = ioi_pairs()
    return {
        "prompts": [p.clean for p in pairs],
        "correct": [p.correct for p in pairs],
        "incorrect": [p.incorrect for p in pairs],
    }


@dataclass(frozen=True)
class LabelledCorpus:
    name: str
    description: str
    position: str
    texts: list[str]
    labels: list[str]


def subject_number() -> LabelledCorpus:
    """400 texts 'The dog(s) near <place>', labelled singular/plural by the subject (see the file's description)."""
    data = json.loads((corpora_dir() / "subject_number.json").read_text(encoding="utf-8"))
    return LabelledCorpus(**data)
