"""What a writer adds to a reader's input, exactly, on blocks whose heads add to the stream directly and on
post-norm blocks (Gemma-2, Gemma-3, OLMo-2) whose heads' sum goes through a norm first.

On a pre-norm block a head's write (``hook_result``) is a term of the residual stream, so giving one reader a
writer's clean write instead of its corrupt one adds clean − corrupt to that reader's input. On a post-norm block
the attention adds N(Σ_h result_h + b) to the stream, N the post-attention norm: no head's write is a term. The
exact definition used instead: a reader sees its layer-L attention write recomputed through N from the per-reader
mix of head outputs — the heads it takes live (or clean) and the rest replaced —

    N(replacement sum_L + Σ_{h taken} (result_h − replacement_h)) − N(replacement sum_L)

added to what it sees with every head of L replaced. Not additive over heads, but exactly defined: with every head
taken it is the layer's real write (the full circuit recovers 1), with none the replacement's (the empty circuit 0).

``one_edge_deltas`` gives one edge's change of its reader's input (the writer's clean write, every other writer
corrupt), ``patch_readers`` runs many such patches in one batched sweep: path patching and the exact check of edge
attribution's top edges are both this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mcp_interp.core.circuits.edge_graph import Reader, Writer
from mcp_interp.core.engine.backend.edits import Rewrite
from mcp_interp.core.engine.backend.points import (
    HOOK_EMBED,
    hook_heads_sum,
    hook_mlp_in,
    hook_mlp_out,
    hook_out,
    hook_qkv_input,
    hook_result,
)
from mcp_interp.core.engine.numbers.row_readouts import RowMetric

ROWS_PER_CALL = 256  # prompt rows one patched forward runs

POST_NORM_NOTE = (
    "Post-norm block: a norm sits between the heads' sum and the residual stream, so a head's write is not a term of "
    "the stream. Exact by definition: a reader gets its layer's attention write recomputed through that norm from "
    "the heads it takes live (or clean) and the others replaced — not additive over heads."
)

WriteMap = Callable[[torch.Tensor], torch.Tensor]


def write_maps(backend: Any) -> dict[int, WriteMap]:
    """Layer → the function from its heads' sum to its attention write, for the layers where that is not the
    identity (post-attention norms); empty on pre-norm models."""
    maps = {layer: backend.attention_write_map(layer) for layer in range(backend.n_layers)}
    return {layer: fn for layer, fn in maps.items() if fn is not None}


def writer_hook(writer: Writer) -> str:
    if writer.kind == "embed":
        return HOOK_EMBED
    return hook_result(writer.layer) if writer.kind == "head" else hook_mlp_out(writer.layer)


def reader_hook(reader: Reader, n_layers: int) -> str:
    if reader.kind == "logits":
        return hook_out(n_layers - 1)
    return hook_mlp_in(reader.layer) if reader.kind == "mlp" else hook_qkv_input(reader.layer, reader.kind)


def writer_points(writers: Sequence[Writer], maps: dict[int, WriteMap]) -> list[str]:
    """The points to capture for these writers' writes: their own, plus the heads' sum of each post-norm layer
    (what a mix of its heads is recomputed from)."""
    names = {writer_hook(w) for w in writers}
    names |= {hook_heads_sum(w.layer) for w in writers if w.kind == "head" and w.layer in maps}
    return sorted(names)


def write_of(values: dict[str, torch.Tensor], writer: Writer) -> torch.Tensor:
    """The writer's own output ``[batch, seq, d_model]`` (a head's ``hook_result`` slice; before the norm on a
    post-norm block)."""
    value = values[writer_hook(writer)]
    return value[:, :, writer.index] if writer.kind == "head" else value


def wide(value: torch.Tensor) -> torch.Tensor:
    """At least float32: sums over dozens of writers are kept in that precision and rounded once."""
    return value.to(torch.promote_types(value.dtype, torch.float32))


def mixed_write(
    fn: WriteMap, replaced_sum: torch.Tensor, taken: torch.Tensor, replaced_write: torch.Tensor | None = None
) -> torch.Tensor:
    """A post-norm layer's write when its heads' sum is the replacement's plus ``taken`` (Σ over the heads taken of
    their output − replacement), minus the write with every head replaced (``replaced_write``, wide: computed here
    when the caller has not already): what a reader's input changes by."""
    mixed = fn((wide(replaced_sum) + taken).to(replaced_sum.dtype))
    return wide(mixed) - (wide(fn(replaced_sum)) if replaced_write is None else replaced_write)


def one_edge_delta(
    writer: Writer, clean: dict[str, torch.Tensor], corrupt: dict[str, torch.Tensor], maps: dict[int, WriteMap]
) -> torch.Tensor:
    """How one reader's input changes in the corrupt run when it alone gets ``writer``'s clean write: clean −
    corrupt, or on a post-norm layer the norm recomputed from the corrupt heads with this one clean."""
    delta = wide(write_of(clean, writer)) - wide(write_of(corrupt, writer))
    if writer.kind == "head" and writer.layer in maps:
        return mixed_write(maps[writer.layer], corrupt[hook_heads_sum(writer.layer)], delta)
    return delta


@dataclass(frozen=True)
class ReaderPatch:
    """Add ``delta`` ``[batch, seq, d_model]`` to one reader's input: ``point`` and, for a per-head (q/k/v) input,
    the head or key/value group ``index``."""

    point: str
    index: int | None
    delta: torch.Tensor


def reader_patch(reader: Reader, n_layers: int, delta: torch.Tensor) -> ReaderPatch:
    return ReaderPatch(reader_hook(reader, n_layers), reader.index if reader.kind in ("q", "k", "v") else None, delta)


def patch_readers(
    backend: Any, ids: torch.Tensor, answers: torch.Tensor, metric: RowMetric, patches: Sequence[ReaderPatch]
) -> torch.Tensor:
    """The metric per patch and pair, ``[patches, pairs]``: row block i is the prompts ``ids`` run with patch i
    only (use within ``backend.edge_points``), in chunks of ``ROWS_PER_CALL`` rows."""
    n = ids.shape[0]
    per_call = max(1, ROWS_PER_CALL // n)
    out = []
    for lo in range(0, len(patches), per_call):
        chunk = patches[lo : lo + per_call]
        by_point: dict[str, list[tuple[int, ReaderPatch]]] = {}
        for i, patch in enumerate(chunk):
            by_point.setdefault(patch.point, []).append((i, patch))
        edits = [Rewrite(point, _adder(members, n)) for point, members in by_point.items()]
        rows = torch.arange(n * len(chunk))
        logits = backend.logits(ids.repeat(len(chunk), 1), edits, mode="no_grad")
        with torch.no_grad():
            values = metric(logits[rows, answers.repeat(len(chunk))], rows % n)
        out.append(values.view(len(chunk), n))
    return torch.cat(out)


def _adder(members: list[tuple[int, ReaderPatch]], n: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def hook(value: torch.Tensor) -> torch.Tensor:
        value = value.clone()
        for i, patch in members:  # the sum taken in the delta's precision (float32 at least), rounded once
            rows = slice(i * n, (i + 1) * n)
            if patch.index is not None:
                value[rows, :, patch.index] = (value[rows, :, patch.index] + patch.delta).to(value.dtype)
            else:
                value[rows] = (value[rows] + patch.delta).to(value.dtype)
        return value

    return hook
