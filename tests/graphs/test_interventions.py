"""Transcoder features as intervention targets on `tiny`: ``ablate`` (and every ``intervention``) with
``{transcoders, layer, features}`` equals a hand hook that reads the activations at the MLP's input and removes
activation × decoder row from the MLP writes they feed (all of them for a cross-layer transcoder); ``mean`` replaces
them by their batch mean; ``steer`` adds coefficient × the decoder row; ``graph_intervene``'s real-model run equals
``ablate`` of the same feature at the same position."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.graphs.intervene import graph_intervene
from mcp_interp.core.localize.ablate import ablate
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import Intervention
from tests.graphs.common import PROMPT, clt_weights, plt_weights, write_clt, write_plt

PROMPTS = [PROMPT, "when tom and james went to the park , james gave a ball to"]


def logit_diff(model: LoadedModel, prompts: list[str], hooks: list[Any]) -> float:
    ids = encode(model.tokenizer, prompts).input_ids
    good, bad = (model.tokenizer.convert_tokens_to_ids(w) for w in ("mary", "john"))
    with torch.no_grad(), model.bridge.hooks(fwd_hooks=hooks):
        logits = model.bridge(ids)[:, -1].double()
    return float((logits[:, good] - logits[:, bad]).mean())


def removal_hooks(
    raw: list[dict[str, torch.Tensor]], layer: int, features: list[int], clt: bool, mask: Any = None
) -> list[Any]:
    """Read layer ``layer``'s input at its transcoder's input hook, remove Σ_f a_f · W_dec rows from each MLP write."""
    held: dict[str, torch.Tensor] = {}
    read = "blocks.{}.hook_resid_mid" if clt else "blocks.{}.mlp.hook_in"

    def keep(values: torch.Tensor, hook: Any) -> None:
        w = raw[layer]
        pre = values @ w["W_enc"].T + w["b_enc"]
        held["a"] = (pre * (pre > w["threshold"]) if clt else torch.relu(pre))[..., features]

    def remove(out_layer: int) -> Any:
        def hook(values: torch.Tensor, hook: Any) -> torch.Tensor:
            rows = raw[layer]["W_dec"][features, out_layer - layer] if clt else raw[layer]["W_dec"][features]
            change = held["a"] @ rows
            if mask is not None:
                change = change * mask
            return values - change

        return hook

    out_layers = range(layer, len(raw)) if clt else [layer]
    return [(read.format(layer), keep)] + [(f"blocks.{j}.hook_mlp_out", remove(j)) for j in out_layers]


def test_ablating_transcoder_features_equals_a_hand_hook(tiny: LoadedModel, tmp_path: Path) -> None:
    raw = plt_weights(3, 64, 32, seed=8)
    folder = write_plt(tmp_path, raw)
    features = [1, 4, 9, 20]
    spec = Intervention(ablate=[{"transcoders": folder, "layer": 1, "features": features}])  # type: ignore[list-item]
    result = ablate(tiny, PROMPTS, spec, "mary", "john")
    assert result.targets == ["transcoder features [1, 4, 9, 20] of layer 1"]
    expected = logit_diff(tiny, PROMPTS, removal_hooks(raw, 1, features, clt=False))
    assert result.after.logit_diff is not None and result.before.logit_diff is not None
    assert result.after.logit_diff.value == pytest.approx(expected, abs=1e-5)
    assert abs(result.after.logit_diff.value - result.before.logit_diff.value) > 1e-3


def test_a_cross_layer_features_removal_reaches_every_layer_it_writes(tiny: LoadedModel, tmp_path: Path) -> None:
    raw = clt_weights(3, 64, 24, seed=9)
    folder = write_clt(tmp_path, raw)
    spec = Intervention(ablate=[{"transcoders": folder, "layer": 0, "features": [2, 3, 5]}], positions="last")  # type: ignore[list-item]
    result = ablate(tiny, PROMPTS, spec, "mary", "john")
    assert len(result.targets) == 3  # its write to layers 0, 1 and 2
    ids = encode(tiny.tokenizer, PROMPTS).input_ids
    last = torch.zeros(ids.shape[0], ids.shape[1], 1)
    last[:, -1] = 1  # equal-length prompts: the answer position is the last column
    expected = logit_diff(tiny, PROMPTS, removal_hooks(raw, 0, [2, 3, 5], clt=True, mask=last))
    assert result.after.logit_diff is not None
    assert result.after.logit_diff.value == pytest.approx(expected, abs=1e-5)


def test_mean_ablation_replaces_the_activations_by_their_batch_mean(tiny: LoadedModel, tmp_path: Path) -> None:
    raw = plt_weights(3, 64, 32, seed=10)
    folder = write_plt(tmp_path, raw)
    spec = Intervention(ablate=[{"transcoders": folder, "layer": 2, "features": [0, 7]}], method="mean")  # type: ignore[list-item]
    result = ablate(tiny, PROMPTS, spec, "mary", "john")
    ids = encode(tiny.tokenizer, PROMPTS).input_ids
    with torch.no_grad():
        _, cache = tiny.bridge.run_with_cache(ids, names_filter=lambda n: n == "blocks.2.mlp.hook_in")
    acts = torch.relu(cache["blocks.2.mlp.hook_in"] @ raw[2]["W_enc"].T + raw[2]["b_enc"])[..., [0, 7]]
    mean = acts.mean(dim=0, keepdim=True)

    def to_mean(values: torch.Tensor, hook: Any) -> torch.Tensor:
        return values + (mean - acts) @ raw[2]["W_dec"][[0, 7]]

    assert result.after.logit_diff is not None
    assert result.after.logit_diff.value == pytest.approx(
        logit_diff(tiny, PROMPTS, [("blocks.2.hook_mlp_out", to_mean)]), abs=1e-5
    )


def test_graph_intervene_model_run_equals_ablate_at_that_position(tiny: LoadedModel, tmp_path: Path) -> None:
    raw = plt_weights(3, 64, 32, seed=12)
    folder = write_plt(tmp_path, raw)
    ids = encode(tiny.tokenizer, [PROMPT]).input_ids
    with torch.no_grad():
        _, cache = tiny.bridge.run_with_cache(ids, names_filter=lambda n: n == "blocks.1.mlp.hook_in")
        x = cache["blocks.1.mlp.hook_in"][0, 6]
    acts = torch.relu(x @ raw[1]["W_enc"].T + raw[1]["b_enc"])
    feature = int(acts.argmax())  # the strongest feature of layer 1 at position 6
    measured = graph_intervene(
        tiny, PROMPT, folder, [{"layer": 1, "position": 6, "feature": feature, "value": 0.0}], ["mary", "john"],
        freeze_attention=False,
    )  # fmt: skip
    spec = Intervention(ablate=[{"transcoders": folder, "layer": 1, "features": [feature]}], positions=[6])  # type: ignore[list-item]
    ablated = ablate(tiny, [PROMPT], spec, "mary", "john")
    mary, john = measured.targets
    assert ablated.after.logit_diff is not None and ablated.before.logit_diff is not None
    change = ablated.after.logit_diff.value - ablated.before.logit_diff.value
    assert mary.model - john.model == pytest.approx(change, abs=1e-5)  # demeaning cancels in a difference
    assert abs(change) > 1e-4
    assert measured.interventions[0].clean_activation == pytest.approx(float(acts[feature]), rel=1e-5)


def test_steering_along_a_transcoder_feature_adds_its_decoder_row(tiny: LoadedModel, tmp_path: Path) -> None:
    from mcp_interp.core.engine.dictionaries.transcoder_format import load_transcoders
    from mcp_interp.core.engine.dictionaries.transcoders import TranscoderFeature
    from mcp_interp.core.lens.steer import steer

    raw = plt_weights(3, 64, 32, seed=13)
    tc = load_transcoders(write_plt(tmp_path, raw), tiny)
    result = steer(tiny, PROMPT, None, None, None, 4.0, 3, 0, feature=TranscoderFeature(tc, 1, 11))
    ids = encode(tiny.tokenizer, [PROMPT]).input_ids

    def add(values: torch.Tensor, hook: Any) -> torch.Tensor:
        return values + 4.0 * raw[1]["W_dec"][11]

    with torch.no_grad():
        base = torch.log_softmax(tiny.bridge(ids)[0, -1].double(), -1)
        with tiny.bridge.hooks(fwd_hooks=[("blocks.1.hook_mlp_out", add)]):
            moved = torch.log_softmax(tiny.bridge(ids)[0, -1].double(), -1)
    assert result.next_token_kl == pytest.approx(float((base.exp() * (base - moved)).sum()), abs=1e-6)
    assert result.layer == 1 and result.site == "hook_mlp_out of layer 1"
    assert result.vector_norm == pytest.approx(float(raw[1]["W_dec"][11].norm()), rel=1e-6)


def test_bad_transcoder_targets_are_refused(tiny: LoadedModel, tmp_path: Path) -> None:
    folder = write_plt(tmp_path, plt_weights(3, 64, 32))
    for spec, message in (
        (
            {"transcoders": folder, "layer": 3, "features": [0]},
            r"layer 3 does not exist; the transcoders have layers 0\.\.2",
        ),
        ({"transcoders": folder, "layer": 0, "features": [32]}, r"feature ids 0\.\.31"),
        ({"transcoders": folder, "layer": 0, "features": []}, r"non-empty list"),
    ):
        with pytest.raises(InputError, match=message):
            ablate(tiny, PROMPTS, Intervention(ablate=[spec]), "mary", "john")  # type: ignore[list-item]
