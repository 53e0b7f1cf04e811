"""Llama blocks run by hand on the positions after a shared prefix: the fast sweep of exact head patching.

In a minimal pair every position before the first token where clean and corrupt differ (the *prefix*) has identical
activations in both runs, so a patched run only needs the *suffix* positions, attending to the prefix's keys and
values (computed once). The TransformerBridge (4.3) cannot call attention with a key/value prefix for these models
(its blocks ignore an HF KV cache), so ``LlamaSuffixBlocks`` runs a Llama block itself — RMSNorm, rotary q/k,
grouped-query eager attention, output projection, MLP — with the bridge's own submodules and weights for every learned
part and HF's ``apply_rotary_pos_emb`` with the position embeddings the model itself produced. It lives in the
backend because it calls the model's components; the sweep that drives it is ``patching.suffix_sweep``, which first
replays the unpatched batch through these blocks and falls back to the generic sweep on any mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from mcp_interp.core.engine.backend.bridge import BlockParts, block_parts, hf_attention, hf_config
from mcp_interp.core.engine.backend.forward import BlockTrace
from mcp_interp.core.engine.backend.points import hook_mlp_post


class InPlacePatch(Protocol):
    """A patch of some rows of one block call (``patching.sweep.SitePatch``), applied in place."""

    def apply(self, values: torch.Tensor) -> torch.Tensor: ...


SUPPORTED_MODEL_TYPES = frozenset({"llama"})


def supports(bridge: Any) -> bool:
    config = hf_config(bridge)
    return getattr(config, "model_type", None) in SUPPORTED_MODEL_TYPES and getattr(
        config, "_attn_implementation", "eager"
    ) in ("eager", None)


@dataclass
class _Layer:
    parts: BlockParts  # the bridge's own components: norms, projections, MLP
    scaling: float  # the attention's factor on q·k


class LlamaSuffixBlocks:
    """Llama blocks run on positions ``start..`` of each row, given the keys/values before ``start``."""

    def __init__(self, backend: Any, trace: BlockTrace) -> None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        self._rotary = apply_rotary_pos_emb
        bridge = backend.bridge
        self.bridge = bridge
        config = hf_config(bridge)
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.d_head = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        self.layers = []
        for layer in range(len(bridge.blocks)):
            parts = block_parts(bridge, layer)
            self.layers.append(_Layer(parts, float(hf_attention(bridge, layer).scaling)))
        cos, sin = trace.kwargs[0]["position_embeddings"]
        self.cos, self.sin = cos[:1], sin[:1]  # [1, seq, d_head]; positions are 0..seq-1 for every row

    def run(
        self,
        layer: int,
        residual: torch.Tensor,
        start: int,
        prefix_kv: tuple[torch.Tensor, torch.Tensor] | None,
        patch: InPlacePatch | None = None,
        site: str | None = None,
        query: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One block on ``residual`` [rows, s, d] at positions start..start+s-1.

        ``prefix_kv``: keys/values of positions 0..start-1 per row, [rows, n_kv, start, d_head].
        ``patch`` is applied at ``site`` (one of ``sites.INSIDE_BLOCK``: the head
        outputs z before the output projection, attention's output, the residual after it, the
        MLP's neurons or its output). ``query`` [rows] (indices into the s positions) computes the output
        at that one position per row only — all a last layer needs — and returns [rows, 1, d].
        Returns the new residual and this call's own (rotary) keys/values.
        """
        p, scaling = self.layers[layer].parts, self.layers[layer].scaling
        rows, s, _ = residual.shape
        hidden = p.ln1(residual)
        q = p.q(hidden).view(rows, s, self.n_heads, self.d_head).transpose(1, 2)
        k = p.k(hidden).view(rows, s, self.n_kv, self.d_head).transpose(1, 2)
        v = p.v(hidden).view(rows, s, self.n_kv, self.d_head).transpose(1, 2)
        q, k = self._rotary(q, k, self.cos[:, start : start + s], self.sin[:, start : start + s])
        keys, values = k, v
        if prefix_kv is not None:
            keys = torch.cat([prefix_kv[0], k], dim=2)
            values = torch.cat([prefix_kv[1], v], dim=2)
        total = keys.shape[2]
        group = self.n_heads // self.n_kv
        key_pos = torch.arange(total, device=residual.device)
        if query is None:
            query_pos = torch.arange(start, start + s, device=residual.device)[:, None]  # [s, 1]
        else:
            every_row = torch.arange(rows, device=residual.device)
            q = q[every_row, :, query].unsqueeze(2)  # [rows, n_heads, 1, d_head]
            residual = residual[every_row, query].unsqueeze(1)  # [rows, 1, d]
            query_pos = (query + start)[:, None, None, None, None]  # [rows, 1, 1, 1, 1]
            s = 1
        # Grouped-query attention without materialising repeated keys: [rows, kv, group, s, total].
        scores = torch.matmul(q.view(rows, self.n_kv, group, s, self.d_head), keys.unsqueeze(2).transpose(-1, -2))
        scores = scores * scaling
        scores = scores.masked_fill(key_pos > query_pos, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        z = torch.matmul(weights, values.unsqueeze(2))  # [rows, kv, group, s, d_head]
        z = z.reshape(rows, self.n_heads, s, self.d_head).transpose(1, 2)  # [rows, s, n_heads, d_head]
        if patch is not None and site == "z":
            z = patch.apply(z)
        attn_out = p.o(z.reshape(rows, s, self.n_heads * self.d_head))
        if patch is not None and site == "attn_out":
            attn_out = patch.apply(attn_out)
        residual = residual + attn_out
        if patch is not None and site == "resid_mid":
            residual = patch.apply(residual)
        mlp_out = self._mlp(layer, p.ln2(residual), patch if site == "mlp_post" else None)
        if patch is not None and site == "mlp_out":
            mlp_out = patch.apply(mlp_out)
        return residual + mlp_out, (k, v)

    def _mlp(self, layer: int, hidden: torch.Tensor, neurons: InPlacePatch | None) -> torch.Tensor:
        """The block's MLP (the bridge component), with ``neurons`` patched through its hook."""
        if neurons is None:
            return self.layers[layer].parts.mlp(hidden)

        def patch_neurons(values: torch.Tensor, hook: Any) -> torch.Tensor:
            return neurons.apply(values.clone())

        with self.bridge.hooks(fwd_hooks=[(hook_mlp_post(layer), patch_neurons)]):
            return self.layers[layer].parts.mlp(hidden)
