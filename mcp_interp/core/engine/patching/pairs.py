"""The minimal pairs every circuit tool starts from: checked, tokenized, and their logit-difference readout."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.numbers.row_readouts import LogitDiffReadout
from mcp_interp.core.engine.text.answers import resolve_answers
from mcp_interp.core.engine.text.tokens import Batch, encode, validate_pairs


@dataclass(frozen=True)
class Pairs:
    clean: Batch
    corrupt: Batch
    readout: LogitDiffReadout  # logit(correct) − logit(incorrect) per pair

    @property
    def n(self) -> int:
        return self.clean.input_ids.shape[0]


def prepare_pairs(
    model: LoadedModel, clean_prompts: Sequence[str], corrupt_prompts: Sequence[str], correct: Any, incorrect: Any
) -> Pairs:
    """Equal token lengths pair by pair (or a tool error showing both tokenizations), single-token answers."""
    tokenizer = model.tokenizer
    validate_pairs(tokenizer, clean_prompts, corrupt_prompts, ("clean_prompts", "corrupt_prompts"))
    clean = encode(tokenizer, clean_prompts, model.device)
    corrupt = encode(tokenizer, corrupt_prompts, model.device)
    n = len(clean.texts)
    readout = LogitDiffReadout(
        model.backend,
        torch.tensor(resolve_answers(tokenizer, correct, n, "correct")),
        torch.tensor(resolve_answers(tokenizer, incorrect, n, "incorrect")),
    )
    return Pairs(clean, corrupt, readout)


def pick(values: Any, indices: Sequence[int]) -> Any:
    """The entries ``indices`` of a per-prompt list; a value shared by every prompt (an answer string) as it is."""
    if isinstance(values, str) or not isinstance(values, Sequence):
        return values
    return [values[i] for i in indices]


def subset_pairs(
    model: LoadedModel,
    clean_prompts: Sequence[str],
    corrupt_prompts: Sequence[str],
    correct: Any,
    incorrect: Any,
    indices: Sequence[int],
) -> Pairs:
    """``prepare_pairs`` of the pairs ``indices`` only (answers given per prompt are picked the same way)."""
    return prepare_pairs(
        model, pick(clean_prompts, indices), pick(corrupt_prompts, indices), pick(correct, indices),
        pick(incorrect, indices),
    )  # fmt: skip
