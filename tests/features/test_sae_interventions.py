"""SAE features as interventions on `tiny`: feature ablation through `ablate` / `loss` equals a hand hook that
removes activation × decoder row at the SAE's hook (activations read from the unablated value), steering along
a feature adds coefficient × its decoder row, resid_mid is refused, and the `sae` / `sae_features` tools answer
over MCP with schema-valid results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from mcp import Client

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import Intervention
from tests.features.test_sae import TEXT, mean_ce, random_weights, write_sae
from tests.helpers import assert_valid_structured, error_text, tools_by_name

PROMPTS = ["when mary and john went to the store , john gave a drink to"] * 2


def hand_ablation_hook(weights: dict[str, torch.Tensor], features: list[int], z: bool = False) -> Any:
    """x − Σ_f a_f(x)·W_dec[f], with a = ReLU((x − b_dec)·W_enc + b_enc) of the *unablated* x."""

    def hook(values: torch.Tensor, hook: Any) -> torch.Tensor:
        x = values.flatten(-2) if z else values
        acts = torch.relu((x - weights["b_dec"]) @ weights["W_enc"] + weights["b_enc"])
        removed = acts[..., features] @ weights["W_dec"][features]
        return (x - removed).reshape(values.shape)

    return hook


@pytest.mark.parametrize(
    ("hook", "bridge_hook", "z"),
    [
        ("blocks.1.hook_resid_post", "blocks.1.hook_out", False),
        ("blocks.0.hook_mlp_out", "blocks.0.hook_mlp_out", False),
        ("blocks.1.attn.hook_z", "blocks.1.attn.hook_z", True),
    ],
)
def test_feature_ablation_equals_a_hand_hook(
    tiny: LoadedModel, tmp_path: Path, hook: str, bridge_hook: str, z: bool
) -> None:
    from mcp_interp.core.localize.ablate import ablate

    weights = random_weights(32, seed=4)
    folder = write_sae(tmp_path / "sae", weights, hook=hook)
    features = [3, 17, 29]
    spec = Intervention(ablate=[{"sae": folder, "features": features}])  # type: ignore[list-item]
    result = ablate(tiny, PROMPTS, spec, "mary", "john")
    ids = encode(tiny.tokenizer, PROMPTS).input_ids
    good, bad = (tiny.tokenizer.convert_tokens_to_ids(w) for w in ("mary", "john"))
    with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=[(bridge_hook, hand_ablation_hook(weights, features, z))]):
        logits = tiny.bridge(ids)[:, -1].double()
    expected = float((logits[:, good] - logits[:, bad]).mean())
    assert result.after.logit_diff is not None and result.before.logit_diff is not None
    assert result.after.logit_diff.value == pytest.approx(expected, abs=1e-5)
    assert abs(result.after.logit_diff.value - result.before.logit_diff.value) > 1e-3  # it did something
    assert result.targets == [f"SAE features {features} at {hook}"]


def test_feature_ablation_under_loss_and_resid_mid_refused(tiny: LoadedModel, tmp_path: Path) -> None:
    from mcp_interp.core.localize.loss import text_losses
    from mcp_interp.schemas.common import Intervention

    weights = random_weights(16, seed=2)
    folder = write_sae(tmp_path / "post", weights, hook="blocks.2.hook_resid_post")
    spec = Intervention(ablate=[{"sae": folder, "features": [0, 5]}])  # type: ignore[list-item]
    measured = text_losses(tiny, [TEXT], spec)
    by_hand = mean_ce(tiny, TEXT, [("blocks.2.hook_out", hand_ablation_hook(weights, [0, 5]))])
    assert measured.mean_loss == pytest.approx(by_hand, abs=1e-5)

    mid = write_sae(tmp_path / "mid", weights, hook="blocks.1.hook_resid_mid")
    with pytest.raises(InputError, match="resid_mid are not supported"):
        text_losses(tiny, [TEXT], Intervention(ablate=[{"sae": mid, "features": [0]}]))  # type: ignore[list-item]
    with pytest.raises(InputError, match=r"feature ids 0\.\.15"):
        text_losses(tiny, [TEXT], Intervention(ablate=[{"sae": folder, "features": [16]}]))  # type: ignore[list-item]


def test_steering_along_a_feature_adds_its_decoder_row(tiny: LoadedModel, tmp_path: Path) -> None:
    from mcp_interp.core.engine.backend.edits import Rewrite
    from mcp_interp.core.engine.dictionaries.saelens import load_sae
    from mcp_interp.core.lens.steer import greedy, steer

    weights = random_weights(16, seed=6)
    folder = write_sae(tmp_path / "sae", weights, hook="blocks.1.hook_resid_post")
    result = steer(tiny, TEXT, None, None, None, 3.0, 5, 0, feature=(load_sae(folder, tiny), 7))

    def add(values: torch.Tensor, hook: Any) -> torch.Tensor:
        return values + 3.0 * weights["W_dec"][7]

    ids = encode(tiny.tokenizer, [TEXT]).ids(0)
    assert result.steered_text == tiny.tokenizer.decode(
        greedy(tiny, ids, 5, [Rewrite("blocks.1.hook_out", lambda v: add(v, None))])
    )
    with torch.no_grad():
        base = torch.log_softmax(tiny.bridge(torch.tensor([ids]))[0, -1].double(), -1)
        with tiny.bridge.hooks(fwd_hooks=[("blocks.1.hook_out", add)]):
            moved = torch.log_softmax(tiny.bridge(torch.tensor([ids]))[0, -1].double(), -1)
    assert result.next_token_kl == pytest.approx(float((base.exp() * (base - moved)).sum()), abs=1e-6)
    assert (
        result.site == "resid_post"
        and result.layer == 1
        and result.vector_norm == pytest.approx(float(weights["W_dec"][7].norm()), rel=1e-6)
    )
    with pytest.raises(InputError, match=r"features 0\.\.15"):
        steer(tiny, TEXT, None, None, None, 3.0, 5, 0, feature=(load_sae(folder, tiny), 16))


@pytest.mark.anyio
async def test_sae_tools_over_mcp(tiny_client: Client, tmp_path: Path) -> None:

    folder = write_sae(tmp_path / "sae", random_weights(24, seed=1), hook="blocks.1.hook_resid_post")
    tools = await tools_by_name(tiny_client)
    report = assert_valid_structured(
        tools["sae"], await tiny_client.call_tool("sae", {"text": TEXT, "sae": folder, "top_k": 3})
    )
    acts = assert_valid_structured(
        tools["sae_features"],
        await tiny_client.call_tool("sae_features", {"texts": [TEXT], "sae": folder, "features": [2, 9]}),
    )
    steered = assert_valid_structured(
        tools["steer"],
        await tiny_client.call_tool(
            "steer", {"prompt": TEXT, "coefficient": 2.0, "sae": folder, "feature": 2, "max_new_tokens": 3}
        ),
    )
    missing = await tiny_client.call_tool("sae", {"text": TEXT, "sae": str(tmp_path / "nowhere")})
    half = await tiny_client.call_tool("steer", {"prompt": TEXT, "coefficient": 2.0, "sae": folder})
    figure = await tiny_client.read_resource(report["figure_uri"])
    n_tokens = len(TEXT.split())  # tiny's tokenizer is word-level
    assert len(report["per_token"]) == n_tokens and all(len(t["top_features"]) <= 3 for t in report["per_token"])
    assert [f["feature"] for f in acts["features"]] == [2, 9]
    assert len(acts["features"][0]["texts"][0]["activations"]) == n_tokens
    assert steered["sae_feature"].startswith("2 of standard SAE (24 features)")
    assert "cfg.json" in error_text(missing) or "not" in error_text(missing)
    assert "Give both `sae`" in error_text(half)
    assert report["tokens"] == TEXT.split()
    assert figure.contents[0].mime_type == "image/png"
