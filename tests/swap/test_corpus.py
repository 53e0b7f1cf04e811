"""The causal-swap corpus: shape, the trial cross product, token resolution and its ledger reasons."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from mcp_interp.core.swap.corpus import load_corpus, prompt_text, resolve, token_reason, trial_keys
from mcp_interp.errors import InputError
from mcp_interp.schemas.swap import SwapCorpus


class SplitsSomeWords:
    """A stand-in tokenizer: every word is one token except the ones listed, which split in two, and the
    ``unknown`` ones, which are the unknown token."""

    def __init__(self, split: set[str], unknown: frozenset[str] = frozenset()) -> None:
        self.split, self.unknown = split, unknown
        self.vocab: dict[str, int] = {"[UNK]": 0}

    unk_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, Any]:
        word = text.strip()
        if word in self.unknown:
            return {"input_ids": [0]}
        pieces = [" " + word[:1], word[1:]] if word in self.split else [" " + word]
        return {"input_ids": [self.vocab.setdefault(p, len(self.vocab)) for p in pieces]}

    def decode(self, ids: list[int]) -> str:
        inverse = {i: p for p, i in self.vocab.items()}
        return "".join(inverse[i] for i in ids)


def test_shipped_countries_corpus_and_cross_product() -> None:
    corpus = load_corpus("countries")
    assert corpus.concepts == ["France", "Canada", "China", "Egypt"]
    assert [f.name for f in corpus.functions] == ["capital", "language", "continent", "currency"]
    capital = corpus.functions[0]
    assert prompt_text(capital, "France") == "The capital of France is the city of"
    assert capital.answers["Canada"] == "Ottawa"
    assert corpus.functions[3].answers["Egypt"] == "Pound"
    keys = trial_keys(corpus)
    assert len(keys) == 4 * 4 * 3  # functions × ordered (source, target) pairs with source ≠ target
    assert len(set(keys)) == len(keys)
    assert all(k.source != k.target for k in keys)
    assert sum(k.function == "capital" and k.source == "France" for k in keys) == 3


def test_a_split_answer_is_a_sequence_and_an_unknown_one_excludes_only_what_needs_it() -> None:
    corpus = load_corpus("countries")
    tokenizer = SplitsSomeWords({"Pound"})
    resolved = resolve(corpus, tokenizer)
    assert not resolved.unusable and len(resolved.answer_ids) == 16
    assert [tokenizer.decode([i]) for i in resolved.answer_ids[("currency", "Egypt")]] == [" P", "ound"]
    assert token_reason(resolved, corpus, "currency", "France", "Egypt") is None
    unknown = resolve(corpus, SplitsSomeWords(set(), frozenset({"Pound"})))
    assert set(unknown.unusable) == {"Pound"} and ("currency", "Egypt") not in unknown.answer_ids
    reason = token_reason(unknown, corpus, "currency", "France", "Egypt")
    assert reason is not None and "'Pound' cannot be scored" in reason and "does not know" in reason
    assert token_reason(unknown, corpus, "currency", "France", "China") is None
    assert token_reason(unknown, corpus, "capital", "Egypt", "France") is None


def test_a_split_concept_excludes_every_trial_with_it() -> None:
    corpus = load_corpus("countries")
    resolved = resolve(corpus, SplitsSomeWords({"Egypt"}))
    for function in ["capital", "language"]:
        reason = token_reason(resolved, corpus, function, "Egypt", "France")
        assert reason is not None and "concept 'Egypt'" in reason


def test_nothing_usable_is_an_error_naming_the_words() -> None:
    corpus = SwapCorpus.model_validate(
        {
            "name": "tiny",
            "concepts": ["Aa", "Bb"],
            "functions": [{"name": "f", "template": "{arg} is", "answers": {"Aa": "Xx", "Bb": "Yy"}}],
        }
    )
    with pytest.raises(InputError, match="Nothing in corpus 'tiny' is usable") as raised:
        resolve(corpus, SplitsSomeWords({"Aa"}, frozenset({"Xx", "Yy"})))
    assert "'Xx'" in str(raised.value) and "'Aa'" in str(raised.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"template": "no slot here"}, "exactly once"),
        ({"template": "{arg} and {arg}"}, "exactly once"),
        ({"answers": {"Aa": "Xx"}}, "missing \\['Bb'\\]"),
    ],
)
def test_malformed_corpora_are_rejected(change: dict[str, Any], message: str) -> None:
    function = {"name": "f", "template": "{arg} is", "answers": {"Aa": "Xx", "Bb": "Yy"}} | change
    with pytest.raises(ValidationError, match=message):
        SwapCorpus.model_validate({"name": "c", "concepts": ["Aa", "Bb"], "functions": [function]})


def test_unknown_shipped_corpus_is_an_input_error() -> None:
    with pytest.raises(InputError, match="countries"):
        load_corpus("../../etc/passwd")
    with pytest.raises(InputError, match="capitals_languages"):
        load_corpus("ioi")  # a shipped data file, but not a swap corpus


def test_default_corpus_is_the_capable_one() -> None:
    corpus = load_corpus("capitals_languages")
    assert [f.name for f in corpus.functions] == ["capital", "language"] and len(corpus.concepts) == 8
    assert corpus.functions[0].answers["Canada"] == "Ottawa" and corpus.functions[1].answers["Egypt"] == "Arabic"


def test_duplicate_concepts_are_rejected() -> None:
    function = {"name": "f", "template": "{arg} is", "answers": {"Aa": "Xx", "Aa ": "Yy"}}
    with pytest.raises(ValidationError, match="distinct"):
        SwapCorpus.model_validate({"name": "c", "concepts": ["Aa", "Aa "], "functions": [function]})
