"""Exact patching on a backend without block calls (TransformerLens' RemoteBridge): each cell a whole forward of the
base batch with the source's value *set* at the cell's site and positions.

The block-level sweeps (``sweep``, ``suffix_sweep``) re-run only the layers after a cell's own, which needs calling
one block by itself. A remote backend runs whole forwards from tokens, with declarative edits. A cell's patch is one
``set`` at the cell's positions only (a per-row mask: the cell's position, or every patched position for a cell
without one): there, the source run's value at the site — for a channel site (a head of ``z``), the base run's value
with that channel taken from the source. Nothing upstream of the cell changes, so the base run's own value there is
the value the patched run would have — captured once, with the source's, before the sweep — and the numbers are
exactly the block sweeps'. A cell at one position is one vector per row, which every driver takes as it is.

Cells of one layer go to the backend stacked (one row per cell and pair), and only each row's logits at its answer
are read (``answer_logits``: the tokens after the answer are not sent where the engine allows it). How many requests
the engine took for those rows is the backend's to say (``requests``): several rows per request on vLLM with one
worker, one per request elsewhere (``backend.remote``).
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

PATCHED_ROWS_PER_CALL = 256  # patched rows stacked into one backend call (the backend splits them into requests)


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
    rows: int = field(default=0, init=False)  # patched rows sent
    requests: int = field(default=0, init=False)  # engine requests they took

    def steps(self) -> Iterator[int]:
        batch = int(self.base_ids.shape[0])
        values: torch.Tensor | None = None
        layers = sorted({u.layer for u in self.units})
        sent = getattr(self.backend, "requests", 0)
        for layer in layers:
            members = [i for i, u in enumerate(self.units) if u.layer == layer]
            per_call = max(1, PATCHED_ROWS_PER_CALL // batch)
            for lo in range(0, len(members), per_call):
                chunk = members[lo : lo + per_call]
                edit = self._edit(layer, [self.units[i] for i in chunk])
                ids = self.base_ids.repeat(len(chunk), 1)
                answer = self.backend.answer_logits(ids, self.answer_positions.repeat(len(chunk)), [edit])
                self.rows += int(ids.shape[0])
                self.requests = getattr(self.backend, "requests", 0) - sent
                prompts = torch.arange(batch).repeat(len(chunk))
                with torch.inference_mode():
                    metric = self.metric(answer, prompts).to(torch.float64)
                if values is None:  # [units, batch] or, when each row reads several tokens, [units, batch, K]
                    values = torch.empty(len(self.units), batch, *metric.shape[1:], dtype=torch.float64)
                values[chunk] = metric.view(len(chunk), batch, *metric.shape[1:])
            yield layer
        self.values = values if values is not None else torch.empty(len(self.units), batch, dtype=torch.float64)

    def _edit(self, layer: int, units: list[Unit]) -> Set:
        """One ``set`` for ``units`` (stacked: unit j's copy of the batch is rows j·batch…) at each unit's positions
        only: the source's value there, or — at a channel site — the base value with the unit's channel from the
        source."""
        point = site_hook(self.site, layer)
        base, source = self.base[point], self.source[layer].to(self.base[point].dtype)
        values, masks = [], []
        for unit in units:
            where = self.patch_mask.clone()
            if unit.position is not None:
                where[:] = False
                where[:, unit.position] = True
            if self.site in CHANNEL_SITES:  # a head of z [b, s, heads, d_head] or a neuron of mlp_post [b, s, d_mlp]
                assert unit.channel is not None
                value = base.clone()
                value[:, :, unit.channel] = source[:, :, unit.channel]
            else:
                value = source
            values.append(value)
            masks.append(where)
        return Set(point, torch.cat(values), pos=torch.cat(masks))


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
    return ChosenEditSweep(
        sweep, f"{backend.name}: each cell a whole forward with the patched value set at its positions"
    )
