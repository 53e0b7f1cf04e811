"""Answers of any length: one token, a token sequence, or a set of alternatives.

An answer is written as a string (its tokens under the model's tokenizer, without special
tokens) or as ``{"any_of": [...]}`` (a set of strings, e.g. " Paris" and " paris"). A string of
one token is a *token* answer, read from the logits at the answer position as every metric tool
always has. Anything else is scored by its teacher-forced log-probability:

    log P(t1…tn | prompt) = Σ_k log P(t_k | prompt, t_<k)

read from one forward of the prompt followed by t1…t(n-1), and a set by the log of its summed
probability, log Σ_a P(a | prompt) (a log-sum-exp over the alternatives). Both are ≤ 0, in nats. A set of single
tokens costs one forward whatever its size: alternatives that share a prefix share their rows.

Why this is the sequence counterpart of the logit difference: for two single tokens,
log P(a) − log P(b) = logit(a) − logit(b) (the normaliser cancels), so the difference of
sequence log-probs reduces to the logit difference when both answers are one token.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

import mcp_interp.state.limits as limits
from mcp_interp.core.engine.backend.edits import Edit
from mcp_interp.core.engine.text.tokens import Batch, token_strings
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import AnswerKind


@dataclass(frozen=True)
class Answer:
    """One prompt's answer: ``alternatives`` are token-id sequences (one for a string, several for a set)."""

    text: str
    alternatives: tuple[tuple[int, ...], ...]
    kind: AnswerKind

    @property
    def first_token(self) -> int:
        return self.alternatives[0][0]


def answer_kind(answers: Iterable[Answer]) -> AnswerKind:
    """The kind a result reports for the answers it scored (``answer_kind``): 'set' when any is a set, else
    'sequence' when any is several tokens, else 'token'."""
    kinds = {a.kind for a in answers}
    return "set" if "set" in kinds else "sequence" if "sequence" in kinds else "token"


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
        refuse_prefixes(tokenizer, alternatives, argument)
        return Answer(" | ".join(repr(m) for m in members), alternatives, "set")
    tokens = _tokens(tokenizer, spec, argument)
    return Answer(spec, (tokens,), "token" if len(tokens) == 1 else "sequence")


def refuse_prefixes(tokenizer: Any, alternatives: Sequence[tuple[int, ...]], argument: str) -> None:
    """A set is scored by log Σ_a P(a): when one member's tokens begin another's (' North' and ' North America'),
    P(' North America') is already part of P(' North'), so the sum would count it twice."""
    for short in alternatives:
        for long in alternatives:
            if len(short) < len(long) and long[: len(short)] == short:
                shorter, longer = tokenizer.decode(list(short)), tokenizer.decode(list(long))
                raise InputError(
                    f"`{argument}`: {shorter!r} is a token prefix of {longer!r}, so P({longer!r}) is already part of "
                    f"P({shorter!r}) and log Σ P would count it twice. Keep {shorter!r} alone (it includes every "
                    "continuation), or give alternatives none of which begins another."
                )


def answer_token_ids(tokenizer: Any, text: str) -> tuple[int, ...]:
    """The tokens of an answer: the text tokenized without special tokens (an answer is a continuation,
    not a prompt). The one rule every tool tokenizes answers by."""
    return tuple(int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"])


def known_answer_tokens(tokenizer: Any, text: str) -> tuple[tuple[int, ...] | None, str]:
    """``answer_token_ids`` when they are usable (non-empty, no unknown token), else None and why not."""
    ids = answer_token_ids(tokenizer, text)
    if not ids:
        return None, f"{text!r} tokenizes to no tokens"
    program = getattr(tokenizer, "program_vocabulary", None)
    if program is not None and (len(ids) != 1 or ids[0] not in program.output_ids):
        return None, (
            f"{text!r} is not one output value of this compiled program (an answer is one of "
            f"{list(program.output_values)[:20]})"
        )
    unknown = getattr(tokenizer, "unk_token_id", None)
    if unknown is not None and unknown in ids:
        return None, (
            f"{text!r} tokenizes to {token_strings(tokenizer, ids)}, which contains tokens this tokenizer does not "
            f"know ({getattr(tokenizer, 'unk_token', unknown)!r})"
        )
    return ids, ""


def _tokens(tokenizer: Any, text: Any, argument: str) -> tuple[int, ...]:
    if not isinstance(text, str) or text == "":
        raise InputError(f"`{argument}`: an answer must be a non-empty string, got {text!r}.")
    ids, why = known_answer_tokens(tokenizer, text)
    if ids is None:
        raise InputError(f"`{argument}`: answer {why}: the model cannot produce it; check with `tokenize`.")
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


def resolve_answer(tokenizer: Any, answer: str) -> int:
    """The single token id of ``answer`` as the model would emit it next, or a helpful error.

    Answers are tokenized without special tokens: the answer is a continuation, not a prompt.
    A string that is not exactly one token is an error that shows how it tokenizes and, when
    it helps, suggests the leading-space form (" Mary"), which is what GPT-2-style tokenizers
    emit after a space.
    """
    if not isinstance(answer, str) or answer == "":
        raise InputError(f"An answer must be a non-empty string, got {answer!r}.")
    ids = list(answer_token_ids(tokenizer, answer))
    if len(ids) == 1:
        return int(ids[0])
    pieces = token_strings(tokenizer, ids)
    message = (
        f"Answer {answer!r} is {len(ids)} tokens under this model's tokenizer: "
        f"{pieces} (ids {ids}); answers must be exactly one token."
    )
    suggestions = []
    for variant in (" " + answer.lstrip(), answer.strip()):
        if variant != answer and variant and len(answer_token_ids(tokenizer, variant)) == 1:
            suggestions.append(variant)
    if suggestions:
        message += f" Did you mean {suggestions[0]!r}? That is one token."
    else:
        message += (
            " Pick a word that is a single token (the `tokenize` tool shows how text splits); "
            "GPT-2-style tokenizers usually want the leading-space form, e.g. ' Mary'."
        )
    raise InputError(message)


def resolve_answers(tokenizer: Any, answers: str | Sequence[str], n_prompts: int, argument: str) -> list[int]:
    """One answer id per prompt: a single string applies to all prompts, a list to each."""
    if isinstance(answers, str):
        return [resolve_answer(tokenizer, answers)] * n_prompts
    answers = list(answers)
    if len(answers) != n_prompts:
        raise InputError(
            f"`{argument}` has {len(answers)} entries but there are {n_prompts} prompts: pass one "
            "string for all prompts or a list with exactly one answer per prompt."
        )
    return [resolve_answer(tokenizer, a) for a in answers]


def spacing_notes(tokenizer: Any, answers: Sequence[Answer]) -> list[str]:
    """Notes for multi-token string answers whose leading-space form is a single token — usually a
    forgotten space (' Mary'), which would otherwise be scored, silently, as a sequence."""
    notes = []
    for text in dict.fromkeys(a.text for a in answers if a.kind == "sequence"):
        variant = " " + text.lstrip()
        if variant != text and len(answer_token_ids(tokenizer, variant)) == 1:
            notes.append(
                f"Answer {text!r} is {len(answer_token_ids(tokenizer, text))} tokens and was "
                f"scored as a sequence; {variant!r} is one token — did you mean it?"
            )
    return notes


def describe(tokenizer: Any, answer: Answer) -> str:
    """The answer as its tokens, e.g. "' North' + ' America'"."""
    parts = [" + ".join(repr(t) for t in token_strings(tokenizer, alt)) for alt in answer.alternatives]
    return " | ".join(parts)


class RowEdits(Protocol):
    """Edits for a batch whose row r starts with prompt ``owners[r]``'s tokens (``ablation.targets.PreparedAblation``
    is one): how an intervention prepared on the prompts applies to their teacher-forced rows."""

    def edits_for(self, owners: list[int] | None) -> list[Edit]: ...


def answer_log_probs(
    backend: Any, batch: Batch, answers: Sequence[Answer], ablation: RowEdits | None = None
) -> torch.Tensor:
    """log P(answer_i | prompt_i) per prompt, float64, teacher-forced (see the module docstring)."""
    return answers_log_probs(backend, batch, [answers], ablation)[0]


def answers_log_probs(
    backend: Any, batch: Batch, answer_lists: Sequence[Sequence[Answer]], ablation: RowEdits | None = None
) -> list[torch.Tensor]:
    """log P(answer | prompt) per prompt for each list of answers (e.g. the correct and the incorrect ones), from one
    forward over the distinct rows they need: prompt i followed by a prefix of an alternative, right-padded. Rows are
    shared wherever alternatives share a prefix, so single-token answers — a set of any size among them — are read
    from prompt i's own row: one forward for all of them. An ``ablation`` is one prepared on the prompt batch (its mean
    and resample replacements come from the prompts' own clean run), applied to each row as ``edits_for`` says."""
    rows: dict[tuple[int, tuple[int, ...]], int] = {}
    for answers in answer_lists:
        for i, answer in enumerate(answers):
            for alt in answer.alternatives:
                for k in range(len(alt)):
                    rows.setdefault((i, tuple(alt[:k])), len(rows))
    keys = list(rows)
    sequences = [batch.ids(i) + list(prefix) for i, prefix in keys]
    max_tokens = limits.current().max_tokens
    too_long = [(i, len(s)) for (i, _), s in zip(keys, sequences, strict=True) if len(s) > max_tokens]
    if too_long:
        i, n = too_long[0]
        raise InputError(
            f"Prompt {i} followed by its answer is {n} tokens, over the server's limit of {max_tokens} (max_tokens): "
            "shorten the prompt or the answer, or raise --max-tokens."
        )
    extended = batch_of_ids(sequences, [len(s) - 1 for s in sequences], batch.input_ids.device, batch.pad_id)
    edits = ablation.edits_for([i for i, _ in keys]) if ablation is not None else []
    logits = backend.logits(extended.input_ids, edits)
    at = torch.tensor([len(s) - 1 for s in sequences], device=logits.device)
    log_probs = torch.log_softmax(logits[torch.arange(len(keys), device=logits.device), at].to(torch.float64), dim=-1)
    out = []
    for answers in answer_lists:
        per_prompt = []
        for i, answer in enumerate(answers):
            alternatives = [
                sum(
                    (log_probs[rows[(i, tuple(alt[:k]))], token] for k, token in enumerate(alt)),
                    log_probs.new_zeros(()),
                )
                for alt in answer.alternatives
            ]
            per_prompt.append(torch.logsumexp(torch.stack(alternatives), dim=0))
        out.append(torch.stack(per_prompt))
    return out


def read_log_probs(
    backend: Any,
    batch: Batch,
    logits: torch.Tensor,
    answer_lists: Sequence[Sequence[Answer]],
    ablation: RowEdits | None = None,
) -> list[torch.Tensor]:
    """``answers_log_probs``, read from ``logits`` (``[batch, vocab]`` at the answer positions, of the same run) when
    every alternative is one token — a set of any size then costs no forward beyond the one already made."""
    if any(len(alt) != 1 for answers in answer_lists for a in answers for alt in a.alternatives):
        return answers_log_probs(backend, batch, answer_lists, ablation)
    log_probs = torch.log_softmax(logits.to(torch.float64), dim=-1)
    return [
        torch.stack(
            [torch.logsumexp(log_probs[i, [alt[0] for alt in a.alternatives]], dim=0) for i, a in enumerate(answers)]
        )
        for answers in answer_lists
    ]


def batch_of_ids(sequences: list[list[int]], answer_positions: list[int], device: Any, pad_id: int = 0) -> Batch:
    """A right-padded ``Batch`` of token-id lists, padded with ``pad_id`` (the prompts' padding token: a causal model
    never reads padding, a compiled program's backend masks the keys holding it)."""
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for r, sequence in enumerate(sequences):
        input_ids[r, : len(sequence)] = torch.tensor(sequence)
        attention_mask[r, : len(sequence)] = 1
    return Batch(
        texts=[""] * len(sequences),
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        answer_positions=torch.tensor(answer_positions, device=device),
        pad_id=pad_id,
    )
