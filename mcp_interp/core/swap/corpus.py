"""Causal-swap corpora: relations ("functions") over concepts, and the trials they imply.

A corpus names concepts (``France``) and functions, each a template with one ``{arg}`` slot and
a one-word answer per concept (``capital``: "The capital of {arg} is the city of" → ``Paris``).
A trial is (function, source, target, layer) with source ≠ target: edit the source prompt's
representation of the source concept toward the target and ask whether the model now gives the
target's answer.

Tokens: a concept is the lens atom of ``" " + concept`` and must be a single token of the loaded
model; an answer is the tokens of ``" " + word`` — one or several (" North America" is scored as
a sequence: strict top-1 at every step of teacher forcing, i.e. greedy decoding produces it). A
concept that is not one token, or an answer with a token the tokenizer does not know, sends every
prompt and trial that needs it to the exclusion ledger with that reason, and the rest of the
corpus runs; a corpus in which nothing is usable is an ``InputError`` naming the words.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from mcp_interp.core.engine.text.answers import known_answer_tokens
from mcp_interp.corpora import corpora_dir
from mcp_interp.errors import InputError
from mcp_interp.schemas.swap import SLOT, SwapCorpus, SwapFunction

SHIPPED = ("capitals_languages", "countries")


def load_corpus(name: str) -> SwapCorpus:
    """A causal-swap corpus shipped in ``mcp_interp/data/corpora/`` (one of ``SHIPPED``)."""
    if name not in SHIPPED:
        shipped = ", ".join(map(repr, SHIPPED))
        raise InputError(f"No shipped causal-swap corpus named {name!r}; shipped: {shipped} (or pass a corpus).")
    path = corpora_dir() / f"{name}.json"
    return SwapCorpus.model_validate(json.loads(path.read_text(encoding="utf-8")))


def corpus_of(value: SwapCorpus | dict[str, Any]) -> SwapCorpus:
    """A corpus object given inline, validated into the shipped corpora's shape, or an InputError naming the field."""
    if isinstance(value, SwapCorpus):
        return value
    try:
        return SwapCorpus.model_validate(value)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'corpus'}: {e['msg']}" for e in error.errors()[:5]
        )
        raise InputError(
            f"The corpus object is not in the shipped corpora's shape ({problems}). It needs name, concepts "
            "(≥ 2 words) and functions: [{name, template with one '{arg}', answers: {concept: answer}}] — see "
            "mcp_interp/data/corpora/countries.json."
        ) from None


def prompt_text(function: SwapFunction, concept: str) -> str:
    return function.template.replace(SLOT, concept)


@dataclass(frozen=True)
class TrialKey:
    function: str
    source: str
    target: str


def trial_keys(corpus: SwapCorpus) -> list[TrialKey]:
    """Every (function, source, target) with source ≠ target, in corpus order."""
    return [
        TrialKey(f.name, source, target)
        for f in corpus.functions
        for source in corpus.concepts
        for target in corpus.concepts
        if source != target
    ]


@dataclass(frozen=True)
class Resolved:
    """Token ids of a corpus under one tokenizer, and why any word could not be used."""

    concept_ids: dict[str, int]
    answer_ids: dict[tuple[str, str], tuple[int, ...]]  # (function, concept) → the answer's token ids
    unusable: dict[str, str]  # word → why it cannot be used (how it tokenizes)


def word_tokens(tokenizer: Any, word: str) -> tuple[tuple[int, ...] | None, str]:
    """The known tokens of ``" " + word.strip()`` (how a corpus writes concepts and answers: after a space), by
    the engine's one answer rule, or None and why not."""
    return known_answer_tokens(tokenizer, " " + word.strip())


def single_token(tokenizer: Any, word: str) -> tuple[int | None, str]:
    """The one known token of ``" " + word.strip()``, or None and how it tokenizes instead."""
    ids, why = word_tokens(tokenizer, word)
    if ids is None:
        return None, why
    if len(ids) > 1:
        text = " " + word.strip()
        return None, f"{text!r} is {len(ids)} tokens {[tokenizer.decode([i]) for i in ids]}"
    return ids[0], ""


def resolve(corpus: SwapCorpus, tokenizer: Any) -> Resolved:
    unusable: dict[str, str] = {}

    def single(word: str) -> int | None:
        token, why = single_token(tokenizer, word)
        if token is None:
            unusable[word] = why
        return token

    def tokens(word: str) -> tuple[int, ...] | None:
        ids, why = word_tokens(tokenizer, word)
        if ids is None:
            unusable[word] = why
        return ids

    concept_ids = {c: i for c in corpus.concepts if (i := single(c)) is not None}
    answer_ids = {
        (f.name, c): ids for f in corpus.functions for c in corpus.concepts if (ids := tokens(f.answers[c])) is not None
    }
    same = [c for c in concept_ids if list(concept_ids.values()).count(concept_ids[c]) > 1]
    if same:
        raise InputError(f"Concepts {same} resolve to the same token: a swap needs distinct concept atoms.")
    if len(concept_ids) < 2 or not answer_ids:
        raise InputError(
            f"Nothing in corpus {corpus.name!r} is usable with this model's tokenizer: concepts must be single "
            f"tokens with a leading space, answers known tokens. Unusable: {unusable}."
        )
    return Resolved(concept_ids=concept_ids, answer_ids=answer_ids, unusable=unusable)


def token_reason(resolved: Resolved, corpus: SwapCorpus, function: str, *concepts: str) -> str | None:
    """Why prompts/trials over these concepts cannot run (a word is not one token), or None."""
    answers = next(f.answers for f in corpus.functions if f.name == function)
    for concept in concepts:
        if concept not in resolved.concept_ids:
            return f"concept {concept!r} is not a single token: {resolved.unusable[concept]}"
        if (function, concept) not in resolved.answer_ids:
            word = answers[concept]
            return f"answer {word!r} cannot be scored: {resolved.unusable[word]}"
    return None
