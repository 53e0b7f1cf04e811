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

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from mcp_interp.core.bridge import (
    block_output,
    final_norm,
    hook_z,
    logits_from_residual,
    run_block,
    unembed_linear,
)
from mcp_interp.core.heads import Head

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
    z: dict[int, torch.Tensor]  # layer -> hook_z [batch, seq, n_heads, d_head]
    trace: BlockTrace | None


class _StopForward(Exception):
    """Raised by a hook after the last block: nothing after it (final norm, unembedding) is needed."""


def capture_forward(
    bridge: Any, input_ids: torch.Tensor, z_layers: list[int] | tuple[int, ...] = (), trace: bool = False
) -> Capture:
    """Run ``input_ids`` once, recording ``hook_z`` of ``z_layers`` and, with ``trace``, each
    block's residual input and call arguments. The vocabulary projection is skipped: callers
    unembed only the answer positions."""
    n_layers = len(bridge.blocks)
    inputs: list[torch.Tensor | None] = [None] * n_layers
    kwargs: list[dict[str, Any] | None] = [None] * n_layers
    z: dict[int, torch.Tensor] = {}
    final: list[torch.Tensor] = []

    def recorder(layer: int) -> Callable[..., None]:
        def record(module: Any, args: tuple[Any, ...], call_kwargs: dict[str, Any]) -> None:
            hidden = args[0] if args else call_kwargs["hidden_states"]
            inputs[layer] = hidden.detach()
            kwargs[layer] = {k: v for k, v in call_kwargs.items() if k != "hidden_states"}

        return record

    def keep_z(layer: int) -> Callable[[torch.Tensor, Any], None]:
        def hook(value: torch.Tensor, hook: Any) -> None:
            z[layer] = value.detach().clone()

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
    fwd_hooks = [(hook_z(layer), keep_z(layer)) for layer in z_layers]
    try:
        with torch.inference_mode(), bridge.hooks(fwd_hooks=fwd_hooks):
            bridge(input_ids, return_type=None)
    except _StopForward:
        pass
    finally:
        for handle in handles:
            handle.remove()
    if not final or len(z) != len(set(z_layers)):
        raise RuntimeError("the forward pass did not reach every requested hook of this model")
    block_trace = None
    if trace:
        if any(x is None for x in inputs) or any(k is None for k in kwargs):
            raise RuntimeError("could not trace every transformer block of this model")
        block_trace = BlockTrace(inputs, kwargs, final[0], input_ids.shape[0])  # type: ignore[arg-type]
    return Capture(final=final[0], z=z, trace=block_trace)


def trace_blocks(bridge: Any, input_ids: torch.Tensor) -> BlockTrace:
    """Each block's residual input and call arguments from one forward of ``input_ids``."""
    trace = capture_forward(bridge, input_ids, trace=True).trace
    assert trace is not None
    return trace


def collect_z(bridge: Any, input_ids: torch.Tensor, layers: list[int]) -> dict[int, torch.Tensor]:
    """``hook_z`` of the given layers from one forward of ``input_ids``."""
    return capture_forward(bridge, input_ids, z_layers=layers).z


# --- exact patching: one sweep, two engines ---------------------------------------------------


@dataclass
class HeadPatch:
    """The patch of one block call: rows ``rows`` of the call get their head's source z.

    ``heads`` [k] is each such row's head index, ``source`` [k, s, d_head] the source run's z of
    that head and prompt over the call's s positions, ``where`` [k, s, 1] the positions patched.
    """

    rows: torch.Tensor
    heads: torch.Tensor
    source: torch.Tensor
    where: torch.Tensor

    def apply(self, z: torch.Tensor) -> torch.Tensor:
        """Patch ``z`` [rows, s, n_heads, d_head] in place and return it."""
        z[self.rows, :, self.heads] = torch.where(self.where, self.source.to(z.dtype), z[self.rows, :, self.heads])
        return z


@dataclass
class HeadSweep(ABC):
    """Exact patching of many heads in one sweep over the layers (see the module docstring).

    The bookkeeping every engine shares: each head's rows (one per prompt) join the batch at
    their head's layer as copies of the base run's residual there; the batch runs through each
    later layer in chunks of ``rows_per_call()`` rows, each chunk carrying the ``HeadPatch`` of
    the rows joining at that layer; at the end the metric is read at each row's answer position.
    An engine implements ``run_block`` and ``rows_per_call``, and may recompute only positions
    ``first_position()..`` and, when ``ANSWER_ONLY_AT_LAST``, only the answer position at the
    last layer.

    ``steps()`` runs one layer per step (for progress and cancellation between layers); when it
    is exhausted, ``values`` holds the metric per head and prompt, ``[len(heads), batch]``.
    """

    bridge: Any
    base: BlockTrace
    source_z: dict[int, torch.Tensor]  # layer -> source run's hook_z, [batch, seq, n_heads, d_head]
    heads: list[Head]
    patch_mask: torch.Tensor  # [batch, seq] bool: positions whose z is patched
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
        patch: HeadPatch | None,
        query: torch.Tensor | None,
    ) -> torch.Tensor:
        """Block ``layer`` on ``residual`` [rows, s, d_model] (positions ``first_position()..`` of
        prompts ``rows_prompt``), with ``patch`` applied to its z. ``query`` [rows] is given at the
        last layer of an ``ANSWER_ONLY_AT_LAST`` engine: the answer's index among the s positions."""

    def layers(self) -> list[int]:
        first = min(h.layer for h in self.heads)
        return list(range(first, len(self.bridge.blocks)))

    def steps(self) -> Iterator[int]:
        batch, start = self.base.batch_size, self.first_position()
        rows_per_call = self.rows_per_call()
        order = sorted(range(len(self.heads)), key=lambda i: self.heads[i].layer)
        residual: torch.Tensor | None = None
        rows_prompt = torch.empty(0, dtype=torch.long)
        rows_head = torch.empty(0, dtype=torch.long)  # index into self.heads
        rows_layer = torch.empty(0, dtype=torch.long)  # the layer each row's head is patched at
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
                answer_only = self.ANSWER_ONLY_AT_LAST and layer == len(self.bridge.blocks) - 1
                pieces = []
                for lo in range(0, residual.shape[0], rows_per_call):
                    hi = min(lo + rows_per_call, residual.shape[0])
                    prompts = rows_prompt[lo:hi]
                    query = self.answer_positions[prompts] - start if answer_only else None
                    patch = self._patch(layer, prompts, rows_head[lo:hi], rows_layer[lo:hi], query)
                    pieces.append(self.run_block(layer, residual[lo:hi], prompts, patch, query))
                residual = torch.cat(pieces)
                yield layer
            assert residual is not None
            if self.ANSWER_ONLY_AT_LAST:
                final = residual[:, 0]  # the last layer returned only each row's answer position
            else:
                final = residual[torch.arange(residual.shape[0]), self.answer_positions[rows_prompt] - start]
            row_values = self.metric(final, rows_prompt)
        values = torch.empty(len(self.heads), batch, dtype=row_values.dtype)
        values[rows_head, rows_prompt] = row_values
        self.values = values

    def _patch(
        self,
        layer: int,
        rows_prompt: torch.Tensor,
        rows_head: torch.Tensor,
        rows_layer: torch.Tensor,
        query: torch.Tensor | None,
    ) -> HeadPatch | None:
        """The patch of the rows (of one chunk) whose head is at ``layer``; None if there are none."""
        joining = (rows_layer == layer).nonzero().squeeze(1)
        if not joining.numel():
            return None
        start = self.first_position()
        heads = torch.tensor([self.heads[i].head for i in rows_head[joining].tolist()])
        prompts = rows_prompt[joining]
        source = self.source_z[layer][prompts, start:, heads]  # [k, s, d_head]
        where = self.patch_mask[prompts, start:].unsqueeze(-1)  # [k, s, 1]
        if query is not None:  # only the answer position is computed
            at = query[joining]
            every = torch.arange(len(joining))
            source, where = source[every, at].unsqueeze(1), where[every, at].unsqueeze(1)
        return HeadPatch(joining, heads, source, where)


@dataclass
class HeadPatchSweep(HeadSweep):
    """The generic engine: every block called through the TransformerBridge on every position,
    the patch applied by a ``hook_z`` hook. Works for any model the bridge runs."""

    max_rows_per_call: int = 512

    def rows_per_call(self) -> int:
        return self.max_rows_per_call

    def run_block(
        self,
        layer: int,
        residual: torch.Tensor,
        rows_prompt: torch.Tensor,
        patch: HeadPatch | None,
        query: torch.Tensor | None,
    ) -> torch.Tensor:
        fwd_hooks = []
        if patch is not None:

            def patch_z(z: torch.Tensor, hook: Any) -> torch.Tensor:
                return patch.apply(z.clone())  # the hook's z may be a view the bridge still uses

            fwd_hooks.append((hook_z(layer), patch_z))
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


def attribution_estimates(
    bridge: Any,
    base_ids: torch.Tensor,
    source_z: dict[int, torch.Tensor],
    patch_mask: torch.Tensor,
    answer_positions: torch.Tensor,
    logits_metric: RowMetric,
    n_heads: int,
) -> torch.Tensor:
    """First-order estimate of (patched − base) metric per head and prompt, ``[n_layers, n_heads, batch]``.

    For head h at layer l: Σ over patched positions and d_head of (z_src − z_base) · ∂metric/∂z_base,
    from one forward and one backward of the base batch. Exact when the metric is linear in z
    (e.g. a head writing straight to the logits with nothing downstream); an approximation otherwise.
    """
    layers = sorted(source_z)
    captured: dict[int, torch.Tensor] = {}

    def keep(layer: int) -> Callable[[torch.Tensor, Any], torch.Tensor]:
        def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:
            # Return a new tensor so the rest of the forward provably consumes it: the bridge may
            # hand the hook a reshaped view that is not itself on the path to the logits.
            captured[layer] = z.clone()
            return captured[layer]

        return hook

    fwd_hooks = [(hook_z(layer), keep(layer)) for layer in layers]
    batch = base_ids.shape[0]
    with torch.enable_grad(), bridge.hooks(fwd_hooks=fwd_hooks):
        logits = bridge(base_ids, return_type="logits")
        final = logits[torch.arange(batch), answer_positions]
        total = logits_metric(final, torch.arange(batch)).sum()  # prompts are independent: per-prompt grads
        grads = torch.autograd.grad(total, [captured[layer] for layer in layers])
    estimates = torch.zeros(len(bridge.blocks), n_heads, batch, dtype=torch.float64)
    mask = patch_mask.unsqueeze(-1).unsqueeze(-1).to(torch.float64)  # [batch, seq, 1, 1]
    for layer, grad in zip(layers, grads, strict=True):
        delta = (source_z[layer].to(torch.float64) - captured[layer].detach().to(torch.float64)) * mask
        estimates[layer] = (delta * grad.to(torch.float64)).sum(dim=(1, 3)).T  # [n_heads, batch]
    return estimates
