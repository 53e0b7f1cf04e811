"""Transcoders and their math: per-layer transcoders (PLT) and cross-layer transcoders (CLT).

A transcoder replaces an MLP: it reads x, the MLP's input at layer l (its ``input_hooks[l]``), and writes a
reconstruction of the MLP's output (at ``output_hooks[l]``) from sparse feature activations::

    pre_l   = x_l · W_enc[l]ᵀ + b_enc[l]                        ([..., d_transcoder])
    a_l     = act(pre_l)        relu:     max(pre, 0)
                                jumprelu: pre · 1[pre > threshold]      (circuit-tracer: no ReLU first)
                                topk:     pre at the k largest entries, 0 elsewhere (no ReLU either)
    PLT:  ŷ_l = a_l · W_dec[l] + b_dec[l] + skip_l(x_l)
    CLT:  ŷ_l = Σ_{s ≤ l} a_s · W_dec[s][:, l − s] + b_dec[l] + skip_l(x_l)   (a layer-s feature writes to every
          layer from s on)
    skip_l(x) = x · W_skip[l]   (optional linear skip; a PLT file stores its transpose, fixed at load)

What differs between the two architectures is only where a feature's decoder rows go, so each is one class
with ``output_layers`` and ``decoder_rows``, found by circuit-tracer's ``model_kind`` in ``TRANSCODER_KINDS``.
The activations and thresholds follow circuit-tracer 0.5 exactly, so a graph built here equals its graph.
Weights are float32 on the model's device; ``transcoder_format`` reads circuit-tracer's files into these.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch

from mcp_interp.core.engine.backend.edits import Add, Edit
from mcp_interp.schemas.graphs import TranscoderKind

ActivationName = Literal["relu", "jumprelu", "topk"]


@dataclass(frozen=True, kw_only=True)
class Transcoders(ABC):
    """One transcoder per layer of the loaded model (a PLT set or a CLT), ready on the model's device.

    ``input_hooks[l]`` / ``output_hooks[l]`` are the bridge hooks layer l reads and writes (mapped from the
    config's ``feature_input_hook`` / ``feature_output_hook``). ``source`` is what the caller passed (a folder
    or a hub id), ``folder`` where the files were read, ``scan`` circuit-tracer's identifier of the set (the
    hub reference, or the folder). ``notes`` are warnings a result should carry.
    """

    kind: ClassVar[TranscoderKind]

    source: str
    folder: str
    scan: str
    feature_input_hook: str  # config.yaml's names, relative to blocks.{l}.
    feature_output_hook: str
    input_hooks: tuple[str, ...]
    output_hooks: tuple[str, ...]
    n_layers: int
    d_model: int
    d_transcoder: int
    activation: ActivationName
    W_enc: torch.Tensor  # [n_layers, d_transcoder, d_model]
    b_enc: torch.Tensor  # [n_layers, d_transcoder]
    b_dec: torch.Tensor  # [n_layers, d_model]: the decoder bias of each output layer
    threshold: torch.Tensor | None = None  # [n_layers, d_transcoder], jumprelu
    k: int | None = None  # topk
    W_skip: torch.Tensor | None = None  # [n_layers, d_model, d_model], skip_l(x) = x @ W_skip[l]
    model_name: str | None = None
    notes: tuple[str, ...] = field(default=())

    @abstractmethod
    def output_layers(self, layer: int) -> range:
        """The layers a layer-``layer`` feature writes to."""

    @abstractmethod
    def decoder_rows(self, layer: int, features: torch.Tensor | Sequence[int], out_layer: int) -> torch.Tensor:
        """``[n, d_model]``: what one unit of activation of each layer-``layer`` feature adds at ``out_layer``."""

    def pre_activations(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """``[..., d_model]`` → ``[..., d_transcoder]``: x · W_enc[layer]ᵀ + b_enc[layer] (the graph's feature
        targets are these, before the activation function)."""
        return x.to(self.W_enc.dtype) @ self.W_enc[layer].T + self.b_enc[layer]

    def activate(self, layer: int, pre: torch.Tensor) -> torch.Tensor:
        """Feature activations from pre-activations of the same shape (see the module docstring)."""
        if self.activation == "relu":
            return torch.relu(pre)
        if self.activation == "jumprelu":
            assert self.threshold is not None
            return pre * (pre > self.threshold[layer])
        assert self.k is not None
        _, indices = pre.topk(self.k, dim=-1)
        return pre * torch.zeros_like(pre).scatter_(-1, indices, 1.0)

    def encode(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Feature activations ``[..., d_transcoder]`` of layer ``layer``'s input ``x`` ``[..., d_model]``."""
        return self.activate(layer, self.pre_activations(layer, x))

    def skip(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """The skip connection's write at ``layer`` (zeros without one), ``[..., d_model]``."""
        if self.W_skip is None:
            return torch.zeros_like(x, dtype=self.W_enc.dtype)
        return x.to(self.W_skip.dtype) @ self.W_skip[layer]

    @property
    def has_skip(self) -> bool:
        return self.W_skip is not None

    def reconstruct(self, inputs: torch.Tensor, acts: torch.Tensor | None = None) -> torch.Tensor:
        """Every layer's reconstruction ``[n_layers, ..., d_model]`` from every layer's input ``[n_layers, ...,
        d_model]`` (``acts``: the activations to decode instead of encoding the inputs, same leading shape)."""
        if acts is None:
            acts = torch.stack([self.encode(layer, inputs[layer]) for layer in range(self.n_layers)])
        out = [self.b_dec[layer] + self.skip(layer, inputs[layer]) for layer in range(self.n_layers)]
        for source in range(self.n_layers):
            for target in self.output_layers(source):
                out[target] = out[target] + acts[source] @ self.decoder_matrix(source, target)
        return torch.stack(out)

    @abstractmethod
    def decoder_matrix(self, layer: int, out_layer: int) -> torch.Tensor:
        """``[d_transcoder, d_model]``: every layer-``layer`` feature's write at ``out_layer``."""

    def describe(self) -> str:
        skip = " with skip" if self.has_skip else ""
        what = "per-layer transcoders" if self.kind == "transcoder_set" else "a cross-layer transcoder"
        return (
            f"{what} ({self.activation}{skip}, {self.n_layers} × {self.d_transcoder} features) reading "
            f"{self.feature_input_hook}, writing {self.feature_output_hook}"
        )


@dataclass(frozen=True, kw_only=True)
class PerLayerTranscoders(Transcoders):
    """circuit-tracer's ``transcoder_set``: layer l's features write to layer l only."""

    kind: ClassVar[TranscoderKind] = "transcoder_set"
    W_dec: torch.Tensor  # [n_layers, d_transcoder, d_model]

    def output_layers(self, layer: int) -> range:
        return range(layer, layer + 1)

    def decoder_matrix(self, layer: int, out_layer: int) -> torch.Tensor:
        if out_layer != layer:
            raise ValueError(f"a per-layer transcoder at layer {layer} writes only to layer {layer}")
        return self.W_dec[layer]

    def decoder_rows(self, layer: int, features: torch.Tensor | Sequence[int], out_layer: int) -> torch.Tensor:
        return self.decoder_matrix(layer, out_layer)[torch.as_tensor(features, dtype=torch.long)]


@dataclass(frozen=True, kw_only=True)
class CrossLayerTranscoders(Transcoders):
    """circuit-tracer's ``cross_layer_transcoder``: a layer-s feature writes to layers s, s+1, …, n_layers − 1;
    ``W_dec[s]`` is ``[d_transcoder, n_layers − s, d_model]`` (slot j = output layer s + j)."""

    kind: ClassVar[TranscoderKind] = "cross_layer_transcoder"
    W_dec: tuple[torch.Tensor, ...]

    def output_layers(self, layer: int) -> range:
        return range(layer, self.n_layers)

    def decoder_matrix(self, layer: int, out_layer: int) -> torch.Tensor:
        if not layer <= out_layer < self.n_layers:
            raise ValueError(f"a layer-{layer} feature writes to layers {layer}..{self.n_layers - 1}")
        return self.W_dec[layer][:, out_layer - layer]

    def decoder_rows(self, layer: int, features: torch.Tensor | Sequence[int], out_layer: int) -> torch.Tensor:
        return self.W_dec[layer][torch.as_tensor(features, dtype=torch.long), out_layer - layer]


TRANSCODER_KINDS: dict[str, type[Transcoders]] = {cls.kind: cls for cls in (PerLayerTranscoders, CrossLayerTranscoders)}


@dataclass(frozen=True)
class TranscoderFeature:
    """One transcoder feature as a steering direction: its decoder rows at every layer it writes to.

    ``vector`` is the rows concatenated (``[n_out · d_model]``, the space a coefficient and a random
    comparison direction live in); ``edits(added)`` adds the matching slice of ``added`` (its last dimension:
    ``[n_out · d_model]``, or one such row per batch row) at each output point, every position.
    """

    transcoders: Transcoders
    layer: int
    feature: int

    @property
    def out_layers(self) -> range:
        return self.transcoders.output_layers(self.layer)

    @property
    def vector(self) -> torch.Tensor:
        rows = [self.transcoders.decoder_rows(self.layer, [self.feature], j)[0] for j in self.out_layers]
        return torch.cat(rows).detach().float().cpu()

    def edits(self, added: torch.Tensor) -> list[Edit]:
        d = self.transcoders.d_model
        return [
            Add(self.transcoders.output_hooks[out_layer], added[..., i * d : (i + 1) * d])
            for i, out_layer in enumerate(self.out_layers)
        ]

    def describe(self) -> str:
        return f"feature {self.feature} of layer {self.layer} of {self.transcoders.describe()}"
