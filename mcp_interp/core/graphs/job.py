"""The measurement behind ``attribution_graph``: circuit-tracer's ``attribute`` as a long job.

Phases (each a step or a run of steps, so progress is reported and a cancel stops between backward passes):

1. the real forward of the prompt: transcoder inputs and outputs, embeddings, patterns, norm scales; the active
   features and the error vectors (``replacement``); the logit targets (``targets``);
2. one forward of ``batch_size`` copies under the freezes (``FrozenForward``), its graph kept;
3. the logit rows: one backward per ``batch_size`` targets;
4. the feature rows, ``batch_size`` per backward: all active features in order when there are at most
   ``max_feature_nodes``; otherwise greedily, the features with the largest influence on the rows computed so
   far first, re-ranked every ``UPDATE_ROWS`` rows (circuit-tracer's ``compute_partial_influences``);
5. the square adjacency, pruning, the scores, the replacement model's logit check, the Neuronpedia JSON.

Cost: one forward of the prompt, one of ``batch_size`` copies, and ⌈targets / batch⌉ + ⌈feature rows / batch⌉
backward passes, each from the highest layer in its batch down to the embeddings (gradients never enter an MLP).
"""

from __future__ import annotations

import re
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.jobs import Job, per_step
from mcp_interp.core.graphs.intervene import replacement_logit_error
from mcp_interp.core.graphs.neuronpedia import AttributionGraph, neuronpedia_json
from mcp_interp.core.graphs.pruning import Pruned, graph_scores, normalized_rows, partial_influences, prune_graph
from mcp_interp.core.graphs.replacement import FrozenForward, Prepared, contract, prepare
from mcp_interp.core.graphs.summary import counts, significant, top_features, transcoder_info, view_graph
from mcp_interp.core.graphs.targets import DESIRED_PROBABILITY, MAX_LOGITS, LogitTargets, logit_targets, softcap_note
from mcp_interp.errors import InputError
from mcp_interp.schemas.graphs import AttributionGraphMeasurement, GraphTiming, LogitTarget

DEFAULT_MAX_FEATURE_NODES = 4096
MAX_FEATURE_NODES = 10_000
BATCH_SIZE = 64  # rows per backward (measured on SmolLM2: 3.2 ms per row at 32, 64 and 128)
UPDATE_ROWS = 1024  # greedy mode: rows between re-rankings (circuit-tracer's CLI: update_interval 4 × batch 256)
FEATURE_TICKS = 20  # progress steps over the feature rows
MAX_GRAPH_BYTES = 4 * 1024**3  # the edge rows, their normalised copy, the square adjacency and pruning's copies
MAX_LISTED_FEATURES = 50


@dataclass
class Clock:
    """Seconds spent per phase."""

    forward: float = 0.0
    backward: float = 0.0
    pruning: float = 0.0
    started: float = field(default_factory=time.perf_counter)


@dataclass(kw_only=True)
class AttributionGraphJob(Job[AttributionGraphMeasurement]):
    model: Any  # LoadedModel
    prompt: str
    transcoders: str
    targets: Sequence[str] | None = None
    node_threshold: float = 0.8
    edge_threshold: float = 0.98
    max_feature_nodes: int = DEFAULT_MAX_FEATURE_NODES
    top_k: int = 10
    batch_size: int = BATCH_SIZE
    result: AttributionGraphMeasurement | None = field(default=None, init=False)
    graph: AttributionGraph | None = field(default=None, init=False)
    pruned: Pruned | None = field(default=None, init=False)
    graph_json: dict[str, Any] | None = field(default=None, init=False)

    def total_steps(self) -> int:
        return 3 + FEATURE_TICKS + 1

    def _check(self) -> None:
        for name in ("node_threshold", "edge_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                raise InputError(
                    f"`{name}` is a share of the total influence in [0, 1], got {value!r}; 0.8 / 0.98 are usual."
                )
        count = self.max_feature_nodes
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_FEATURE_NODES:
            raise InputError(
                f"`max_feature_nodes` must be an integer from 0 to {MAX_FEATURE_NODES} (each costs a share of a "
                f"backward pass), got {count!r}."
            )
        if (
            isinstance(self.top_k, bool)
            or not isinstance(self.top_k, int)
            or not 1 <= self.top_k <= MAX_LISTED_FEATURES
        ):
            raise InputError(
                f"`top_k` (features listed) must be an integer from 1 to {MAX_LISTED_FEATURES}, got {self.top_k!r}."
            )

    def steps(self) -> Iterator[str]:
        require(self.model.backend, "attribution_graph")
        self._check()
        clock = Clock()
        prepared = prepare(self.model, self.prompt, self.transcoders)
        targets = logit_targets(self.model, prepared.clean.logits, self.targets)
        active, n_layers, n_positions = prepared.active, prepared.transcoders.n_layers, prepared.clean.n_positions
        n_rows = min(self.max_feature_nodes, active.n)
        n_columns = active.n + (n_layers + 1) * n_positions + len(targets)
        n_nodes = n_rows + (n_layers + 1) * n_positions + len(targets)
        needed = 4 * ((n_rows + len(targets)) * n_columns * (2 if n_rows < active.n else 1) + 6 * n_nodes**2)
        if needed > MAX_GRAPH_BYTES:
            raise InputError(
                f"This graph needs about {needed / 1e9:.1f} GB ({n_rows + len(targets)} rows × {n_columns} columns of "
                f"edges, {n_nodes} nodes), over the {MAX_GRAPH_BYTES / 1e9:.1f} GB limit: {active.n} features are "
                "active. Lower `max_feature_nodes` or shorten the prompt."
            )
        clock.forward += time.perf_counter() - clock.started
        yield f"real forward: {active.n} active features, {len(targets)} target logits"
        batch = min(self.batch_size, max(n_rows, len(targets)))
        edges = torch.zeros(n_rows + len(targets), n_columns)
        row_nodes = torch.zeros(n_rows + len(targets), dtype=torch.long)

        def rows() -> Generator[str, None, None]:
            started = time.perf_counter()
            frozen = FrozenForward(self.model, prepared.transcoders, prepared.input_ids, batch)
            clock.forward += time.perf_counter() - started
            yield f"frozen forward of {batch} copies"
            self._logit_rows(frozen, prepared, targets, edges, row_nodes, n_rows, clock)
            yield f"logit rows: {len(targets)}"
            yield from self._feature_rows(frozen, prepared, targets, edges, row_nodes, n_rows, clock)

        # The weights frozen per step (``per_step``): between steps the model is at rest for others' calls.
        yield from per_step(self.model.backend.weights_frozen, rows())
        self._finish(prepared, targets, edges, row_nodes, n_rows, clock)
        yield "pruned"

    def _logit_rows(
        self, frozen: FrozenForward, prepared: Prepared, targets: LogitTargets, edges: torch.Tensor,
        row_nodes: torch.Tensor, n_rows: int, clock: Clock,
    ) -> None:  # fmt: skip
        n_layers, n_positions = prepared.transcoders.n_layers, prepared.clean.n_positions
        first_logit = edges.shape[1] - len(targets)
        started = time.perf_counter()
        for i in range(0, len(targets), frozen.batch_size):
            vectors = targets.vectors[i : i + frozen.batch_size]
            k = int(vectors.shape[0])
            layers = torch.full((k,), n_layers, device=vectors.device)
            positions = torch.full((k,), n_positions - 1, device=vectors.device)
            last = n_rows == 0 and i + k >= len(targets)
            grad_embed, grad_outputs = frozen.gradients(layers, positions, vectors, last=last)
            edges[i : i + k, :first_logit] = contract(prepared.active, grad_embed, grad_outputs).cpu()
            row_nodes[i : i + k] = torch.arange(first_logit + i, first_logit + i + k)
        clock.backward += time.perf_counter() - started

    def _feature_rows(
        self, frozen: FrozenForward, prepared: Prepared, targets: LogitTargets, edges: torch.Tensor,
        row_nodes: torch.Tensor, n_rows: int, clock: Clock,
    ) -> Iterator[str]:  # fmt: skip
        active, batch = prepared.active, frozen.batch_size
        first_logit = edges.shape[1] - len(targets)
        visited = torch.zeros(active.n, dtype=torch.bool)
        done, row, tick = 0, len(targets), 0
        greedy = n_rows < active.n
        normalized = normalized_rows(edges) if greedy else None  # rows normalised once, as they are computed
        while done < n_rows:
            if normalized is None:
                pending = torch.arange(active.n)
            else:
                started = time.perf_counter()
                influence = partial_influences(normalized[:row], targets.probabilities.cpu(), row_nodes[:row])
                ranked = torch.argsort(influence[: active.n], descending=True)
                pending = ranked[~visited[ranked]][: min(UPDATE_ROWS, n_rows - done)]
                # the same rows, in layer order: a backward starts at its batch's highest layer, so layer-local
                # batches cost less than batches mixing every layer (the rows do not depend on the order)
                pending = pending[torch.argsort(active.layers.cpu()[pending], stable=True)]
                clock.pruning += time.perf_counter() - started
            for chunk in torch.split(pending, batch):
                started = time.perf_counter()
                done += len(chunk)
                index = chunk.to(active.layers.device)
                grads = frozen.gradients(
                    active.layers[index], active.positions[index], active.encoders[index], last=done >= n_rows
                )
                edges[row : row + len(chunk), :first_logit] = contract(active, *grads).cpu()
                if normalized is not None:
                    normalized[row : row + len(chunk)] = normalized_rows(edges[row : row + len(chunk)])
                row_nodes[row : row + len(chunk)] = chunk
                visited[chunk] = True
                row += len(chunk)
                clock.backward += time.perf_counter() - started
                while tick < FEATURE_TICKS and done >= (tick + 1) * n_rows / FEATURE_TICKS:
                    tick += 1
                    yield f"feature rows: {done} of {n_rows}"
        while tick < FEATURE_TICKS:
            tick += 1
            yield f"feature rows: {done} of {n_rows}"

    def _finish(
        self, prepared: Prepared, targets: LogitTargets, edges: torch.Tensor, row_nodes: torch.Tensor, n_rows: int,
        clock: Clock,
    ) -> None:  # fmt: skip
        active = prepared.active
        started = time.perf_counter()
        selected = torch.sort(row_nodes[len(targets) :]).values if n_rows else torch.zeros(0, dtype=torch.long)
        if n_rows < active.n:
            columns = torch.cat([selected, torch.arange(active.n, edges.shape[1])])
            edges = edges[:, columns]
        edges = edges[torch.argsort(row_nodes)]
        n_nodes = edges.shape[1]
        adjacency = torch.zeros(n_nodes, n_nodes)
        adjacency[:n_rows] = edges[:n_rows]
        adjacency[n_nodes - len(targets) :] = edges[n_rows:]
        graph = AttributionGraph(
            prompt=self.prompt,
            token_ids=[int(t) for t in prepared.input_ids[0]],
            tokens=prepared.tokens,
            n_layers=prepared.transcoders.n_layers,
            active=active,
            selected=selected.to(active.layers.device),
            adjacency=adjacency,
            targets=targets,
        )
        probabilities = targets.probabilities.cpu()
        pruned = prune_graph(
            adjacency, probabilities, n_rows, graph.n_positions, self.node_threshold, self.edge_threshold
        )
        replacement, completeness = graph_scores(adjacency, probabilities, n_rows, graph.n_errors, graph.n_positions)
        clock.pruning += time.perf_counter() - started
        started = time.perf_counter()
        logit_error = replacement_logit_error(self.model, prepared)
        clock.forward += time.perf_counter() - started
        self.graph, self.pruned = graph, pruned
        slug = "-".join(re.findall(r"[a-z0-9]+", self.prompt.lower()))[:48] or "graph"
        self.graph_json = neuronpedia_json(
            graph, pruned, slug, self.model.name, self._settings(), prepared.transcoders.scan
        )
        influence = pruned.node_influence
        kept_influence = (
            float(influence[pruned.node_mask].sum() / influence.sum()) if float(influence.sum()) > 0 else 0.0
        )
        nodes, links = view_graph(graph, pruned)
        self.result = AttributionGraphMeasurement(
            prompt=self.prompt,
            tokens=prepared.tokens,
            transcoders=transcoder_info(prepared.transcoders),
            targets=[
                LogitTarget(token=t, token_id=i, probability=significant(float(p)), logit=significant(lg))
                for t, i, p, lg in zip(targets.tokens, targets.ids, targets.probabilities, targets.logits, strict=True)
            ],
            logit_softcap=self.model.backend.final_logit_softcap(),
            targets_probability=float(targets.probabilities.sum()),
            first_node_position=active.first_node_position,
            node_threshold=self.node_threshold,
            edge_threshold=self.edge_threshold,
            max_feature_nodes=self.max_feature_nodes,
            counts=counts(graph, pruned),
            replacement_score=replacement,
            completeness_score=completeness,
            kept_influence=kept_influence,
            replacement_logit_error=logit_error,
            top_features=top_features(graph, pruned, self.top_k),
            nodes=nodes,
            links=links,
            timing=GraphTiming(
                forward_s=round(clock.forward, 3),
                backward_s=round(clock.backward, 3),
                pruning_s=round(clock.pruning, 3),
                total_s=round(time.perf_counter() - clock.started, 3),
            ),
            notes=self._notes(prepared, targets, n_rows, replacement, logit_error),
        )

    def _settings(self) -> dict[str, Any]:
        return {
            "node_threshold": self.node_threshold, "edge_threshold": self.edge_threshold,
            "max_n_logits": MAX_LOGITS, "desired_logit_prob": DESIRED_PROBABILITY, "batch_size": self.batch_size,
            "max_feature_nodes": self.max_feature_nodes,
        }  # fmt: skip

    def _notes(
        self, prepared: Prepared, targets: LogitTargets, n_rows: int, replacement: float, logit_error: float
    ) -> list[str]:
        active = prepared.active
        notes = list(prepared.transcoders.notes)
        if active.first_node_position:
            notes.append(
                f"Position 0 ({prepared.tokens[0]!r}) is a special token: it has no feature or error nodes, as in "
                "circuit-tracer (its MLP writes are constants of the graph; its token node stays)."
            )
        else:
            notes.append(
                f"The prompt starts with a real token ({prepared.tokens[0]!r}: this model's tokenizer adds no BOS), so "
                "position 0 has feature and error nodes; its activations are often an attention sink of huge norm."
            )
        if n_rows < active.n:
            notes.append(
                f"{active.n} features are active but max_feature_nodes = {self.max_feature_nodes}: the {n_rows} with "
                "the largest influence (ranked greedily on the rows computed so far) are the graph's feature nodes; "
                "the rest are dropped, their effect lost from the graph (not moved to the error nodes)."
            )
        if targets.salient and float(targets.probabilities.sum()) < DESIRED_PROBABILITY:
            notes.append(
                f"The {len(targets)} most probable tokens cover only {float(targets.probabilities.sum()):.2f} of the "
                f"probability (at most {MAX_LOGITS} logit nodes): the graph explains those, not the whole distribution."
            )
        capped = softcap_note(self.model, targets)
        if capped is not None:
            notes.append(capped)
        if not targets.salient and int(prepared.clean.logits.argmax()) not in targets.ids:
            top = self.model.tokenizer.decode([int(prepared.clean.logits.argmax())])
            notes.append(f"None of the given targets is the model's top-1 next token ({top!r}).")
        if replacement < 0.5:
            notes.append(
                f"replacement_score {replacement:.2f}: most of the influence from the input reaches the logits through "
                "error nodes, i.e. what the transcoders miss — read the features as a partial explanation."
            )
        if not logit_error <= 1e-3:
            notes.append(
                f"replacement_logit_error {logit_error:.2e} exceeds 1e-3: the replacement model does not reproduce the "
                "model (a bug in mcp-interp or a dtype below float32)."
            )
        return notes
