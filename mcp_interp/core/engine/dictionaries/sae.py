"""Sparse dictionaries — sparse autoencoders now, transcoders with the graphs family — and their math.

A dictionary reads an activation x at one site (``sites.Site``) of one layer and writes feature
activations a ≥ 0; each feature i has a decoder row W_dec[i], so the reconstruction is
x̂ = a · W_dec + b_dec. What differs between architectures is only how the pre-activations become
activations, so each architecture is one class with one method, ``activate``, found by its name in
``ARCHITECTURES`` (the names SAELens writes in ``cfg.json``)::

    pre = (x − b_dec if apply_b_dec_to_input else x) · W_enc + b_enc
    standard:  a = ReLU(pre)
    jumprelu:  a = ReLU(pre) · 1[pre > threshold]          (SAELens applies the ReLU, then the mask)
    topk:      a = ReLU(pre) at the k largest entries of pre, 0 elsewhere (ties: torch.topk's pick)

Weights are float32 on the model's device. ``saelens`` reads SAELens' folders into these classes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from mcp_interp.core.engine.backend.edits import Edit
from mcp_interp.core.engine.backend.sites import Site, replace_edits
from mcp_interp.schemas.sae import SaeArchitecture


@dataclass(frozen=True, kw_only=True)
class SparseAutoencoder(ABC):
    """One SAE, ready to run on the loaded model's device.

    ``hook_name`` is the bridge hook whose value the SAE reads; ``encode``/``decode`` work on the
    SAE's input space ``[..., d_in]`` (``to_input``/``from_input`` convert a hook's value, which for
    ``z`` is ``[..., n_heads, d_head]``). ``notes`` are warnings a result should carry (e.g. the
    SAE's model name differs from the loaded model's).
    """

    architecture: ClassVar[SaeArchitecture]

    folder: str
    saelens_hook: str  # cfg.json's hook_name
    site: Site
    layer: int
    hook_name: str  # the bridge hook
    d_in: int
    d_sae: int
    W_enc: torch.Tensor  # [d_in, d_sae]
    b_enc: torch.Tensor  # [d_sae]
    W_dec: torch.Tensor  # [d_sae, d_in]
    b_dec: torch.Tensor  # [d_in]
    apply_b_dec_to_input: bool
    model_name: str | None
    prepend_bos: bool | None
    notes: tuple[str, ...] = field(default=())

    @abstractmethod
    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        """Feature activations ``[..., d_sae]`` (≥ 0) from pre-activations of the same shape."""

    def to_input(self, values: torch.Tensor) -> torch.Tensor:
        """A hook's value ``[..., width]`` (``z``: ``[..., n_heads, d_head]``) → the SAE's input ``[..., d_in]``."""
        flat = values.flatten(-2) if self.site == "z" else values
        return flat.to(self.W_enc.dtype)

    def from_input(self, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``[..., d_in]`` → the shape and dtype of the hook's value ``like``."""
        return x.reshape(like.shape).to(like.dtype)

    def pre_activations(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., d_in]`` → ``[..., d_sae]``: (x − b_dec)·W_enc + b_enc (b_dec only with apply_b_dec_to_input)."""
        x = x.to(self.W_enc.dtype)
        if self.apply_b_dec_to_input:
            x = x - self.b_dec
        return x @ self.W_enc + self.b_enc

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations ``[..., d_sae]`` (≥ 0) of ``x`` ``[..., d_in]``."""
        return self.activate(self.pre_activations(x))

    def decode(self, acts: torch.Tensor) -> torch.Tensor:
        """The reconstruction ``[..., d_in]``: acts·W_dec + b_dec."""
        return acts.to(self.W_dec.dtype) @ self.W_dec + self.b_dec

    def reconstruct(self, values: torch.Tensor) -> torch.Tensor:
        """A hook's value replaced by the SAE's reconstruction of it (same shape and dtype)."""
        return self.from_input(self.decode(self.encode(self.to_input(values))), values)

    def describe(self) -> str:
        return f"{self.architecture} SAE ({self.d_sae} features) at {self.saelens_hook}"


@dataclass(frozen=True, kw_only=True)
class ReluSae(SparseAutoencoder):
    architecture: ClassVar[SaeArchitecture] = "standard"

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        return torch.relu(pre)


@dataclass(frozen=True, kw_only=True)
class JumpReluSae(SparseAutoencoder):
    architecture: ClassVar[SaeArchitecture] = "jumprelu"
    threshold: torch.Tensor  # [d_sae]

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        return torch.where(pre > self.threshold, torch.relu(pre), torch.zeros_like(pre))


@dataclass(frozen=True, kw_only=True)
class TopKSae(SparseAutoencoder):
    architecture: ClassVar[SaeArchitecture] = "topk"
    k: int

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        values, indices = pre.topk(self.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter_(-1, indices, torch.relu(values))


ARCHITECTURES: dict[str, type[SparseAutoencoder]] = {cls.architecture: cls for cls in (ReluSae, JumpReluSae, TopKSae)}


def splice_edits(sae: SparseAutoencoder, replace_fn: Callable[[torch.Tensor], torch.Tensor]) -> list[Edit]:
    """Edits that replace the SAE's activation ``v`` by ``replace_fn(v)`` at every position, so that everything
    downstream reads the replacement (``sites.replace_edits``: resid_mid is written through attn_out)."""
    return replace_edits(sae.site, sae.layer, replace_fn)
