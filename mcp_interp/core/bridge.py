"""Every place core meets TransformerLens' ``TransformerBridge``: hook names and bridge internals.

Why one module: hook-name strings and reaches into the bridge's private attributes are what
breaks when TransformerLens moves; kept here, a TransformerLens upgrade is checked and mended in
one file. The rest of ``core/`` calls these functions and never spells a hook name itself.
"""

from __future__ import annotations

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
