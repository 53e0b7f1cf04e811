"""The residual stream leaving chosen blocks, one vector per text: what a probe reads.

A probe needs, for each text, ``resid_post`` of every requested layer at one position. All layers
come from the same forward pass (hooks on every requested block's output; nothing else is kept),
so a probe over 30 layers costs one pass over the texts, in chunks of the server's prompt limit.

Position rules:

* ``"last"`` — the last real token (where a causal model has read the whole text; the answer
  position of every other tool);
* ``"mean"`` — the mean over the text's real tokens (padding never enters);
* an integer ``i`` — token ``i`` (0-based; negative counts from each text's end, −1 = ``"last"``).

For ``"last"`` and an integer the token at the read position is returned too: it is the *word
type* a probe could memorise instead of reading a property (the Hewitt & Liang control needs it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

import mcp_interp.state.limits as limits
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.points import hook_out
from mcp_interp.core.engine.text.tokens import Batch, encode
from mcp_interp.errors import InputError

PositionRule = str | int


@dataclass
class Residuals:
    """``values`` [texts, layers, d_model] float32 in the order of ``layers``; ``words`` the token read at
    each text's position (None for ``"mean"``)."""

    layers: list[int]
    position: PositionRule
    values: torch.Tensor
    words: list[str] | None


def check_position(position: PositionRule) -> None:
    if isinstance(position, bool) or not (position in ("last", "mean") or isinstance(position, int)):
        raise InputError(
            f"`position` {position!r} must be 'last', 'mean', or a token index (0-based; negative counts from the end)."
        )


def check_layers(layers: Sequence[int] | None, n_layers: int) -> list[int]:
    if layers is None:
        return list(range(n_layers))
    chosen = list(dict.fromkeys(layers))
    bad = [
        layer for layer in chosen if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n_layers
    ]
    if not chosen or bad:
        raise InputError(
            f"`layers` {list(layers)!r}: give layer indices 0..{n_layers - 1} (or omit `layers` for all of them)."
        )
    return chosen


def _rows(batch: Batch, position: PositionRule) -> torch.Tensor:
    """The token index read in each text of ``batch`` (for an integer or 'last')."""
    if position == "last":
        return batch.answer_positions
    assert isinstance(position, int)
    lengths = torch.tensor(batch.lengths, device=batch.input_ids.device)
    rows = lengths + position if position < 0 else torch.full_like(lengths, position)
    short = [i for i, (row, n) in enumerate(zip(rows.tolist(), lengths.tolist(), strict=True)) if not 0 <= row < n]
    if short:
        i = short[0]
        raise InputError(
            f"`position` {position} is outside text {i} ({batch.texts[i]!r}, {batch.lengths[i]} tokens). Use "
            "'last', 'mean', or an index every text has."
        )
    return rows


def read_residuals(
    model: LoadedModel, texts: Sequence[str], layers: Sequence[int] | None, position: PositionRule
) -> Residuals:
    """``resid_post`` of ``layers`` at ``position`` for every text, from one forward pass per chunk."""
    check_position(position)
    chosen = check_layers(layers, model.cfg.n_layers)
    texts = list(texts)
    limits.check("max_probe_texts", len(texts), "Number of probe texts")
    names = {hook_out(layer): i for i, layer in enumerate(chosen)}
    out = torch.empty(len(texts), len(chosen), model.cfg.d_model, dtype=torch.float32)
    words: list[str] | None = None if position == "mean" else []
    chunk = limits.current().max_prompts
    for start in range(0, len(texts), chunk):
        batch = encode(model.tokenizer, texts[start : start + chunk], model.device)
        rows = None if position == "mean" else _rows(batch, position)
        index = torch.arange(len(batch.texts), device=batch.input_ids.device)
        cache = model.backend.capture(batch.input_ids, list(names)).acts
        for name, column in names.items():
            resid = cache[name]
            if rows is None:
                mask = batch.attention_mask.unsqueeze(-1).to(resid.dtype)
                picked = (resid * mask).sum(1) / mask.sum(1)
            else:
                picked = resid[index, rows]
            out[start : start + len(batch.texts), column] = picked.float().cpu()
        if words is not None and rows is not None:
            words.extend(
                model.tokenizer.convert_ids_to_tokens(int(batch.input_ids[i, int(r)])) for i, r in enumerate(rows)
            )
    return Residuals(chosen, position, out, words)
