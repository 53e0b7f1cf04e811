"""The names of the points a value is read or written at: TransformerLens' hook names, spelled here once.

A point is a string such as ``blocks.5.attn.hook_z`` — the vocabulary both of TransformerLens' ``TransformerBridge``
and of its ``RemoteBridge`` (vLLM, Inspect), so an edit named by a point runs on either backend. Families name points
with these functions and never spell one; ``bridge`` holds what reaches into the bridge itself.
"""

from __future__ import annotations

HOOK_EMBED = "hook_embed"
EMBED_OUT = "embed.hook_out"  # the embedding's output on a RemoteBridge (vLLM's driver serves it, not hook_embed)
FINAL_NORM_NORMALIZED = "ln_final.hook_normalized"  # vLLM's final norm after its weight: what its logits are built from


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


def hook_heads_sum(layer: int) -> str:
    """Block ``layer``'s heads' summed output (plus the output projection's bias) before any post-attention norm;
    on blocks without one it is what the attention adds to the residual stream."""
    return f"blocks.{layer}.attn.hook_out"


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
