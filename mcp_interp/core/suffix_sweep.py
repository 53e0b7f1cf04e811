"""A faster exact head-patching sweep for Llama-family models: recompute only the suffix.

In a minimal pair, every position before the first token where clean and corrupt differ (the
*prefix*) has identical activations in both runs, so patching a head changes nothing there and
nothing there depends on later positions (attention is causal). A patched run therefore only
needs the *suffix* positions, attending to the prefix's keys and values, which are shared by
every patched run and computed once. On the IOI pairs that is 5 of 14 positions.

Recomputing only some positions means calling attention with a key/value prefix, which the
TransformerBridge (4.3) does not support for these models (its blocks ignore an HF KV cache), so
this module runs a Llama block itself — RMSNorm, rotary q/k, grouped-query eager attention,
output projection, MLP — using the bridge's own submodules and weights for every learned part,
and HF's ``apply_rotary_pos_emb`` with the position embeddings the model itself produced.

Why this is safe to use: ``SuffixHeadPatchSweep.check`` first replays the unpatched base batch
through these blocks at every position and compares each layer's residual and the final logits
with the real forward; any mismatch beyond ``CHECK_TOLERANCE`` (or an architecture this module
does not know) makes the caller fall back to the generic sweep in ``core.patching``. The tests
compare both against TransformerLens' patching module.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from mcp_interp.core.heads import Head
from mcp_interp.core.patching import BlockTrace, RowMetric, answer_logits_from_residual

SUPPORTED_MODEL_TYPES = frozenset({"llama"})
CHECK_TOLERANCE = 1e-3  # max |logit| difference between this replay and the real forward


def supports(bridge: Any) -> bool:
    config = getattr(bridge.original_model, "config", None)
    return getattr(config, "model_type", None) in SUPPORTED_MODEL_TYPES and getattr(
        config, "_attn_implementation", "eager"
    ) in ("eager", None)


@dataclass
class _Layer:
    ln1: Any
    q: Any
    k: Any
    v: Any
    o: Any
    ln2: Any
    mlp: Any
    scaling: float


def _rms_norm(norm_bridge: Any) -> Any:
    """The block's RMSNorm as one fused ``F.rms_norm`` call when it is a plain RMSNorm.

    Same formula as HF's LlamaRMSNorm (x · rsqrt(mean(x²) + ε) · w), in one kernel instead of
    five elementwise passes; anything unrecognised is called as is. ``check`` measures the
    (float-rounding) difference this makes.
    """
    inner = getattr(norm_bridge, "_original_component", None)
    weight, eps = getattr(inner, "weight", None), getattr(inner, "variance_epsilon", None)
    if type(inner).__name__ != "LlamaRMSNorm" or weight is None or eps is None:
        return norm_bridge
    shape = (weight.shape[0],)
    return lambda x: torch.nn.functional.rms_norm(x, shape, weight, eps)


class LlamaSuffixBlocks:
    """Llama blocks run on positions ``start..`` of each row, given the keys/values before ``start``."""

    def __init__(self, bridge: Any, trace: BlockTrace) -> None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        self._rotary = apply_rotary_pos_emb
        config = bridge.original_model.config
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.d_head = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        self.layers = []
        for block in bridge.blocks:
            hf_attn = block.attn._original_component
            self.layers.append(
                _Layer(
                    block.ln1,
                    block.attn.q,
                    block.attn.k,
                    block.attn.v,
                    block.attn.o,
                    block.ln2,
                    block.mlp,
                    float(hf_attn.scaling),
                )
            )
        cos, sin = trace.kwargs[0]["position_embeddings"]
        self.cos, self.sin = cos[:1], sin[:1]  # [1, seq, d_head]; positions are 0..seq-1 for every row

    def run(
        self,
        layer: int,
        residual: torch.Tensor,
        start: int,
        prefix_kv: tuple[torch.Tensor, torch.Tensor] | None,
        patch: Any = None,
        query: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One block on ``residual`` [rows, s, d] at positions start..start+s-1.

        ``prefix_kv``: keys/values of positions 0..start-1 per row, [rows, n_kv, start, d_head].
        ``patch(z)`` may replace the head outputs z [rows, s, n_heads, d_head] before the
        output projection. ``query`` [rows] (indices into the s positions) computes the output
        at that one position per row only — all a last layer needs — and returns [rows, 1, d].
        Returns the new residual and this call's own (rotary) keys/values.
        """
        p = self.layers[layer]
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
        scores = scores * p.scaling
        scores = scores.masked_fill(key_pos > query_pos, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        z = torch.matmul(weights, values.unsqueeze(2))  # [rows, kv, group, s, d_head]
        z = z.reshape(rows, self.n_heads, s, self.d_head).transpose(1, 2)  # [rows, s, n_heads, d_head]
        if patch is not None:
            z = patch(z)
        attn_out = p.o(z.reshape(rows, s, self.n_heads * self.d_head))
        residual = residual + attn_out
        residual = residual + p.mlp(p.ln2(residual))
        return residual, (k, v)


@dataclass
class SuffixHeadPatchSweep:
    """Same contract as ``core.patching.HeadPatchSweep``, recomputing only positions ``start..``."""

    bridge: Any
    base: BlockTrace
    source_z: dict[int, torch.Tensor]
    heads: list[Head]
    patch_mask: torch.Tensor
    answer_positions: torch.Tensor
    metric: RowMetric
    start: int
    # Rows per block call, as a token budget: ~1k tokens keep the MLP's intermediate activations
    # (rows × positions × d_mlp floats) a few MB, which measured fastest here (bigger calls spill
    # out of cache and into fresh pages; smaller ones under-use the matmul kernels).
    tokens_per_call: int = 1080
    values: torch.Tensor | None = field(default=None, init=False)
    check_error: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.blocks = LlamaSuffixBlocks(self.bridge, self.base)
        self.prefix: list[tuple[torch.Tensor, torch.Tensor]] = []

    def check(self) -> float:
        """Replay the base batch through these blocks; return the max |difference| from the real run.

        Also keeps every layer's prefix keys/values for the sweep.
        """
        batch = self.base.batch_size
        with torch.inference_mode():
            residual = self.base.inputs[0]
            worst = 0.0
            for layer in range(len(self.blocks.layers)):
                if layer > 0:
                    worst = max(worst, float((residual - self.base.inputs[layer]).abs().max()))
                residual, (k, v) = self.blocks.run(layer, residual, 0, None)
                self.prefix.append((k[:, :, : self.start], v[:, :, : self.start]))
            final = residual[torch.arange(batch), self.answer_positions]
            ours = answer_logits_from_residual(self.bridge, final)
            real = self._real_answer_logits()
            worst = max(worst, float((ours - real).abs().max()))
        self.check_error = worst
        return worst

    def _real_answer_logits(self) -> torch.Tensor:
        final = self.base.final[torch.arange(self.base.batch_size), self.answer_positions]
        return answer_logits_from_residual(self.bridge, final)

    def layers(self) -> list[int]:
        return list(range(min(h.layer for h in self.heads), len(self.bridge.blocks)))

    def steps(self) -> Iterator[int]:
        if not self.prefix:
            self.check()
        batch, start = self.base.batch_size, self.start
        rows_per_call = max(8, self.tokens_per_call // max(1, self.base.inputs[0].shape[1] - start))
        order = sorted(range(len(self.heads)), key=lambda i: self.heads[i].layer)
        residual: torch.Tensor | None = None
        rows_prompt = torch.empty(0, dtype=torch.long)
        rows_head = torch.empty(0, dtype=torch.long)
        rows_layer = torch.empty(0, dtype=torch.long)
        with torch.inference_mode():
            for layer in self.layers():
                joining = [i for i in order if self.heads[i].layer == layer]
                if joining:
                    new = self.base.inputs[layer][:, start:].repeat(len(joining), 1, 1)
                    residual = new if residual is None else torch.cat([residual, new])
                    rows_prompt = torch.cat([rows_prompt, torch.arange(batch).repeat(len(joining))])
                    rows_head = torch.cat([rows_head, torch.tensor(joining).repeat_interleave(batch)])
                    rows_layer = torch.cat([rows_layer, torch.full((len(joining) * batch,), layer)])
                assert residual is not None
                last = layer == len(self.bridge.blocks) - 1
                pieces = []
                for lo in range(0, residual.shape[0], rows_per_call):
                    hi = min(lo + rows_per_call, residual.shape[0])
                    query = self.answer_positions[rows_prompt[lo:hi]] - start if last else None
                    pieces.append(
                        self._run(
                            layer, residual[lo:hi], rows_prompt[lo:hi], rows_head[lo:hi], rows_layer[lo:hi], query
                        )
                    )
                residual = torch.cat(pieces)
                yield layer
            assert residual is not None
            final = residual[:, 0]  # the last layer returned only each row's answer position
            row_values = self.metric(final, rows_prompt)
        values = torch.empty(len(self.heads), batch, dtype=row_values.dtype)
        values[rows_head, rows_prompt] = row_values
        self.values = values

    def _run(
        self,
        layer: int,
        residual: torch.Tensor,
        rows_prompt: torch.Tensor,
        rows_head: torch.Tensor,
        rows_layer: torch.Tensor,
        query: torch.Tensor | None,
    ) -> torch.Tensor:
        keys, values = self.prefix[layer]
        prefix_kv = (keys.index_select(0, rows_prompt), values.index_select(0, rows_prompt))
        patch = None
        joining = (rows_layer == layer).nonzero().squeeze(1)
        if joining.numel():
            heads = torch.tensor([self.heads[i].head for i in rows_head[joining].tolist()])
            prompts = rows_prompt[joining]
            source = self.source_z[layer][prompts, self.start :, heads]  # [k, s, d_head]
            where = self.patch_mask[prompts, self.start :].unsqueeze(-1)  # [k, s, 1]
            if query is not None:  # only the answer position is computed
                at = query[joining]
                every = torch.arange(len(joining))
                source, where = source[every, at].unsqueeze(1), where[every, at].unsqueeze(1)

            def patch(z: torch.Tensor) -> torch.Tensor:
                # z is a fresh tensor of this call: patched in place.
                z[joining, :, heads] = torch.where(where, source.to(z.dtype), z[joining, :, heads])
                return z

        return self.blocks.run(layer, residual, self.start, prefix_kv, patch, query)[0]
