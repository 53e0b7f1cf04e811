"""Circuit faithfulness: run the model with every edge outside a circuit ablated — exactly, not linearised.

A reader's input (the residual stream before its norm: a head's query input, a key/value group's
key or value input, an MLP's input, the final residual) is the sum of its upstream writers' writes
plus constant biases. In one forward on the clean prompts, each writer's live write is recorded as
it happens and each reader's input is rebuilt as

    input − Σ_{w upstream} (live_w − replacement_w) + Σ_{w → reader in the circuit} (live_w − replacement_w)

so the reader sees the live write of exactly its circuit writers and the replacement of every other
one (``corrupt``: the corrupt run's write; ``mean``: the clean writes' mean over the pairs at the same
position). Everything downstream is recomputed by the model itself. The result, as a fraction of the
clean−corrupt gap of the metric: the full graph recovers 1 and (with ``corrupt``) the empty circuit 0
by construction — the sanity pins a test holds. On post-norm blocks (Gemma-2/3, OLMo-2) a layer's heads reach a
reader through the layer's norm, recomputed from the heads the reader takes (``edge_writes``): exact, not additive.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Generator
from typing import Any

import torch

from mcp_interp.core.circuits.edge_graph import Graph
from mcp_interp.core.circuits.edge_writes import (
    mixed_write,
    reader_hook,
    wide,
    write_maps,
    write_of,
    writer_hook,
    writer_points,
)
from mcp_interp.core.engine.backend.edits import Edit, Rewrite
from mcp_interp.core.engine.backend.points import hook_attn_out, hook_heads_sum, hook_result
from mcp_interp.core.engine.numbers import metrics
from mcp_interp.core.engine.numbers.row_readouts import RowMetric
from mcp_interp.core.engine.patching.pairs import Pairs
from mcp_interp.core.engine.text.tokens import Batch
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import Score

CHUNK_SECONDS = 2.0  # the longest stretch of ablated runs between a job's progress messages (on the measured speed)
ABLATED_COST = 2.0  # an ablated run's cost in plain forwards, before any was measured


def writer_values(backend: Any, graph: Graph, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every writer point's value in a plain forward of ``ids`` (within ``backend.edge_points``), with each post-norm
    layer's heads' sum."""
    names = writer_points(graph.writers, write_maps(backend))
    return backend.run(ids, capture=names, output="none", mode="no_grad").acts


def _delta(live: dict[str, torch.Tensor], replacement: dict[str, torch.Tensor], graph: Graph, w: int) -> torch.Tensor:
    """Writer ``w``'s live output minus its replacement, in float32 at least."""
    writer = graph.writers[w]
    return wide(write_of(live, writer)) - wide(write_of(replacement, writer))


def ablated_metric(
    backend: Any,
    graph: Graph,
    clean: Batch,
    circuit: set[tuple[int, int]],
    replacement: dict[str, torch.Tensor],
    metric: RowMetric,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """The metric per pair with every edge outside ``circuit`` (pairs of writer and reader indices)
    ablated to ``replacement`` (writer hook → values, as ``writer_values`` returns); only the pairs ``rows`` when
    given (a chunk of a long run: each pair's forward is independent of the others').

    A reader's upstream writers are always the first ``in_degree`` writers of ``build_graph``'s order
    (embeddings, then per layer its heads and its MLP; a parallel block's MLP reader stops before its own
    layer's heads). The running sum Σ (live − replacement) is therefore snapshotted at every length some
    reader needs, and each reader subtracts the snapshot of its own in-degree. Why not the sum so far: in
    a parallel block the layer's heads write (``hook_result`` fires) before its MLP reads (``hook_mlp_in``
    fires after attention), so "every writer recorded so far" includes writers that do not feed that MLP.

    On a post-norm layer (``edge_writes``) the heads enter the running sum together, as the layer's real write
    minus its write with every head replaced, recorded where the norm's output is added (``hook_attn_out``); a
    reader adds back the norm recomputed from the heads it takes (cached per set of heads within the forward).
    """
    if rows is not None:
        clean = Batch(
            [clean.texts[int(i)] for i in rows],
            clean.input_ids[rows],
            clean.attention_mask[rows],
            clean.answer_positions[rows],
        )
        replacement = {name: value[rows] for name, value in replacement.items()}
    n_layers = backend.n_layers
    maps = write_maps(backend)
    replaced_writes = {layer: wide(fn(replacement[hook_heads_sum(layer)])) for layer, fn in maps.items()}
    live: dict[str, torch.Tensor] = {}
    running: list[torch.Tensor] = []  # [Σ (live − replacement) over the writers seen so far]
    seen: list[int] = []  # writer indices in the order their writes were recorded
    by_hook_writers: dict[str, list[int]] = {}
    for w, writer in enumerate(graph.writers):
        normed = writer.kind == "head" and writer.layer in maps
        by_hook_writers.setdefault(hook_attn_out(writer.layer) if normed else writer_hook(writer), []).append(w)
    into: dict[int, list[int]] = {}
    for w, r in sorted(circuit):  # one order of summation for a set however it was built: equal sets, equal values
        into.setdefault(r, []).append(w)
    in_degree = upstream_prefixes(graph)
    needed = set(in_degree.values())
    snapshots: dict[int, torch.Tensor] = {}
    mixes: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}  # (layer, heads taken) → the recomputed write's change

    def add(delta: torch.Tensor, writers: list[int]) -> None:
        running[:] = [delta if not running else running[0] + delta]
        seen.extend(writers)
        if len(seen) in needed:
            snapshots[len(seen)] = running[0]

    def record(name: str) -> Callable[[torch.Tensor], None]:
        writers = by_hook_writers[name]
        layer = graph.writers[writers[0]].layer
        if graph.writers[writers[0]].kind == "head" and layer in maps:  # the layer's normed write, its heads at once

            def hook_normed(value: torch.Tensor) -> None:
                add(wide(value) - replaced_writes[layer], writers)

            return hook_normed

        def hook(value: torch.Tensor) -> None:
            live[name] = value
            for w in writers:
                add(_delta(live, replacement, graph, w), [w])

        return hook

    def keep(name: str) -> Callable[[torch.Tensor], None]:
        def hook(value: torch.Tensor) -> None:
            live[name] = value

        return hook

    def taken_from(layer: int, heads: list[int]) -> torch.Tensor:
        key = (layer, tuple(heads))
        if key not in mixes:
            taken = sum((_delta(live, replacement, graph, w) for w in heads), torch.zeros(()))
            mixes[key] = mixed_write(maps[layer], replacement[hook_heads_sum(layer)], taken, replaced_writes[layer])
        return mixes[key]

    def rebuild(name: str, readers: list[int]) -> Callable[[torch.Tensor], torch.Tensor]:
        def hook(value: torch.Tensor) -> torch.Tensor:
            value = value.clone()
            for r in readers:
                reader, k = graph.readers[r], in_degree[r]
                if seen[:k] != list(range(k)):
                    raise RuntimeError(f"writers recorded before {reader} are not its upstream writers")
                correction = -snapshots[k]
                normed_heads: dict[int, list[int]] = {}
                for w in into.get(r, []):
                    writer = graph.writers[w]
                    if writer.kind == "head" and writer.layer in maps:
                        normed_heads.setdefault(writer.layer, []).append(w)
                    else:
                        correction = correction + _delta(live, replacement, graph, w)
                for layer, heads in normed_heads.items():
                    correction = correction + taken_from(layer, heads)
                if reader.kind in ("q", "k", "v"):
                    value[:, :, reader.index] = (value[:, :, reader.index] + correction).to(value.dtype)
                else:
                    value = (value + correction).to(value.dtype)
            return value

        return hook

    readers_by_hook: dict[str, list[int]] = {}
    for r, reader in enumerate(graph.readers):
        readers_by_hook.setdefault(reader_hook(reader, n_layers), []).append(r)
    # A reader's input is rebuilt from writes recorded at other points: local only.
    edits: list[Edit] = [Rewrite(name, record(name), is_pure=False) for name in by_hook_writers]
    edits += [Rewrite(hook_result(layer), keep(hook_result(layer)), is_pure=False) for layer in maps]
    edits += [Rewrite(name, rebuild(name, readers), is_pure=False) for name, readers in readers_by_hook.items()]
    local = torch.arange(clean.input_ids.shape[0])
    logits = backend.logits(clean.input_ids, edits, mode="no_grad")
    return metric(logits[local, clean.answer_positions], local if rows is None else rows).to(torch.float64)


def upstream_prefixes(graph: Graph) -> Counter[int]:
    """Each reader's in-degree, checked to be a prefix: its upstream writers are writers 0..in_degree − 1."""
    in_degree = Counter(r for _, r in graph.edges)
    upstream: dict[int, list[int]] = {}
    for w, r in graph.edges:
        upstream.setdefault(r, []).append(w)
    for r, writers in upstream.items():
        if sorted(writers) != list(range(len(writers))):
            raise RuntimeError(f"the upstream writers of {graph.readers[r]} are not a prefix of the graph's writers")
    return in_degree


def replacement_values(
    backend: Any, graph: Graph, clean: Batch, corrupt: Batch, ablation: str
) -> dict[str, torch.Tensor]:
    if ablation == "corrupt":
        return writer_values(backend, graph, corrupt.input_ids)
    if ablation == "mean":
        if len(set(clean.lengths)) > 1:
            raise InputError(
                "ablation='mean' averages writes position by position: the clean prompts need equal lengths."
            )
        values = writer_values(backend, graph, clean.input_ids)
        return {name: value.mean(dim=0, keepdim=True).expand_as(value).clone() for name, value in values.items()}
    raise InputError(f"`ablation` must be 'corrupt' or 'mean', got {ablation!r}.")


def untested_writers(
    graph: Graph, live: dict[str, torch.Tensor], replacement: dict[str, torch.Tensor], real: torch.Tensor
) -> list[str]:
    """The heads and MLPs whose write on the clean prompts equals its replacement at every real position (``real``
    [batch, seq]): ablating an edge out of one changes nothing, so these pairs cannot show whether a circuit needs
    it — a component that writes the same on clean and corrupt inputs (or nothing) is invisible to patching, however
    much the output depends on it. Equal within float rounding: 1e-6 of the write's largest entry (at least 1)."""
    untested = []
    for writer in graph.writers:
        if writer.kind == "embed":
            continue
        write = wide(write_of(live, writer))[real]
        delta = write - wide(write_of(replacement, writer))[real]
        if float(delta.abs().max()) <= 1e-6 * max(1.0, float(write.abs().max())):
            untested.append(str(writer))
    return untested


def untested_note(ablator: Ablator) -> list[str]:
    if not ablator.untested:
        return []
    names = ablator.untested
    shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
    return [
        f"Untested by these pairs: {shown} write the same on the clean prompts as their replacement (the corrupt "
        "prompts' writes, or the mean), so no edge ablation here can show whether the circuit needs them, and a "
        "circuit leaving them out loses nothing. Ablate them directly (`ablate`, method zero or mean), or use pairs "
        "whose corruption changes their inputs."
    ]


def refuse_zero_gaps(clean: torch.Tensor, corrupt: torch.Tensor) -> None:
    """A recovered fraction divides by the clean − corrupt gap: a pair that does not change the metric has none."""
    gaps = (clean - corrupt).to(torch.float64)
    flat = [i for i, gap in enumerate(gaps.tolist()) if abs(gap) <= 1e-9]
    if flat:
        raise InputError(
            f"Pair(s) {flat} give the same logit difference clean and corrupt ({float(clean[flat[0]]):+.4f}): they do "
            "not change the metric, so no fraction of their gap is defined. Check that each corrupt prompt changes "
            "the answer, and drop the pairs that do not."
        )


class Ablator:
    """Exact runs of one set of pairs with edges outside a circuit ablated (use within ``backend.edge_points``):
    the replacement writes and the clean and corrupt metrics are computed once, each circuit costs one
    forward of the pairs."""

    def __init__(self, backend: Any, graph: Graph, pairs: Pairs, ablation: str) -> None:
        self.backend, self.graph, self.pairs = backend, graph, pairs
        self.replacement = replacement_values(backend, graph, pairs.clean, pairs.corrupt, ablation)
        live = writer_values(backend, graph, pairs.clean.input_ids)
        self.untested = untested_writers(graph, live, self.replacement, pairs.clean.attention_mask.bool())
        rows = torch.arange(pairs.n)
        clean, corrupt = pairs.clean, pairs.corrupt
        started = time.perf_counter()
        clean_logits = backend.logits(clean.input_ids, mode="no_grad")[rows, clean.answer_positions]
        # An ablated run costs about ABLATED_COST plain forwards (hooks rebuild every reader's input): the first
        # estimate of a pair's seconds, replaced by the measured one after each run.
        self.pair_seconds = ABLATED_COST * (time.perf_counter() - started) / max(1, pairs.n)
        corrupt_logits = backend.logits(corrupt.input_ids, mode="no_grad")[rows, corrupt.answer_positions]
        with torch.no_grad():
            self.clean_m = pairs.readout.from_logits(clean_logits, rows)
            self.corrupt_m = pairs.readout.from_logits(corrupt_logits, rows)
        refuse_zero_gaps(self.clean_m, self.corrupt_m)

    def run(self, circuit: set[tuple[int, int]]) -> torch.Tensor:
        """The metric per pair with every edge outside ``circuit`` ablated."""
        started = time.perf_counter()
        values = ablated_metric(
            self.backend, self.graph, self.pairs.clean, circuit, self.replacement, self.pairs.readout.from_logits
        )
        self.pair_seconds = (time.perf_counter() - started) / max(1, self.pairs.n)
        return values

    def chunks(self) -> list[torch.Tensor]:
        """The pairs in chunks of about ``CHUNK_SECONDS`` of ablated runs (one chunk when a whole run is quicker)."""
        per = max(1, int(CHUNK_SECONDS / max(self.pair_seconds, 1e-9)))
        return [torch.arange(i, min(i + per, self.pairs.n)) for i in range(0, self.pairs.n, per)]

    def run_chunked(self, circuit: set[tuple[int, int]]) -> Generator[tuple[int, int], None, torch.Tensor]:
        """``run`` in chunks of pairs, yielding (pairs done, pairs) after each chunk but the last, so a job's progress
        moves and other callers get the model within seconds of a long run (a whole run of SmolLM2 with answer sets
        took minutes). A run quicker than one chunk is one forward, exactly ``run``."""
        chunks = self.chunks()
        if len(chunks) == 1:
            return self.run(circuit)
        pieces = []
        for n, rows in enumerate(chunks):
            started = time.perf_counter()
            pieces.append(
                ablated_metric(
                    self.backend,
                    self.graph,
                    self.pairs.clean,
                    circuit,
                    self.replacement,
                    self.pairs.readout.from_logits,
                    rows,
                )
            )
            self.pair_seconds = (time.perf_counter() - started) / len(rows)
            if n + 1 < len(chunks):
                yield int(rows[-1]) + 1, self.pairs.n
        return torch.cat(pieces)

    def recovered(self, values: torch.Tensor) -> Score:
        """(values − corrupt) / (clean − corrupt): the recovered fraction, mean and per pair."""
        return metrics.recovered_fraction(values, self.clean_m, self.corrupt_m)

    def random_fractions(self, size: int, generator: random.Random, count: int) -> list[float | None]:
        """The recovered fraction of ``count`` random circuits of ``size`` edges (None where undefined)."""
        values = [self.recovered(self.run(set(generator.sample(self.graph.edges, size)))).value for _ in range(count)]
        return [v if math.isfinite(v) else None for v in values]
