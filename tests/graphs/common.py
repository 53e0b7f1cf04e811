"""Transcoder sets written in circuit-tracer's on-disk format by the tests, and the independent frozen forward the
edge tests compare against.

``frozen_readout`` is written here from the definition, not from ``core/graphs``: the real model run with every
attention pattern and norm scale *replaced by its value from the clean run* (not detached), every MLP write
replaced by its clean value plus the skip connection's response to the live input, plus whatever the caller adds
(``extra``: a function of layer → a ``[T, d_model]`` addition at that MLP write, or at the embeddings for layer
"embed"). Its outputs are the transcoders' pre-activations of every layer and position and the last position's
demeaned logits — so a derivative of them with respect to a scale on a source's vector is an edge weight computed
by plain autograd through the model, independently of the batched leaves and contractions under test.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import save_file

from mcp_interp.core.engine.backend.bridge import frozen_hooks
from mcp_interp.core.engine.dictionaries.transcoders import Transcoders
from mcp_interp.core.graphs.replacement import CleanRun

PROMPT = "when mary and john went to the store , john gave a drink to"


def plt_weights(
    n_layers: int,
    d_model: int,
    d_transcoder: int,
    seed: int = 0,
    bias: float = -0.2,
    threshold: bool = False,
    skip: bool = False,
) -> list[dict[str, torch.Tensor]]:
    """Random per-layer transcoders in circuit-tracer's tensor names and orientations."""
    generator = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(n_layers):
        weights = {
            "W_enc": torch.randn(d_transcoder, d_model, generator=generator) / d_model**0.5,
            "b_enc": torch.randn(d_transcoder, generator=generator) * 0.3 + bias,
            "W_dec": torch.randn(d_transcoder, d_model, generator=generator) / d_transcoder**0.5,
            "b_dec": torch.randn(d_model, generator=generator) * 0.01,
        }
        if threshold:
            weights["activation_function.threshold"] = torch.rand(d_transcoder, generator=generator) * 0.3
        if skip:
            weights["W_skip"] = torch.randn(d_model, d_model, generator=generator) * 0.02
        layers.append(weights)
    return layers


def write_plt(
    folder: Path,
    layers: list[dict[str, torch.Tensor]],
    input_hook: str = "mlp.hook_in",
    output_hook: str = "hook_mlp_out",
    **config: Any,
) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for i, weights in enumerate(layers):
        save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / f"layer_{i}.safetensors"))
    cfg = {"model_kind": "transcoder_set", "feature_input_hook": input_hook, "feature_output_hook": output_hook}
    (folder / "config.yaml").write_text(yaml.safe_dump({**cfg, **config}), encoding="utf-8")
    return str(folder)


def clt_weights(
    n_layers: int, d_model: int, d_transcoder: int, seed: int = 0, threshold: bool = True
) -> list[dict[str, torch.Tensor]]:
    """Random cross-layer transcoder tensors: layer i's W_dec is [d_transcoder, n_layers − i, d_model]."""
    generator = torch.Generator().manual_seed(seed)
    layers = []
    for i in range(n_layers):
        weights = {
            "W_enc": torch.randn(d_transcoder, d_model, generator=generator) / d_model**0.5,
            "b_enc": torch.randn(d_transcoder, generator=generator) * 0.3 - 0.2,
            "b_dec": torch.randn(d_model, generator=generator) * 0.01,
            "W_dec": torch.randn(d_transcoder, n_layers - i, d_model, generator=generator) / d_transcoder**0.5,
        }
        if threshold:
            weights["threshold"] = torch.rand(d_transcoder, generator=generator) * 0.3
        layers.append(weights)
    return layers


def write_clt(folder: Path, layers: list[dict[str, torch.Tensor]], input_hook: str = "hook_resid_mid") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for i, weights in enumerate(layers):
        encoder = {f"W_enc_{i}": weights["W_enc"], f"b_enc_{i}": weights["b_enc"], f"b_dec_{i}": weights["b_dec"]}
        if "threshold" in weights:
            encoder[f"threshold_{i}"] = weights["threshold"]
        save_file(encoder, str(folder / f"W_enc_{i}.safetensors"))
        save_file({f"W_dec_{i}": weights["W_dec"].contiguous()}, str(folder / f"W_dec_{i}.safetensors"))
    cfg = {
        "model_kind": "cross_layer_transcoder",
        "feature_input_hook": input_hook,
        "feature_output_hook": "hook_mlp_out",
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return str(folder)


Extra = Callable[[str | int], torch.Tensor | None]


def frozen_readout(
    bridge: Any, tc: Transcoders, clean: CleanRun, vectors: torch.Tensor, extra: Extra
) -> tuple[torch.Tensor, torch.Tensor]:
    """(pre-activations ``[L, T, d_transcoder]``, last position's logits read out by ``vectors`` ``[k, d_model]``
    as u · final-norm output) of the frozen model with ``extra`` added (see the module docstring)."""
    pre: dict[int, torch.Tensor] = {}
    live: dict[int, torch.Tensor] = {}
    final: dict[str, torch.Tensor] = {}

    def frozen(name: str) -> Callable[[torch.Tensor, Any], torch.Tensor]:
        return lambda values, hook: clean.frozen[name].to(values.dtype)

    def read(layer: int) -> Callable[[torch.Tensor, Any], None]:
        def hook(values: torch.Tensor, hook: Any) -> None:
            live[layer] = values[0]
            pre[layer] = tc.pre_activations(layer, values[0])

        return hook

    def write(layer: int) -> Callable[[torch.Tensor, Any], torch.Tensor]:
        def hook(values: torch.Tensor, hook: Any) -> torch.Tensor:
            out = clean.outputs[layer] + tc.skip(layer, live[layer]) - tc.skip(layer, clean.inputs[layer])
            added = extra(layer)
            return (out if added is None else out + added).unsqueeze(0)

        return hook

    def embed(values: torch.Tensor, hook: Any) -> torch.Tensor:
        added = extra("embed")
        return values if added is None else values + added.unsqueeze(0)

    def keep_final(values: torch.Tensor, hook: Any) -> None:
        final["n"] = values[0, -1]

    hooks = [(name, frozen(name)) for name in frozen_hooks(bridge)]
    hooks += [(tc.input_hooks[layer], read(layer)) for layer in range(tc.n_layers)]
    hooks += [(tc.output_hooks[layer], write(layer)) for layer in range(tc.n_layers)]
    hooks += [("hook_embed", embed), ("ln_final.hook_out", keep_final)]
    with warnings.catch_warnings():  # the bridge warns when a norm's scale is edited: freezing it is that edit
        warnings.filterwarnings("ignore", message=".*hook_scale/hook_normalized.*")
        with bridge.hooks(fwd_hooks=hooks):
            bridge(clean.input_ids, return_type=None)
    return torch.stack([pre[layer] for layer in range(tc.n_layers)]), vectors @ final["n"]
