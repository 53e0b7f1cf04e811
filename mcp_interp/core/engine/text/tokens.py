"""Tokenization rules shared by every tool: batches, answer positions, minimal pairs (answers: ``answers``).

The rule (one for every tool): text is tokenized by the model's own Hugging Face tokenizer
with its own default for special tokens (``add_special_tokens=True``). SmolLM2's tokenizer adds
no BOS, so neither do we; TransformerLens' ``to_tokens`` would prepend one, which changes every
number. ``tokenize`` shows the exact ids every tool uses.

Batches are right-padded. The model is causal, so real tokens never attend to the padding after
them, and the answer position of each prompt is its last real token, read from the attention
mask — never the last column of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

import mcp_interp.state.limits as limits
from mcp_interp.errors import InputError


@dataclass(frozen=True)
class Batch:
    """Right-padded token ids for a list of prompts, ready for one forward pass."""

    texts: list[str]
    input_ids: torch.Tensor  # [batch, seq] long
    attention_mask: torch.Tensor  # [batch, seq] 1 = real token, 0 = padding
    answer_positions: torch.Tensor  # [batch] long, last real token of each prompt
    pad_id: int = 0  # the padding token (rows rebuilt from this batch pad with it too)

    @property
    def lengths(self) -> list[int]:
        return [int(n) for n in self.attention_mask.sum(dim=1)]

    def ids(self, i: int) -> list[int]:
        """The real (unpadded) token ids of prompt ``i``."""
        return [int(t) for t in self.input_ids[i, : self.lengths[i]]]


def encode(tokenizer: Any, texts: Sequence[str], device: str = "cpu") -> Batch:
    """Tokenize ``texts`` by the shared rule into a right-padded batch."""
    texts = list(texts)
    if not texts:
        raise InputError("No prompts were given: pass a non-empty list of strings.")
    limits.check("max_prompts", len(texts), "Number of prompts")
    ids_per_text = [token_ids(tokenizer, text) for text in texts]
    for i, ids in enumerate(ids_per_text):
        if not ids:
            raise InputError(f"Prompt {i} ({texts[i]!r}) tokenizes to no tokens: every prompt needs at least one.")
    width = max(len(ids) for ids in ids_per_text)
    pad_id = pad_token_id(tokenizer)
    input_ids = torch.full((len(texts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(texts), width), dtype=torch.long)
    for i, ids in enumerate(ids_per_text):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
    return Batch(
        texts=texts,
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        answer_positions=answer_positions(attention_mask).to(device),
        pad_id=pad_id,
    )


def encode_ids(tokenizer: Any, sequences: Sequence[Sequence[int]], vocab_size: int, device: str = "cpu") -> Batch:
    """Token ids given by the caller (exactly as the model reads them: nothing is added) as a right-padded batch;
    each sequence's ``texts`` entry is its decoding. An InputError names a sequence that is empty or holds an id
    outside the vocabulary."""
    sequences = [list(ids) for ids in sequences] if isinstance(sequences, list | tuple) else []
    if not sequences:
        raise InputError("`token_ids` must be a non-empty list of token-id lists, e.g. [[12, 7, 99]].")
    limits.check("max_prompts", len(sequences), "Number of token sequences")
    for i, ids in enumerate(sequences):
        if not ids:
            raise InputError(f"`token_ids[{i}]` is empty: every sequence needs at least one token.")
        bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size]
        if bad:
            raise InputError(
                f"`token_ids[{i}]` holds {bad[0]!r}, not a token id of this model (integers 0..{vocab_size - 1}); "
                "`tokenize` shows a text's ids."
            )
        limits.check("max_tokens", len(ids), f"`token_ids[{i}]` length in tokens")
    width = max(len(ids) for ids in sequences)
    pad_id = pad_token_id(tokenizer)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, ids in enumerate(sequences):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
    return Batch(
        texts=[tokenizer.decode(ids) for ids in sequences],
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        answer_positions=answer_positions(attention_mask).to(device),
        pad_id=pad_id,
    )


def token_ids(tokenizer: Any, text: str) -> list[int]:
    """The ids of ``text`` under the shared rule (the tokenizer's own special-token default).

    Enforces the per-prompt token limit (and a character bound checked first, so an enormous
    string is refused before the tokenizer spends time on it).
    """
    if not isinstance(text, str):
        raise InputError(f"Expected a string, got {type(text).__name__}.")
    max_tokens = limits.current().max_tokens
    if len(text) > 64 * max_tokens:
        limits.check("max_tokens", len(text) // 4, f"A text of {len(text)} characters (≈ tokens)")
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    limits.check("max_tokens", len(ids), f"Prompt {text[:40]!r}… length in tokens")
    program = getattr(tokenizer, "program_vocabulary", None)
    if program is not None:
        check_program_prompt(program, text, ids)
    return ids


def check_program_prompt(program: Any, text: str, ids: Sequence[int]) -> None:
    """A compiled RASP program's prompt is its input values separated by spaces, at most ``max_values`` of them
    (``loader.program.ProgramVocabulary``): anything else is refused here, naming the values."""
    values = text.split()
    unknown = [v for v, i in zip(values, ids[1:], strict=False) if i not in program.input_ids]
    if unknown:
        raise InputError(
            f"Prompt {text[:60]!r}: {unknown[0]!r} is not an input value of this compiled program. A prompt is input "
            f"values separated by spaces, from {list(program.input_values)}."
        )
    if len(ids) - 1 > program.max_values:
        raise InputError(
            f"Prompt {text[:60]!r} has {len(ids) - 1} values; this compiled program takes at most {program.max_values} "
            "(its max_seq_len)."
        )


def token_strings(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each id decoded on its own, so a leading space shows as a space (" Mary", not "ĠMary")."""
    return [tokenizer.decode([i]) for i in ids]


def adds_bos(tokenizer: Any) -> bool:
    """Whether the shared rule puts a BOS token in front of every prompt for this tokenizer."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    probe = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(probe) and probe[0] == bos


def pad_token_id(tokenizer: Any) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return int(candidate)
    return 0  # pragma: no cover - the loop always returns


def answer_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real token per row: where the next-token prediction is read.

    Works for right padding (the case here) and for left padding alike, because it takes the
    largest index whose mask is 1 rather than ``length - 1``.
    """
    if attention_mask.ndim != 2:
        raise ValueError(f"attention_mask must be [batch, seq], got shape {tuple(attention_mask.shape)}")
    seq = attention_mask.shape[1]
    index = torch.arange(seq, device=attention_mask.device).expand_as(attention_mask)
    masked = torch.where(attention_mask.bool(), index, torch.full_like(index, -1))
    positions = masked.max(dim=1).values
    if bool((positions < 0).any()):
        raise ValueError("a row of the attention mask has no real token")
    return positions


@dataclass(frozen=True)
class PairDiff:
    """Where a minimal pair differs (token positions), for results and error messages."""

    index: int
    positions: list[int]


def validate_pairs(
    tokenizer: Any, first: Sequence[str], second: Sequence[str], names: tuple[str, str]
) -> list[PairDiff]:
    """Check that ``first[i]`` and ``second[i]`` tokenize to equal lengths; report differences.

    Equal length is what makes position-wise comparison (KL at the answer position, patching)
    meaningful. The error lists every offending pair with both tokenizations.
    """
    first, second = list(first), list(second)
    limits.check("max_prompts", max(len(first), len(second)), "Number of prompt pairs")
    if len(first) != len(second):
        raise InputError(
            f"`{names[0]}` has {len(first)} prompts and `{names[1]}` has {len(second)}: "
            "they are compared pairwise, so pass the same number of each."
        )
    problems = []
    diffs = []
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        ids_a, ids_b = token_ids(tokenizer, a), token_ids(tokenizer, b)
        if len(ids_a) != len(ids_b):
            problems.append(
                f"pair {i}: {len(ids_a)} tokens {token_strings(tokenizer, ids_a)} vs "
                f"{len(ids_b)} tokens {token_strings(tokenizer, ids_b)}"
            )
            continue
        diffs.append(PairDiff(i, [p for p, (x, y) in enumerate(zip(ids_a, ids_b, strict=True)) if x != y]))
    if problems:
        raise InputError(
            f"`{names[0]}` and `{names[1]}` must tokenize to the same number of tokens pair by pair; "
            + "; ".join(problems)
            + ". Rephrase so the differing words are single tokens of equal count (check with `tokenize`)."
        )
    return diffs
