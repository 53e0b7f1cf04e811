"""Where a value is read or written: the one vocabulary of sites, and how each is written.

A *site* names an activation at one layer: ``resid_pre`` / ``resid_post`` (the residual stream
entering / leaving a block), ``attn_out`` / ``mlp_out`` (what attention / the MLP adds to it),
``resid_mid`` (the stream between the two, carried on to the block's output), ``z`` (each head's
output before W_O, ``[..., n_heads, d_head]``) and ``mlp_post`` (each MLP neuron, the input of the
down projection). Patching, attribution, SAE splicing and interventions all address values this
way (``bridge.site_hook`` gives the hook each is read at).

Every site is written at its own hook except ``resid_mid``: the bridge's ``hook_resid_mid`` is the
MLP norm's input, and a value written there reaches the MLP but not the residual stream the block
carries on (HF keeps its own copy of the residual). resid_mid = resid_pre + attn_out, so a new
resid_mid value v is written as attn_out := v − resid_pre — the MLP and the stream then both read v,
and a gradient taken there is the gradient with respect to resid_mid.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from mcp_interp.core.engine.backend.edits import Edit, Rewrite
from mcp_interp.core.engine.backend.points import hook_attn_out, hook_in, site_hook

Site = Literal["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "z", "mlp_post"]
SITES: tuple[Site, ...] = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "z", "mlp_post")
INSIDE_BLOCK: frozenset[str] = frozenset({"z", "attn_out", "resid_mid", "mlp_out", "mlp_post"})
CHANNEL_SITES: frozenset[str] = frozenset({"z", "mlp_post"})


def write_hook(site: str, layer: int) -> str:
    """The hook through which a site is written (and differentiated): its own, except ``resid_mid``
    (written through ``attn_out``: the same value written, the same gradient read)."""
    return hook_attn_out(layer) if site == "resid_mid" else site_hook(site, layer)


def replace_edits(site: str, layer: int, replace_fn: Callable[[torch.Tensor], torch.Tensor]) -> list[Edit]:
    """Edits that replace the site's value ``v`` (``[batch, seq, ...]`` as its point holds it) by
    ``replace_fn(v)`` at every position, so that everything downstream reads the replacement
    (``resid_mid`` through ``attn_out``, see the module docstring: that one also reads resid_pre, so it runs only
    on a local model)."""
    if site != "resid_mid":
        return [Rewrite(site_hook(site, layer), lambda values: replace_fn(values).to(values.dtype))]
    held: dict[str, torch.Tensor] = {}

    def keep(values: torch.Tensor) -> None:
        held["resid_pre"] = values

    def write_mid(attn_out: torch.Tensor) -> torch.Tensor:
        resid_pre = held.pop("resid_pre")
        return (replace_fn(resid_pre + attn_out) - resid_pre).to(attn_out.dtype)

    return [Rewrite(hook_in(layer), keep, is_pure=False), Rewrite(hook_attn_out(layer), write_mid, is_pure=False)]
