"""The minimal pairs every circuit tool starts from: checked, tokenized, and their metric's readout.

The circuit tools read one position per pair, so each answer is a single token or a set of single tokens (a set is
its members' summed probability, read from the same forward: one pass whatever its size). The metric is
``logit_diff`` — logit(correct) − logit(incorrect), or for sets log P(correct) − log P(incorrect) — or ``prob_diff``,
P(correct) − P(incorrect) (Hanna et al.'s greater-than metric over answer sets). Answers of several tokens need
teacher-forced rows, which ``patch`` and ``patch_heads`` read; here they are refused with that fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.numbers.row_readouts import AnswerSetReadout, LogitDiffReadout, Readout
from mcp_interp.core.engine.text.answers import Answer, describe, resolve_answer_specs
from mcp_interp.core.engine.text.tokens import Batch, encode, validate_pairs
from mcp_interp.errors import InputError, require_choice
from mcp_interp.schemas.common import AnswerKind, PairMetric


@dataclass(frozen=True)
class Pairs:
    clean: Batch
    corrupt: Batch
    readout: Readout  # the metric per pair (``logit_diff`` or ``prob_diff``)
    metric: PairMetric = "logit_diff"
    notes: list[str] = field(default_factory=list)  # what a result must say about how its metric was read

    @property
    def n(self) -> int:
        return self.clean.input_ids.shape[0]


def prepare_pairs(
    model: LoadedModel,
    clean_prompts: Sequence[str],
    corrupt_prompts: Sequence[str],
    correct: Any,
    incorrect: Any,
    metric: PairMetric = "logit_diff",
) -> Pairs:
    """Equal token lengths pair by pair (or a tool error showing both tokenizations), answers of single tokens or sets
    of them."""
    require_choice("metric", metric, PairMetric)
    tokenizer = model.tokenizer
    validate_pairs(tokenizer, clean_prompts, corrupt_prompts, ("clean_prompts", "corrupt_prompts"))
    clean = encode(tokenizer, clean_prompts, model.device)
    corrupt = encode(tokenizer, corrupt_prompts, model.device)
    n = len(clean.texts)
    good = resolve_answer_specs(tokenizer, correct, n, "correct")
    bad = resolve_answer_specs(tokenizer, incorrect, n, "incorrect")
    _refuse_sequences(tokenizer, good + bad)
    notes = []
    readout: Readout
    if metric == "logit_diff" and all(a.kind == "token" for a in good + bad):
        readout = LogitDiffReadout(
            model.backend, torch.tensor([a.first_token for a in good]), torch.tensor([a.first_token for a in bad])
        )
    else:
        readout = AnswerSetReadout(model.backend, _members(good), _members(bad), metric)
        read = "P(correct) − P(incorrect)" if metric == "prob_diff" else "log P(correct) − log P(incorrect)"
        notes.append(
            f"The metric is {read}, a set's probability the sum of its members' (one forward per run whatever the "
            "set's size); the result's *_logit_diff fields hold it."
        )
    return Pairs(clean, corrupt, readout, metric, notes)


def _members(answers: list[Answer]) -> torch.Tensor:
    width = max(len(a.alternatives) for a in answers)
    out = torch.full((len(answers), width), -1, dtype=torch.long)
    for i, answer in enumerate(answers):
        out[i, : len(answer.alternatives)] = torch.tensor([alt[0] for alt in answer.alternatives])
    return out


def _refuse_sequences(tokenizer: Any, answers: list[Answer]) -> None:
    long = next((a for a in answers if any(len(alt) > 1 for alt in a.alternatives)), None)
    if long is not None:
        width = max(len(alt) for alt in long.alternatives)
        raise InputError(
            "The circuit tools read one position per pair, so every answer (and every member of a set) must be "
            f"exactly one token; {long.text!r} is {width} tokens ({describe(tokenizer, long)}). Use single-token "
            "answers or sets of them ({'any_of': [...]}), or `patch` / `patch_heads`, which read answers of several "
            "tokens teacher-forced."
        )


def pair_answer_kind(correct: Any, incorrect: Any) -> AnswerKind:
    """What a circuit result reports as ``answer_kind``: 'set' when some answer is an ``{"any_of": [...]}`` set (of
    single tokens), else 'token' (an answer of several tokens is refused before this matters)."""
    specs = [s for spec in (correct, incorrect) for s in (spec if isinstance(spec, list) else [spec])]
    return "set" if any(isinstance(s, dict) or hasattr(s, "any_of") for s in specs) else "token"


def pick(values: Any, indices: Sequence[int]) -> Any:
    """The entries ``indices`` of a per-prompt list; a value shared by every prompt (an answer string or set) as it
    is."""
    if (
        isinstance(values, str)
        or hasattr(values, "any_of")
        or isinstance(values, dict)
        or not isinstance(values, Sequence)
    ):
        return values
    return [values[i] for i in indices]


def subset_pairs(
    model: LoadedModel,
    clean_prompts: Sequence[str],
    corrupt_prompts: Sequence[str],
    correct: Any,
    incorrect: Any,
    indices: Sequence[int],
    metric: PairMetric = "logit_diff",
) -> Pairs:
    """``prepare_pairs`` of the pairs ``indices`` only (answers given per prompt are picked the same way)."""
    return prepare_pairs(
        model, pick(clean_prompts, indices), pick(corrupt_prompts, indices), pick(correct, indices),
        pick(incorrect, indices), metric,
    )  # fmt: skip
