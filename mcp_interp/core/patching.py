"""Activation patching of attention-head outputs (``hook_z``): exact and attribution.

Exact patching answers: "if head h at layer l had its value from the *source* run, what
would the metric be in the *base* run?" (denoise: base = corrupt, source = clean; noise: the
reverse). TransformerLens' ``get_act_patch_attn_head_out_all_pos`` runs one full forward per
head. Three facts make the same numbers far cheaper, and this module uses all of them:

1. A patch at layer l leaves layers 0..l-1 exactly as in the base run, so a patched run can
   start from the base run's residual entering block l (captured once) — lower layers are not
   re-run.
2. The patched runs of every head are independent, so they are batched: one sweep over the
   layers carries a growing batch in which each head's copies join at their own layer.
   Every block runs once per sweep, on big matrices, instead of once per head.
3. Only the answer positions are unembedded (the vocabulary projection is the largest matmul).

``HeadSweep`` is that sweep — the rows, who joins when, the chunking into block calls, each
chunk's patch, the read-out — written once. An engine only says how one block runs on a chunk
of rows: ``HeadPatchSweep`` (here, any model) calls each block through the TransformerBridge
with the keyword arguments (attention mask, position embeddings, ...) captured from a real
forward of the base batch, so the computation is the model's own, hooks included;
``core.suffix_sweep.SuffixHeadPatchSweep`` (Llama) recomputes only the positions after the
pairs' shared prefix. Agreement with TransformerLens' patching module is a test.

Attribution patching is the first-order estimate (Δz · ∂metric/∂z) from one forward on each
input and one backward on the base run: cheap, approximate, and labelled as such.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from mcp_interp.core.bridge import (
    block_output,
    final_norm,
    hook_attn_out,
    hook_z,
    logits_from_residual,
    run_block,
    site_hook,
    unembed_linear,
)

# A metric maps final residuals at the answer position [rows, d_model] (before the final norm)
# and each row's prompt index to one number per row.
RowMetric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class LogitDiffReadout:
    """logit(correct[p]) − logit(incorrect[p]) for rows of prompt p, float64.

    ``from_residual`` applies the final norm and then only the two unembedding rows it needs:
    the full vocabulary projection of thousands of patched rows would cost more than the
    patched runs' attention. Falls back to the full unembedding when the model's unembedding
    is not a plain linear layer.
    """

    def __init__(self, bridge: Any, correct: torch.Tensor, incorrect: torch.Tensor) -> None:
        self.bridge, self.correct, self.incorrect = bridge, correct, incorrect
        linear = unembed_linear(bridge)
        self.weight = linear.weight if linear is not None else None
        self.bias = linear.bias if linear is not None else None

    def from_logits(self, logits: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        good = logits.gather(1, self.correct[prompts].unsqueeze(1))
        bad = logits.gather(1, self.incorrect[prompts].unsqueeze(1))
        return (good - bad).squeeze(1).to(torch.float64)

    def from_residual(self, residual: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            return self.from_logits(logits_from_residual(self.bridge, residual), prompts)
        normed = final_norm(self.bridge, residual)
        good, bad = self.correct[prompts], self.incorrect[prompts]
        diff = (normed * (self.weight[good] - self.weight[bad])).sum(dim=-1)
        if self.bias is not None:
            diff = diff + self.bias[good] - self.bias[bad]
        return diff.to(torch.float64)


@dataclass
class BlockTrace:
    """What a patched run needs from one real forward of the base batch."""

    inputs: list[torch.Tensor]  # residual entering block l, [batch, seq, d_model]
    kwargs: list[dict[str, Any]]  # keyword arguments the model passed to block l
    final: torch.Tensor  # output of the last block (before the final norm), [batch, seq, d_model]
    batch_size: int


@dataclass
class Capture:
    """One forward pass, stopped after the last block: the final residual plus what was asked for."""

    final: torch.Tensor  # [batch, seq, d_model], before the final norm
    acts: dict[str, torch.Tensor]  # hook name -> its value
    trace: BlockTrace | None


class _StopForward(Exception):
    """Raised by a hook after the last block: nothing after it (final norm, unembedding) is needed."""


def capture_forward(bridge: Any, input_ids: torch.Tensor, names: Sequence[str] = (), trace: bool = False) -> Capture:
    """Run ``input_ids`` once, recording the hooks ``names`` and, with ``trace``, each block's
    residual input and call arguments. The vocabulary projection is skipped: callers unembed
    only the answer positions."""
    n_layers = len(bridge.blocks)
    inputs: list[torch.Tensor | None] = [None] * n_layers
    kwargs: list[dict[str, Any] | None] = [None] * n_layers
    acts: dict[str, torch.Tensor] = {}
    final: list[torch.Tensor] = []

    def recorder(layer: int) -> Callable[..., None]:
        def record(module: Any, args: tuple[Any, ...], call_kwargs: dict[str, Any]) -> None:
            hidden = args[0] if args else call_kwargs["hidden_states"]
            inputs[layer] = hidden.detach()
            kwargs[layer] = {k: v for k, v in call_kwargs.items() if k != "hidden_states"}

        return record

    def keep(name: str) -> Callable[[torch.Tensor, Any], None]:
        def hook(value: torch.Tensor, hook: Any) -> None:
            acts[name] = value.detach().clone()

        return hook

    def stop(module: Any, args: Any, output: Any) -> None:
        final.append(block_output(output).detach())
        raise _StopForward

    handles = []
    if trace:
        handles = [
            block.register_forward_pre_hook(recorder(i), with_kwargs=True) for i, block in enumerate(bridge.blocks)
        ]
    handles.append(bridge.blocks[n_layers - 1].register_forward_hook(stop))
    fwd_hooks = [(name, keep(name)) for name in names]
    try:
        with torch.inference_mode(), bridge.hooks(fwd_hooks=fwd_hooks):
            bridge(input_ids, return_type=None)
    except _StopForward:
        pass
    finally:
        for handle in handles:
            handle.remove()
    if not final or len(acts) != len(set(names)):
        raise RuntimeError("the forward pass did not reach every requested hook of this model")
    block_trace = None
    if trace:
        if any(x is None for x in inputs) or any(k is None for k in kwargs):
            raise RuntimeError("could not trace every transformer block of this model")
        block_trace = BlockTrace(inputs, kwargs, final[0], input_ids.shape[0])  # type: ignore[arg-type]
    return Capture(final=final[0], acts=acts, trace=block_trace)


def trace_blocks(bridge: Any, input_ids: torch.Tensor) -> BlockTrace:
    """Each block's residual input and call arguments from one forward of ``input_ids``."""
    trace = capture_forward(bridge, input_ids, trace=True).trace
    assert trace is not None
    return trace


def collect_z(bridge: Any, input_ids: torch.Tensor, layers: list[int]) -> dict[int, torch.Tensor]:
    """``hook_z`` of the given layers from one forward of ``input_ids``."""
    acts = capture_forward(bridge, input_ids, [hook_z(layer) for layer in layers]).acts
    return {layer: acts[hook_z(layer)] for layer in layers}


# --- exact patching: one sweep, two engines ---------------------------------------------------

# Where a patch is written. ``resid_pre``/``resid_post``: the residual stream entering/leaving a
# block; ``attn_out``/``mlp_out``: what attention/the MLP adds to it; ``resid_mid``: the residual
# stream between the two (carried on to the block's output, not only the MLP's input); ``z``:
# one head's output before W_O; ``mlp_post``: one MLP neuron (the input of the down projection).
Site = Literal["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "z", "mlp_post"]
INSIDE_BLOCK: frozenset[str] = frozenset({"z", "attn_out", "resid_mid", "mlp_out", "mlp_post"})
CHANNEL_SITES: frozenset[str] = frozenset({"z", "mlp_post"})


@dataclass(frozen=True)
class Unit:
    """One patched run: a site at ``layer``, restricted to one head/neuron (``channel``) and to
    one ``position`` (None: every position of the sweep's ``patch_mask``)."""

    layer: int
    channel: int | None = None
    position: int | None = None


@dataclass
class SitePatch:
    """The patch of some rows of one block call at the sweep's site.

    ``rows`` [k] index the call's rows; ``channels`` [k] the head/neuron of each (None for a
    whole residual-width vector); ``source`` the source run's values over the call's s positions
    ([k, s, width], or [k, s] for a neuron); ``where`` (same shape, or with a trailing 1) the
    positions patched.
    """

    rows: torch.Tensor
    channels: torch.Tensor | None
    source: torch.Tensor
    where: torch.Tensor

    def apply(self, values: torch.Tensor) -> torch.Tensor:
        """Patch ``values`` [rows, s, ...] in place and return it."""
        if self.channels is None:
            current = values[self.rows]
            values[self.rows] = torch.where(self.where, self.source.to(values.dtype), current)
        else:
            current = values[self.rows, :, self.channels]
            values[self.rows, :, self.channels] = torch.where(self.where, self.source.to(values.dtype), current)
        return values

    def minus(self, base: torch.Tensor) -> SitePatch:
        """The same patch with ``base[rows]`` subtracted from the source: a patch of the residual
        after attention (``resid_mid``) written as a patch of what attention adds to it."""
        return SitePatch(self.rows, self.channels, self.source - base[self.rows].to(self.source.dtype), self.where)


@dataclass
class PatchSweep(ABC):
    """Exact patching of many units in one sweep over the layers (see the module docstring).

    The bookkeeping every engine shares: each unit's rows (one per prompt) join the batch at
    their unit's layer as copies of the base run's residual there; the batch runs through each
    later layer in chunks of ``rows_per_call()`` rows, each chunk carrying the ``SitePatch`` of
    the rows joining at that layer; at the end the metric is read at each row's answer position.
    ``resid_pre`` and ``resid_post`` patches are applied here, around the block calls; an engine
    applies the ``INSIDE_BLOCK`` sites. An engine implements ``run_block`` and
    ``rows_per_call``, and may recompute only positions ``first_position()..`` and, when
    ``ANSWER_ONLY_AT_LAST``, only the answer position at the last layer.

    ``steps()`` runs one layer per step (for progress and cancellation between layers); when it
    is exhausted, ``values`` holds the metric per unit and prompt, ``[len(units), batch]``.
    """

    bridge: Any
    base: BlockTrace
    site: Site
    source: dict[int, torch.Tensor]  # layer -> source run's values at the site, [batch, seq, ...]
    units: list[Unit]
    patch_mask: torch.Tensor  # [batch, seq] bool: positions patched for units without a position
    answer_positions: torch.Tensor  # [batch]
    metric: RowMetric
    values: torch.Tensor | None = field(default=None, init=False)

    # The last layer's ``run_block`` returns only the query position of each row, [rows, 1, d_model].
    ANSWER_ONLY_AT_LAST: ClassVar[bool] = False

    def first_position(self) -> int:
        """Positions before this one are not recomputed (identical in every patched run)."""
        return 0

    @abstractmethod
    def rows_per_call(self) -> int:
        """How many rows one block call takes."""

    @abstractmethod
    def run_block(
        self,
        layer: int,
        residual: torch.Tensor,
        rows_prompt: torch.Tensor,
        patch: SitePatch | None,
        query: torch.Tensor | None,
    ) -> torch.Tensor:
        """Block ``layer`` on ``residual`` [rows, s, d_model] (positions ``first_position()..`` of
        prompts ``rows_prompt``), with ``patch`` applied at the sweep's site (an ``INSIDE_BLOCK``
        one). ``query`` [rows] is given at the last layer of an ``ANSWER_ONLY_AT_LAST`` engine:
        the answer's index among the s positions."""

    def layers(self) -> list[int]:
        first = min(u.layer for u in self.units)
        return list(range(first, len(self.bridge.blocks)))

    def steps(self) -> Iterator[int]:
        batch, start = self.base.batch_size, self.first_position()
        if any(u.position is not None and u.position < start for u in self.units):
            raise ValueError(f"a unit patches a position before {start}, which this engine does not recompute")
        rows_per_call = self.rows_per_call()
        order = sorted(range(len(self.units)), key=lambda i: self.units[i].layer)
        residual: torch.Tensor | None = None
        rows_prompt = torch.empty(0, dtype=torch.long)
        rows_unit = torch.empty(0, dtype=torch.long)  # index into self.units
        rows_layer = torch.empty(0, dtype=torch.long)  # the layer each row's unit is patched at
        last_layer = len(self.bridge.blocks) - 1
        with torch.inference_mode():
            for layer in self.layers():
                joining = [i for i in order if self.units[i].layer == layer]
                if joining:
                    new = self.base.inputs[layer][:, start:].repeat(len(joining), 1, 1)
                    residual = new if residual is None else torch.cat([residual, new])
                    rows_prompt = torch.cat([rows_prompt, torch.arange(batch).repeat(len(joining))])
                    rows_unit = torch.cat([rows_unit, torch.tensor(joining).repeat_interleave(batch)])
                    rows_layer = torch.cat([rows_layer, torch.full((len(joining) * batch,), layer)])
                    if self.site == "resid_pre":
                        self._apply_around(layer, residual, rows_prompt, rows_unit, rows_layer, None)
                assert residual is not None
                answer_only = self.ANSWER_ONLY_AT_LAST and layer == last_layer
                pieces = []
                for lo in range(0, residual.shape[0], rows_per_call):
                    hi = min(lo + rows_per_call, residual.shape[0])
                    prompts = rows_prompt[lo:hi]
                    query = self.answer_positions[prompts] - start if answer_only else None
                    patch = None
                    if self.site in INSIDE_BLOCK:
                        patch = self._patch(layer, prompts, rows_unit[lo:hi], rows_layer[lo:hi], query)
                    pieces.append(self.run_block(layer, residual[lo:hi], prompts, patch, query))
                residual = torch.cat(pieces)
                if self.site == "resid_post":
                    query = self.answer_positions[rows_prompt] - start if answer_only else None
                    self._apply_around(layer, residual, rows_prompt, rows_unit, rows_layer, query)
                yield layer
            assert residual is not None
            if self.ANSWER_ONLY_AT_LAST:
                final = residual[:, 0]  # the last layer returned only each row's answer position
            else:
                final = residual[torch.arange(residual.shape[0]), self.answer_positions[rows_prompt] - start]
            row_values = self.metric(final, rows_prompt)
        values = torch.empty(len(self.units), batch, dtype=row_values.dtype)
        values[rows_unit, rows_prompt] = row_values
        self.values = values

    def _apply_around(
        self,
        layer: int,
        residual: torch.Tensor,
        rows_prompt: torch.Tensor,
        rows_unit: torch.Tensor,
        rows_layer: torch.Tensor,
        query: torch.Tensor | None,
    ) -> None:
        patch = self._patch(layer, rows_prompt, rows_unit, rows_layer, query)
        if patch is not None:
            patch.apply(residual)

    def _patch(
        self,
        layer: int,
        rows_prompt: torch.Tensor,
        rows_unit: torch.Tensor,
        rows_layer: torch.Tensor,
        query: torch.Tensor | None,
    ) -> SitePatch | None:
        """The patch of the rows (of one chunk) whose unit is at ``layer``; None if there are none."""
        joining = (rows_layer == layer).nonzero().squeeze(1)
        if not joining.numel():
            return None
        start = self.first_position()
        units = [self.units[i] for i in rows_unit[joining].tolist()]
        prompts = rows_prompt[joining]
        channels = None
        if self.site in CHANNEL_SITES:
            channels = torch.tensor([u.channel for u in units])
            source = self.source[layer][prompts, start:, channels]  # [k, s, d_head] or [k, s]
        else:
            source = self.source[layer][prompts, start:]  # [k, s, d_model]
        where = self.patch_mask[prompts, start:].clone()  # [k, s]
        positions = torch.tensor([-1 if u.position is None else u.position - start for u in units])
        one = (positions >= 0).nonzero().squeeze(1)
        if one.numel():
            where[one] = False
            where[one, positions[one]] = True
        if query is not None:  # only the answer position is computed
            at = query[joining]
            every = torch.arange(len(joining))
            source, where = source[every, at].unsqueeze(1), where[every, at].unsqueeze(1)
        if source.ndim == 3:
            where = where.unsqueeze(-1)
        return SitePatch(joining, channels, source, where)


def write_hook(site: str, layer: int) -> str:
    """The hook through which an inside-block site is patched (and differentiated). ``resid_mid``
    goes through ``attn_out`` (resid_mid = resid_pre + attn_out, and ``bridge.hook_resid_mid``
    cannot be written): the same value written, the same gradient read."""
    return hook_attn_out(layer) if site == "resid_mid" else site_hook(site, layer)


@dataclass
class BridgePatchSweep(PatchSweep):
    """The generic engine: every block called through the TransformerBridge on every position,
    the patch applied by a hook. Works for any model the bridge runs."""

    max_rows_per_call: int = 512

    def rows_per_call(self) -> int:
        return self.max_rows_per_call

    def run_block(
        self,
        layer: int,
        residual: torch.Tensor,
        rows_prompt: torch.Tensor,
        patch: SitePatch | None,
        query: torch.Tensor | None,
    ) -> torch.Tensor:
        fwd_hooks = []
        if patch is not None:
            applied = patch.minus(residual) if self.site == "resid_mid" else patch

            def patch_values(values: torch.Tensor, hook: Any) -> torch.Tensor:
                return applied.apply(values.clone())  # the hook's tensor may be a view the bridge still uses

            fwd_hooks.append((write_hook(self.site, layer), patch_values))
        call_kwargs = _rows_kwargs(self.base.kwargs[layer], rows_prompt, self.base.batch_size)
        with self.bridge.hooks(fwd_hooks=fwd_hooks):
            return run_block(self.bridge, layer, residual, call_kwargs)


def _rows_kwargs(call_kwargs: dict[str, Any], rows_prompt: torch.Tensor, batch_size: int) -> dict[str, Any]:
    """Block kwargs for a batch whose row r is a copy of prompt ``rows_prompt[r]``."""

    def select(value: Any) -> Any:
        if torch.is_tensor(value) and value.ndim > 0 and value.shape[0] == batch_size and batch_size > 1:
            return value.index_select(0, rows_prompt)
        if isinstance(value, tuple):
            return tuple(select(v) for v in value)
        return value

    out = {k: select(v) for k, v in call_kwargs.items() if k not in ("cache", "past_key_values", "past_key_value")}
    if "use_cache" in out:
        out["use_cache"] = False
    return out


# --- attribution patching -------------------------------------------------------------------------


@dataclass
class Attribution:
    """First-order terms per layer (see ``attribution_terms``) and the base run's final residual at
    each prompt's answer position, ``[batch, d_model]``."""

    terms: dict[int, torch.Tensor]
    base_answer_residual: torch.Tensor


def attribution_terms(
    bridge: Any,
    base_ids: torch.Tensor,
    site: Site,
    source: dict[int, torch.Tensor],
    answer_positions: torch.Tensor,
    residual_metric: RowMetric,
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

    def keep(layer: int) -> Callable[[torch.Tensor, Any], torch.Tensor]:
        def hook(value: torch.Tensor, hook: Any) -> torch.Tensor:
            # Return a new tensor so the rest of the forward provably consumes it: the bridge may
            # hand the hook a reshaped view that is not itself on the path to the logits.
            grads_at[layer] = value.clone()
            return grads_at[layer]

        return hook

    def read(layer: int) -> Callable[[torch.Tensor, Any], None]:
        def hook(value: torch.Tensor, hook: Any) -> None:
            values_at[layer] = value.detach()

        return hook

    grad_hook = write_hook if site in INSIDE_BLOCK else site_hook
    fwd_hooks: list[tuple[str, Callable[[torch.Tensor, Any], torch.Tensor | None]]]
    fwd_hooks = [(grad_hook(site, layer), keep(layer)) for layer in layers]
    if site == "resid_mid":  # the gradient is read at attn_out, the value at resid_mid
        fwd_hooks += [(site_hook(site, layer), read(layer)) for layer in layers]
    batch = base_ids.shape[0]
    final: list[torch.Tensor] = []

    def stop(module: Any, args: Any, output: Any) -> None:
        final.append(block_output(output))
        raise _StopForward

    handle = bridge.blocks[len(bridge.blocks) - 1].register_forward_hook(stop)
    try:
        with torch.enable_grad(), bridge.hooks(fwd_hooks=fwd_hooks):
            with contextlib.suppress(_StopForward):
                bridge(base_ids, return_type=None)
            rows = final[0][torch.arange(batch), answer_positions]
            total = residual_metric(rows, torch.arange(batch)).sum()  # prompts are independent: per-prompt grads
            grads = torch.autograd.grad(total, [grads_at[layer] for layer in layers])
    finally:
        handle.remove()
    terms = {}
    for layer, grad in zip(layers, grads, strict=True):
        base = values_at[layer] if site == "resid_mid" else grads_at[layer].detach()
        term = (source[layer].to(torch.float64) - base.to(torch.float64)) * grad.to(torch.float64)
        terms[layer] = term if site == "mlp_post" else term.sum(dim=-1)
    return Attribution(terms, rows.detach())


def attribution_estimates(
    bridge: Any,
    base_ids: torch.Tensor,
    source_z: dict[int, torch.Tensor],
    patch_mask: torch.Tensor,
    answer_positions: torch.Tensor,
    residual_metric: RowMetric,
    n_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """First-order estimate of (patched − base) metric per head and prompt, ``[n_layers, n_heads, batch]``,
    patching each head's z at the positions of ``patch_mask`` (see ``attribution_terms``); and the base
    run's final residual at the answer positions."""
    run = attribution_terms(bridge, base_ids, "z", source_z, answer_positions, residual_metric)
    estimates = torch.zeros(len(bridge.blocks), n_heads, base_ids.shape[0], dtype=torch.float64)
    mask = patch_mask.unsqueeze(-1).to(torch.float64)  # [batch, seq, 1]
    for layer, term in run.terms.items():
        estimates[layer] = (term * mask).sum(dim=1).T  # [n_heads, batch]
    return estimates, run.base_answer_residual
