"""Exact activation patching of many units in one sweep over the layers.

Exact patching answers: "if this unit (a site at one layer, maybe one head/neuron, maybe one
position) had its value from the *source* run, what would the metric be in the *base* run?"
(denoise: base = corrupt, source = clean; noise: the reverse). TransformerLens' patchers run one
full forward per unit. Three facts make the same numbers far cheaper, and the sweep uses all of them:

1. A patch at layer l leaves layers 0..l-1 exactly as in the base run, so a patched run can
   start from the base run's residual entering block l (captured once, ``forward.BlockTrace``) —
   lower layers are not re-run.
2. The patched runs of every unit are independent, so they are batched: one sweep over the
   layers carries a growing batch in which each unit's copies join at their own layer.
   Every block runs once per sweep, on big matrices, instead of once per unit.
3. Only the answer positions are read out (the vocabulary projection is the largest matmul).

``PatchSweep`` is that sweep — the rows, who joins when, the chunking into block calls, each
chunk's patch, the read-out — written once. A sweep only says how one block runs on a chunk
of rows: ``BridgePatchSweep`` (here, any model) calls each block through the TransformerBridge
with the keyword arguments (attention mask, position embeddings, ...) captured from a real
forward of the base batch, so the computation is the model's own, hooks included;
``suffix_sweep.SuffixPatchSweep`` (Llama) recomputes only the positions after the pairs'
shared prefix. Agreement with TransformerLens' patching module is a test.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from mcp_interp.core.engine.backend.edits import Rewrite
from mcp_interp.core.engine.backend.forward import BlockTrace
from mcp_interp.core.engine.backend.sites import CHANNEL_SITES, INSIDE_BLOCK, Site, write_hook
from mcp_interp.core.engine.numbers.row_readouts import RowMetric


@dataclass(frozen=True)
class Unit:
    """One patched run: a site at ``layer``, restricted to one head/neuron (``channel``) and to
    one ``position`` (None: every position of the sweep's ``patch_mask``)."""

    layer: int
    channel: int | None = None
    position: int | None = None


@dataclass
class SitePatch:
    """The patch of some rows of one block call at the sweep's site.

    ``rows`` [k] index the call's rows; ``channels`` [k] the head/neuron of each (None for a
    whole residual-width vector); ``source`` the source run's values over the call's s positions
    ([k, s, width], or [k, s] for a neuron); ``where`` (same shape, or with a trailing 1) the
    positions patched.
    """

    rows: torch.Tensor
    channels: torch.Tensor | None
    source: torch.Tensor
    where: torch.Tensor

    def apply(self, values: torch.Tensor) -> torch.Tensor:
        """Patch ``values`` [rows, s, ...] in place and return it."""
        if self.channels is None:
            current = values[self.rows]
            values[self.rows] = torch.where(self.where, self.source.to(values.dtype), current)
        else:
            current = values[self.rows, :, self.channels]
            values[self.rows, :, self.channels] = torch.where(self.where, self.source.to(values.dtype), current)
        return values

    def minus(self, base: torch.Tensor) -> SitePatch:
        """The same patch with ``base[rows]`` subtracted from the source: a patch of the residual
        after attention (``resid_mid``) written as a patch of what attention adds to it."""
        return SitePatch(self.rows, self.channels, self.source - base[self.rows].to(self.source.dtype), self.where)


@dataclass(kw_only=True)
class PatchSweep(ABC):
    """Exact patching of many units in one sweep over the layers (see the module docstring).

    The bookkeeping every sweep shares: each unit's rows (one per prompt) join the batch at
    their unit's layer as copies of the base run's residual there; the batch runs through each
    later layer in chunks of ``rows_per_call()`` rows, each chunk carrying the ``SitePatch`` of
    the rows joining at that layer; at the end the metric is read at each row's answer position.
    ``resid_pre`` and ``resid_post`` patches are applied here, around the block calls; a sweep
    applies the ``INSIDE_BLOCK`` sites. A sweep implements ``run_block`` and
    ``rows_per_call``, and may recompute only positions ``first_position()..`` and, when
    ``ANSWER_ONLY_AT_LAST``, only the answer position at the last layer.

    ``steps()`` runs one layer per step (for progress and cancellation between layers); when it
    is exhausted, ``values`` holds the metric per unit and prompt, ``[len(units), batch]``.
    """

    backend: Any  # the model's backend (``backend.local.LocalBackend``: it re-runs single blocks)
    base: BlockTrace
    site: Site
    source: dict[int, torch.Tensor]  # layer -> source run's values at the site, [batch, seq, ...]
    units: list[Unit]
    patch_mask: torch.Tensor  # [batch, seq] bool: positions patched for units without a position
    answer_positions: torch.Tensor  # [batch]
    metric: RowMetric
    values: torch.Tensor | None = field(default=None, init=False)

    # The last layer's ``run_block`` returns only the query position of each row, [rows, 1, d_model].
    ANSWER_ONLY_AT_LAST: ClassVar[bool] = False

    def first_position(self) -> int:
        """Positions before this one are not recomputed (identical in every patched run)."""
        return 0

    @abstractmethod
    def rows_per_call(self) -> int:
        """How many rows one block call takes."""

    @abstractmethod
    def run_block(
        self,
        layer: int,
        residual: torch.Tensor,
        rows_prompt: torch.Tensor,
        patch: SitePatch | None,
        query: torch.Tensor | None,
    ) -> torch.Tensor:
        """Block ``layer`` on ``residual`` [rows, s, d_model] (positions ``first_position()..`` of
        prompts ``rows_prompt``), with ``patch`` applied at the sweep's site (an ``INSIDE_BLOCK``
        one). ``query`` [rows] is given at the last layer of an ``ANSWER_ONLY_AT_LAST`` sweep:
        the answer's index among the s positions."""

    def layers(self) -> list[int]:
        first = min(u.layer for u in self.units)
        return list(range(first, self.backend.n_layers))

    def steps(self) -> Iterator[int]:
        batch, start = self.base.batch_size, self.first_position()
        if any(u.position is not None and u.position < start for u in self.units):
            raise ValueError(f"a unit patches a position before {start}, which this sweep does not recompute")
        rows_per_call = self.rows_per_call()
        order = sorted(range(len(self.units)), key=lambda i: self.units[i].layer)
        residual: torch.Tensor | None = None
        rows_prompt = torch.empty(0, dtype=torch.long)
        rows_unit = torch.empty(0, dtype=torch.long)  # index into self.units
        rows_layer = torch.empty(0, dtype=torch.long)  # the layer each row's unit is patched at
        last_layer = self.backend.n_layers - 1
        # Inference mode per step, not around the yields: between two steps the model is at rest, so others' work
        # may run there (``host.run_steps``).
        for layer in self.layers():
            with torch.inference_mode():
                joining = [i for i in order if self.units[i].layer == layer]
                if joining:
                    new = self.base.inputs[layer][:, start:].repeat(len(joining), 1, 1)
                    residual = new if residual is None else torch.cat([residual, new])
                    rows_prompt = torch.cat([rows_prompt, torch.arange(batch).repeat(len(joining))])
                    rows_unit = torch.cat([rows_unit, torch.tensor(joining).repeat_interleave(batch)])
                    rows_layer = torch.cat([rows_layer, torch.full((len(joining) * batch,), layer)])
                    if self.site == "resid_pre":
                        self._apply_around(layer, residual, rows_prompt, rows_unit, rows_layer, None)
                assert residual is not None
                answer_only = self.ANSWER_ONLY_AT_LAST and layer == last_layer
                pieces = []
                for lo in range(0, residual.shape[0], rows_per_call):
                    hi = min(lo + rows_per_call, residual.shape[0])
                    prompts = rows_prompt[lo:hi]
                    query = self.answer_positions[prompts] - start if answer_only else None
                    patch = None
                    if self.site in INSIDE_BLOCK:
                        patch = self._patch(layer, prompts, rows_unit[lo:hi], rows_layer[lo:hi], query)
                    pieces.append(self.run_block(layer, residual[lo:hi], prompts, patch, query))
                residual = torch.cat(pieces)
                if self.site == "resid_post":
                    query = self.answer_positions[rows_prompt] - start if answer_only else None
                    self._apply_around(layer, residual, rows_prompt, rows_unit, rows_layer, query)
            yield layer
        with torch.inference_mode():
            assert residual is not None
            if self.ANSWER_ONLY_AT_LAST:
                final = residual[:, 0]  # the last layer returned only each row's answer position
            else:
                final = residual[torch.arange(residual.shape[0]), self.answer_positions[rows_prompt] - start]
            row_values = self.metric(final, rows_prompt)
        values = torch.empty(len(self.units), batch, *row_values.shape[1:], dtype=row_values.dtype)
        values[rows_unit, rows_prompt] = row_values
        self.values = values

    def _apply_around(
        self,
        layer: int,
        residual: torch.Tensor,
        rows_prompt: torch.Tensor,
        rows_unit: torch.Tensor,
        rows_layer: torch.Tensor,
        query: torch.Tensor | None,
    ) -> None:
        patch = self._patch(layer, rows_prompt, rows_unit, rows_layer, query)
        if patch is not None:
            patch.apply(residual)

    def _patch(
        self,
        layer: int,
        rows_prompt: torch.Tensor,
        rows_unit: torch.Tensor,
        rows_layer: torch.Tensor,
        query: torch.Tensor | None,
    ) -> SitePatch | None:
        """The patch of the rows (of one chunk) whose unit is at ``layer``; None if there are none."""
        joining = (rows_layer == layer).nonzero().squeeze(1)
        if not joining.numel():
            return None
        start = self.first_position()
        units = [self.units[i] for i in rows_unit[joining].tolist()]
        prompts = rows_prompt[joining]
        channels = None
        if self.site in CHANNEL_SITES:
            channels = torch.tensor([u.channel for u in units])
            source = self.source[layer][prompts, start:, channels]  # [k, s, d_head] or [k, s]
        else:
            source = self.source[layer][prompts, start:]  # [k, s, d_model]
        where = self.patch_mask[prompts, start:].clone()  # [k, s]
        positions = torch.tensor([-1 if u.position is None else u.position - start for u in units])
        one = (positions >= 0).nonzero().squeeze(1)
        if one.numel():
            where[one] = False
            where[one, positions[one]] = True
        if query is not None:  # only the answer position is computed
            at = query[joining]
            every = torch.arange(len(joining))
            source, where = source[every, at].unsqueeze(1), where[every, at].unsqueeze(1)
        if source.ndim == 3:
            where = where.unsqueeze(-1)
        return SitePatch(joining, channels, source, where)


@dataclass(kw_only=True)
class BridgePatchSweep(PatchSweep):
    """The generic sweep: every block called through the backend on every position, the patch applied as an
    edit at its point. Works for any model the local backend runs."""

    max_rows_per_call: int = 512

    def rows_per_call(self) -> int:
        return self.max_rows_per_call

    def run_block(
        self,
        layer: int,
        residual: torch.Tensor,
        rows_prompt: torch.Tensor,
        patch: SitePatch | None,
        query: torch.Tensor | None,
    ) -> torch.Tensor:
        edits = []
        if patch is not None:
            applied = patch.minus(residual) if self.site == "resid_mid" else patch
            # the value at the point may be a view the bridge still uses: patch a copy
            edits.append(Rewrite(write_hook(self.site, layer), lambda values: applied.apply(values.clone())))
        call_kwargs = _rows_kwargs(self.base.kwargs[layer], rows_prompt, self.base.batch_size)
        return self.backend.run_block(layer, residual, call_kwargs, edits)


def _rows_kwargs(call_kwargs: dict[str, Any], rows_prompt: torch.Tensor, batch_size: int) -> dict[str, Any]:
    """Block kwargs for a batch whose row r is a copy of prompt ``rows_prompt[r]`` — never a KV cache.

    A cache from the traced base run holds that run's keys (batch = prompts); handed to a block of the
    sweep, whose rows are copies, the attention would append the rows' keys to it. HF layers name it
    ``cache``, ``past_key_values``, ``past_key_value`` or (GPT-NeoX, GPT-J in older transformers)
    ``layer_past``, so it is dropped by type as well as by name.
    """
    from transformers.cache_utils import Cache

    def select(value: Any) -> Any:
        if torch.is_tensor(value) and value.ndim > 0 and value.shape[0] == batch_size and batch_size > 1:
            return value.index_select(0, rows_prompt)
        if isinstance(value, tuple):
            return tuple(select(v) for v in value)
        return value

    out = {k: select(v) for k, v in call_kwargs.items() if k not in _CACHE_KWARGS and not isinstance(v, Cache)}
    if "use_cache" in out:
        out["use_cache"] = False
    return out


_CACHE_KWARGS = frozenset({"cache", "past_key_values", "past_key_value", "layer_past"})
