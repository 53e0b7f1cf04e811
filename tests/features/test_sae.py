"""SAEs in SAELens' format (``sae`` / ``sae_features``) on `tiny`: constructed dictionaries whose
activations, reconstructions and losses are computed here by hand from the bridge's own cache, and
bad input.

Every expected number is built in this file from ``bridge.run_with_cache`` and plain tensor algebra,
never with the functions under test.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import mcp_interp.figures as figures
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.dictionaries.sae import splice_edits
from mcp_interp.core.engine.dictionaries.saelens import load_sae
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.features import figures as features_figures
from mcp_interp.core.features.sae_report import sae_feature_activations, sae_report
from mcp_interp.errors import InputError

TEXT = "when mary and john went to the store , john gave a drink to"
TEXTS = ["when mary and john went to the store", "after tom went to the park , he gave a ball to mary"]
D = 64  # tiny's d_model (and n_heads × d_head = 4 × 16)


# --- helpers ------------------------------------------------------------------------------------


def write_sae(
    folder: Path,
    weights: dict[str, torch.Tensor],
    hook: str = "blocks.1.hook_resid_post",
    architecture: str | None = "standard",
    model_name: str = "tiny",
    **extra: Any,
) -> str:
    """A folder in SAELens 6 format: cfg.json (model fields under ``metadata``) + sae_weights.safetensors."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous() for name, t in weights.items()}, str(folder / "sae_weights.safetensors"))
    d_sae, d_in = weights["W_dec"].shape
    cfg: dict[str, Any] = {
        "d_in": d_in,
        "d_sae": d_sae,
        "dtype": "float32",
        "device": "cpu",
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "reshape_activations": "hook_z" if hook.endswith("hook_z") else "none",
        "metadata": {"sae_lens_version": "6.18.0", "model_name": model_name, "hook_name": hook, "prepend_bos": False},
    }
    if architecture is not None:
        cfg["architecture"] = architecture
    cfg.update(extra)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return str(folder)


def random_weights(d_sae: int, seed: int, d_in: int = D, scale: float = 0.3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "W_enc": torch.randn(d_in, d_sae, generator=g) * scale,
        "b_enc": torch.randn(d_sae, generator=g) * 0.1,
        "W_dec": torch.randn(d_sae, d_in, generator=g) * scale,
        "b_dec": torch.randn(d_in, generator=g) * 0.1,
    }


def activation(model: LoadedModel, text: str, hook: str) -> torch.Tensor:
    """The bridge's cached value at a SAELens hook name, [seq, ...], float64."""
    ids = encode(model.tokenizer, [text]).input_ids
    with torch.inference_mode():
        _, cache = model.bridge.run_with_cache(ids, names_filter=[hook])
    return cache[hook][0].to(torch.float64)


def mean_ce(model: LoadedModel, text: str, hooks: list[Any]) -> float:
    """Mean next-token cross-entropy of ``text`` with ``hooks``, by hand from log_softmax."""
    ids = encode(model.tokenizer, [text]).input_ids
    with torch.inference_mode(), model.bridge.hooks(fwd_hooks=hooks):
        logits = model.bridge(ids, return_type="logits")[0].to(torch.float64)
    log_probs = torch.log_softmax(logits[:-1], dim=-1)
    return float(-log_probs.gather(1, ids[0, 1:, None]).mean())


def replace_with(value: torch.Tensor) -> Any:
    def hook(v: torch.Tensor, hook: Any) -> torch.Tensor:
        return value.reshape(v.shape).to(v.dtype)

    return hook


def fve(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    return float(1 - ((x - x_hat) ** 2).sum() / ((x - x.mean(0)) ** 2).sum())


def top_by_hand(acts: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
    """Per token, the k largest activations > 0 as (feature, value), largest first."""
    rows = []
    for row in acts:
        order = sorted(range(len(row)), key=lambda i: -float(row[i]))[:k]
        rows.append([(i, float(row[i])) for i in order if row[i] > 0])
    return rows


def reported_top(measurement: Any) -> list[list[tuple[int, float]]]:
    return [[(f.feature, f.activation) for f in token.top_features] for token in measurement.per_token]


def assert_tops_equal(got: list[list[tuple[int, float]]], want: list[list[tuple[int, float]]]) -> None:
    assert [[f for f, _ in row] for row in got] == [[f for f, _ in row] for row in want]
    for row_got, row_want in zip(got, want, strict=True):
        assert [v for _, v in row_got] == pytest.approx([v for _, v in row_want], abs=1e-5)


# --- exact constructions ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hook",
    [
        "blocks.0.hook_resid_pre",
        "blocks.1.hook_resid_mid",
        "blocks.1.hook_resid_post",
        "blocks.2.hook_attn_out",
        "blocks.0.hook_mlp_out",
        "blocks.1.attn.hook_z",
    ],
)
def test_identity_dictionary_reconstructs_exactly(tiny: LoadedModel, tmp_path: Path, hook: str) -> None:
    """W_enc = [I, −I], W_dec = [I; −I]: features ±(x − b_dec)_j, x̂ = x exactly, so FVE = 1, spliced = clean."""
    eye = torch.eye(D)
    b_dec = torch.linspace(-0.5, 0.5, D)
    weights = {"W_enc": torch.cat([eye, -eye], 1), "b_enc": torch.zeros(2 * D), "W_dec": torch.cat([eye, -eye], 0)}
    folder = write_sae(tmp_path / "identity", {**weights, "b_dec": b_dec}, hook=hook)
    measurement, _ = sae_report(tiny, TEXT, folder, top_k=3)

    x = activation(tiny, TEXT, hook).flatten(1) - b_dec.double()  # [seq, 64]
    acts = torch.cat([x.clamp(min=0), (-x).clamp(min=0)], dim=1)
    assert measurement.fraction_variance_explained == pytest.approx(1.0, abs=1e-6)
    assert max(t.relative_error or 0.0 for t in measurement.per_token) < 1e-10
    assert measurement.l0 == pytest.approx(float((x != 0).sum(dim=1).double().mean()))
    assert_tops_equal(reported_top(measurement), top_by_hand(acts, 3))
    clean = mean_ce(tiny, TEXT, [])
    assert measurement.clean_loss == pytest.approx(clean, abs=1e-6)
    assert measurement.spliced_loss == pytest.approx(clean, abs=1e-5)
    assert measurement.loss_recovered == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize(
    ("hook", "d_in"),
    [
        ("blocks.1.hook_resid_post", D),
        ("blocks.0.hook_resid_pre", D),
        ("blocks.2.hook_attn_out", D),
        ("blocks.1.hook_mlp_out", D),
        ("blocks.1.attn.hook_z", D),
        ("blocks.2.mlp.hook_post", 128),
    ],
)
def test_standard_relu_with_bias_matches_hand_computation(
    tiny: LoadedModel, tmp_path: Path, hook: str, d_in: int
) -> None:
    w = random_weights(96, seed=1, d_in=d_in)
    folder = write_sae(tmp_path / "relu", w, hook=hook)
    measurement, heatmap = sae_report(tiny, TEXT, folder, top_k=5)

    x = activation(tiny, TEXT, hook).flatten(1)
    W_enc, b_enc, W_dec, b_dec = (w[n].double() for n in ("W_enc", "b_enc", "W_dec", "b_dec"))
    acts = torch.relu((x - b_dec) @ W_enc + b_enc)
    x_hat = acts @ W_dec + b_dec
    assert_tops_equal(reported_top(measurement), top_by_hand(acts, 5))
    assert [t.l0 for t in measurement.per_token] == [int(n) for n in (acts > 0).sum(dim=1)]
    assert measurement.l0 == pytest.approx(float((acts > 0).sum(dim=1).double().mean()))
    assert measurement.features_active == int((acts > 0).any(dim=0).sum())
    assert measurement.fraction_variance_explained == pytest.approx(fve(x, x_hat), abs=1e-5)
    assert measurement.fraction_variance_explained_excluding_first == pytest.approx(fve(x[1:], x_hat[1:]), abs=1e-5)
    relative = ((x - x_hat) ** 2).sum(dim=1) / (x**2).sum(dim=1)
    assert [t.relative_error for t in measurement.per_token] == pytest.approx(relative.tolist(), rel=1e-4)
    assert [t.activation_norm for t in measurement.per_token] == pytest.approx(x.norm(dim=1).tolist(), rel=1e-6)

    clean = mean_ce(tiny, TEXT, [])
    spliced = mean_ce(tiny, TEXT, [(hook, replace_with(x_hat))])
    zero = mean_ce(tiny, TEXT, [(hook, replace_with(torch.zeros_like(x)))])
    assert spliced != pytest.approx(clean, abs=1e-3)  # the construction is not trivially exact
    assert measurement.clean_loss == pytest.approx(clean, abs=1e-6)
    assert measurement.spliced_loss == pytest.approx(spliced, abs=1e-5)
    assert measurement.zero_ablation_loss == pytest.approx(zero, abs=1e-5)
    assert measurement.loss_recovered == pytest.approx((zero - spliced) / (zero - clean), abs=1e-4)

    # the heatmap: the union of the tokens' top-5 features, by peak activation, values from the hand acts
    union = {f for row in top_by_hand(acts, 5) for f, _ in row}
    want = sorted(union, key=lambda f: (-float(acts[:, f].max()), f))[:40]
    assert heatmap.features == want
    assert torch.tensor(heatmap.values, dtype=torch.float64) == pytest.approx(acts[:, want], abs=1e-5)
    assert heatmap.tokens == measurement.tokens and len(heatmap.tokens) == x.shape[0]


def test_splice_at_resid_mid_reaches_the_residual_stream(tiny: LoadedModel, tmp_path: Path) -> None:
    """resid_mid is written through attn_out: both the MLP's input and the stream the block carries on
    (resid_post − mlp_out) must equal the reconstruction, and the loss must match a hand splice."""
    w = random_weights(80, seed=2)
    folder = write_sae(tmp_path / "mid", w, hook="blocks.1.hook_resid_mid")
    sae = load_sae(folder, tiny)
    x = activation(tiny, TEXT, "blocks.1.hook_resid_mid")
    W_enc, b_enc, W_dec, b_dec = (w[n].double() for n in ("W_enc", "b_enc", "W_dec", "b_dec"))
    x_hat = torch.relu((x - b_dec) @ W_enc + b_enc) @ W_dec + b_dec

    ids = encode(tiny.tokenizer, [TEXT]).input_ids
    names = ["blocks.1.hook_resid_mid", "blocks.1.hook_resid_post", "blocks.1.hook_mlp_out"]
    cache = tiny.backend.run(ids, capture=names, edits=splice_edits(sae, sae.reconstruct)).acts
    carried = (cache["blocks.1.hook_resid_post"] - cache["blocks.1.hook_mlp_out"])[0].double()
    assert carried == pytest.approx(x_hat, abs=1e-4)
    assert cache["blocks.1.hook_resid_mid"][0].double() == pytest.approx(x_hat, abs=1e-4)

    resid_pre = activation(tiny, TEXT, "blocks.1.hook_resid_pre")
    spliced = mean_ce(tiny, TEXT, [("blocks.1.hook_attn_out", replace_with(x_hat - resid_pre))])
    zero = mean_ce(tiny, TEXT, [("blocks.1.hook_attn_out", replace_with(-resid_pre))])
    measurement, _ = sae_report(tiny, TEXT, folder)
    assert measurement.spliced_loss == pytest.approx(spliced, abs=1e-5)
    assert measurement.zero_ablation_loss == pytest.approx(zero, abs=1e-5)


@pytest.mark.parametrize("stored", ["threshold", "log_threshold"])
def test_jumprelu_thresholds(tiny: LoadedModel, tmp_path: Path, stored: str) -> None:
    hook = "blocks.2.hook_resid_pre"
    w = random_weights(48, seed=3)
    theta = torch.linspace(0.05, 0.6, 48)
    weights = {**w, stored: theta if stored == "threshold" else torch.log(theta)}
    folder = write_sae(tmp_path / "jump", weights, hook=hook, architecture="jumprelu")

    x = activation(tiny, TEXT, hook)
    pre = (x - w["b_dec"].double()) @ w["W_enc"].double() + w["b_enc"].double()
    acts = pre * (pre > theta.double())
    assert bool(((pre > 0) & (pre <= theta.double())).any())  # some features are cut by the threshold alone
    measurement, _ = sae_report(tiny, TEXT, folder, top_k=48)
    assert_tops_equal(reported_top(measurement), top_by_hand(acts, 48))
    assert [t.l0 for t in measurement.per_token] == [int(n) for n in (acts > 0).sum(dim=1)]

    features = sae_feature_activations(tiny, [TEXT], folder, list(range(48)))
    got = torch.tensor([f.texts[0].activations for f in features.features], dtype=torch.float64).T
    assert got == pytest.approx(acts, abs=1e-5)


def test_topk_keeps_exactly_the_k_largest(tiny: LoadedModel, tmp_path: Path) -> None:
    hook = "blocks.1.hook_mlp_out"
    w = random_weights(40, seed=4)
    w["b_enc"] = w["b_enc"] + 5.0  # every pre-activation > 0, so exactly k fire
    folder = write_sae(tmp_path / "topk", w, hook=hook, architecture="topk", k=3)
    x = activation(tiny, TEXT, hook)
    pre = (x - w["b_dec"].double()) @ w["W_enc"].double() + w["b_enc"].double()
    assert bool((pre > 0).all())
    values, indices = pre.topk(3, dim=1)
    acts = torch.zeros_like(pre).scatter(1, indices, values)

    measurement, _ = sae_report(tiny, TEXT, folder, top_k=10)
    assert [t.l0 for t in measurement.per_token] == [3] * x.shape[0]
    assert measurement.l0 == 3.0
    assert [{f for f, _ in row} for row in reported_top(measurement)] == [set(map(int, row)) for row in indices]
    assert_tops_equal(reported_top(measurement), top_by_hand(acts, 10))
    x_hat = acts @ w["W_dec"].double() + w["b_dec"].double()
    assert measurement.fraction_variance_explained == pytest.approx(fve(x, x_hat), abs=1e-5)

    # the same SAE in the pre-6.0 format: hook_point, activation_fn_str "topk", activation_fn_kwargs.k
    old = tmp_path / "topk_old"
    write_sae(old, w, hook=hook, architecture=None)
    (old / "cfg.json").write_text(
        json.dumps(
            {
                "d_in": D,
                "d_sae": 40,
                "hook_point": hook,
                "model_name": "tiny",
                "activation_fn_str": "topk",
                "activation_fn_kwargs": {"k": 3},
                "apply_b_dec_to_input": True,
                "normalize_activations": False,
            }
        )
    )
    old_measurement, _ = sae_report(tiny, TEXT, str(old), top_k=10)
    assert reported_top(old_measurement) == reported_top(measurement)


def test_topk_rescaled_by_decoder_norm(tiny: LoadedModel, tmp_path: Path) -> None:
    """rescale_acts_by_decoder_norm: pre × ‖W_dec row‖ picks the top k; decoding divides by the norm."""
    hook = "blocks.1.hook_resid_post"
    w = random_weights(40, seed=5)
    w["W_dec"] = w["W_dec"] * torch.linspace(0.2, 3.0, 40).unsqueeze(1)  # very different decoder norms
    folder = write_sae(tmp_path / "rescaled", w, hook=hook, architecture="topk", k=4, rescale_acts_by_decoder_norm=True)
    x = activation(tiny, TEXT, hook)
    norms = w["W_dec"].double().norm(dim=1)
    pre = ((x - w["b_dec"].double()) @ w["W_enc"].double() + w["b_enc"].double()) * norms
    values, indices = pre.topk(4, dim=1)
    acts = torch.zeros_like(pre).scatter(1, indices, values.clamp(min=0))
    x_hat = (acts / norms) @ w["W_dec"].double() + w["b_dec"].double()

    measurement, _ = sae_report(tiny, TEXT, folder, top_k=10)
    assert_tops_equal(reported_top(measurement), top_by_hand(acts, 10))
    relative = ((x - x_hat) ** 2).sum(dim=1) / (x**2).sum(dim=1)
    assert [t.relative_error for t in measurement.per_token] == pytest.approx(relative.tolist(), rel=1e-4)


def test_sae_features_on_padded_texts(tiny: LoadedModel, tmp_path: Path) -> None:
    hook = "blocks.0.hook_resid_post"
    w = random_weights(64, seed=6)
    folder = write_sae(tmp_path / "relu", w, hook=hook)
    wanted = [5, 63, 0, 17]
    measurement = sae_feature_activations(tiny, TEXTS, folder, wanted)

    per_text = []
    for text in TEXTS:  # each text alone: no padding anywhere
        x = activation(tiny, text, hook)
        per_text.append(torch.relu((x - w["b_dec"].double()) @ w["W_enc"].double() + w["b_enc"].double())[:, wanted])
    assert [f.feature for f in measurement.features] == wanted
    assert [len(t.tokens) for t in measurement.texts] == [a.shape[0] for a in per_text]
    for j, report in enumerate(measurement.features):
        for i, on_text in enumerate(report.texts):
            column = per_text[i][:, j]
            assert on_text.activations == pytest.approx(column.tolist(), abs=1e-5)
            assert on_text.max == pytest.approx(float(column.max()), abs=1e-5)
            assert on_text.max_position == int(column.argmax())
            assert on_text.max_token == measurement.texts[i].tokens[int(column.argmax())]
        everything = torch.cat([a[:, j] for a in per_text])
        assert report.max == pytest.approx(float(everything.max()), abs=1e-5)
        assert report.active_fraction == pytest.approx(float((everything > 0).double().mean()))


def test_dead_sae_and_one_token_text(tiny: LoadedModel, tmp_path: Path) -> None:
    hook = "blocks.1.hook_resid_post"
    w = random_weights(32, seed=7)
    w["b_enc"] = torch.full((32,), -1000.0)
    folder = write_sae(tmp_path / "dead", w, hook=hook)
    measurement, heatmap = sae_report(tiny, TEXT, folder)
    x = activation(tiny, TEXT, hook)
    x_hat = w["b_dec"].double().expand_as(x)  # no feature fires: x̂ = b_dec
    assert measurement.l0 == 0 and measurement.features_active == 0
    assert measurement.fraction_variance_explained == pytest.approx(fve(x, x_hat), abs=1e-6)
    assert measurement.fraction_variance_explained < 0
    assert any("L0 = 0" in note for note in measurement.notes)
    assert any("< 0" in note for note in measurement.notes)
    assert heatmap.features == []
    png = features_figures.token_feature_heatmap(heatmap.values, heatmap.tokens, heatmap.features, heatmap.title)
    assert figures.png_size(png)[0] >= 500

    one, _ = sae_report(tiny, "when", folder)
    assert one.tokens == ["when"]
    assert (one.clean_loss, one.spliced_loss, one.zero_ablation_loss, one.loss_recovered) == (None, None, None, None)
    assert one.fraction_variance_explained is None
    assert any("1 token" in note for note in one.notes)


def test_model_name_mismatch_is_a_note(tiny: LoadedModel, tmp_path: Path) -> None:
    w = random_weights(16, seed=8)
    other = sae_report(tiny, TEXT, write_sae(tmp_path / "other", w, model_name="gpt2"))[0]
    same = sae_report(tiny, TEXT, write_sae(tmp_path / "same", w, model_name="org/Tiny-Llama"))[0]
    assert any("'gpt2'" in note for note in other.notes)
    assert not any("does not look like" in note for note in same.notes)
    assert not any("BOS" in note for note in same.notes)
    metadata = {"hook_name": "blocks.1.hook_resid_post", "model_name": "tiny", "prepend_bos": True}
    bos = sae_report(tiny, TEXT, write_sae(tmp_path / "bos", w, metadata=metadata))[0]
    assert any("BOS" in note for note in bos.notes)  # `tiny`'s tokenizer adds no BOS


def test_loaded_saes_are_cached_until_the_weights_change(tiny: LoadedModel, tmp_path: Path) -> None:
    w = random_weights(16, seed=9)
    folder = write_sae(tmp_path / "cached", w)
    first, second = load_sae(folder, tiny), load_sae(folder, tiny)
    assert second.W_enc is first.W_enc
    assert first.W_enc == pytest.approx(w["W_enc"])
    changed = random_weights(16, seed=10)
    weights_file = tmp_path / "cached" / "sae_weights.safetensors"
    save_file({name: t.contiguous() for name, t in changed.items()}, str(weights_file))
    stat = weights_file.stat()
    os.utime(weights_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    third = load_sae(folder, tiny)
    assert third.W_enc == pytest.approx(changed["W_enc"])


def test_token_feature_heatmap_png(tiny: LoadedModel, tmp_path: Path) -> None:
    folder = write_sae(tmp_path / "fig", random_weights(64, seed=11))
    _, heatmap = sae_report(tiny, TEXT, folder, top_k=4)
    png = features_figures.token_feature_heatmap(heatmap.values, heatmap.tokens, heatmap.features, heatmap.title)
    width, height = figures.png_size(png)
    assert width >= 500 and height >= 350
    assert b"Description" in png and b"drink@12" in png


# --- bad input ----------------------------------------------------------------------------------


def test_bad_folders(tiny: LoadedModel, tmp_path: Path) -> None:
    download = r"huggingface-cli download gemma-scope-2b-pt-res-canonical/layer_12 --include 'width_16k/canonical/\*'"
    with pytest.raises(InputError, match=download):  # read as a hub id, which is not cached
        sae_report(tiny, TEXT, "gemma-scope-2b-pt-res-canonical/layer_12/width_16k/canonical")
    empty = tmp_path / "empty"
    (empty / "blocks.1.hook_resid_post").mkdir(parents=True)
    with pytest.raises(InputError, match=r"no cfg\.json"):
        sae_report(tiny, TEXT, str(empty))
    write_sae(empty / "blocks.1.hook_resid_post", random_weights(8, seed=0))
    with pytest.raises(InputError, match=r"subfolders \['blocks\.1\.hook_resid_post'\]"):
        sae_report(tiny, TEXT, str(empty))
    folder = write_sae(tmp_path / "no_weights", random_weights(8, seed=0))
    (tmp_path / "no_weights" / "sae_weights.safetensors").unlink()
    with pytest.raises(InputError, match=r"no sae_weights\.safetensors"):
        sae_report(tiny, TEXT, folder)
    with pytest.raises(InputError, match="is a file"):
        sae_report(tiny, TEXT, str(tmp_path / "empty" / "blocks.1.hook_resid_post" / "cfg.json"))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"architecture": "gated"}, r"`architecture` = 'gated'"),
        ({"architecture": "mystery"}, r"unknown `architecture` = 'mystery'"),
        ({"normalize_activations": "layer_norm"}, r"`normalize_activations` = 'layer_norm'"),
        ({"normalize_activations": "expected_average_only_in"}, r"`normalize_activations`.*fold"),
        ({"architecture": "topk"}, r"integer `k`"),
        ({"metadata": {"hook_name": "blocks.1.hook_resid_post", "hook_head_index": 2}}, r"`hook_head_index`"),
        ({"metadata": {"hook_name": "blocks.40.hook_resid_post"}}, r"`hook_name`.*layer 40.*0\.\.2"),
        ({"metadata": {"hook_name": "blocks.1.ln2.hook_normalized"}}, r"`hook_name` = 'blocks\.1\.ln2"),
        ({"metadata": {}}, r"`hook_name`.*missing"),
        ({"d_sae": "many"}, r"`d_sae` must be a positive integer"),
    ],
)
def test_bad_configs(tiny: LoadedModel, tmp_path: Path, overrides: dict[str, Any], match: str) -> None:
    folder = write_sae(tmp_path / "bad", random_weights(8, seed=0), **overrides)
    with pytest.raises(InputError, match=match):
        sae_report(tiny, TEXT, folder)


def test_mismatched_d_in_and_weights(tiny: LoadedModel, tmp_path: Path) -> None:
    small = write_sae(tmp_path / "small", random_weights(8, seed=0, d_in=32))
    with pytest.raises(InputError, match=r"`d_in` = 32 .* width 64 \(d_model\)"):
        sae_report(tiny, TEXT, small)
    z = write_sae(tmp_path / "z", random_weights(8, seed=0, d_in=48), hook="blocks.1.attn.hook_z")
    with pytest.raises(InputError, match=r"`d_in` = 48 .* width 64 \(n_heads × d_head\)"):
        sae_report(tiny, TEXT, z)
    w = random_weights(8, seed=0)
    w["W_enc"] = w["W_enc"][:, :6]
    with pytest.raises(InputError, match=r"`W_enc` has shape \[64, 6\]"):
        sae_report(tiny, TEXT, write_sae(tmp_path / "shape", w))
    no_threshold = write_sae(tmp_path / "jump", random_weights(8, seed=0), architecture="jumprelu")
    with pytest.raises(InputError, match="`threshold`"):
        sae_report(tiny, TEXT, no_threshold)


def test_bad_arguments(tiny: LoadedModel, tmp_path: Path) -> None:
    folder = write_sae(tmp_path / "ok", random_weights(128, seed=0))
    for top_k in (0, 101, True):
        with pytest.raises(InputError, match="`top_k`"):
            sae_report(tiny, TEXT, folder, top_k=top_k)
    for features in ([128], [-1], [3, 200]):
        with pytest.raises(InputError, match=r"`features`.*0\.\.127"):
            sae_feature_activations(tiny, TEXTS, folder, features)
    with pytest.raises(InputError, match="at most 256"):
        sae_feature_activations(tiny, TEXTS, folder, list(range(257)))
    with pytest.raises(InputError, match="`features` is empty"):
        sae_feature_activations(tiny, TEXTS, folder, [])


def test_pre_6_scaling_factor_is_folded_into_the_decoder(tiny: LoadedModel, tmp_path: Path) -> None:
    """A pre-6.0 ``scaling_factor`` s multiplies the activations before decoding: x̂ = (a·s)·W_dec + b_dec."""
    hook = "blocks.1.hook_resid_post"
    w = random_weights(24, seed=12)
    scale = torch.linspace(0.5, 2.0, 24)
    folder = write_sae(tmp_path / "scaled", {**w, "scaling_factor": scale}, hook=hook, finetuning_scaling_factor=True)
    x = activation(tiny, TEXT, hook)
    acts = torch.relu((x - w["b_dec"].double()) @ w["W_enc"].double() + w["b_enc"].double())
    x_hat = (acts * scale.double()) @ w["W_dec"].double() + w["b_dec"].double()
    measurement, _ = sae_report(tiny, TEXT, folder, top_k=24)
    assert_tops_equal(reported_top(measurement), top_by_hand(acts, 24))  # activations are before the scale
    assert measurement.fraction_variance_explained == pytest.approx(fve(x, x_hat), abs=1e-5)
    relative = ((x - x_hat) ** 2).sum(dim=1) / (x**2).sum(dim=1)
    assert [t.relative_error for t in measurement.per_token] == pytest.approx(relative.tolist(), rel=1e-4)
