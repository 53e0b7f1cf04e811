"""Attribution patching: the first-order estimate of exact patching, from one forward and one backward.

Term = (a_src − a_base) · ∂metric/∂a_base at every position (and head or neuron), for the sites
and layers asked for. Summing terms over positions estimates patching those positions together.
Exact when the metric is linear in the activation (nothing non-linear downstream); an
approximation otherwise — cheap, and labelled as such wherever it is reported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mcp_interp.core.engine.backend.edits import Edit, Rewrite, observe
from mcp_interp.core.engine.backend.points import site_hook
from mcp_interp.core.engine.backend.sites import INSIDE_BLOCK, Site, write_hook
from mcp_interp.core.engine.numbers.row_readouts import RowMetric


@dataclass
class Attribution:
    """First-order terms per layer (see ``attribution_terms``) and the base run's final residual at
    each prompt's answer position, ``[batch, d_model]``."""

    terms: dict[int, torch.Tensor]
    base_answer_residual: torch.Tensor


def attribution_terms(
    backend: Any,
    base_ids: torch.Tensor,
    site: Site,
    source: dict[int, torch.Tensor],
    answer_positions: torch.Tensor,
    residual_metric: RowMetric,
    objective: Callable[[torch.Tensor], torch.Tensor] = torch.sum,
    base_edits: Sequence[Edit] = (),
) -> Attribution:
    """First-order terms of (patched − base) metric at each layer of ``source``, per prompt and position.

    Term = (a_src − a_base) · ∂metric/∂a_base, from one forward and one backward of the base
    batch, summed over the activation's width: ``[batch, seq]`` for residual-width sites,
    ``[batch, seq, n_heads]`` for ``z``, ``[batch, seq, d_mlp]`` for ``mlp_post`` (each neuron on
    its own). Summing terms over positions estimates patching those positions together. Exact
    when the metric is linear in the activation (nothing non-linear downstream); an
    approximation otherwise. ``residual_metric`` reads the metric from the final residual at the
    answer positions (a readout's ``from_residual``): the forward stops after the last block, so
    the vocabulary projection of every position is neither computed nor differentiated. The same
    forward is the base run: its final residual at the answer positions comes back too, so no
    separate base forward is needed.
    """
    layers = sorted(source)
    grads_at: dict[int, torch.Tensor] = {}
    values_at: dict[int, torch.Tensor] = {}

    def keep(layer: int) -> Rewrite:
        def hold(value: torch.Tensor) -> torch.Tensor:
            # Return a new tensor so the rest of the forward provably consumes it: the bridge may
            # hand the hook a reshaped view that is not itself on the path to the logits.
            grads_at[layer] = value.clone()
            return grads_at[layer]

        grad_point = write_hook(site, layer) if site in INSIDE_BLOCK else site_hook(site, layer)
        return Rewrite(grad_point, hold, is_pure=False)

    def read(layer: int) -> Edit:
        return observe(site_hook(site, layer), lambda value: values_at.__setitem__(layer, value.detach()))

    edits: list[Edit] = [*base_edits, *(keep(layer) for layer in layers)]
    if site == "resid_mid":  # the gradient is read at attn_out, the value at resid_mid
        edits += [read(layer) for layer in layers]
    batch = base_ids.shape[0]
    run = backend.run(base_ids, edits=edits, output="final", mode="grad")
    assert run.final is not None
    with torch.enable_grad():
        rows = run.final[torch.arange(batch), answer_positions]
        # The rows' values folded into the sum of the pair metrics (``rows.RowPlan.objective``; a plain sum when each
        # row is a pair): pairs are independent, so each row's gradient is its own pair's.
        total = objective(residual_metric(rows, torch.arange(batch)))
    grads = backend.backward(total, [grads_at[layer] for layer in layers])
    terms = {}
    for layer, grad in zip(layers, grads, strict=True):
        assert grad is not None
        base = values_at[layer] if site == "resid_mid" else grads_at[layer].detach()
        term = (source[layer].to(torch.float64) - base.to(torch.float64)) * grad.to(torch.float64)
        terms[layer] = term if site == "mlp_post" else term.sum(dim=-1)
    return Attribution(terms, rows.detach())
