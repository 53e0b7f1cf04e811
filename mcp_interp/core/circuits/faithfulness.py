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
by construction — the sanity pins a test holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from mcp_interp.core.bridge import edge_hooks
from mcp_interp.core.circuits.attribution import RowMetric, graph_of, reader_hook, writer_hook
from mcp_interp.core.circuits.graph import Graph
from mcp_interp.core.tokens import Batch
from mcp_interp.errors import InputError


def writer_values(bridge: Any, graph: Graph, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every writer hook's value in a plain forward of ``ids`` (with ``edge_hooks`` on)."""
    values: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Callable[[torch.Tensor, Any], None]:
        def hook(value: torch.Tensor, hook: Any) -> None:
            values[name] = value.detach().clone()

        return hook

    names = sorted({writer_hook(w) for w in graph.writers})
    with torch.no_grad(), bridge.hooks(fwd_hooks=[(name, keep(name)) for name in names]):
        bridge(ids, return_type=None)
    return values


def _write(values: dict[str, torch.Tensor], graph: Graph, w: int) -> torch.Tensor:
    writer = graph.writers[w]
    value = values[writer_hook(writer)]
    return value[:, :, writer.index] if writer.kind == "head" else value


def ablated_metric(
    bridge: Any,
    graph: Graph,
    clean: Batch,
    circuit: set[tuple[int, int]],
    replacement: dict[str, torch.Tensor],
    metric: RowMetric,
) -> torch.Tensor:
    """The metric per pair with every edge outside ``circuit`` (pairs of writer and reader indices)
    ablated to ``replacement`` (writer hook → values, as ``writer_values`` returns)."""
    n_layers = bridge.cfg.n_layers
    live: dict[str, torch.Tensor] = {}
    running: list[torch.Tensor] = []  # [Σ (live − replacement) over the writers seen so far]
    seen: list[int] = []  # writer indices in the order their writes were recorded
    by_hook_writers: dict[str, list[int]] = {}
    for w, writer in enumerate(graph.writers):
        by_hook_writers.setdefault(writer_hook(writer), []).append(w)
    into: dict[int, list[int]] = {}
    for w, r in circuit:
        into.setdefault(r, []).append(w)
    upstream_of = {r: {w for w, rr in graph.edges if rr == r} for r in range(len(graph.readers))}

    def record(name: str) -> Callable[[torch.Tensor, Any], None]:
        def hook(value: torch.Tensor, hook: Any) -> None:
            live[name] = value
            for w in by_hook_writers[name]:
                delta = _write(live, graph, w) - _write(replacement, graph, w).to(value.dtype)
                running[:] = [delta if not running else running[0] + delta]
                seen.append(w)

        return hook

    def rebuild(name: str, readers: list[int]) -> Callable[[torch.Tensor, Any], torch.Tensor]:
        def hook(value: torch.Tensor, hook: Any) -> torch.Tensor:
            value = value.clone()
            for r in readers:
                reader = graph.readers[r]
                if set(seen) != upstream_of[r]:
                    raise RuntimeError(f"writers recorded before {reader} are not its upstream writers")
                correction = -running[0]
                for w in into.get(r, []):
                    correction = correction + _write(live, graph, w) - _write(replacement, graph, w).to(value.dtype)
                if reader.kind in ("q", "k", "v"):
                    value[:, :, reader.index] += correction
                else:
                    value += correction
            return value

        return hook

    readers_by_hook: dict[str, list[int]] = {}
    for r, reader in enumerate(graph.readers):
        readers_by_hook.setdefault(reader_hook(reader, n_layers), []).append(r)
    fwd_hooks: list[tuple[str, Callable[..., Any]]] = [(name, record(name)) for name in by_hook_writers]
    fwd_hooks += [(name, rebuild(name, readers)) for name, readers in readers_by_hook.items()]
    rows = torch.arange(clean.input_ids.shape[0])
    with torch.no_grad(), bridge.hooks(fwd_hooks=fwd_hooks):
        logits = bridge(clean.input_ids, return_type="logits")
    return metric(logits[rows, clean.answer_positions], rows).to(torch.float64)


def replacement_values(
    bridge: Any, graph: Graph, clean: Batch, corrupt: Batch, ablation: str
) -> dict[str, torch.Tensor]:
    if ablation == "corrupt":
        return writer_values(bridge, graph, corrupt.input_ids)
    if ablation == "mean":
        if len(set(clean.lengths)) > 1:
            raise InputError(
                "ablation='mean' averages writes position by position: the clean prompts need equal lengths."
            )
        values = writer_values(bridge, graph, clean.input_ids)
        return {name: value.mean(dim=0, keepdim=True).expand_as(value).clone() for name, value in values.items()}
    raise InputError(f"`ablation` must be 'corrupt' or 'mean', got {ablation!r}.")


def faithfulness(
    bridge: Any,
    clean: Batch,
    corrupt: Batch,
    metric: RowMetric,
    circuits: Sequence[set[tuple[int, int]]],
    ablation: str = "corrupt",
) -> tuple[Graph, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(graph, clean metric, corrupt metric, the ablated metric per circuit), each per pair."""
    graph = graph_of(bridge)
    with edge_hooks(bridge):
        replacement = replacement_values(bridge, graph, clean, corrupt, ablation)
        rows_c, rows_k = torch.arange(clean.input_ids.shape[0]), torch.arange(corrupt.input_ids.shape[0])
        with torch.no_grad():
            clean_m = metric(bridge(clean.input_ids)[rows_c, clean.answer_positions], rows_c).to(torch.float64)
            corrupt_m = metric(bridge(corrupt.input_ids)[rows_k, corrupt.answer_positions], rows_k).to(torch.float64)
        results = [ablated_metric(bridge, graph, clean, circuit, replacement, metric) for circuit in circuits]
    return graph, clean_m, corrupt_m, results
