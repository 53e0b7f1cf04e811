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
does not know) makes the caller fall back to the generic sweep in ``sweep``. The tests
compare both against TransformerLens' patching module.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from mcp_interp.core.engine.backend.bridge import (
    BlockParts,
    block_parts,
    hf_attention,
    hf_config,
    hook_mlp_post,
    logits_from_residual,
)
from mcp_interp.core.engine.backend.forward import BlockTrace
from mcp_interp.core.engine.backend.sites import Site
from mcp_interp.core.engine.numbers.row_readouts import RowMetric
from mcp_interp.core.engine.patching.sweep import BridgePatchSweep, PatchSweep, SitePatch, Unit

SUPPORTED_MODEL_TYPES = frozenset({"llama"})
CHECK_TOLERANCE = 1e-3  # max |logit| difference between this replay and the real forward


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

    def __init__(self, bridge: Any, trace: BlockTrace) -> None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        self._rotary = apply_rotary_pos_emb
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
        patch: SitePatch | None = None,
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

    def _mlp(self, layer: int, hidden: torch.Tensor, neurons: SitePatch | None) -> torch.Tensor:
        """The block's MLP (the bridge component), with ``neurons`` patched through its hook."""
        if neurons is None:
            return self.layers[layer].parts.mlp(hidden)

        def patch_neurons(values: torch.Tensor, hook: Any) -> torch.Tensor:
            return neurons.apply(values.clone())

        with self.bridge.hooks(fwd_hooks=[(hook_mlp_post(layer), patch_neurons)]):
            return self.layers[layer].parts.mlp(hidden)


@dataclass(kw_only=True)
class SuffixPatchSweep(PatchSweep):
    """The Llama engine of ``sweep.PatchSweep``: recomputes only positions ``start..``,
    attending to the base run's keys/values before ``start``, and at the last layer only the
    answer position. Same contract and numbers as ``sweep.BridgePatchSweep``."""

    start: int
    # Rows per block call, as a token budget: ~1k tokens keep the MLP's intermediate activations
    # (rows × positions × d_mlp floats) a few MB, which measured fastest here (bigger calls spill
    # out of cache and into fresh pages; smaller ones under-use the matmul kernels).
    tokens_per_call: int = 1080
    check_error: float | None = field(default=None, init=False)

    ANSWER_ONLY_AT_LAST: ClassVar[bool] = True

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
            ours = logits_from_residual(self.bridge, final)
            real = self._real_answer_logits()
            worst = max(worst, float((ours - real).abs().max()))
        self.check_error = worst
        return worst

    def _real_answer_logits(self) -> torch.Tensor:
        final = self.base.final[torch.arange(self.base.batch_size), self.answer_positions]
        return logits_from_residual(self.bridge, final)

    def first_position(self) -> int:
        return self.start

    def rows_per_call(self) -> int:
        return max(8, self.tokens_per_call // max(1, self.base.inputs[0].shape[1] - self.start))

    def steps(self) -> Iterator[int]:
        if not self.prefix:
            self.check()
        yield from super().steps()

    def run_block(
        self,
        layer: int,
        residual: torch.Tensor,
        rows_prompt: torch.Tensor,
        patch: SitePatch | None,
        query: torch.Tensor | None,
    ) -> torch.Tensor:
        keys, values = self.prefix[layer]
        prefix_kv = (keys.index_select(0, rows_prompt), values.index_select(0, rows_prompt))
        # Every patched tensor is a fresh one of this call: patched in place.
        return self.blocks.run(layer, residual, self.start, prefix_kv, patch, self.site, query)[0]


@dataclass
class ChosenSweep:
    """The engine an exact patching run uses, and why (for the result's ``engine`` and notes)."""

    sweep: PatchSweep
    engine: str
    note: str | None


def best_sweep(
    bridge: Any,
    trace: BlockTrace,
    site: Site,
    source: dict[int, torch.Tensor],
    units: list[Unit],
    mask: torch.Tensor,
    answer_positions: torch.Tensor,
    metric: RowMetric,
    first_diff: int,
) -> ChosenSweep:
    """The suffix engine when it applies to this model and replays its forward within
    ``CHECK_TOLERANCE``; otherwise the generic one (same numbers, slower), with a note saying why."""
    args: dict[str, Any] = dict(bridge=bridge, base=trace, site=site, source=source, units=units, patch_mask=mask,
                                answer_positions=answer_positions, metric=metric)  # fmt: skip
    generic = ChosenSweep(
        BridgePatchSweep(**args), "generic: each block called through the TransformerBridge on every position", None
    )
    if not supports(bridge):
        return generic
    start = min(first_diff, int(answer_positions.min()))
    if any(u.position is not None and u.position < start for u in units):
        return generic
    fast = SuffixPatchSweep(**args, start=start)
    error = fast.check()
    if error > CHECK_TOLERANCE:
        generic.note = (
            f"The fast suffix engine did not reproduce this model's forward (max |Δ| {error:.2e}); "
            "used the generic engine instead (same numbers, slower)."
        )
        return generic
    engine = (
        f"suffix: positions {start}.. recomputed with the model's own weights (replay of the "
        f"unpatched run matches the real forward to {error:.1e})"
    )
    return ChosenSweep(fast, engine, None)
