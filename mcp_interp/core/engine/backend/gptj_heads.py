"""GPT-J's attention run head by head, so that it has the hook points TransformerLens 4.3 leaves dead on it.

TransformerLens wraps GPT-J's attention (HF ``GPTJAttention``) in its generic ``AttentionBridge``, which calls the HF
module whole. Each head's write (``attn.hook_result``) and each head's own query/key/value input (``hook_q_input``,
``hook_k_input``, ``hook_v_input``) exist as hook points but never fire, ``set_use_attn_result`` /
``set_use_split_qkv_input`` raise, and ``hook_pattern`` fires after the module has used the pattern, so an edit there
changes nothing. ``exposed`` installs ``forward`` below as the HF module's own ``forward`` for its duration: it
computes what ``GPTJAttention.forward`` computes and fires the bridge's hook points where TransformerLens' own
per-head attention (``PositionEmbeddingsAttentionBridge``) fires them, so an edit through ``bridge.hooks`` applies.
The bridge's ``AttentionBridge.forward`` around it is unchanged (``attn.hook_in`` on its input, ``attn.hook_out`` on
the heads' sum, the captured pre-norm residual released afterwards).

Where each part comes from:

* the HF module's: the query/key/value/output projections' weights (no biases on GPT-J), ``rotary_dim``, the rotary
  itself (``modeling_gptj.apply_rotary_pos_emb`` on the (sin, cos) the model passes this call), ``scaling``, the
  attention mask as the model built it, the key/value cache update, the dropouts (identities in eval mode);
* TransformerLens' (the per-head fork its other attention bridges use): ``_fork_and_norm_per_head`` (the residual
  before ``ln_1``, captured by the block, copied once per head, the hook fired on the copies, ``ln_1`` — the bare HF
  norm — applied to each copy), ``_project_per_head_qkv`` (head h's copy through head h's rows of the projection
  only) and ``_compute_per_head_result`` (each head's ``z_h · W_O[h]``, ``hook_result``, their sum);
* written here: eager attention between the rotary and the output projection, in HF's order (scores in float32,
  times ``scaling``, plus the mask, softmax, back to the values' dtype, times the values). HF's
  ``eager_attention_forward`` does these steps in one call with no point between the softmax and the product with
  the values, which is where ``hook_pattern`` must fire for an edit of the pattern to count.

``split``: each head reads its own copy of the residual (the edge tools); otherwise the projections run on the
attention's input through the bridge's own projection components (``hook_q`` … fire as usual) and only the pattern
is made live (the replacement model of attribution graphs freezes it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

SPLIT = "_mcp_interp_split"  # marks a forward installed here, and whether it splits the heads' inputs


def runs_per_head(attention: Any) -> bool:
    """Whether a block's attention component is one ``exposed`` can run per head: TransformerLens' plain
    ``AttentionBridge`` (not a subclass, which computes attention itself) around HF's ``GPTJAttention``."""
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge
    from transformers.models.gptj.modeling_gptj import GPTJAttention

    original = getattr(attention, "original_component", None) if attention is not None else None
    return type(attention) is AttentionBridge and isinstance(original, GPTJAttention)


@contextmanager
def exposed(attentions: Sequence[Any], split: bool) -> Iterator[None]:
    """``forward`` installed on each of these attention components' HF modules for the duration, then the module's
    own (or accelerate's wrapper of it) restored, also on error. A module already running per head keeps its forward
    unless this one splits and that one does not."""
    installed: list[tuple[Any, Any]] = []
    try:
        for attention in attentions:
            module = attention.original_component
            implementation = getattr(module.config, "_attn_implementation", None)
            if implementation not in (None, "eager"):
                raise RuntimeError(
                    f"{attention.name}: GPT-J's attention is run per head as eager attention, but this model was "
                    f"loaded with {implementation!r} attention (load it with attn_implementation='eager')"
                )
            current = module.__dict__.get("forward")
            if current is not None and hasattr(current, SPLIT) and (getattr(current, SPLIT) or not split):
                continue

            def run(*args: Any, attention: Any = attention, **kwargs: Any) -> tuple[torch.Tensor, None]:
                return forward(attention, split, *args, **kwargs)

            setattr(run, SPLIT, split)
            installed.append((module, current))
            module.forward = run
    except BaseException:
        _restore(installed)
        raise
    try:
        yield
    finally:
        _restore(installed)


def _restore(installed: list[tuple[Any, Any]]) -> None:
    for module, previous in reversed(installed):
        if previous is None:
            del module.forward
        else:
            module.forward = previous


def forward(
    attention: Any,
    split: bool,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None = None,
    cache: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``GPTJAttention.forward`` (transformers 5) with the bridge's hook points live; its arguments are the HF
    module's. Returns (output, None): no pattern as the second element, so the bridge does not fire ``hook_pattern``
    again after the fact."""
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb

    module = attention.original_component
    n_heads, d_head = int(module.num_attention_heads), int(module.head_dim)
    batch, seq = hidden_states.shape[:2]
    projections = (attention.q, attention.k, attention.v)
    if split:
        residual = attention._captured_pre_ln_residual  # ln_1's input, captured by the block
        if residual is None:
            raise RuntimeError(f"{attention.name}: the residual before ln_1 was not captured; cannot fork it per head")
        hooks = (attention.hook_q_input, attention.hook_k_input, attention.hook_v_input)
        query, key, value = (
            attention._project_per_head_qkv(projection, attention._fork_and_norm_per_head(residual, hook, n_heads),
                                            n_heads, d_head)
            for projection, hook in zip(projections, hooks, strict=True)
        )  # fmt: skip
    else:
        query, key, value = (p(hidden_states).view(batch, seq, n_heads, d_head) for p in projections)

    sin, cos = position_embeddings
    rotary = module.rotary_dim

    def rotate(x: torch.Tensor) -> torch.Tensor:  # [batch, seq, heads, d_head], as HF rotates it
        if rotary is None:
            return apply_rotary_pos_emb(x, sin, cos)
        return torch.cat([apply_rotary_pos_emb(x[..., :rotary], sin, cos), x[..., rotary:]], dim=-1)

    query, key, value = rotate(query).transpose(1, 2), rotate(key).transpose(1, 2), value.transpose(1, 2)
    query, key = attention.hook_rot_q(query), attention.hook_rot_k(key)  # seen as [batch, seq, heads, d_head]
    if cache is not None:
        key, value = cache.update(key, value, module.layer_idx, kwargs=kwargs)

    scores = torch.matmul(query.to(torch.float32), key.to(torch.float32).transpose(2, 3)) * module.scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    scores = attention.hook_attn_scores(scores)
    pattern = torch.nn.functional.softmax(scores, dim=-1).to(value.dtype)
    dropout = module.attention_dropout if module.training else 0.0
    pattern = attention.hook_pattern(torch.nn.functional.dropout(pattern, p=dropout, training=module.training))
    z = torch.matmul(pattern, value).transpose(1, 2).reshape(batch, seq, n_heads * d_head)

    if split:
        z = attention.o.hook_in(z)  # hook_z, before the per-head products as on TransformerLens' own bridges
        output = attention._compute_per_head_result(z.reshape(batch, seq, n_heads, d_head), n_heads, d_head)
    else:
        output = attention.o(z)
    return module.resid_dropout(output), None
