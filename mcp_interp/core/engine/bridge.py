"""Every place core meets TransformerLens' ``TransformerBridge``: hook names and bridge internals.

Why one module: hook-name strings and reaches into the bridge's private attributes are what
breaks when TransformerLens moves; kept here, a TransformerLens upgrade is checked and mended in
one file. The rest of ``core/`` calls these functions and never spells a hook name itself.

The bridge's documented surface (``bridge(...)``, ``bridge.hooks``, ``bridge.run_with_cache``,
``bridge.cfg``, ``bridge.blocks``) is used directly elsewhere; what is here is everything
beyond it: the Hugging Face modules the bridge wraps, and calling its components by hand.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

# --- hook names ---------------------------------------------------------------------------------

HOOK_EMBED = "hook_embed"
FINAL_NORM_SCALE = "ln_final.hook_scale"


def hook_z(layer: int) -> str:
    """Per-head attention output before the output projection, ``[batch, seq, n_heads, d_head]``."""
    return f"blocks.{layer}.attn.hook_z"


def hook_pattern(layer: int) -> str:
    """Attention probabilities, ``[batch, n_heads, query, key]``."""
    return f"blocks.{layer}.attn.hook_pattern"


def hook_in(layer: int) -> str:
    """The residual stream entering block ``layer``."""
    return f"blocks.{layer}.hook_in"


def hook_out(layer: int) -> str:
    """The residual stream leaving block ``layer`` (the input of block ``layer + 1``)."""
    return f"blocks.{layer}.hook_out"


def hook_attn_out(layer: int) -> str:
    """What block ``layer``'s attention adds to the residual stream."""
    return f"blocks.{layer}.hook_attn_out"


def hook_mlp_out(layer: int) -> str:
    """What block ``layer``'s MLP adds to the residual stream."""
    return f"blocks.{layer}.hook_mlp_out"


def hook_mlp_post(layer: int) -> str:
    """Block ``layer``'s MLP neurons: the input of its down projection, ``[batch, seq, d_mlp]``."""
    return f"blocks.{layer}.mlp.hook_post"


def hook_resid_mid(layer: int) -> str:
    """The residual stream between block ``layer``'s attention and its MLP — for reading only.

    The bridge aliases it to the MLP norm's input: a value written there reaches the MLP but not
    the residual stream the block carries on (HF Llama keeps its own copy of the residual), so
    patching code writes ``resid_mid`` through ``hook_attn_out`` instead.
    """
    return f"blocks.{layer}.hook_resid_mid"


def site_hook(site: str, layer: int) -> str:
    """The hook whose value is a patching site's activation (``sites.Site``) at ``layer``."""
    names = {
        "resid_pre": hook_in,
        "resid_mid": hook_resid_mid,
        "resid_post": hook_out,
        "attn_out": hook_attn_out,
        "mlp_out": hook_mlp_out,
        "z": hook_z,
        "mlp_post": hook_mlp_post,
    }
    return names[site](layer)


def hook_result(layer: int) -> str:
    """Each head's write to the residual stream, ``[batch, seq, n_heads, d_model]`` (needs ``edge_hooks``)."""
    return f"blocks.{layer}.attn.hook_result"


def hook_qkv_input(layer: int, kind: str) -> str:
    """The residual stream (before the norm) as read by each query head (``kind`` "q",
    ``[batch, seq, n_heads, d_model]``) or each key/value group ("k"/"v", ``[batch, seq, n_kv_heads,
    d_model]``: under grouped-query attention a key/value input is shared by its group's heads).
    Needs ``edge_hooks``."""
    return f"blocks.{layer}.attn.hook_{kind}_input"


def hook_mlp_in(layer: int) -> str:
    """The residual stream (before the norm) as the MLP reads it (needs ``edge_hooks``)."""
    return f"blocks.{layer}.hook_mlp_in"


@contextmanager
def edge_hooks(bridge: Any) -> Iterator[None]:
    """Turn on the bridge's per-head write and per-reader input hooks (``hook_result``, split q/k/v
    inputs, ``hook_mlp_in``) and restore the caller's flags afterwards, also on error.

    Why: an edge (writer → reader) needs each head's own write and each reader's own input, which the
    bridge only materialises with these flags (they cost memory: per-head tensors of d_model). The
    logits change by float rounding only (measured 1.4e-6 on `tiny`).
    """
    cfg = bridge.cfg
    saved = (
        cfg.use_attn_result,
        cfg.use_split_qkv_input,
        cfg.use_hook_mlp_in,
        bool(getattr(cfg, "use_attn_in", False)),
    )
    try:
        if saved[3]:
            bridge.set_use_attn_in(False)  # exclusive with split q/k/v inputs
        bridge.set_use_attn_result(True)
        bridge.set_use_split_qkv_input(True)
        bridge.set_use_hook_mlp_in(True)
        yield
    finally:
        bridge.set_use_attn_result(saved[0])
        bridge.set_use_split_qkv_input(saved[1])
        bridge.set_use_hook_mlp_in(saved[2])
        if saved[3]:
            bridge.set_use_attn_in(True)


# --- the Hugging Face model inside the bridge ---------------------------------------------------


def hf_model(bridge: Any) -> Any:
    """The Hugging Face model the bridge wraps (``bridge.original_model``).

    Needed for what TransformerLens' config does not carry: the HF class name (the model's
    architecture) and the HF config below.
    """
    return bridge.original_model


def hf_config(bridge: Any) -> Any:
    """The wrapped HF model's own ``PretrainedConfig``, or None if the model has none.

    Needed for facts the bridge's ``cfg`` does not state the HF way: ``model_type`` and
    ``_attn_implementation`` (which decide whether the Llama suffix engine applies),
    ``num_key_value_heads``, ``head_dim``, ``architectures``.
    """
    return getattr(hf_model(bridge), "config", None)


def hf_module(component: Any) -> Any:
    """The HF module a bridge component wraps (its ``original_component``), or None.

    Needed to read a component's weights and settings (a Linear's weight, a norm's epsilon) or
    to call the bare HF module without the bridge's hooks around it.
    """
    return getattr(component, "original_component", None)


def hf_attention(bridge: Any, layer: int) -> Any:
    """Block ``layer``'s HF attention module (e.g. ``LlamaAttention``).

    Needed for its ``scaling`` (the factor on q·k), which the bridge does not expose.
    """
    return hf_module(bridge.blocks[layer].attn)


def attn_output_projection(bridge: Any, layer: int) -> Any:
    """Block ``layer``'s attention output projection as the bare HF module (Linear, or GPT-2's Conv1D).

    Needed to apply W_O (+ b_O) to hand-made per-head inputs — one head kept, the others zero —
    without firing the bridge's hooks: what each head writes to the residual stream.
    """
    return hf_module(bridge.blocks[layer].attn.o)


def unembed_linear(bridge: Any) -> torch.nn.Linear | None:
    """The unembedding as a plain ``torch.nn.Linear`` (weight ``[vocab, d_model]``), or None.

    Needed to read single rows of W_U (logit differences of a few tokens without projecting on
    the whole vocabulary; direct logit attribution). None when the model's unembedding is not
    a plain linear layer: callers then fall back to ``logits_from_residual`` or refuse.
    """
    linear = hf_module(bridge.unembed)
    return linear if isinstance(linear, torch.nn.Linear) else None


def final_norm_module(bridge: Any) -> Any:
    """The final norm as the bare HF module (``LlamaRMSNorm``, ``LayerNorm``, ...), or None.

    Needed for its weight and bias (direct logit attribution freezes the norm's scale and
    folds the rest into the read-out direction) and its kind (LayerNorm centres, RMSNorm not).
    """
    return hf_module(bridge.ln_final)


# --- running parts of the model by hand ---------------------------------------------------------


def final_norm(bridge: Any, residual_rows: torch.Tensor) -> torch.Tensor:
    """The model's final norm on residual vectors ``[rows, d_model]`` → ``[rows, d_model]``.

    Called through the bridge component (as a one-position sequence, the shape it expects), so
    the numbers are the model's own.
    """
    return bridge.ln_final(residual_rows.unsqueeze(1))[:, 0]


def logits_from_residual(bridge: Any, residual_rows: torch.Tensor) -> torch.Tensor:
    """Final norm and unembedding of residual vectors ``[rows, d_model]`` → ``[rows, vocab]`` logits.

    Needed to read out only the positions that matter (the answer, or one layer's residual in
    the logit lens) instead of running the whole model to its logits.
    """
    normed = bridge.ln_final(residual_rows.unsqueeze(1))
    return bridge.unembed(normed)[:, 0]


def block_output(output: Any) -> torch.Tensor:
    """The hidden states out of a block call: HF decoder layers return a tensor or a tuple."""
    return output[0] if isinstance(output, tuple) else output


def run_block(bridge: Any, layer: int, residual: torch.Tensor, call_kwargs: dict[str, Any]) -> torch.Tensor:
    """Block ``layer`` on ``residual`` ``[rows, seq, d_model]``, through the bridge (hooks included).

    A bridge block takes its HF decoder layer's call signature: the hidden states plus the
    keyword arguments the model passes it (attention mask, position embeddings, ...), which
    callers capture from a real forward. Returns the new residual ``[rows, seq, d_model]``.
    """
    return block_output(bridge.blocks[layer](residual, **call_kwargs))


@dataclass(frozen=True)
class BlockParts:
    """The bridge components of one pre-norm decoder block, each callable on its own."""

    ln1: Any  # norm before attention
    q: Any  # query, key, value and output projections
    k: Any
    v: Any
    o: Any
    ln2: Any  # norm before the MLP
    mlp: Any


def block_parts(bridge: Any, layer: int) -> BlockParts:
    """Block ``layer``'s norms, attention projections and MLP as bridge components.

    Needed by the Llama suffix engine, which runs a block's pieces itself (attention over a
    shared key/value prefix, which the bridge's blocks cannot do) with the model's own weights.
    """
    block = bridge.blocks[layer]
    attn = block.attn
    return BlockParts(block.ln1, attn.q, attn.k, attn.v, attn.o, block.ln2, block.mlp)


# --- the local replacement model (attribution graphs) -------------------------------------------

FINAL_NORM_OUT = "ln_final.hook_out"  # the final norm's output: what the unembedding reads


def hook_mlp_input(layer: int) -> str:
    """Block ``layer``'s MLP input after its norm (normalised × the norm's weight): the TransformerLens
    ``ReplacementMLP.hook_in`` that circuit-tracer's ``mlp.hook_in`` transcoders read."""
    return f"blocks.{layer}.mlp.hook_in"


def hook_mlp_output(layer: int) -> str:
    """Block ``layer``'s MLP output before any post-MLP norm (Gemma's ``ln2_post``); on blocks without one
    (Llama, Qwen, GPT-2) it is the same hook as ``hook_mlp_out``."""
    return f"blocks.{layer}.mlp.hook_out"


def hook_mlp_norm_normalized(layer: int) -> str:
    """Block ``layer``'s MLP norm output before its weight (x / scale), TransformerLens' ``ln2.hook_normalized``."""
    return f"blocks.{layer}.ln2.hook_normalized"


def frozen_hooks(bridge: Any) -> list[str]:
    """Every hook whose value the local replacement model freezes: each attention pattern and each norm's
    scale (``*.hook_scale``: the blocks' norms, post-norms and Q/K norms where present, the final norm).

    Why these: with the patterns and the norms' denominators held at their values from the real forward,
    what remains between the residual stream's writers and readers is linear (value and output projections,
    the norms' weights), which is what makes an attribution graph's edges exact direct effects.
    """
    names = set(bridge.hook_dict)
    return sorted(n for n in names if n.endswith(".attn.hook_pattern") or n.endswith(".hook_scale"))


def has_hook(bridge: Any, name: str) -> bool:
    """Whether the bridge exposes a hook of this name (aliases included)."""
    return name in bridge.hook_dict


def final_norm_logits(bridge: Any, normed_rows: torch.Tensor) -> torch.Tensor:
    """The unembedding of final-norm outputs ``[rows, d_model]`` → ``[rows, vocab]`` logits (the norm already
    applied, e.g. read at ``FINAL_NORM_OUT``)."""
    return bridge.unembed(normed_rows.unsqueeze(1))[:, 0]
