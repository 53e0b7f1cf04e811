"""Exact patching on a backend without block calls (TransformerLens' RemoteBridge): each cell a whole forward of the
base batch with the source's value *set* at the cell's site.

The block-level sweeps (``sweep``, ``suffix_sweep``) re-run only the layers after a cell's own, which needs calling
one block by itself. A remote backend runs whole forwards from tokens, with declarative edits. A cell's patch is one
``set``: at the cell's site and layer, the value the base run had there with the cell's channel (a head of ``z``) at
the cell's positions taken from the source run. Nothing upstream of the cell changes, so the base run's own value
there is the value the patched run would have — captured once, with the source's, before the sweep — and the
numbers are exactly the block sweeps'. Cells of one layer go to the backend as one request of stacked rows (one
row per cell and pair); a driver that takes one row at a time gets them in turn.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from mcp_interp.core.engine.backend.edits import Set
from mcp_interp.core.engine.backend.points import site_hook
from mcp_interp.core.engine.backend.sites import CHANNEL_SITES, Site
from mcp_interp.core.engine.numbers.row_readouts import RowMetric
from mcp_interp.core.engine.patching.sweep import Unit

ROWS_PER_REQUEST = 64  # patched rows stacked into one backend request


@dataclass(kw_only=True)
class EditPatchSweep:
    """The sweep (module docstring); ``steps()`` yields once per layer, then ``values`` is ``[len(units), batch]``."""

    backend: Any
    base_ids: torch.Tensor  # [batch, seq]
    site: Site
    base: dict[str, torch.Tensor]  # point -> the base run's value there
    source: dict[int, torch.Tensor]  # layer -> the source run's value at the site
    units: list[Unit]
    patch_mask: torch.Tensor  # [batch, seq] bool: positions patched for units without a position
    answer_positions: torch.Tensor  # [batch]
    metric: RowMetric  # from answer logits [rows, vocab] and each row's prompt index
    values: torch.Tensor | None = field(default=None, init=False)

    def steps(self) -> Iterator[int]:
        batch = int(self.base_ids.shape[0])
        values: torch.Tensor | None = None
        layers = sorted({u.layer for u in self.units})
        for layer in layers:
            members = [i for i, u in enumerate(self.units) if u.layer == layer]
            per_request = max(1, ROWS_PER_REQUEST // batch)
            for lo in range(0, len(members), per_request):
                chunk = members[lo : lo + per_request]
                edit = self._edit(layer, [self.units[i] for i in chunk])
                ids = self.base_ids.repeat(len(chunk), 1)
                logits = self.backend.logits(ids, [edit])
                rows = torch.arange(ids.shape[0])
                answer = logits[rows, self.answer_positions.repeat(len(chunk))]
                prompts = torch.arange(batch).repeat(len(chunk))
                with torch.inference_mode():
                    metric = self.metric(answer, prompts).to(torch.float64)
                if values is None:  # [units, batch] or, when each row reads several tokens, [units, batch, K]
                    values = torch.empty(len(self.units), batch, *metric.shape[1:], dtype=torch.float64)
                values[chunk] = metric.view(len(chunk), batch, *metric.shape[1:])
            yield layer
        self.values = values if values is not None else torch.empty(len(self.units), batch, dtype=torch.float64)

    def _edit(self, layer: int, units: list[Unit]) -> Set:
        """One ``set`` for ``units`` (stacked: unit j's copy of the batch is rows j·batch…): the base value with each
        unit's channel and positions from the source."""
        point = site_hook(self.site, layer)
        base, source = self.base[point], self.source[layer]
        pieces = []
        for unit in units:
            where = self.patch_mask.clone()
            if unit.position is not None:
                where[:] = False
                where[:, unit.position] = True
            if self.site in CHANNEL_SITES:  # a head of z [b, s, heads, d_head] or a neuron of mlp_post [b, s, d_mlp]
                assert unit.channel is not None
                value = base.clone()
                kept, moved = base[:, :, unit.channel], source[:, :, unit.channel].to(base.dtype)
                value[:, :, unit.channel] = torch.where(where if kept.ndim == 2 else where.unsqueeze(-1), moved, kept)
            else:
                value = torch.where(where.unsqueeze(-1), source.to(base.dtype), base)
            pieces.append(value)
        return Set(point, torch.cat(pieces))


@dataclass
class ChosenEditSweep:
    sweep: EditPatchSweep
    label: str  # how its patched runs are computed, in words (the result's ``sweep``)
    note: str | None = None


def edit_sweep(
    backend: Any,
    base_ids: torch.Tensor,
    site: Site,
    base: dict[str, torch.Tensor],
    source: dict[int, torch.Tensor],
    units: list[Unit],
    mask: torch.Tensor,
    answer_positions: torch.Tensor,
    metric: RowMetric,
) -> ChosenEditSweep:
    """The edit sweep, labelled for the result's ``sweep``."""
    sweep = EditPatchSweep(backend=backend, base_ids=base_ids, site=site, base=base, source=source, units=units,
                           patch_mask=mask, answer_positions=answer_positions, metric=metric)  # fmt: skip
    return ChosenEditSweep(sweep, f"{backend.name}: each cell a whole forward with the patched value set")
