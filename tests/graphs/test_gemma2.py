"""Gemma-2 graphs: the logit nodes are the pre-cap logits, the probabilities are the model's own (after the cap).

The model: the tiny random Gemma-2 of the architecture matrix with its unembedding × 20, so the top pre-cap logits
(x ≈ 32–45) sit where the soft-cap 30 · tanh(x / 30) bends hard (capped ≈ 24–27, slope 0.18–0.38): a graph that read
the capped logits, or weighted its targets by the pre-cap softmax, fails each check below by far more than rounding.
The transcoders: random per-layer ones with b_dec = 0. Gemma-2 has no biases (attention, MLP and its RMS norms have
none) and the tokenizer adds no BOS (position 0 has nodes), so with the patterns and norm scales frozen the final
norm's output is the sum of what the token, feature and error nodes write: a logit node's incoming edges add up to
its value exactly, with no constant left over.

Each expected number is computed here from the weights and plain forwards of the bridge:
* the logit target: each node's `logit` is x_k = W_U[k] · n (n the final norm's output at the last position, read
  from the bridge's cache), 30 · tanh(x_k / 30) is the model's own logit, the node's incoming edges sum to the demeaned
  x_k (not the demeaned capped logit), and the targets and their probabilities are circuit-tracer's salient set of the
  softmax of the model's capped logits;
* the replacement and completeness scores, from the graph's adjacency by the closed form (I − B)⁻¹ of the normalised
  |adjacency| in float64 (the job iterates), with the logit weights the capped probabilities computed here;
* graph_intervene zeroing the top feature: its `direct` change equals the independent frozen forward of
  ``common.frozen_readout`` (pre-cap), its `model` change and probability the real model run by hand with that
  feature's decoder row taken away.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mcp_interp.core.engine.backend.loader.load import boot
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.dictionaries.transcoder_format import load_transcoders
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.graphs.intervene import graph_intervene
from mcp_interp.core.graphs.job import AttributionGraphJob
from mcp_interp.core.graphs.replacement import clean_run
from tests.architectures.builders import build_arch
from tests.graphs.common import PROMPT, frozen_readout, plt_weights, write_plt

CAP, UNEMBED_SCALE, D_TRANSCODER = 30.0, 20.0, 32


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    hf_model, tokenizer = build_arch("gemma2")
    assert hf_model.config.final_logit_softcapping == CAP
    with torch.no_grad():
        hf_model.lm_head.weight.mul_(UNEMBED_SCALE)
    model = boot("tiny-gemma2-capped", "local", "tiny-gemma2-capped", hf_model, tokenizer)
    cfg = model.bridge.cfg
    raw = plt_weights(int(cfg.n_layers), int(cfg.d_model), D_TRANSCODER, seed=3)
    for weights in raw:
        weights["b_dec"].zero_()
    folder = write_plt(tmp_path_factory.mktemp("gemma2") / "tc", raw)
    ids = encode(tokenizer, [PROMPT]).input_ids
    assert int(ids[0, 0]) not in tokenizer.all_special_ids  # position 0 has nodes: nothing is left out of the sums
    with torch.no_grad():
        real = model.bridge(ids)[0, -1].double()  # the model's own (capped) logits
        _, cache = model.bridge.run_with_cache(ids, names_filter=lambda n: n == "ln_final.hook_out")
    w_u = hf_model.lm_head.weight.detach().double()
    pre_cap = w_u @ cache["ln_final.hook_out"][0, -1].double()
    job = AttributionGraphJob(model=model, prompt=PROMPT, transcoders=folder, max_feature_nodes=10_000)
    result = drain(job)
    return {
        "model": model, "raw": raw, "folder": folder, "ids": ids, "real": real, "pre_cap": pre_cap, "w_u": w_u,
        "job": job, "result": result,
    }  # fmt: skip


def salient(probabilities: torch.Tensor, desired: float = 0.95, most: int = 10) -> list[int]:
    """circuit-tracer's salient logits: the most probable tokens until their probabilities reach ``desired``."""
    order = torch.argsort(probabilities, descending=True)[:most].tolist()
    chosen, total = [], 0.0
    for token in order:
        chosen.append(token)
        total += float(probabilities[token])
        if total >= desired:
            break
    return chosen


def test_the_logit_nodes_are_the_pre_cap_logits_and_their_edges_add_up_to_them(capped: dict[str, Any]) -> None:
    result, graph = capped["result"], capped["job"].graph
    real, pre_cap = capped["real"], capped["pre_cap"]
    assert result.logit_softcap == CAP
    assert float((CAP * torch.tanh(pre_cap / CAP) - real).abs().max()) < 1e-4  # the cap is all that differs
    model_probabilities = torch.softmax(real, dim=-1)
    assert [t.token_id for t in result.targets] == salient(model_probabilities)
    assert len(result.targets) == 7 != len(salient(torch.softmax(pre_cap, dim=-1)))  # pre-cap: 2 tokens reach 0.95
    rows = graph.adjacency[graph.n_nodes - len(graph.targets) :].double()
    for target, row in zip(result.targets, rows, strict=True):
        k = target.token_id
        assert target.logit == pytest.approx(float(pre_cap[k]), rel=1e-5)
        assert float(pre_cap[k] - real[k]) > 5  # far apart: the checks below tell them apart
        assert target.probability == pytest.approx(float(model_probabilities[k]), rel=1e-5)
        assert float(row.sum()) == pytest.approx(float(pre_cap[k] - pre_cap.mean()), abs=1e-4)
    assert result.replacement_logit_error < 1e-4  # pre-cap against pre-cap (capped against pre-cap: 26.6 here)
    assert any("soft-caps its logits" in note and "pre-cap" in note for note in result.notes)


def closed_form_scores(adjacency: torch.Tensor, weights: torch.Tensor, graph: Any) -> tuple[float, float]:
    """(replacement, completeness) from the definitions: B the |adjacency| with each row divided by its sum, a node's
    influence w·(B + B² + …) = w·((I − B)⁻¹ − I), w the logit nodes' probabilities; replacement = the tokens' influence
    over the tokens' and error nodes'; completeness = Σ (1 − a node's input share from error nodes) × (influence + w)
    / Σ (influence + w)."""
    a = adjacency.double().abs()
    sums = a.sum(dim=1, keepdim=True)
    b = torch.where(sums > 0, a / sums.clamp(min=1e-300), torch.zeros((), dtype=torch.float64))
    n = b.shape[0]
    w = torch.zeros(n, dtype=torch.float64)
    w[n - len(weights) :] = weights
    eye = torch.eye(n, dtype=torch.float64)
    influence = w @ (torch.linalg.inv(eye - b) - eye)
    errors = slice(graph.n_features, graph.n_features + graph.n_errors)
    tokens = slice(graph.n_features + graph.n_errors, graph.n_features + graph.n_errors + graph.n_positions)
    replacement = influence[tokens].sum() / (influence[tokens].sum() + influence[errors].sum())
    output = influence + w
    completeness = ((1 - b[:, errors].sum(dim=1)) * output).sum() / output.sum()
    return float(replacement), float(completeness)


def test_replacement_and_completeness_scores_weigh_the_targets_by_the_models_probabilities(
    capped: dict[str, Any],
) -> None:
    result, graph = capped["result"], capped["job"].graph
    ids = torch.tensor([t.token_id for t in result.targets])
    model_weights = torch.softmax(capped["real"], dim=-1)[ids]
    replacement, completeness = closed_form_scores(graph.adjacency, model_weights, graph)
    assert result.replacement_score == pytest.approx(replacement, abs=1e-5)
    assert result.completeness_score == pytest.approx(completeness, abs=1e-5)
    assert 0.6 < replacement < 0.8 and 0.8 < completeness < 0.95  # random transcoders: errors carry a real share
    pre_cap_weights = torch.softmax(capped["pre_cap"], dim=-1)[ids]  # the same graph weighted by the pre-cap softmax
    assert abs(closed_form_scores(graph.adjacency, pre_cap_weights, graph)[0] - replacement) > 1e-3


def test_intervening_moves_the_pre_cap_logits_by_what_the_graph_and_the_real_model_say(
    capped: dict[str, Any],
) -> None:
    model: LoadedModel = capped["model"]
    result, ids, raw, w_u = capped["result"], capped["ids"], capped["raw"], capped["w_u"]
    top = result.top_features[0]
    change = {"layer": top.layer, "position": top.position, "feature": top.feature, "value": 0.0}
    measured = graph_intervene(model, PROMPT, capped["folder"], [change], freeze_attention=False)
    assert measured.logit_softcap == CAP
    tc = load_transcoders(capped["folder"], model)
    clean = clean_run(model, tc, ids)
    weights = raw[top.layer]
    activation = torch.relu(
        clean.inputs[top.layer, top.position] @ weights["W_enc"][top.feature] + weights["b_enc"][top.feature]
    )
    assert float(activation) == pytest.approx(top.activation, rel=1e-5)
    removed = -activation * weights["W_dec"][top.feature]  # the feature's write, taken away
    vectors = w_u.float() - w_u.float().mean(dim=0)  # every demeaned pre-cap logit

    def at_the_feature(layer: str | int) -> torch.Tensor | None:
        if layer != top.layer:
            return None
        added = torch.zeros(clean.n_positions, int(w_u.shape[1]))
        added[top.position] = removed
        return added

    with torch.no_grad():
        _, frozen_clean = frozen_readout(model.bridge, tc, clean, vectors, lambda layer: None)
        _, frozen_new = frozen_readout(model.bridge, tc, clean, vectors, at_the_feature)

        def take_away(values: torch.Tensor, hook: Any) -> torch.Tensor:
            values = values.clone()
            values[0, top.position] += removed
            return values

        with model.bridge.hooks(fwd_hooks=[(f"blocks.{top.layer}.hook_mlp_out", take_away)]):
            real_new = model.bridge(ids)[0, -1].double()
            _, cache = model.bridge.run_with_cache(ids, names_filter=lambda n: n == "ln_final.hook_out")
    pre_cap, real = capped["pre_cap"], capped["real"]
    pre_cap_new = w_u @ cache["ln_final.hook_out"][0, -1].double()
    probabilities_new = torch.softmax(real_new, dim=-1)
    for row in measured.targets:
        k = row.token_id
        frozen_change = float(frozen_new[k] - frozen_clean[k])
        assert row.direct == pytest.approx(frozen_change, abs=1e-4)
        assert row.predicted_direct == pytest.approx(frozen_change, abs=1e-4)
        real_change = float((pre_cap_new[k] - pre_cap_new.mean()) - (pre_cap[k] - pre_cap.mean()))
        assert row.model == pytest.approx(real_change, abs=1e-4)
        assert row.clean_logit == pytest.approx(float(pre_cap[k]), rel=1e-5)
        assert row.clean_probability == pytest.approx(float(torch.softmax(real, dim=-1)[k]), rel=1e-5)
        assert row.model_probability == pytest.approx(float(probabilities_new[k]), rel=1e-4)
    capped_change = (real_new - real_new.mean()) - (real - real.mean())  # what a capped target would have reported
    assert max(abs(row.model - float(capped_change[row.token_id])) for row in measured.targets) > 0.05
    model_run = next(run for run in measured.runs if run.name == "model")
    kl = float((torch.softmax(real, -1) * (torch.log_softmax(real, -1) - torch.log_softmax(real_new, -1))).sum())
    assert model_run.kl_from_clean == pytest.approx(kl, rel=1e-3, abs=1e-7)
    assert measured.max_prediction_error < 1e-4
