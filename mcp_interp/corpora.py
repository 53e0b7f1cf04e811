"""The data shipped inside the package (``mcp_interp/data/``): prompt corpora, the Markdown templates of the MCP
prompts, the MCP Apps views and the ``tiny`` model's tokenizer. Tools, tests and scripts read them through here, so a
checkout and an installed wheel resolve the same files.
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


@dataclass(frozen=True)
class TextCorpus:
    """Plain texts to search for what makes a feature fire (``feature_examples``) and to draw quizzes from
    (``score_explanation``). ``search`` and ``held_out`` split the texts: examples are found in ``search`` only and
    quizzes drawn from ``held_out`` only, so a quiz never shows a text an example did. A corpus without a split
    (``lens_corpus``) has every text in ``search`` and none held out."""

    name: str
    description: str
    source: str
    license: str
    search: list[str]
    held_out: list[str]


TEXT_CORPORA = ("wordnet_examples", "lens_corpus")
DEFAULT_TEXT_CORPUS = "wordnet_examples"


def text_corpus(name: str) -> TextCorpus:
    """A shipped corpus of plain texts by name (``TEXT_CORPORA``): ``wordnet_examples`` (3,000 WordNet 3.0 example
    sentences, 2,000 to search and 1,000 held out; WordNet 3.0 licence) or ``lens_corpus`` (48 paragraphs written
    for this project, MIT; no held-out texts). ``KeyError`` for another name."""
    if name not in TEXT_CORPORA:
        raise KeyError(name)
    data = json.loads((corpora_dir() / f"{name}.json").read_text(encoding="utf-8"))
    texts = list(data["texts"])
    search = int(data.get("search", len(texts)))
    held_out = int(data.get("held_out", 0))
    return TextCorpus(
        name=name,
        description=data["description"],
        source=data["source"],
        license=data.get("license", "MIT (written for mcp-interp)"),
        search=texts[:search],
        held_out=texts[search : search + held_out],
    )
