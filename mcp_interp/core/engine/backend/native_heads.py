"""TransformerLens' native attention (``boot_native``: compiled tracr programs) run head by head, for the edge tools.

``TransformerBridge.boot_native`` wraps its ``NativeAttention`` in the generic ``AttentionBridge``, which calls the
module whole: each head's write (``attn.hook_result``) and each head's own query/key/value input (``hook_q_input``,
``hook_k_input``, ``hook_v_input``) never fire, and ``set_use_attn_result`` / ``set_use_split_qkv_input`` raise.
``heads_split`` installs ``split_forward`` below as the module's own ``forward`` for its duration: it computes what
``NativeAttention.forward`` computes, with the heads' inputs split and their writes separate, through TransformerLens'
own per-head helpers (``_fork_and_norm_per_head``, ``_project_per_head_qkv``, ``_compute_per_head_result``), the
module's projections, scale, causal flag, mask combination and ``pattern_fn`` (the bridge's ``hook_pattern``, applied
before the product with the values as the module applies it). Unsplit, the module's own forward already has every
point live (its pattern is edited in place), so nothing is installed.

Measured on compiled programs (sort, reverse): the logits and every residual equal the module's own forward to 0.0;
each head's ``hook_result`` summed over heads equals ``hook_attn_out`` to 0.0.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

MARK = "_mcp_interp_native_split"


def is_native_attention(attention: Any) -> bool:
    """Whether a block's attention component is TransformerLens' plain ``AttentionBridge`` around its own
    ``NativeAttention`` (multi-head: tracr's compiled models have one key/value head per query head)."""
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge
    from transformer_lens.model_bridge.sources.native.model import NativeAttention

    original = getattr(attention, "original_component", None) if attention is not None else None
    return (
        type(attention) is AttentionBridge
        and isinstance(original, NativeAttention)
        and original.rotary is None
        and original.kv_repeats == 1
    )


@contextmanager
def heads_split(attentions: Sequence[Any]) -> Iterator[None]:
    """``forward`` installed on each of these attention components' modules for the duration, then removed, also on
    error."""
    installed: list[Any] = []
    try:
        for attention in attentions:
            module = attention.original_component
            if MARK in module.__dict__:
                continue

            def run(*args: Any, attention: Any = attention, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
                return split_forward(attention, *args, **kwargs)

            module.forward = run
            module.__dict__[MARK] = True
            installed.append(module)
        yield
    finally:
        for module in reversed(installed):
            del module.forward
            del module.__dict__[MARK]


def split_forward(
    attention: Any,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    pattern_fn: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``NativeAttention.forward`` with each head's query/key/value input forked and each head's write separate."""
    module = attention.original_component
    n_heads, d_head = int(module.n_heads), int(module.d_head)
    batch, seq = hidden_states.shape[:2]
    residual = attention._captured_pre_ln_residual  # ln1's input, captured by the block
    if residual is None:
        residual = hidden_states
    hooks = (attention.hook_q_input, attention.hook_k_input, attention.hook_v_input)
    query, key, value = (
        attention._project_per_head_qkv(projection, attention._fork_and_norm_per_head(residual, hook, n_heads), n_heads,
                                        d_head).transpose(1, 2)
        for projection, hook in zip((attention.q, attention.k, attention.v), hooks, strict=True)
    )  # fmt: skip
    scores = torch.matmul(query, key.transpose(-2, -1)) / module.scale
    if module.causal:
        block_mask = module.causal_mask[:seq, :seq]
    else:
        block_mask = torch.zeros(seq, seq, dtype=torch.bool, device=scores.device)
    if attention_mask is not None:
        block_mask = module._combine_attention_mask(block_mask, attention_mask, batch=batch)
    scores = scores.masked_fill(block_mask, float("-inf"))
    pattern = torch.nn.functional.softmax(scores, dim=-1).masked_fill(block_mask, 0.0)
    if pattern_fn is not None:
        pattern = pattern_fn(pattern)
    z = torch.matmul(pattern, value).transpose(1, 2).reshape(batch, seq, n_heads * d_head)
    z = attention.o.hook_in(z)  # hook_z, before the per-head products as on TransformerLens' own bridges
    output = attention._compute_per_head_result(z.reshape(batch, seq, n_heads, d_head), n_heads, d_head)
    return output, pattern
