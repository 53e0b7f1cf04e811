"""What a forward pass changes: the one edit vocabulary every family speaks, and which backend can run each edit.

An edit names a *point* — a hook point in TransformerLens' vocabulary (``blocks.5.attn.hook_z``), always obtained
from ``bridge``'s naming functions, never spelled by a family — and what happens to the value there. The first four
are TransformerLens' ``RemoteBridge`` operations (``suppress``, ``scale``, ``add``, ``set``), so a backend without a
local ``nn.Module`` (vLLM, an Inspect provider) runs them as they are:

* ``Suppress`` — the value becomes 0;
* ``Scale`` — the value times ``factor``;
* ``Add`` — the value plus ``value``;
* ``Set`` — the value replaced by ``value``.

Each applies at every position (``pos=None``), at some positions of every row (``pos`` an int or a list of ints, as
RemoteBridge takes them), or at a per-row set of positions (``pos`` a ``[batch, seq]`` bool mask: a remote backend,
which runs one row per call, turns it into each row's list). ``value`` broadcasts against what it replaces: the
point's value ``[batch, seq, *width]`` (or ``[batch, len(pos), *width]`` with a list of positions); a leading batch
dimension gives each row its own value.

What only a local model does in one pass, because the new value depends on the value itself:

* ``SetSlice`` — set some channels (heads of ``z``, neurons of ``mlp.hook_post``) and leave the others;
* ``Project`` — set the component along a unit direction (0: project it out), leave the orthogonal rest;
* ``Rewrite`` — any function of the value (an SAE splice, an ablation's prepared parts). A *pure* rewrite is a
  function of the value at its point alone, so a remote backend can run it exactly by capturing that value (under
  the edits before it) and then setting ``fn(value)``; an impure one (an autograd leaf, a value carried from another
  point) runs only locally.

A rewrite ``fn`` returns the new value, or None to leave it (an observer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

import torch

Positions: TypeAlias = int | Sequence[int] | torch.Tensor | None
"""Where an edit applies: None (every position), an int or a list of ints (those positions of every row), or a
``[batch, seq]`` bool mask (each row's own positions)."""

RemoteOp = Literal["suppress", "scale", "add", "set"]


def _positions_mask(values: torch.Tensor, pos: Positions) -> torch.Tensor | None:
    """The bool mask ``[batch, seq, 1, …]`` (broadcastable over the value's width) of the positions ``pos`` names,
    or None for every position."""
    if pos is None:
        return None
    batch, seq = values.shape[:2]
    if isinstance(pos, torch.Tensor) and pos.dtype == torch.bool:
        mask = pos.to(values.device)[:, :seq]
        if mask.shape[1] < seq:  # a mask over fewer positions than the value has: the rest are not edited
            mask = torch.cat([mask, mask.new_zeros(batch, seq - mask.shape[1])], dim=1)
    else:
        index = [int(pos)] if isinstance(pos, int) else [int(p) for p in pos]
        mask = torch.zeros(batch, seq, dtype=torch.bool, device=values.device)
        mask[:, index] = True
    return mask.reshape(*mask.shape, *([1] * (values.ndim - 2)))


def _broadcast_value(value: torch.Tensor | float, values: torch.Tensor, pos: Positions) -> torch.Tensor:
    """``value`` as a tensor shaped like ``values``: with a list of positions, ``[batch?, len(pos), *width]`` is
    scattered to those positions; otherwise it broadcasts against the whole value."""
    tensor = torch.as_tensor(value, device=values.device).to(values.dtype)
    if pos is None or (isinstance(pos, torch.Tensor) and pos.dtype == torch.bool) or tensor.ndim < values.ndim - 1:
        return tensor.expand_as(values) if tensor.ndim <= values.ndim else tensor
    index = [int(pos)] if isinstance(pos, int) else [int(p) for p in pos]
    width = values.shape[2:]
    full = values.new_zeros(values.shape)
    full[:, index] = tensor.expand(values.shape[0], len(index), *width)
    return full


@dataclass(frozen=True)
class Edit:
    """One change of the value at ``point`` (see the module docstring)."""

    point: str

    @property
    def remote_op(self) -> RemoteOp | None:
        """The RemoteBridge operation this edit is, or None when only a local model runs it in one pass."""
        return None

    @property
    def pure(self) -> bool:
        """Whether the new value is a function of the value at ``point`` alone (a remote backend can then run it by
        capturing the value first)."""
        return True

    def apply(self, values: torch.Tensor) -> torch.Tensor | None:
        """The new value at ``point`` (a new tensor), or None to leave it."""
        raise NotImplementedError


@dataclass(frozen=True)
class Suppress(Edit):
    pos: Positions = None

    @property
    def remote_op(self) -> RemoteOp:
        return "suppress"

    def apply(self, values: torch.Tensor) -> torch.Tensor:
        mask = _positions_mask(values, self.pos)
        return torch.zeros_like(values) if mask is None else values.masked_fill(mask, 0.0)


@dataclass(frozen=True)
class Scale(Edit):
    factor: float = 1.0
    pos: Positions = None

    @property
    def remote_op(self) -> RemoteOp:
        return "scale"

    def apply(self, values: torch.Tensor) -> torch.Tensor:
        mask = _positions_mask(values, self.pos)
        scaled = values * self.factor
        return scaled if mask is None else torch.where(mask, scaled, values)


@dataclass(frozen=True)
class Add(Edit):
    value: torch.Tensor | float = 0.0
    pos: Positions = None

    @property
    def remote_op(self) -> RemoteOp:
        return "add"

    def apply(self, values: torch.Tensor) -> torch.Tensor:
        mask = _positions_mask(values, self.pos)
        added = values + _broadcast_value(self.value, values, self.pos)
        return added if mask is None else torch.where(mask, added, values)


@dataclass(frozen=True)
class Set(Edit):
    value: torch.Tensor | float = 0.0
    pos: Positions = None

    @property
    def remote_op(self) -> RemoteOp:
        return "set"

    def apply(self, values: torch.Tensor) -> torch.Tensor:
        mask = _positions_mask(values, self.pos)
        new = _broadcast_value(self.value, values, self.pos)
        return new.clone() if mask is None else torch.where(mask, new, values)


@dataclass(frozen=True)
class SetSlice(Edit):
    """Channels ``channels`` of the last-but-width dimension (heads of ``z`` ``[batch, seq, n_heads, d_head]``, or
    neurons of ``mlp.hook_post`` ``[batch, seq, d_mlp]`` when ``neurons``) set to ``value`` at ``pos``, the others
    left as they are."""

    channels: tuple[int, ...] = ()
    value: torch.Tensor | float = 0.0
    pos: Positions = None
    neurons: bool = False

    def apply(self, values: torch.Tensor) -> torch.Tensor:
        new = values.clone()
        index = list(self.channels)
        current = new[..., index] if self.neurons else new[:, :, index]
        part = torch.as_tensor(self.value, device=values.device).to(values.dtype)
        part = part.reshape(current.shape) if part.numel() == current.numel() else part.expand_as(current)
        mask = _positions_mask(current, self.pos)
        replaced = part if mask is None else torch.where(mask, part, current)
        if self.neurons:
            new[..., index] = replaced
        else:
            new[:, :, index] = replaced
        return new


@dataclass(frozen=True)
class Project(Edit):
    """The component x·u along the unit vector ``direction`` u ``[width]`` set to ``value`` (0: projected out) at
    ``pos``; the rest of x left as it is."""

    direction: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    value: torch.Tensor | float = 0.0
    pos: Positions = None

    def apply(self, values: torch.Tensor) -> torch.Tensor:
        unit = self.direction.to(device=values.device, dtype=values.dtype)
        current = (values @ unit).unsqueeze(-1)
        target = torch.as_tensor(self.value, device=values.device).to(values.dtype)
        moved = values + (target - current) * unit
        mask = _positions_mask(values, self.pos)
        return moved if mask is None else torch.where(mask, moved, values)


@dataclass(frozen=True)
class Rewrite(Edit):
    """``fn(value)`` at ``point``: the new value, or None to leave it. ``pure``: a function of this value alone."""

    fn: Callable[[torch.Tensor], torch.Tensor | None] = field(default=lambda values: None, compare=False)
    is_pure: bool = True

    @property
    def pure(self) -> bool:
        return self.is_pure

    def apply(self, values: torch.Tensor) -> torch.Tensor | None:
        return self.fn(values)


@dataclass(frozen=True)
class Observe(Edit):
    """No change: ``fn(value)`` is called with the value at ``point`` (e.g. to accumulate a statistic over a batch).
    A remote backend captures the point and calls ``fn`` with the batch's captured value."""

    fn: Callable[[torch.Tensor], None] = field(default=lambda values: None, compare=False)

    def apply(self, values: torch.Tensor) -> None:
        self.fn(values)


def observe(point: str, fn: Callable[[torch.Tensor], None]) -> Observe:
    """An edit that only reads the value at ``point``."""
    return Observe(point, fn)


def local_only(edit: Edit) -> bool:
    """Whether only a local model can run ``edit`` at all (an impure rewrite)."""
    return not edit.pure
