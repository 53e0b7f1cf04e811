"""A feature's activation on every token of many texts: one batched pass, cached with the model.

Why batched and cached: naming a feature reads it on thousands of texts (the default corpus's 2,000), and the cost
is the forward pass up to the feature's point. Texts are sorted by length and run in batches of similar lengths (so
little padding is computed), each forward stopped right after the point. Two caches live as long as the model
(``LoadedModel.cache``):

* per (feature, texts): the feature's activations, ``[tokens]`` per text — a second call on the same feature and
  texts runs no forward;
* per (point, texts): the point's whole value on every real token when it fits ``POINT_CACHE_BYTES`` — every other
  feature read at the same point (another neuron of the layer, another feature of the SAE, another direction at the
  layer) is then computed from it without a forward.

Batches are right-padded; the model is causal, so real tokens never see the padding after them and the values equal
a text run alone (to float rounding).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

import mcp_interp.state.limits as limits
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.tokens import pad_token_id, token_ids
from mcp_interp.core.features.units import NamedFeature
from mcp_interp.errors import InputError

BATCH_TOKENS = 1024  # padded tokens per forward: on SmolLM2 faster than 4096 (the matrices stay in cache)
POINT_CACHE_BYTES = 256 * 2**20  # a point's values on every token, float32, kept when at most this large
POINT_ENTRIES = 2
FEATURE_ENTRIES = 64
SKIP_FIRST = 1  # position 0 is never scored (the attention sink without a BOS token; the BOS token with one)


@dataclass(frozen=True)
class TextActivations:
    """Per text: its token ids and the feature's activation on each token (float32 numpy arrays)."""

    ids: list[list[int]]
    values: list[np.ndarray]

    def maxima(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(scored, max, position): whether each text has a scored token (≥ 2 tokens), its largest activation over
        positions ≥ ``SKIP_FIRST`` (−inf when none) and where (the first on ties)."""
        scored = np.array([len(v) > SKIP_FIRST for v in self.values], dtype=bool)
        top = np.full(len(self.values), -np.inf)
        where = np.zeros(len(self.values), dtype=np.int64)
        for i, v in enumerate(self.values):
            if scored[i]:
                j = int(np.argmax(v[SKIP_FIRST:]))
                top[i], where[i] = float(v[SKIP_FIRST + j]), SKIP_FIRST + j
        return scored, top, where


def texts_key(texts: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(list(texts), ensure_ascii=False).encode()).hexdigest()


def tokenize_all(model: LoadedModel, texts: Sequence[str]) -> list[list[int]]:
    """Every text's ids by the shared rule; an InputError names an empty text."""
    out = []
    for i, text in enumerate(texts):
        ids = token_ids(model.tokenizer, text)
        if not ids:
            raise InputError(f"Text {i} ({text!r}) tokenizes to no tokens: every text needs at least one.")
        out.append(ids)
    return out


def batches(lengths: Sequence[int]) -> list[list[int]]:
    """Text indices grouped for forwards: sorted by length, each batch at most ``BATCH_TOKENS`` padded tokens and
    the server's prompt limit."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    cap = limits.current().max_prompts
    groups: list[list[int]] = []
    for i in order:
        if groups and len(groups[-1]) < cap and (len(groups[-1]) + 1) * lengths[i] <= BATCH_TOKENS:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def count_steps(model: LoadedModel, texts: Sequence[str]) -> int:
    """Forwards a cold pass over ``texts`` takes (for progress totals)."""
    return len(batches([len(ids) for ids in tokenize_all(model, texts)]))


def activation_steps(
    model: LoadedModel, feature: NamedFeature, texts: Sequence[str], into: list[TextActivations]
) -> Iterator[str]:
    """The feature on every token of ``texts`` (appended to ``into``), from a cache or one batched pass; a progress
    message per forward."""
    corpus = texts_key(texts)
    feature_key = ("naming_feature", feature.key, corpus)
    cached = model.cache.peek(feature_key)
    if cached is not None:
        into.append(cached)
        yield "activations from the cache"
        return
    ids = tokenize_all(model, texts)
    lengths = [len(x) for x in ids]
    values: list[np.ndarray]
    point_key = ("naming_point", feature.point, corpus)
    point_values = model.cache.peek(point_key)
    if point_values is not None:
        with torch.inference_mode():
            flat = feature.activations(point_values)
        values = [v.numpy() for v in flat.cpu().split(lengths)]
        yield f"activations from the cached values at {feature.point}"
    else:
        values = []
        kept: list[torch.Tensor] = []
        yield from _forwards(model, feature, ids, values, kept)
        if kept:
            model.cache.put(point_key, torch.cat(kept), POINT_ENTRIES)
    result = TextActivations(ids=ids, values=values)
    model.cache.put(feature_key, result, FEATURE_ENTRIES)
    into.append(result)


def _forwards(
    model: LoadedModel, feature: NamedFeature, ids: list[list[int]], values: list[np.ndarray], kept: list[torch.Tensor]
) -> Iterator[str]:
    """One forward per batch, stopped at the feature's point; fills ``values`` (per text, in order) and, when the
    point's values on every token fit ``POINT_CACHE_BYTES`` (known after the first batch), ``kept`` (them, per text,
    in order, ``[tokens, ...]``)."""
    lengths = [len(x) for x in ids]
    groups = batches(lengths)
    per_text: list[np.ndarray | None] = [None] * len(ids)
    raw: list[torch.Tensor | None] = [None] * len(ids)
    pad = pad_token_id(model.tokenizer)
    done = 0
    keep = True
    for group in groups:
        width = max(lengths[i] for i in group)
        input_ids = torch.full((len(group), width), pad, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.bool)
        for row, i in enumerate(group):
            input_ids[row, : lengths[i]] = torch.tensor(ids[i])
            mask[row, : lengths[i]] = True
        point = model.backend.run(
            input_ids.to(model.device), capture=[feature.point], stop_at=feature.point, output="none"
        ).acts[feature.point]
        with torch.inference_mode():
            real = point[mask.to(point.device)]  # [tokens, ...], text by text in the group's order
            acts = feature.activations(real).cpu()
        keep = keep and sum(lengths) * (real[0].numel() if real.shape[0] else 0) * 4 <= POINT_CACHE_BYTES
        sizes = [lengths[i] for i in group]
        for i, a, r in zip(group, acts.split(sizes), real.float().cpu().split(sizes), strict=True):
            per_text[i], raw[i] = a.numpy(), (r if keep else None)
        done += len(group)
        yield f"texts {done} of {len(ids)} read at {feature.point}"
    values.extend(v for v in per_text if v is not None)
    if keep:
        kept.extend(r for r in raw if r is not None)
