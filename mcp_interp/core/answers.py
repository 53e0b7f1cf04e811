"""Answers of any length: one token, a token sequence, or a set of alternatives.

An answer is written as a string (its tokens under the model's tokenizer, without special
tokens) or as ``{"any_of": [...]}`` (a set of strings, e.g. " Paris" and " paris"). A string of
one token is a *token* answer, read from the logits at the answer position as every metric tool
always has. Anything else is scored by its teacher-forced log-probability:

    log P(t1…tn | prompt) = Σ_k log P(t_k | prompt, t_<k)

read from one forward of the prompt followed by t1…t(n-1), and a set by the log of its summed
probability, log Σ_a P(a | prompt) (a log-sum-exp over the alternatives). Both are ≤ 0, in nats.

Why this is the sequence counterpart of the logit difference: for two single tokens,
log P(a) − log P(b) = logit(a) − logit(b) (the normaliser cancels), so the difference of
sequence log-probs reduces to the logit difference when both answers are one token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from mcp_interp import limits
from mcp_interp.core.interventions import Ablation, prepare_ablation
from mcp_interp.core.tokens import Batch, token_strings
from mcp_interp.errors import InputError

AnswerKind = Literal["token", "sequence", "set"]


@dataclass(frozen=True)
class Answer:
    """One prompt's answer: ``alternatives`` are token-id sequences (one for a string, several for a set)."""

    text: str
    alternatives: tuple[tuple[int, ...], ...]
    kind: AnswerKind

    @property
    def first_token(self) -> int:
        return self.alternatives[0][0]


def parse_answer(tokenizer: Any, spec: Any, argument: str) -> Answer:
    """An ``Answer`` from a string or ``{"any_of": [strings]}`` (a pydantic model with ``any_of`` too)."""
    if hasattr(spec, "any_of"):
        spec = {"any_of": spec.any_of}
    if isinstance(spec, Mapping):
        members = spec.get("any_of")
        if set(spec) != {"any_of"} or not isinstance(members, list) or not members:
            raise InputError(
                f"`{argument}`: a set of answers is written {{'any_of': [' Paris', ' paris']}} with a non-empty list."
            )
        alternatives = tuple(dict.fromkeys(_tokens(tokenizer, m, argument) for m in members))
        return Answer(" | ".join(repr(m) for m in members), alternatives, "set")
    tokens = _tokens(tokenizer, spec, argument)
    return Answer(spec, (tokens,), "token" if len(tokens) == 1 else "sequence")


def _tokens(tokenizer: Any, text: Any, argument: str) -> tuple[int, ...]:
    if not isinstance(text, str) or text == "":
        raise InputError(f"`{argument}`: an answer must be a non-empty string, got {text!r}.")
    ids = tuple(int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"])
    if not ids:
        raise InputError(f"`{argument}`: answer {text!r} tokenizes to no tokens.")
    unknown = getattr(tokenizer, "unk_token_id", None)
    if unknown is not None and unknown in ids:
        raise InputError(
            f"`{argument}`: answer {text!r} tokenizes to {token_strings(tokenizer, ids)}, which contains tokens this "
            f"tokenizer does not know ({tokenizer.unk_token!r}): the model cannot produce it; check with `tokenize`."
        )
    limits.check("max_tokens", len(ids), f"`{argument}`: answer {text[:40]!r} length in tokens")
    return ids


def resolve_answer_specs(tokenizer: Any, spec: Any, n_prompts: int, argument: str) -> list[Answer]:
    """One ``Answer`` per prompt: a string or set applies to every prompt, a list gives one per prompt."""
    if isinstance(spec, str | Mapping) or hasattr(spec, "any_of"):
        return [parse_answer(tokenizer, spec, argument)] * n_prompts
    items = list(spec)
    if len(items) != n_prompts:
        raise InputError(
            f"`{argument}` has {len(items)} entries but there are {n_prompts} prompts: pass one answer for all "
            "prompts or a list with exactly one answer per prompt (a set of alternatives is {'any_of': [...]})."
        )
    return [parse_answer(tokenizer, item, argument) for item in items]


def spacing_notes(tokenizer: Any, answers: Sequence[Answer]) -> list[str]:
    """Notes for multi-token string answers whose leading-space form is a single token — usually a
    forgotten space (' Mary'), which would otherwise be scored, silently, as a sequence."""
    notes = []
    for text in dict.fromkeys(a.text for a in answers if a.kind == "sequence"):
        variant = " " + text.lstrip()
        if variant != text and len(tokenizer(variant, add_special_tokens=False)["input_ids"]) == 1:
            notes.append(
                f"Answer {text!r} is {len(tokenizer(text, add_special_tokens=False)['input_ids'])} tokens and was "
                f"scored as a sequence; {variant!r} is one token — did you mean it?"
            )
    return notes


def describe(tokenizer: Any, answer: Answer) -> str:
    """The answer as its tokens, e.g. "' North' + ' America'"."""
    parts = [" + ".join(repr(t) for t in token_strings(tokenizer, alt)) for alt in answer.alternatives]
    return " | ".join(parts)


def answer_log_probs(
    bridge: Any, batch: Batch, answers: Sequence[Answer], ablation: Ablation | None = None
) -> torch.Tensor:
    """log P(answer_i | prompt_i) per prompt, float64, teacher-forced (see the module docstring).

    One forward over every (prompt, alternative) row: the prompt's real tokens followed by all but
    the alternative's last token, right-padded. Under ``ablation`` the hooks are prepared on that
    batch, with "last" meaning each prompt's own last token (its answer position).
    """
    rows: list[tuple[int, tuple[int, ...]]] = [(i, alt) for i, a in enumerate(answers) for alt in a.alternatives]
    lengths = batch.lengths
    sequences = [batch.ids(i) + list(alt[:-1]) for i, alt in rows]
    max_tokens = limits.current().max_tokens
    too_long = [(i, len(s)) for (i, _), s in zip(rows, sequences, strict=True) if len(s) > max_tokens]
    if too_long:
        i, n = too_long[0]
        raise InputError(
            f"Prompt {i} followed by its answer is {n} tokens, over the server's limit of {max_tokens} (max_tokens): "
            "shorten the prompt or the answer, or raise --max-tokens."
        )
    extended = batch_of_ids(sequences, [lengths[i] - 1 for i, _ in rows], batch.input_ids.device)
    hooks = prepare_ablation(bridge, extended, ablation).hooks if ablation is not None else []
    with torch.inference_mode(), bridge.hooks(fwd_hooks=hooks):
        logits = bridge(extended.input_ids, return_type="logits")
    per_row = []
    for r, (i, alt) in enumerate(rows):
        start = lengths[i] - 1  # the prediction of the answer's first token
        log_probs = torch.log_softmax(logits[r, start : start + len(alt)].to(torch.float64), dim=-1)
        per_row.append(log_probs.gather(1, torch.tensor(alt, device=logits.device).unsqueeze(1)).sum())
    values = torch.stack(per_row)
    owners = torch.tensor([i for i, _ in rows])
    return torch.stack([torch.logsumexp(values[owners == i], dim=0) for i in range(len(answers))])


def batch_of_ids(sequences: list[list[int]], answer_positions: list[int], device: Any) -> Batch:
    """A right-padded ``Batch`` of token-id lists (padding is masked and never read, so its id is 0)."""
    width = max(len(s) for s in sequences)
    input_ids = torch.zeros((len(sequences), width), dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for r, sequence in enumerate(sequences):
        input_ids[r, : len(sequence)] = torch.tensor(sequence)
        attention_mask[r, : len(sequence)] = 1
    return Batch(
        texts=[""] * len(sequences),
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        answer_positions=torch.tensor(answer_positions, device=device),
    )
