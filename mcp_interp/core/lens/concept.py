"""How much a continuation is about a concept, judged by the unsteered model: the score steering is tested on.

A steering vector's next-token KL says the prediction moved, not where: a vector that makes the text about the sea and
one that makes it gibberish can move it equally. So ``steer`` also scores each continuation for the caller's concept and
ranks the steered continuation's score among random directions' continuations (same norm, same site, same greedy
decoding):

* **words** (``[" sea", " ocean", " waves"]``): the mean over the continuation's positions of
  log Σ_w P(w | prompt + continuation so far) under the *unsteered* model — how strongly the text written so far primes
  the concept for a reader who was not steered. The judge is the same model without the edit, so the score measures
  the text, not the edit's direct push on the logits (which the KL already measures); each word counts by its first
  token. Higher = more about the concept; a log-probability, ≤ 0.
* **a direction** (``direction://`` from ``probe``): the mean over the continuation's tokens of the unsteered model's
  projection on it at the direction's layer (resid_post), in units of its probe texts' projection spread — the concept
  as the probe defined it, read from the text. Higher = further toward ``labels[1]``.

Continuations of the random directions are generated together, one row per direction, one forward per token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mcp_interp.core.engine.backend.edits import Edit
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.points import hook_out
from mcp_interp.core.engine.text.answers import parse_answer
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import StoredDirection

MAX_CONCEPT_WORDS = 50


@dataclass(frozen=True)
class Concept:
    """What a continuation is scored for: ``describe`` in words, ``score(ids, continuation)`` a number (higher =
    more about the concept)."""

    describe: str
    score: Callable[[list[int], list[int]], float]


def concept_from_words(model: LoadedModel, words: list[str]) -> Concept:
    """The concept as words, each by its first token (see the module)."""
    if not words or len(words) > MAX_CONCEPT_WORDS:
        raise InputError(f"`concept` takes 1 to {MAX_CONCEPT_WORDS} words, got {len(words)}.")
    tokens = sorted({parse_answer(model.tokenizer, word, "concept").first_token for word in words})

    def score(prompt: list[int], continuation: list[int]) -> float:
        if not continuation:
            return float("-inf")
        ids = torch.tensor([prompt + continuation[:-1]], device=model.device)
        logits = model.backend.logits(ids, [])[0, len(prompt) - 1 :].to(torch.float64)
        log_probs = torch.log_softmax(logits, dim=-1)[:, tokens]
        return float(torch.logsumexp(log_probs, dim=-1).mean())

    shown = [model.tokenizer.decode([t]) for t in tokens]
    return Concept(f"log P(next token ∈ {shown}) under the unsteered model, mean over the continuation", score)


def concept_from_direction(model: LoadedModel, direction: StoredDirection, uri: str) -> Concept:
    """The concept as a probe's direction (see the module)."""
    unit = torch.tensor(direction.vector, dtype=torch.float64)
    point = hook_out(direction.layer)
    spread = direction.projection_std if direction.projection_std > 0 else 1.0

    def score(prompt: list[int], continuation: list[int]) -> float:
        if not continuation:
            return float("nan")
        ids = torch.tensor([prompt + continuation], device=model.device)
        acts = model.backend.run(ids, capture=[point], stop_at=point).acts[point][0, len(prompt) :]
        return float((acts.to("cpu", torch.float64) @ unit).mean() / spread)

    return Concept(
        f"projection on {uri} (layer {direction.layer} resid_post, toward {direction.labels[1]!r}) in units of its "
        "probe texts' spread, unsteered model, mean over the continuation's tokens",
        score,
    )


def greedy_rows(
    model: LoadedModel, prompt: list[int], max_new_tokens: int, edits: list[Edit], rows: int
) -> list[list[int]]:
    """Greedy continuations of ``prompt`` for ``rows`` rows at once under ``edits`` (whose values carry one row each,
    ``[rows, 1, width]``), one forward per token; each stops at its first end-of-text token."""
    ids = torch.tensor([prompt] * rows, device=model.device)
    eos = model.tokenizer.eos_token_id
    for _ in range(max_new_tokens):
        nxt = model.backend.logits(ids, edits)[:, -1].argmax(dim=-1, keepdim=True)
        ids = torch.cat([ids, nxt.to(ids.device)], dim=1)
    out = []
    for row in ids[:, len(prompt) :].tolist():
        out.append(row[: row.index(eos) + 1] if eos is not None and eos in row else row)
    return out
