"""Naming components and token positions the way every tool accepts them.

Heads are written ``"L9H9"`` (core callers may pass ``{"layer": 9, "head": 9}``); both parse to
``Head(9, 9)``. What a block's MLP or attention adds to the stream is ``"L28MLP"`` / ``"L12ATTN"``; MLP
neurons are ``"L28N17"`` or ``"L28N17,403"``. Positions are ``"all"``,
``"last"`` (each prompt's answer position) or a list of indices; they resolve to a ``[batch, seq]``
boolean mask over real tokens.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

import torch

import mcp_interp.state.limits as limits
from mcp_interp.errors import InputError

_HEAD_NAME = re.compile(r"^\s*L(\d+)\s*H(\d+)\s*$", re.IGNORECASE)
_BLOCK_PART_NAME = re.compile(r"^\s*L(\d+)\s*(MLP|ATTN)\s*$", re.IGNORECASE)
_NEURONS_NAME = re.compile(r"^\s*L(\d+)\s*N\s*(\d+(?:\s*,\s*\d+)*)\s*$", re.IGNORECASE)


class Head(NamedTuple):
    layer: int
    head: int

    def __str__(self) -> str:
        return f"L{self.layer}H{self.head}"


def parse_head(spec: Any, n_layers: int, n_heads: int) -> Head:
    """One head from ``"L9H9"`` or ``{"layer": 9, "head": 9}``, checked against the model."""
    if isinstance(spec, str):
        match = _HEAD_NAME.match(spec)
        if not match:
            raise InputError(f"Head {spec!r} is not of the form 'L<layer>H<head>', e.g. 'L9H3'.")
        layer, head = int(match.group(1)), int(match.group(2))
    elif isinstance(spec, Mapping) and set(spec) == {"layer", "head"}:
        layer, head = spec["layer"], spec["head"]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (layer, head)):
            raise InputError(f"Head {dict(spec)!r}: layer and head must be integers.")
    else:
        raise InputError(f"Head {spec!r} must be a string like 'L9H3' or an object {{'layer': 9, 'head': 3}}.")
    if not 0 <= layer < n_layers:
        raise InputError(f"Head {spec!r}: layer {layer} does not exist; this model has layers 0..{n_layers - 1}.")
    if not 0 <= head < n_heads:
        raise InputError(f"Head {spec!r}: head {head} does not exist; each layer has heads 0..{n_heads - 1}.")
    return Head(layer, head)


def resolve_head(head: Any, layer: int | None, n_layers: int, n_heads: int) -> Head:
    """One head from a tool's ``head`` and optional ``layer``: ``head`` is ``"L9H3"`` (then ``layer`` may be left out,
    or must agree) or ``{"layer": 9, "head": 3}``, or an index within ``layer``."""
    if isinstance(head, int) and not isinstance(head, bool):
        if layer is None:
            raise InputError(
                f"`head` {head} is an index within a layer: pass `layer` too, or name it like 'L9H{head}'."
            )
        return parse_head({"layer": layer, "head": head}, n_layers, n_heads)
    parsed = parse_head(head, n_layers, n_heads)
    if layer is not None and layer != parsed.layer:
        raise InputError(f"`head` {head!r} is in layer {parsed.layer}, but `layer` is {layer}: pass one of them.")
    return parsed


def parse_heads(specs: Any, n_layers: int, n_heads: int) -> list[Head]:
    """Several heads (one spec or a list), de-duplicated in the order given."""
    if isinstance(specs, str | Mapping):
        specs = [specs]
    if not isinstance(specs, Sequence) or len(specs) == 0:
        raise InputError("`heads` must be one head or a non-empty list of heads, e.g. ['L9H3', 'L10H0'].")
    limits.check("max_heads", len(specs), "Number of heads")
    heads: list[Head] = []
    for spec in specs:
        head = parse_head(spec, n_layers, n_heads)
        if head not in heads:
            heads.append(head)
    return heads


def parse_block_part(spec: str, n_layers: int) -> tuple[int, Literal["MLP", "ATTN"]] | None:
    """(layer, "MLP" | "ATTN") from ``"L28MLP"`` / ``"L12ATTN"``, checked against the model; None for any other name."""
    match = _BLOCK_PART_NAME.match(spec)
    if match is None:
        return None
    layer = int(match.group(1))
    if not 0 <= layer < n_layers:
        raise InputError(f"{spec!r}: layer {layer} does not exist; this model has layers 0..{n_layers - 1}.")
    return layer, "MLP" if match.group(2).upper() == "MLP" else "ATTN"


def parse_neurons(spec: str, n_layers: int, d_mlp: int) -> tuple[int, tuple[int, ...]] | None:
    """(layer, neurons) from ``"L28N17"`` or ``"L28N17,403"`` (MLP neurons: inputs of the down projection), checked
    against the model; None for any other name."""
    match = _NEURONS_NAME.match(spec)
    if match is None:
        return None
    layer = int(match.group(1))
    if not 0 <= layer < n_layers:
        raise InputError(f"{spec!r}: layer {layer} does not exist; this model has layers 0..{n_layers - 1}.")
    neurons = tuple(sorted({int(n) for n in match.group(2).split(",")}))
    bad = [n for n in neurons if not n < d_mlp]
    if bad:
        raise InputError(f"{spec!r}: neuron {bad[0]} is out of range; each MLP has neurons 0..{d_mlp - 1}.")
    return layer, neurons


PositionSpec = str | Sequence[int] | None


def position_mask(spec: PositionSpec, attention_mask: torch.Tensor, answer_positions: torch.Tensor) -> torch.Tensor:
    """``[batch, seq]`` bool: where an intervention applies. Padding is never selected.

    ``"all"``/None = every real token; ``"last"`` = each prompt's answer position; a list of
    indices = those positions in every prompt (negative indices count from each prompt's end).
    """
    real = attention_mask.bool()
    if spec is None or spec == "all":
        return real
    if spec == "last":
        mask = torch.zeros_like(real)
        mask[torch.arange(real.shape[0]), answer_positions] = True
        return mask
    if isinstance(spec, str) or not isinstance(spec, Sequence) or len(spec) == 0:
        raise InputError(f"`positions` must be 'all', 'last' or a non-empty list of token indices, got {spec!r}.")
    lengths = attention_mask.sum(dim=1).tolist()
    mask = torch.zeros_like(real)
    for row, length in enumerate(lengths):
        for index in spec:
            if not isinstance(index, int) or isinstance(index, bool):
                raise InputError(f"`positions` entries must be integers, got {index!r}.")
            resolved = index + length if index < 0 else index
            if not 0 <= resolved < length:
                raise InputError(
                    f"Position {index} is outside prompt {row}, which has {length} tokens (0..{length - 1})."
                )
            mask[row, resolved] = True
    return mask
