"""Exact direct path patching: the edge sender → receiver, measured rather than estimated.

The sender's clean-minus-corrupt write (a head's ``hook_result``, an MLP's output) is added, at every
position, to one receiver's own input — a query head's query input, a key/value group's key or
value input, or the final residual stream the logits read — in the corrupt run; every other reader
still sees the sender's corrupt write. The metric of that run, against the clean and corrupt runs,
is the edge's effect (Wang et al. 2022). Under grouped-query attention a key or value receiver is a
key/value group: its input is shared by the group's query heads, so that is what can be patched.

All receivers run in one batched sweep: row (receiver i, pair b) is the corrupt prompt b with the
delta added at receiver i only, in chunks of rows. Equal to TransformerLens'
``patching.get_act_patch_direct_path`` on a multi-head model (a test).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mcp_interp.core.circuits.edge_graph import Reader, Writer
from mcp_interp.core.circuits.edge_writes import (
    POST_NORM_NOTE,
    one_edge_delta,
    patch_readers,
    reader_patch,
    write_maps,
    writer_points,
)
from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import Job
from mcp_interp.core.engine.numbers import metrics
from mcp_interp.core.engine.numbers.row_readouts import Readout
from mcp_interp.core.engine.patching.pairs import pair_answer_kind, prepare_pairs
from mcp_interp.errors import InputError, require_choice
from mcp_interp.schemas.circuits import PathPatchMeasurement, ReceiverInput, ReceiverScore
from mcp_interp.schemas.common import PairMetric

_SENDER = re.compile(r"^\s*L(\d+)\s*(?:H(\d+)|(MLP))\s*$", re.IGNORECASE)
_RECEIVER = re.compile(r"^\s*L(\d+)\s*(H|KV)(\d+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Receiver:
    layer: int  # -1 for the logits
    index: int = 0  # query head for "q", key/value group for "k"/"v"

    def name(self, component: ReceiverInput) -> str:
        if self.layer < 0:
            return "logits"
        return f"L{self.layer}H{self.index}.q" if component == "q" else f"L{self.layer}KV{self.index}.{component}"


@dataclass(kw_only=True)
class PathPatchJob(Job[PathPatchMeasurement]):
    model: LoadedModel
    clean_prompts: Sequence[str]
    corrupt_prompts: Sequence[str]
    correct: Any
    incorrect: Any
    metric: PairMetric = "logit_diff"
    sender: str
    receivers: Any = None  # None (every later head or group), "logits", or a list of names
    component: ReceiverInput = "q"
    result: PathPatchMeasurement | None = field(default=None, init=False)

    def _sender(self) -> tuple[int, int | None]:
        """(layer, head) of the sender; head None for an MLP."""
        cfg = self.model.cfg
        match = _SENDER.match(self.sender) if isinstance(self.sender, str) else None
        if match is None:
            raise InputError(f"`sender` {self.sender!r} must be a head 'L5H1' or an MLP 'L5MLP'.")
        layer = int(match.group(1))
        head = None if match.group(3) else int(match.group(2))
        if not 0 <= layer < cfg.n_layers or (head is not None and not 0 <= head < cfg.n_heads):
            raise InputError(
                f"`sender` {self.sender!r} does not exist: layers 0..{cfg.n_layers - 1}, heads 0..{cfg.n_heads - 1}."
            )
        return layer, head

    def _receivers(self, sender_layer: int) -> list[Receiver]:
        cfg = self.model.cfg
        width = cfg.n_heads if self.component == "q" else (getattr(cfg, "n_key_value_heads", None) or cfg.n_heads)
        per = cfg.n_heads // width
        if self.receivers == "logits":
            return [Receiver(-1)]
        if self.receivers is None:
            if sender_layer + 1 >= cfg.n_layers:
                raise InputError(
                    f"The sender {self.sender!r} is in the last layer: no head reads it. Pass receivers='logits' for "
                    "its direct path to the logits."
                )
            return [Receiver(layer, i) for layer in range(sender_layer + 1, cfg.n_layers) for i in range(width)]
        names = [self.receivers] if isinstance(self.receivers, str) else list(self.receivers)
        if not names:
            raise InputError("`receivers` is empty: omit it for every later head, or pass 'logits' or names.")
        out: list[Receiver] = []
        for name in names:
            match = _RECEIVER.match(name) if isinstance(name, str) else None
            if match is None:
                raise InputError(f"Receiver {name!r} must be a head 'L9H3', a key/value group 'L9KV1', or 'logits'.")
            layer, kind, index = int(match.group(1)), match.group(2).upper(), int(match.group(3))
            if kind == "KV" and self.component == "q":
                raise InputError(f"Receiver {name!r} is a key/value group: with component 'q' name a query head.")
            if kind == "H" and self.component != "q":
                index //= per  # a query head reads the key/value input of its group
            limit = cfg.n_heads if kind == "H" and self.component == "q" else width
            if not 0 <= layer < cfg.n_layers or not 0 <= index < limit:
                raise InputError(f"Receiver {name!r} does not exist in this model.")
            if layer <= sender_layer:
                raise InputError(
                    f"Receiver {name!r} is at layer {layer}, not after the sender {self.sender!r} (layer "
                    f"{sender_layer}): a path runs from a writer to a later reader."
                )
            if Receiver(layer, index) not in out:
                out.append(Receiver(layer, index))
        return out

    def total_steps(self) -> int:
        return 2

    def steps(self) -> Iterator[str]:
        require(self.model.backend, "path_patch")
        require_choice("component", self.component, ReceiverInput)
        sender_layer, sender_head = self._sender()
        receivers = self._receivers(sender_layer)
        pairs = prepare_pairs(
            self.model, self.clean_prompts, self.corrupt_prompts, self.correct, self.incorrect, self.metric
        )
        clean, corrupt, readout = pairs.clean, pairs.corrupt, pairs.readout
        backend = self.model.backend
        writer = Writer("head", sender_layer, sender_head) if sender_head is not None else Writer("mlp", sender_layer)
        maps = write_maps(backend)
        points = writer_points([writer], maps)
        # Edge points entered per step, so the model is at rest between the two (others' calls may run there).
        with backend.edge_points():
            clean_values, clean_m = self._run(clean.input_ids, clean.answer_positions, readout, points)
            corrupt_values, corrupt_m = self._run(corrupt.input_ids, corrupt.answer_positions, readout, points)
        yield "clean and corrupt runs"
        with backend.edge_points():
            delta = one_edge_delta(writer, clean_values, corrupt_values, maps)
            n_layers = backend.n_layers
            patches = [reader_patch(self._reader(receiver, n_layers), n_layers, delta) for receiver in receivers]
            patched = patch_readers(backend, corrupt.input_ids, corrupt.answer_positions, readout.from_logits, patches)
        yield f"{len(receivers)} receivers patched"
        self.result = self._measurement(
            receivers, patched, clean_m, corrupt_m, writer.kind == "head" and writer.layer in maps, pairs.notes
        )

    def _reader(self, receiver: Receiver, n_layers: int) -> Reader:
        if receiver.layer < 0:
            return Reader("logits", n_layers - 1)
        return Reader(self.component, receiver.layer, receiver.index)

    def _run(
        self, ids: torch.Tensor, answers: torch.Tensor, readout: Readout, points: list[str]
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        run = self.model.backend.run(ids, capture=points, mode="no_grad")
        assert run.logits is not None
        rows = torch.arange(ids.shape[0])
        with torch.no_grad():
            return run.acts, readout.from_logits(run.logits[rows, answers], rows)

    def _measurement(
        self,
        receivers: list[Receiver],
        patched: torch.Tensor,
        clean_m: torch.Tensor,
        corrupt_m: torch.Tensor,
        sender_normed: bool,
        metric_notes: list[str],
    ) -> PathPatchMeasurement:
        cfg = self.model.cfg
        width = cfg.n_heads if self.component == "q" else (getattr(cfg, "n_key_value_heads", None) or cfg.n_heads)
        grid: list[list[float | None]] = [[None] * width for _ in range(cfg.n_layers)]
        recovered: list[list[float | None]] = [[None] * width for _ in range(cfg.n_layers)]
        rows = []
        for receiver, values in zip(receivers, patched, strict=True):
            fraction = metrics.recovered_fraction(values, clean_m, corrupt_m).value
            fraction_or_none = fraction if fraction == fraction else None
            if receiver.layer >= 0:
                grid[receiver.layer][receiver.index] = float(values.mean())
                recovered[receiver.layer][receiver.index] = fraction_or_none
            rows.append(
                ReceiverScore(
                    receiver=receiver.name(self.component),
                    patched_logit_diff=float(values.mean()),
                    per_example_patched=[float(v) for v in values],
                    recovered=fraction_or_none,
                )
            )
        rows.sort(key=lambda row: -abs(row.recovered or 0.0))
        notes = [
            "Exact: each receiver's run is a real forward with the sender's clean write added to that input only.",
            *metric_notes,
        ]
        if sender_normed:
            notes.append(POST_NORM_NOTE)
        if float(clean_m.mean()) == float(corrupt_m.mean()):
            notes.append(
                "Clean and corrupt give the same logit difference (a gap of 0; identical pairs do): every recovered "
                "fraction is undefined (null). Choose pairs whose corrupt prompt changes the answer."
            )
        if self.component != "q" and width != cfg.n_heads:
            notes.append(
                f"Grouped-query attention: a {self.component} receiver is a key/value group ('L9KV1'), shared by "
                f"{cfg.n_heads // width} query heads; patching it changes all of them."
            )
        return PathPatchMeasurement(
            answer_kind=pair_answer_kind(self.correct, self.incorrect),
            sender=self.sender.strip(),
            component=self.component,
            clean_logit_diff=metrics.score_of(clean_m),
            corrupt_logit_diff=metrics.score_of(corrupt_m),
            patched_logit_diff=grid,
            recovered=recovered,
            receivers=rows,
            notes=notes,
        )
