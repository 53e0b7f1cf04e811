"""Transcoders in circuit-tracer's on-disk format, read onto `tiny`: each layout's tensors end up in the orientation
circuit-tracer uses (checked by computing encodings, skips and reconstructions by hand from the raw tensors), hub ids
resolve through the local caches only, and whatever does not fit the loaded model is refused with a message that
names the field and the fix."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import save_file

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.dictionaries.transcoder_format import load_transcoders
from mcp_interp.errors import InputError
from tests.graphs.common import clt_weights, plt_weights, write_clt, write_plt

L, D, F = 3, 64, 24


def inputs(seed: int = 0) -> torch.Tensor:
    return torch.randn(L, 7, D, generator=torch.Generator().manual_seed(seed))


def test_per_layer_set_with_jumprelu_and_skip(tiny: LoadedModel, tmp_path: Path) -> None:
    raw = plt_weights(L, D, F, seed=1, threshold=True, skip=True, bias=0.0)
    tc = load_transcoders(write_plt(tmp_path, raw, model_name="tiny"), tiny)
    x = inputs()
    assert (tc.kind, tc.activation, tc.has_skip, tc.d_transcoder) == ("transcoder_set", "jumprelu", True, F)
    assert tc.input_hooks == ("blocks.0.mlp.hook_in", "blocks.1.mlp.hook_in", "blocks.2.mlp.hook_in")
    assert tc.output_hooks[2] == "blocks.2.hook_mlp_out" and tc.notes == ()
    for layer, w in enumerate(raw):
        pre = x[layer] @ w["W_enc"].T + w["b_enc"]
        acts = pre * (pre > w["activation_function.threshold"])  # circuit-tracer: no ReLU before the jump
        assert torch.allclose(tc.encode(layer, x[layer]), acts, atol=1e-6)
        assert torch.allclose(tc.skip(layer, x[layer]), x[layer] @ w["W_skip"].T, atol=1e-6)  # W_skip stored transposed
        recon = acts @ w["W_dec"] + w["b_dec"] + x[layer] @ w["W_skip"].T
        assert torch.allclose(tc.reconstruct(x)[layer], recon, atol=1e-5)


def test_jumprelu_passes_negative_values_above_a_negative_threshold(tiny: LoadedModel, tmp_path: Path) -> None:
    raw = plt_weights(L, D, F, seed=7, threshold=True)
    raw[0]["activation_function.threshold"] = torch.full((F,), -10.0)  # as circuit-tracer: x · 1[x > θ], no ReLU
    tc = load_transcoders(write_plt(tmp_path, raw), tiny)
    x = inputs(4)
    pre = x[0] @ raw[0]["W_enc"].T + raw[0]["b_enc"]
    assert bool((pre < 0).any()) and torch.allclose(tc.encode(0, x[0]), pre, atol=1e-6)


def test_topk_from_the_config(tiny: LoadedModel, tmp_path: Path) -> None:
    raw = plt_weights(L, D, F, seed=2)
    tc = load_transcoders(write_plt(tmp_path, raw, activation="topk", k=3), tiny)
    x = inputs(1)
    pre = x[1] @ raw[1]["W_enc"].T + raw[1]["b_enc"]
    acts = tc.encode(1, x[1])
    assert tc.activation == "topk" and bool(((acts != 0).sum(-1) == 3).all())
    kept = pre.topk(3, dim=-1).indices
    assert torch.equal(acts.gather(-1, kept), pre.gather(-1, kept))


def test_cross_layer_transcoder(tiny: LoadedModel, tmp_path: Path) -> None:
    raw = clt_weights(L, D, F, seed=3)
    tc = load_transcoders(write_clt(tmp_path, raw), tiny)
    x = inputs(2)
    assert tc.kind == "cross_layer_transcoder" and tc.input_hooks[1] == "blocks.1.hook_resid_mid"
    assert list(tc.output_layers(1)) == [1, 2]
    acts = [(lambda p, t: p * (p > t))(x[i] @ w["W_enc"].T + w["b_enc"], w["threshold"]) for i, w in enumerate(raw)]
    for j in range(L):
        recon = raw[j]["b_dec"] + sum(acts[s] @ raw[s]["W_dec"][:, j - s] for s in range(j + 1))
        assert torch.allclose(tc.reconstruct(x)[j], recon, atol=1e-5)
    assert torch.equal(tc.decoder_rows(0, [4, 7], 2), raw[0]["W_dec"][[4, 7], 2])


def test_gemma_scope_layouts_are_transposed_like_circuit_tracer(tiny: LoadedModel, tmp_path: Path) -> None:
    raw = plt_weights(L, D, F, seed=4, threshold=True)
    gs2, npz = tmp_path / "gemma-scope-2", tmp_path / "gemma-scope"
    gs2.mkdir()
    npz.mkdir()
    skip = torch.randn(L, D, D) * 0.02
    for i, w in enumerate(raw):
        lowercase = {"w_enc": w["W_enc"].T.contiguous(), "w_dec": w["W_dec"], "b_enc": w["b_enc"], "b_dec": w["b_dec"],
                     "threshold": w["activation_function.threshold"], "affine_skip_connection": skip[i]}  # fmt: skip
        save_file(lowercase, str(gs2 / f"params_{i}.safetensors"))
        arrays = {"W_enc": w["W_enc"].T.numpy(), "W_dec": w["W_dec"].numpy(), "b_enc": w["b_enc"].numpy(),
                  "b_dec": w["b_dec"].numpy(), "threshold": w["activation_function.threshold"].numpy()}  # fmt: skip
        np.savez(npz / f"params_{i}.npz", **arrays)
    base = {"model_kind": "transcoder_set", "feature_input_hook": "mlp.hook_in", "feature_output_hook": "hook_mlp_out"}
    for folder, suffix in ((gs2, "safetensors"), (npz, "npz")):
        config = {**base, "transcoders": [f"params_{i}.{suffix}" for i in range(L)]}  # paths relative to the folder
        (folder / "config.yaml").write_text(yaml.safe_dump(config))
    x = inputs(3)
    from_gs2, from_npz = load_transcoders(str(gs2), tiny), load_transcoders(str(npz), tiny)
    for layer, w in enumerate(raw):
        pre = x[layer] @ w["W_enc"].T + w["b_enc"]
        expected = pre * (pre > w["activation_function.threshold"])
        assert torch.allclose(from_gs2.encode(layer, x[layer]), expected, atol=1e-6)
        assert torch.allclose(from_npz.encode(layer, x[layer]), expected, atol=1e-6)
        # circuit-tracer: W_skip = affine_skip_connectionᵀ, skip(x) = x @ W_skipᵀ = x @ affine
        assert torch.allclose(from_gs2.skip(layer, x[layer]), x[layer] @ skip[layer], atol=1e-6)
    assert not from_npz.has_skip


def fake_hub_cache(root: Path, repo: str, files: Path, subfolder: str) -> None:
    """The Hugging Face cache layout: models--org--repo/refs/main → a commit, snapshots/<commit>/<files>."""
    storage = root / ("models--" + repo.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    (storage / "refs").mkdir(parents=True)
    (storage / "refs" / "main").write_text(commit)
    target = storage / "snapshots" / commit / subfolder
    target.parent.mkdir(parents=True)
    os.symlink(files, target)


def test_hub_ids_come_from_the_local_caches_only(
    tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    folder = Path(write_plt(tmp_path / "files", plt_weights(L, D, F, seed=5)))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("CIRCUIT_TRACER_CACHE_DIR", str(tmp_path / "ct-cache"))
    with pytest.raises(
        InputError, match=r"not in this machine's Hugging Face cache.*hf download org/tiny-tc --include 'plt/\*'"
    ):
        load_transcoders("org/tiny-tc/plt", tiny)
    fake_hub_cache(tmp_path / "hub", "org/tiny-tc", folder, "plt")
    tc = load_transcoders("org/tiny-tc/plt", tiny)
    assert tc.scan == "org/tiny-tc//plt" and tc.source == "org/tiny-tc/plt" and tc.n_layers == L
    (tmp_path / "ct-cache" / "org").mkdir(parents=True)
    os.symlink(folder, tmp_path / "ct-cache" / "org" / "other")  # circuit-tracer's own cache is read first
    assert load_transcoders("org/other", tiny).folder == str(tmp_path / "ct-cache" / "org" / "other")


def test_loads_are_cached_until_a_file_changes(tiny: LoadedModel, tmp_path: Path) -> None:
    raw = plt_weights(L, D, F, seed=6)
    folder = write_plt(tmp_path, raw)
    first, second = load_transcoders(folder, tiny), load_transcoders(folder, tiny)
    assert first.W_enc is second.W_enc  # the same tensors: from the model's cache
    raw[0]["b_enc"] = raw[0]["b_enc"] + 1.0
    os.utime(write_plt(tmp_path, raw), None)
    third = load_transcoders(folder, tiny)
    assert torch.allclose(third.b_enc[0], first.b_enc[0] + 1.0)


def refusal(tiny: LoadedModel, folder: Path | str) -> str:
    with pytest.raises(InputError) as error:
        load_transcoders(str(folder), tiny)
    return str(error.value)


def test_what_does_not_fit_is_refused_with_the_reason(tiny: LoadedModel, tmp_path: Path) -> None:
    assert "2 layers of transcoders, but the loaded model 'tiny' has 3 layers" in refusal(
        tiny, write_plt(tmp_path / "two", plt_weights(2, D, F), model_name="gpt2")
    )
    assert "d_model = 64" in refusal(tiny, write_plt(tmp_path / "wide", plt_weights(L, 32, F)))
    assert "`feature_input_hook` = 'hook_resid_pre' is not a hook" in refusal(
        tiny, write_plt(tmp_path / "hook", plt_weights(L, D, F), input_hook="hook_resid_pre")
    )
    kind = Path(write_plt(tmp_path / "kind", plt_weights(L, D, F)))
    (kind / "config.yaml").write_text(yaml.safe_dump({"model_kind": "sae", "feature_input_hook": "mlp.hook_in"}))
    assert "`model_kind` = 'sae'" in refusal(tiny, kind)
    gap = Path(write_plt(tmp_path / "gap", plt_weights(L, D, F)))
    (gap / "layer_1.safetensors").unlink()
    assert "lacks layer_1.safetensors" in refusal(tiny, gap)
    missing = plt_weights(L, D, F)
    del missing[2]["b_dec"]
    assert "tensor `b_dec` is missing" in refusal(tiny, write_plt(tmp_path / "missing", missing))
    mixed = plt_weights(L, D, F, threshold=True)
    del mixed[1]["activation_function.threshold"]
    assert "some layers have a threshold" in refusal(tiny, write_plt(tmp_path / "mixed", mixed))
    assert "needs an integer `k`" in refusal(
        tiny, write_plt(tmp_path / "topk", plt_weights(L, D, F), activation="topk")
    )
    (tmp_path / "empty").mkdir()
    assert "has no config.yaml" in refusal(tiny, tmp_path / "empty")
    assert "is a file" in refusal(tiny, tmp_path / "two" / "config.yaml")
    assert "is not a folder on this machine" in refusal(tiny, tmp_path / "nonexistent" / "transcoders")
    assert "names a path outside the folders" in refusal(tiny, "/nonexistent/transcoders")  # outside the roots


def test_a_foreign_model_name_is_a_note(tiny: LoadedModel, tmp_path: Path) -> None:
    tc = load_transcoders(write_plt(tmp_path, plt_weights(L, D, F), model_name="google/gemma-2-2b"), tiny)
    assert len(tc.notes) == 1 and "'google/gemma-2-2b'" in tc.notes[0] and "replacement_score" in tc.notes[0]
