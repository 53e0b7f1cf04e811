"""Edge attribution patching (EAP) and its integrated-gradients form (EAP-IG), grouped-query aware.

Score of the edge writer → reader (denoising form, the sign of TransformerLens' convention):

    score = mean over pairs of Σ_positions (a_clean[writer] − a_corrupt[writer]) · ∂m/∂(input of reader)

— the first-order estimate of how much the metric m moves when the reader's input gets the
writer's clean write instead of its corrupt one (nothing else changing). EAP takes the gradient on
the corrupt run. EAP-IG (Hanna et al. 2024; Marks et al. 2024) averages it over ``ig_steps`` runs
whose token embeddings lie on the straight line from the corrupt to the clean embeddings,
e(α) = e_corrupt + α (e_clean − e_corrupt) at α = k/ig_steps, k = 1 … ig_steps: the summed
attribution of the embeddings then approaches m(clean) − m(corrupt) (completeness of integrated
gradients), which the first-order estimate does not.

Why written here rather than called: TransformerLens 4.3's ``attribution_patch`` refuses
grouped-query attention (``_check_kv_heads_match_query_heads``) and raises ``NotImplementedError``
for ``ig_steps > 1``. The bridge itself exposes what is needed — each head's write (``hook_result``)
and each reader's own input, key/value inputs per key/value group (``backend.edge_points``) — so this module
reads those hooks and does the arithmetic; on a multi-head model its scores equal
``attribution_patch(..., EdgeAttributionConfig(granularity="edge"))`` summed over positions (a test).
Every score is an estimate, never a measurement: exact checks belong to path patching and
faithfulness.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from mcp_interp.core.circuits.edge_graph import Graph, Reader, build_graph
from mcp_interp.core.circuits.edge_writes import (
    one_edge_delta,
    patch_readers,
    reader_hook,
    reader_patch,
    wide,
    write_maps,
    write_of,
    writer_points,
)
from mcp_interp.core.engine.backend.edits import Edit, Rewrite, Set
from mcp_interp.core.engine.backend.points import HOOK_EMBED
from mcp_interp.core.engine.jobs import per_step
from mcp_interp.core.engine.numbers.row_readouts import (
    RowMetric,  # here: (answer logits [rows, vocab], prompts) → [rows]
)
from mcp_interp.core.engine.text.tokens import Batch


def graph_of(backend: Any) -> Graph:
    cfg = backend.cfg
    n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    return build_graph(cfg.n_layers, cfg.n_heads, n_kv, bool(getattr(cfg, "parallel_attn_mlp", False)))


def reader_input(values: dict[str, torch.Tensor], reader: Reader, n_layers: int) -> torch.Tensor:
    """A reader's own input (or its gradient) ``[batch, seq, d_model]`` out of the values at the reader points."""
    value = values[reader_hook(reader, n_layers)]
    return value[:, :, reader.index] if reader.kind in ("q", "k", "v") else value


@dataclass
class EdgeScores:
    """``scores`` [n_writers, n_readers] (0 where there is no edge; the mean over pairs of ``per_pair``,
    [batch, n_writers, n_readers]), the pairs' metric on the clean and corrupt runs, and the graph."""

    graph: Graph
    scores: torch.Tensor
    per_pair: torch.Tensor
    clean_metric: torch.Tensor  # [batch]
    corrupt_metric: torch.Tensor  # [batch]


class EdgeAttribution:
    """EAP / EAP-IG over the model's edge graph; ``steps()`` yields once per gradient run (progress)."""

    def __init__(
        self,
        *,
        backend: Any,
        clean: Batch,
        corrupt: Batch,
        metric: RowMetric,
        ig_steps: int = 1,
        integrated: bool = False,
    ) -> None:
        self.backend, self.clean, self.corrupt, self.metric = backend, clean, corrupt, metric
        self.ig_steps, self.integrated = ig_steps, integrated
        self.graph = graph_of(backend)
        self.result: EdgeScores | None = None
        self.normed_layers: list[int] = []  # post-norm layers, whose norm the scores linearise
        self.values: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] = ({}, {})  # clean, corrupt writes

    def total_steps(self) -> int:
        return 2 + (self.ig_steps if self.integrated else 1)

    def steps(self) -> Iterator[str]:
        graph, backend = self.graph, self.backend
        n_layers = backend.n_layers
        maps = write_maps(backend)
        self.normed_layers = sorted(maps)
        norms: dict[int, str] = {layer: backend.attention_write_norm(layer) for layer in maps}
        scale_points = {layer: backend.norm_scale_point(layer, norm) for layer, norm in norms.items()}
        frozen = {layer: backend.norm(layer, norm) for layer, norm in norms.items()}
        reader_hooks = sorted({reader_hook(r, n_layers) for r in graph.readers})
        per_pair, clean_metric, corrupt_metric = yield from per_step(
            backend.edge_points, self._edge_runs(maps, scale_points, frozen, reader_hooks)
        )  # per_pair: [batch, writers, readers]
        mask = torch.zeros(per_pair.shape[1:], dtype=torch.bool)
        writers_of, readers_of = zip(*graph.edges, strict=True)
        mask[list(writers_of), list(readers_of)] = True
        per_pair = torch.where(mask, per_pair, 0.0)
        self.result = EdgeScores(graph, per_pair.mean(dim=0), per_pair, clean_metric, corrupt_metric)

    def _edge_runs(
        self, maps: Any, scale_points: dict[int, str], frozen: dict[int, Any], reader_hooks: list[str]
    ) -> Generator[str, None, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The clean and corrupt runs and the gradients (under edge points, entered per step): the summed
        per-pair scores averaged over the integration steps, and the clean and corrupt metrics."""
        graph, n_layers = self.graph, self.backend.n_layers
        clean_values, clean_metric = self._forward(self.clean, writer_points(graph.writers, maps))
        yield "clean run"
        corrupt_values, corrupt_metric = self._forward(self.corrupt, writer_points(graph.writers, maps))
        yield "corrupt run"
        self.values = (clean_values, corrupt_values)
        deltas = torch.stack(
            [wide(write_of(clean_values, w)) - wide(write_of(corrupt_values, w)) for w in graph.writers], dim=1
        ).to(torch.float64)  # [batch, writers, seq, d_model]
        normed = [(i, w.layer) for i, w in enumerate(graph.writers) if w.kind == "head" and w.layer in maps]
        alphas = [k / self.ig_steps for k in range(1, self.ig_steps + 1)] if self.integrated else [0.0]
        per_pair = torch.zeros(deltas.shape[0], len(graph.writers), len(graph.readers), dtype=torch.float64)
        for alpha in alphas:
            grads, scales = self._gradients(
                reader_hooks, list(scale_points.values()), clean_values[HOOK_EMBED], corrupt_values[HOOK_EMBED],
                alpha,
            )  # fmt: skip
            step_deltas = deltas.clone() if normed else deltas
            for i, layer in normed:  # the post-norm's scale frozen at this gradient run
                step_deltas[:, i] = frozen_norm(frozen[layer], scales[scale_points[layer]], deltas[:, i])
            gradients = torch.stack(
                [reader_input(grads, r, n_layers) for r in graph.readers],
                dim=1,
            )  # [batch, readers, seq, d_model]
            per_pair += step_deltas.flatten(2) @ gradients.flatten(2).transpose(1, 2)
            yield f"gradient at α = {alpha:.3f}"
        return per_pair / len(alphas), clean_metric, corrupt_metric

    def exact_effects(self, edges: list[tuple[int, int]]) -> torch.Tensor:
        """Each edge's exact effect, ``[edges, pairs]``: the metric of the corrupt run whose reader alone gets the
        writer's clean write (on a post-norm layer, its norm recomputed: ``edge_writes``), minus the corrupt
        metric — what the edge's score estimates to first order. Runs after ``steps``."""
        assert self.result is not None
        clean_values, corrupt_values = self.values
        maps = write_maps(self.backend)
        graph, n_layers = self.graph, self.backend.n_layers
        patches = [
            reader_patch(
                graph.readers[r], n_layers, one_edge_delta(graph.writers[w], clean_values, corrupt_values, maps)
            )
            for w, r in edges
        ]
        corrupt = self.corrupt
        with self.backend.edge_points():
            patched = patch_readers(self.backend, corrupt.input_ids, corrupt.answer_positions, self.metric, patches)
        return patched.to(torch.float64) - self.result.corrupt_metric.to(torch.float64)

    def _forward(self, batch: Batch, points: list[str]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        run = self.backend.run(batch.input_ids, capture=points, mode="no_grad")
        assert run.logits is not None
        values = dict(run.acts)
        rows = torch.arange(batch.input_ids.shape[0])
        with torch.no_grad():
            return values, self.metric(run.logits[rows, batch.answer_positions], rows).detach()

    def _gradients(
        self,
        reader_hooks: list[str],
        scale_points: list[str],
        clean_embed: torch.Tensor,
        corrupt_embed: torch.Tensor,
        alpha: float,
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """∂(Σ over pairs of m)/∂(each reader hook's value) on the corrupt tokens, the embeddings moved a
        fraction ``alpha`` of the way to the clean ones (0: the corrupt run itself), and the values at
        ``scale_points`` (post-attention norms' scales) in that run."""
        captured: dict[str, torch.Tensor] = {}
        scales: dict[str, torch.Tensor] = {}

        def note(name: str) -> Edit:
            def hold(value: torch.Tensor) -> torch.Tensor:
                scales[name] = value.detach().to(torch.float64)
                return value

            return Rewrite(name, hold, is_pure=False)

        def keep(name: str) -> Edit:
            def hold(value: torch.Tensor) -> torch.Tensor:
                # The clone is what the rest of the forward consumes. Upstream of every weight (the
                # interpolated embeddings are constants) it is made a leaf that requires a gradient.
                captured[name] = value.clone() if value.requires_grad else value.detach().clone().requires_grad_()
                return captured[name]

            return Rewrite(name, hold, is_pure=False)

        edits: list[Edit] = [keep(name) for name in reader_hooks] + [note(name) for name in scale_points]
        if alpha:
            moved = (corrupt_embed + alpha * (clean_embed - corrupt_embed)).to(corrupt_embed.dtype)
            edits.insert(0, Set(HOOK_EMBED, moved))
        rows = torch.arange(self.corrupt.input_ids.shape[0])
        logits = self.backend.logits(self.corrupt.input_ids, edits, mode="grad")
        with torch.enable_grad():
            total = self.metric(logits[rows, self.corrupt.answer_positions], rows).sum()
        names = list(captured)
        grads = self.backend.backward(total, [captured[name] for name in names], allow_unused=True)
        return {
            name: (torch.zeros_like(captured[name]) if grad is None else grad).detach().to(torch.float64)
            for name, grad in zip(names, grads, strict=True)
        }, scales


def frozen_norm(
    norm: tuple[str, torch.Tensor, torch.Tensor | None], scale: torch.Tensor, delta: torch.Tensor
) -> torch.Tensor:
    """A change ``delta`` ``[batch, seq, d_model]`` of a norm's input carried through the norm with its scale frozen
    at ``scale`` ``[batch, seq, 1]`` (the linearisation DLA and circuit-tracer use): γ ⊙ Δ / scale, Δ centred first
    for a LayerNorm (``norm`` = (kind, γ, β) as ``backend.norm`` gives it; β cancels in a change)."""
    kind, gain, _ = norm
    if kind == "layer":
        delta = delta - delta.mean(dim=-1, keepdim=True)
    return delta * gain.to(delta) / scale.to(delta)
