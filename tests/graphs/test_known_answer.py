"""A known answer: `tiny` rebuilt so that one transcoder feature at one position writes the answer direction.

The model: layers 0 and 1 have their MLPs switched off (down projection 0); layer 2's MLP is one neuron whose gate
and up rows point along its input at the last position, and whose down column is c · u/‖u‖, u = W_U[" mary"] −
mean row (the demeaned unembedding of the answer). So at the last position layer 2 writes s · d (s the neuron's
value, d the down column) and nothing else writes into the residual stream from any MLP.

The transcoders: every feature dead (bias −1000, decoder 0) except feature 5 of layer 2, whose encoder reads the
same direction with a bias chosen so that its activation at the last position is exactly s, and whose decoder row
is d. So the replacement is exact where it matters: the error nodes of layers 0 and 1 are zero vectors, and the one
at (layer 2, last position) is float rounding.

What must follow, each computed independently of the graph code:
* feature 5 at the last position is the top feature by influence, every other feature has none (layer 2 is the last
  layer: writes at earlier positions reach no logit), and the replacement score is 1;
* its edge to each target logit is a · (γ ⊙ d / σ) · u_k — the final norm's weight γ, its frozen scale σ at the
  last position, the demeaned unembedding u_k — computed here from the weights;
* ``graph_intervene`` setting it to 0 moves each demeaned logit, with attention, norms and MLPs frozen, by exactly
  minus that edge; in the real model (norms live) by what zeroing layer 2's MLP write at the last position does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mcp_interp.core.engine.backend.bridge import final_norm_module
from mcp_interp.core.engine.backend.loader.load import boot
from mcp_interp.core.engine.backend.loader.tiny import build_tiny
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.graphs.intervene import graph_intervene
from mcp_interp.core.graphs.job import AttributionGraphJob
from tests.graphs.common import PROMPT, write_plt

ANSWER, FEATURE, D_TRANSCODER, WRITE = "mary", 5, 16, 30.0


@pytest.fixture(scope="module")
def constructed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    hf_model, tokenizer = build_tiny()
    model = boot("tiny-known-feature", "tiny", "tiny-known-feature", hf_model, tokenizer)
    layers = hf_model.model.layers
    ids = encode(tokenizer, [PROMPT]).input_ids
    answer = tokenizer.convert_tokens_to_ids(ANSWER)
    with torch.no_grad():
        for block in layers:
            block.mlp.down_proj.weight.zero_()
        _, cache = model.bridge.run_with_cache(ids, names_filter=lambda n: n == "blocks.2.mlp.hook_in")
        x = cache["blocks.2.mlp.hook_in"][0, -1]
        unit = x / x.norm()
        mlp = layers[2].mlp
        mlp.gate_proj.weight.zero_()
        mlp.up_proj.weight.zero_()
        mlp.gate_proj.weight[0] = 2 * unit
        mlp.up_proj.weight[0] = unit
        s = float(torch.nn.functional.silu(2 * x.norm()) * x.norm())  # the neuron's value at the last position
        w_u = hf_model.lm_head.weight
        u = w_u[answer] - w_u.mean(dim=0)
        d = (WRITE / s) * u / u.norm()  # the layer writes s · d = WRITE · u/‖u‖
        mlp.down_proj.weight[:, 0] = d
    n_layers, d_model = len(layers), int(x.numel())
    raw = []
    for layer in range(n_layers):
        weights = {
            "W_enc": torch.randn(D_TRANSCODER, d_model, generator=torch.Generator().manual_seed(layer)),
            "b_enc": torch.full((D_TRANSCODER,), -1000.0),
            "W_dec": torch.zeros(D_TRANSCODER, d_model),
            "b_dec": torch.zeros(d_model),
        }
        if layer == 2:
            weights["W_enc"][FEATURE] = unit
            weights["b_enc"][FEATURE] = s - float(x.norm())  # pre-activation s at the last position
            weights["W_dec"][FEATURE] = d
        raw.append(weights)
    folder = write_plt(tmp_path_factory.mktemp("known") / "tc", raw)
    return {"model": model, "folder": folder, "s": s, "d": d, "answer": answer, "ids": ids}


def closed_form_edge(model: LoadedModel, ids: torch.Tensor, activation: float, d: torch.Tensor, token: int) -> float:
    """a · (γ ⊙ d / σ) · u_k, σ = sqrt(mean(r²) + eps) of the final residual r at the last position."""
    norm = final_norm_module(model.bridge)
    with torch.no_grad():
        _, cache = model.bridge.run_with_cache(ids, names_filter=lambda n: n == "blocks.2.hook_out")
        r = cache["blocks.2.hook_out"][0, -1].double()
        sigma = torch.sqrt((r**2).mean() + norm.variance_epsilon)
        w_u = model.bridge.original_model.lm_head.weight.double()
        u = w_u[token] - w_u.mean(dim=0)
        return float(activation * (norm.weight.double() * d.double() / sigma) @ u)


def test_the_feature_is_the_graph_and_its_edges_are_the_closed_form(constructed: dict[str, Any]) -> None:
    model = constructed["model"]
    job = AttributionGraphJob(model=model, prompt=PROMPT, transcoders=constructed["folder"], max_feature_nodes=10_000)
    result = drain(job)
    last = len(result.tokens) - 1
    top = result.top_features[0]
    assert (top.layer, top.position, top.feature) == (2, last, FEATURE)
    assert top.activation == pytest.approx(constructed["s"], rel=1e-5)
    assert all(f.influence < 1e-9 for f in result.top_features[1:])  # no other feature reaches a logit
    assert result.targets[0].token_id == constructed["answer"] and result.targets[0].probability > 0.5  # top-1
    assert result.replacement_score == pytest.approx(1.0, abs=1e-6)
    assert result.replacement_logit_error <= 1e-4
    assert job.graph is not None
    for k, token in enumerate(job.graph.targets.ids):
        expected = closed_form_edge(model, constructed["ids"], constructed["s"], constructed["d"], token)
        row = job.graph.n_nodes - len(job.graph.targets) + k
        node = next(n for n in range(job.graph.n_features) if job.graph.describe(n)["node_id"] == top.node_id)
        assert float(job.graph.adjacency[row, node]) == pytest.approx(expected, rel=1e-4)
    assert top.direct_logit_effect == pytest.approx(
        closed_form_edge(model, constructed["ids"], constructed["s"], constructed["d"], constructed["answer"]), rel=1e-4
    )
    first = result.links[0]  # the most influential edge of the pruned graph
    assert (first.source, first.target) == (top.node_id, f"4_{constructed['answer']}_{last}")


def test_zeroing_the_feature_moves_each_logit_by_its_edge(constructed: dict[str, Any]) -> None:
    model, ids = constructed["model"], constructed["ids"]
    targets = [ANSWER, "john", "the"]
    measured = graph_intervene(
        model, PROMPT, constructed["folder"], [{"layer": 2, "position": -1, "feature": FEATURE, "value": 0.0}], targets
    )
    assert measured.interventions[0].clean_activation == pytest.approx(constructed["s"], rel=1e-5)
    with torch.no_grad():  # the real model with layer 2's MLP write at the last position removed
        clean = model.bridge(ids)[0, -1].double()

        def zero_last(values: torch.Tensor, hook: Any) -> torch.Tensor:
            values = values.clone()
            values[:, -1] = 0
            return values

        with model.bridge.hooks(fwd_hooks=[("blocks.2.hook_mlp_out", zero_last)]):
            ablated = model.bridge(ids)[0, -1].double()
    for row, token in zip(measured.targets, targets, strict=True):
        token_id = model.tokenizer.convert_tokens_to_ids(token)
        edge = closed_form_edge(model, ids, constructed["s"], constructed["d"], token_id)
        assert row.predicted_direct == pytest.approx(-edge, rel=1e-4, abs=1e-5)
        assert row.direct == pytest.approx(-edge, rel=1e-4, abs=1e-5)
        real = float((ablated[token_id] - ablated.mean()) - (clean[token_id] - clean.mean()))
        assert row.model == pytest.approx(real, rel=1e-4, abs=1e-4)
        assert row.replacement == pytest.approx(real, rel=1e-3, abs=1e-3)  # the error node there is ≈ 0
    assert measured.targets[0].model_probability < 0.01 < 0.5 < measured.targets[0].clean_probability  # answer gone
    assert measured.max_prediction_error < 1e-4


def test_a_bos_first_position_gets_no_nodes(constructed: dict[str, Any], tmp_path: Path) -> None:
    model = constructed["model"]
    prompt = "[BOS] " + PROMPT
    assert model.tokenizer(prompt)["input_ids"][0] == model.tokenizer.bos_token_id
    job = AttributionGraphJob(model=model, prompt=prompt, transcoders=constructed["folder"])
    result = drain(job)
    assert job.graph is not None
    assert result.first_node_position == 1 and int(job.graph.active.positions.min()) >= 1
    assert float(job.graph.active.errors[:, 0].abs().max()) == 0.0
    assert any("special token" in note for note in result.notes)
