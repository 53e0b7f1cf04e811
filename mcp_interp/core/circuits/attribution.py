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

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from mcp_interp.core.circuits.edge_graph import Graph, Reader, Writer, build_graph
from mcp_interp.core.engine.backend.edits import Edit, Rewrite, Set
from mcp_interp.core.engine.backend.points import (
    HOOK_EMBED,
    hook_mlp_in,
    hook_mlp_out,
    hook_out,
    hook_qkv_input,
    hook_result,
)
from mcp_interp.core.engine.numbers.row_readouts import (
    RowMetric,  # here: (answer logits [rows, vocab], prompts) → [rows]
)
from mcp_interp.core.engine.text.tokens import Batch


def graph_of(backend: Any) -> Graph:
    cfg = backend.cfg
    n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    return build_graph(cfg.n_layers, cfg.n_heads, n_kv, bool(getattr(cfg, "parallel_attn_mlp", False)))


def writer_hook(writer: Writer) -> str:
    if writer.kind == "embed":
        return HOOK_EMBED
    return hook_result(writer.layer) if writer.kind == "head" else hook_mlp_out(writer.layer)


def reader_hook(reader: Reader, n_layers: int) -> str:
    if reader.kind == "logits":
        return hook_out(n_layers - 1)
    return hook_mlp_in(reader.layer) if reader.kind == "mlp" else hook_qkv_input(reader.layer, reader.kind)


def _select(values: dict[str, torch.Tensor], hook: str, index: int, per_head: bool) -> torch.Tensor:
    value = values[hook]
    return value[:, :, index] if per_head else value


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

    def total_steps(self) -> int:
        return 2 + (self.ig_steps if self.integrated else 1)

    def steps(self) -> Iterator[str]:
        graph, n_layers = self.graph, self.backend.n_layers
        writer_hooks = sorted({writer_hook(w) for w in graph.writers})
        reader_hooks = sorted({reader_hook(r, n_layers) for r in graph.readers})
        with self.backend.edge_points():
            clean_values, clean_metric = self._forward(self.clean, writer_hooks)
            yield "clean run"
            corrupt_values, corrupt_metric = self._forward(self.corrupt, writer_hooks)
            yield "corrupt run"
            alphas = [k / self.ig_steps for k in range(1, self.ig_steps + 1)] if self.integrated else [0.0]
            grads: dict[str, torch.Tensor] = {}
            for alpha in alphas:
                step = self._gradients(reader_hooks, clean_values[HOOK_EMBED], corrupt_values[HOOK_EMBED], alpha)
                for hook, grad in step.items():
                    grads[hook] = grads[hook] + grad if hook in grads else grad
                yield f"gradient at α = {alpha:.3f}"
        deltas = torch.stack(
            [
                (
                    _select(clean_values, writer_hook(w), w.index, w.kind == "head")
                    - _select(corrupt_values, writer_hook(w), w.index, w.kind == "head")
                ).flatten(1)
                for w in graph.writers
            ],
            dim=1,
        )  # [batch, writers, seq · d_model]
        gradients = torch.stack(
            [
                _select(grads, reader_hook(r, n_layers), r.index, r.kind in ("q", "k", "v")).flatten(1)
                for r in graph.readers
            ],
            dim=1,
        ) / len(alphas)  # [batch, readers, seq · d_model]
        per_pair = deltas @ gradients.transpose(1, 2)  # [batch, writers, readers]
        mask = torch.zeros(per_pair.shape[1:], dtype=torch.bool)
        writers_of, readers_of = zip(*graph.edges, strict=True)
        mask[list(writers_of), list(readers_of)] = True
        per_pair = torch.where(mask, per_pair, 0.0)
        self.result = EdgeScores(graph, per_pair.mean(dim=0), per_pair, clean_metric, corrupt_metric)

    def _forward(self, batch: Batch, points: list[str]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        run = self.backend.run(batch.input_ids, capture=points, mode="no_grad")
        assert run.logits is not None
        values = {name: value.to(torch.float64) for name, value in run.acts.items()}
        rows = torch.arange(batch.input_ids.shape[0])
        with torch.no_grad():
            return values, self.metric(run.logits[rows, batch.answer_positions], rows).detach()

    def _gradients(
        self, reader_hooks: list[str], clean_embed: torch.Tensor, corrupt_embed: torch.Tensor, alpha: float
    ) -> dict[str, torch.Tensor]:
        """∂(Σ over pairs of m)/∂(each reader hook's value) on the corrupt tokens, the embeddings moved a
        fraction ``alpha`` of the way to the clean ones (0: the corrupt run itself)."""
        captured: dict[str, torch.Tensor] = {}

        def keep(name: str) -> Edit:
            def hold(value: torch.Tensor) -> torch.Tensor:
                # The clone is what the rest of the forward consumes. Upstream of every weight (the
                # interpolated embeddings are constants) it is made a leaf that requires a gradient.
                captured[name] = value.clone() if value.requires_grad else value.detach().clone().requires_grad_()
                return captured[name]

            return Rewrite(name, hold, is_pure=False)

        edits: list[Edit] = [keep(name) for name in reader_hooks]
        if alpha:
            moved = corrupt_embed + alpha * (clean_embed - corrupt_embed)
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
        }
