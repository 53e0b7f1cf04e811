"""``feature_examples``: what makes one feature fire, read off a corpus.

For every text of the pool the feature's activation is read on every token (``activations``: one batched pass,
cached); a text's activation is its maximum from position 1 on (``activations.SKIP_FIRST``). The result lists the
``top_k`` texts by that maximum with the per-token activations in a window around it, the quantiles of the
activations over tokens and over texts, how often the feature fires (``threshold``: the 90th percentile of the
per-text maxima unless the caller sets one — the quizzes' default), and, for units that write to the residual
stream, the tokens their output promotes and suppresses directly (``units.logit_effects``).

Where the texts come from: the caller's ``texts``, or a shipped corpus's *search* pool (``corpora.text_corpus``;
default ``wordnet_examples``, 2,000 texts), never its held-out pool, which only quizzes draw from. Texts shown here
are remembered per feature (``shown_texts``) so that a quiz over the caller's own texts leaves them out.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

import mcp_interp.state.limits as limits
from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.references import Lookup
from mcp_interp.core.engine.text.tokens import token_strings
from mcp_interp.core.features.activations import SKIP_FIRST, TextActivations, activation_steps, count_steps
from mcp_interp.core.features.units import NamedFeature, logit_effects, parse_feature
from mcp_interp.corpora import DEFAULT_TEXT_CORPUS, TEXT_CORPORA, TextCorpus, text_corpus
from mcp_interp.errors import InputError
from mcp_interp.schemas.naming import (
    CorpusInfo,
    Example,
    FeatureExamplesMeasurement,
    FeatureSpec,
    Firing,
    Quantile,
)

MAX_EXAMPLES = 50
MAX_WINDOW = 64
STORED_EXAMPLES = 100  # examples in the complete result (examples_uri)
QUANTILES = (0.5, 0.9, 0.99, 0.999, 1.0)
THRESHOLD_QUANTILE = 0.9
THRESHOLD_RULE = (
    "the 90th percentile of the per-text maxima over the search pool: about the top 10 % of texts fire (fewer when "
    "most maxima are equal, e.g. exactly 0 for a sparse feature)"
)
SHOWN_ENTRIES = 256


@dataclass(frozen=True)
class Pool:
    """The texts a call reads: their name, which pool, the texts, and the shipped corpus they came from."""

    name: str
    kind: Literal["search", "held_out", "all"]
    texts: list[str]
    corpus: TextCorpus | None


def check_texts(texts: Any, what: str) -> list[str]:
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise InputError(f"`{what}` must be a non-empty list of strings.")
    limits.check("max_feature_texts", len(texts), f"Number of `{what}`")
    return list(texts)


def shipped(corpus: Any) -> TextCorpus:
    if not isinstance(corpus, str) or corpus not in TEXT_CORPORA:
        raise InputError(f"`corpus` {corpus!r} is not a shipped text corpus; choose one of {', '.join(TEXT_CORPORA)}.")
    return text_corpus(corpus)


def search_pool(texts: Any, corpus: Any) -> Pool:
    """The caller's texts, or a shipped corpus's search pool (default ``wordnet_examples``)."""
    if texts is not None and corpus is not None:
        raise InputError("Give `texts` or `corpus`, not both.")
    if texts is not None:
        return Pool("texts", "all", check_texts(texts, "texts"), None)
    found = shipped(DEFAULT_TEXT_CORPUS if corpus is None else corpus)
    return Pool(found.name, "search", found.search, found)


def default_threshold(maxima: np.ndarray) -> float:
    return float(np.quantile(maxima, THRESHOLD_QUANTILE))


def shown_texts(model: LoadedModel, feature_key: str) -> set[str]:
    """The texts shown as examples of this feature on this model so far (the set itself, to add to)."""
    key = ("naming_shown", feature_key)
    shown = model.cache.peek(key)
    if shown is None:
        shown = set()
        model.cache.put(key, shown, SHOWN_ENTRIES)
    return shown


@dataclass(kw_only=True)
class FeatureExamplesJob:
    """``feature_examples`` as a job: one step per forward of the corpus pass, then the summary."""

    model: LoadedModel
    feature: FeatureSpec | dict[str, Any]
    texts: Sequence[str] | None = None
    corpus: str | None = None
    top_k: int = 10
    window: int = 8
    lookup: Lookup | None = None
    result: FeatureExamplesMeasurement | None = field(default=None, init=False)
    complete: dict[str, Any] | None = field(default=None, init=False)  # the examples_uri document
    named: NamedFeature = field(init=False)
    pool: Pool = field(init=False)

    def __post_init__(self) -> None:
        require(self.model.backend, "feature_examples")
        for name, value, high in (("top_k", self.top_k, MAX_EXAMPLES), ("window", self.window, MAX_WINDOW)):
            low = 1 if name == "top_k" else 0
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InputError(f"`{name}` must be an integer from {low} to {high}, got {value!r}.")
        self.pool = search_pool(self.texts, self.corpus)
        self.named = parse_feature(self.feature, self.model, self.lookup)

    def total_steps(self) -> int:
        return count_steps(self.model, self.pool.texts) + 1

    def steps(self) -> Iterator[str]:
        read: list[TextActivations] = []
        yield from activation_steps(self.model, self.named, self.pool.texts, read)
        self.result, self.complete = summarise(self.model, self.named, self.pool, read[0], self.top_k, self.window)
        shown_texts(self.model, self.named.key).update(e.text for e in self.result.examples)
        yield "examples ranked"


def summarise(
    model: LoadedModel, feature: NamedFeature, pool: Pool, read: TextActivations, top_k: int, window: int
) -> tuple[FeatureExamplesMeasurement, dict[str, Any]]:
    """The measurement (top ``top_k`` examples) and the complete document (top ``STORED_EXAMPLES``, every maximum)."""
    scored, maxima, where = read.maxima()
    if not scored.any():
        raise InputError("Every text has a single token; position 0 is never scored, so write texts of 2+ tokens.")
    index = np.flatnonzero(scored)
    order = index[np.lexsort((index, -maxima[index]))]
    tokens = np.concatenate([read.values[i][SKIP_FIRST:] for i in index]).astype(np.float64)
    top = maxima[index]
    threshold = default_threshold(top)
    examples = [
        _example(model, pool, read, int(i), rank + 1, float(maxima[i]), int(where[i]), window)
        for rank, i in enumerate(order[:STORED_EXAMPLES])
    ]
    notes = []
    if len(index) < len(pool.texts):
        notes.append(f"{len(pool.texts) - len(index)} texts of one token were left out: position 0 is never scored.")
    if float(top.max()) <= 0:
        notes.append("The feature is never positive on these texts: its 'firing' is only relative (see quantiles).")
    output = None
    if not model.backend.supports("weights"):  # a remote backend: the examples are its, the weights stay there
        notes.append(f"No output tokens: the {model.backend.name} backend does not serve the model's weights.")
    else:
        vector, writes = feature.output(model)
        if vector is None:
            notes.append(f"No output tokens: {writes}.")
        else:
            output = logit_effects(model, vector, writes)
    info = CorpusInfo(
        name=pool.name,
        pool=pool.kind,
        n_texts=len(index),
        n_tokens=int(tokens.size),
        license=None if pool.corpus is None else pool.corpus.license[:120],
    )
    measurement = FeatureExamplesMeasurement(
        feature=feature.info(),
        corpus=info,
        examples=examples[:top_k],
        quantiles=[
            Quantile(quantile=q, token=float(np.quantile(tokens, q)), text_max=float(np.quantile(top, q)))
            for q in QUANTILES
        ],
        firing=Firing(
            threshold=threshold,
            threshold_rule=THRESHOLD_RULE,
            texts_firing=float(np.mean(top > threshold)),
            tokens_firing=float(np.mean(tokens > threshold)),
            tokens_positive=float(np.mean(tokens > 0)),
        ),
        output_tokens=output,
        notes=notes,
    )
    complete = {
        "feature": feature.info().model_dump(),
        "corpus": info.model_dump(),
        "examples": [e.model_dump() for e in examples],
        "text_maxima": [
            {"text_index": int(i), "max_activation": float(maxima[i]), "max_position": int(where[i])} for i in index
        ],
    }
    return measurement, complete


def _example(
    model: LoadedModel, pool: Pool, read: TextActivations, i: int, rank: int, top: float, at: int, window: int
) -> Example:
    ids, values = read.ids[i], read.values[i]
    start, stop = max(0, at - window), min(len(ids), at + window + 1)
    return Example(
        rank=rank,
        text_index=i,
        text=pool.texts[i],
        max_activation=top,
        max_position=at,
        max_token=token_strings(model.tokenizer, [ids[at]])[0],
        window_start=start,
        tokens=token_strings(model.tokenizer, ids[start:stop]),
        activations=[float(v) for v in values[start:stop]],
    )
