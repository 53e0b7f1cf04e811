"""Every edge of an attribution graph equals an independent computation on `tiny`.

The graph (``AttributionGraphJob``: batched frozen forward, leaves at the MLP writes, contraction per layer ×
position, circuit-tracer's node order) is compared with plain computations through ``common.frozen_readout`` (the
model with patterns, norm scales and MLP writes *replaced by their clean values*, skip connections live):

* rows by autograd: for a target (a feature's pre-activation, or a demeaned logit), one scale c_s per source on its
  vector — activation × decoder row(s), error vector, embedding — all added at once; ∂target/∂c is the target's
  whole row. The error vectors and activations here are recomputed by hand from the raw tensors written to disk
  (so the loader's orientations are checked too).
* columns by finite differences: the frozen model is linear in a source's scale, so (y(+1) − y(−1)) / 2 is exact
  up to rounding for every target at once.

Sampled so that every kind of edge is present and compared: token → feature, feature → feature across layers,
error → feature, feature → logit, error → logit, token → logit.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.graphs.job import AttributionGraphJob
from tests.graphs.common import PROMPT, clt_weights, frozen_readout, plt_weights, write_clt, write_plt

TOLERANCE = 2e-4  # float32 edges of magnitude ≲ 5


def hand_activations(raw: list[dict[str, torch.Tensor]], inputs: torch.Tensor) -> torch.Tensor:
    """[L, T, F] activations from the raw tensors: JumpReLU (x·1[x > θ]) where a threshold is stored, else ReLU."""
    out = []
    for layer, weights in enumerate(raw):
        pre = inputs[layer] @ weights["W_enc"].T + weights["b_enc"]
        threshold = weights.get("activation_function.threshold", weights.get("threshold"))
        out.append(pre * (pre > threshold) if threshold is not None else torch.relu(pre))
    return torch.stack(out)


def hand_decoder(kind: str, raw: list[dict[str, torch.Tensor]], source: int, out_layer: int) -> torch.Tensor:
    weights = raw[source]["W_dec"]
    return weights if kind == "plt" else weights[:, out_layer - source]


def hand_errors(
    kind: str, raw: list[dict[str, torch.Tensor]], inputs: torch.Tensor, outputs: torch.Tensor
) -> torch.Tensor:
    acts = hand_activations(raw, inputs)
    errors = []
    for j, weights in enumerate(raw):
        recon = weights["b_dec"].expand_as(outputs[j]).clone()
        if "W_skip" in weights:
            recon = recon + inputs[j] @ weights["W_skip"].T  # circuit-tracer's orientation on disk
        for source in range(j + 1) if kind == "clt" else [j]:
            recon = recon + acts[source] @ hand_decoder(kind, raw, source, j)
        errors.append(outputs[j] - recon)
    return torch.stack(errors)


CASES = {
    "plt-jumprelu-skip": ("plt", dict(threshold=True, skip=True), dict(input_hook="mlp.hook_in")),
    "plt-resid-mid": ("plt", dict(), dict(input_hook="hook_resid_mid", output_hook="mlp.hook_out")),
    "clt": ("clt", dict(), dict()),
}


@pytest.fixture(scope="module", params=list(CASES))
def graph_case(request: Any, tiny: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    kind, weight_options, hooks = CASES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    d_model, n_layers = int(tiny.bridge.cfg.d_model), int(tiny.bridge.cfg.n_layers)
    if kind == "plt":
        raw = plt_weights(n_layers, d_model, 48, seed=3, **weight_options)
        source = write_plt(folder, raw, **hooks)
    else:
        raw = clt_weights(n_layers, d_model, 40, seed=5)
        source = write_clt(folder, raw)
    job = AttributionGraphJob(model=tiny, prompt=PROMPT, transcoders=source, max_feature_nodes=10_000, batch_size=32)
    drain(job)
    return {"kind": kind, "raw": raw, "job": job, "name": request.param}


@pytest.fixture(scope="module")
def replay(graph_case: dict[str, Any], tiny: LoadedModel) -> dict[str, Any]:
    """What the independent computations need: the clean run, the hand errors, the graph."""
    from mcp_interp.core.engine.dictionaries.transcoder_format import load_transcoders
    from mcp_interp.core.graphs.replacement import clean_run

    job = graph_case["job"]
    graph = job.graph
    tc = load_transcoders(job.transcoders, tiny)
    ids = torch.tensor([graph.token_ids])
    clean = clean_run(tiny, tc, ids)
    kind, raw = graph_case["kind"], graph_case["raw"]
    acts = hand_activations(raw, clean.inputs)
    errors = hand_errors(kind, raw, clean.inputs, clean.outputs)
    out = {"tc": tc, "clean": clean, "acts": acts, "errors": errors, "graph": graph, **graph_case}
    out["writes"] = feature_writes(out)
    return out


def feature_meta(graph: Any, node: int) -> tuple[int, int, int, float]:
    i = int(graph.selected[node])
    active = graph.active
    return int(active.layers[i]), int(active.positions[i]), int(active.features[i]), float(active.values[i])


def feature_writes(replay: dict[str, Any]) -> dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per output layer: (graph feature nodes writing there, their positions, activation × hand decoder row)."""
    graph, kind, raw, tc = replay["graph"], replay["kind"], replay["raw"], replay["tc"]
    writes: dict[int, tuple[list[int], list[int], list[torch.Tensor]]] = {
        j: ([], [], []) for j in range(graph.n_layers)
    }
    for node in range(graph.n_features):
        source, position, feature, value = feature_meta(graph, node)
        for j in tc.output_layers(source):
            writes[j][0].append(node)
            writes[j][1].append(position)
            writes[j][2].append(value * hand_decoder(kind, raw, source, j)[feature])
    return {
        j: (torch.tensor(n, dtype=torch.long), torch.tensor(p, dtype=torch.long), torch.stack(r))
        for j, (n, p, r) in writes.items()
        if n
    }


def additions(replay: dict[str, Any], scales: torch.Tensor) -> Any:
    """extra(layer) for frozen_readout: Σ_s scales[s] · vector_s over every source of the graph."""
    graph, clean, errors, writes = replay["graph"], replay["clean"], replay["errors"], replay["writes"]
    n_f, n_layers, n_pos = graph.n_features, graph.n_layers, graph.n_positions

    def extra(layer: str | int) -> torch.Tensor:
        if layer == "embed":
            return scales[n_f + n_layers * n_pos :, None] * clean.embeddings
        assert isinstance(layer, int)
        added = scales[n_f + layer * n_pos : n_f + (layer + 1) * n_pos, None] * errors[layer]
        if layer in writes:
            nodes, positions, rows = writes[layer]
            added = added.index_add(0, positions, scales[nodes, None] * rows)
        return added

    return extra


def target_value(replay: dict[str, Any], node: int, pre: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    graph = replay["graph"]
    if node < graph.n_features:
        layer, position, feature, _ = feature_meta(graph, node)
        return pre[layer, position, feature]
    return logits[node - (graph.n_nodes - len(graph.targets))]


def kinds_of_columns(graph: Any) -> list[str]:
    return [graph.kind(s) for s in range(graph.n_nodes - len(graph.targets))]


def test_rows_equal_autograd_through_the_frozen_model(replay: dict[str, Any], tiny: LoadedModel) -> None:
    graph = replay["graph"]
    n_sources = graph.n_nodes - len(graph.targets)
    layers = graph.active.layers[graph.selected]
    by_layer = {
        layer: int(torch.nonzero(layers == layer)[0]) for layer in range(graph.n_layers) if (layers == layer).any()
    }
    rows = sorted(by_layer.values())[1:] + list(range(graph.n_nodes - len(graph.targets), graph.n_nodes))[:2]
    assert len(rows) >= 3  # features at two layers above the first, two logits
    compared: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        scales = torch.zeros(n_sources, requires_grad=True)
        pre, logits = frozen_readout(
            tiny.bridge, replay["tc"], replay["clean"], graph.targets.vectors, additions(replay, scales)
        )
        (gradient,) = torch.autograd.grad(target_value(replay, row, pre, logits), scales)
        expected, actual = gradient.detach(), graph.adjacency[row, :n_sources]
        for kind, e, a in zip(kinds_of_columns(graph), expected.tolist(), actual.tolist(), strict=True):
            compared.setdefault((kind, graph.kind(row)), []).append(abs(e - a))
            assert abs(e - a) <= TOLERANCE * max(1.0, abs(e)), (replay["name"], row, kind, e, a)
    for pair in [("token", "feature"), ("feature", "feature"), ("error", "feature"), ("feature", "logit")]:
        assert pair in compared and len(compared[pair]) > 0, pair
    nonzero = {
        kind: int(
            (
                graph.adjacency[rows][:, :n_sources][:, torch.tensor([k == kind for k in kinds_of_columns(graph)])] != 0
            ).sum()
        )
        for kind in ("feature", "error", "token")
    }
    assert min(nonzero.values()) > 0, nonzero  # every kind of source has non-zero edges into these rows


def test_columns_equal_finite_differences(replay: dict[str, Any], tiny: LoadedModel) -> None:
    graph = replay["graph"]
    n_f, n_sources = graph.n_features, graph.n_nodes - len(graph.targets)
    layers = graph.active.layers[graph.selected]
    low = int(torch.nonzero(layers == 0)[0])  # a layer-0 feature: it has feature targets in later layers
    error = n_f + 0 * graph.n_positions + graph.n_positions - 2  # layer 0, second-to-last position
    token = n_f + graph.n_errors + graph.n_positions - 1  # the last token
    targets = list(range(n_f)) + list(range(graph.n_nodes - len(graph.targets), graph.n_nodes))
    for source in (low, error, token):

        def readout(c: float, source: int = source) -> torch.Tensor:
            scales = torch.zeros(n_sources)
            scales[source] = c
            with torch.no_grad():
                pre, logits = frozen_readout(
                    tiny.bridge, replay["tc"], replay["clean"], graph.targets.vectors, additions(replay, scales)
                )
            return torch.stack([target_value(replay, t, pre, logits) for t in targets])

        difference = (readout(1.0) - readout(-1.0)) / 2
        column = graph.adjacency[targets, source]
        assert torch.allclose(column, difference, atol=TOLERANCE, rtol=1e-4), (replay["name"], graph.kind(source))
        assert float(column.abs().max()) > 1e-3  # the source does reach some targets
