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

Blocks are called through the TransformerBridge with the keyword arguments (attention mask,
position embeddings, ...) captured from a real forward of the base batch, so the computation
is the model's own, hooks included. Agreement with TransformerLens' patching module is a test.

Attribution patching is the first-order estimate (Δz · ∂metric/∂z) from one forward on each
input and one backward on the base run: cheap, approximate, and labelled as such.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

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
        linear = getattr(bridge.unembed, "_original_component", None)
        self.weight = linear.weight if isinstance(linear, torch.nn.Linear) else None
        self.bias = linear.bias if isinstance(linear, torch.nn.Linear) else None

    def from_logits(self, logits: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        good = logits.gather(1, self.correct[prompts].unsqueeze(1))
        bad = logits.gather(1, self.incorrect[prompts].unsqueeze(1))
        return (good - bad).squeeze(1).to(torch.float64)

    def from_residual(self, residual: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            return self.from_logits(answer_logits_from_residual(self.bridge, residual), prompts)
        normed = self.bridge.ln_final(residual.unsqueeze(1))[:, 0]
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
        final.append(_block_output(output).detach())
        raise _StopForward

    handles = []
    if trace:
        handles = [
            block.register_forward_pre_hook(recorder(i), with_kwargs=True) for i, block in enumerate(bridge.blocks)
        ]
    handles.append(bridge.blocks[n_layers - 1].register_forward_hook(stop))
    fwd_hooks = [(f"blocks.{layer}.attn.hook_z", keep_z(layer)) for layer in z_layers]
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


def _block_output(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def answer_logits_from_residual(bridge: Any, residual_rows: torch.Tensor) -> torch.Tensor:
    """Final norm and unembedding of ``[rows, d_model]`` residuals → ``[rows, vocab]`` logits."""
    normed = bridge.ln_final(residual_rows.unsqueeze(1))
    return bridge.unembed(normed)[:, 0]


@dataclass
class HeadPatchSweep:
    """Exact patching of many heads in one sweep over the layers (see the module docstring).

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
    max_rows_per_call: int = 512
    values: torch.Tensor | None = field(default=None, init=False)

    def layers(self) -> list[int]:
        first = min(h.layer for h in self.heads)
        return list(range(first, len(self.bridge.blocks)))

    def steps(self) -> Iterator[int]:
        batch = self.base.batch_size
        order = sorted(range(len(self.heads)), key=lambda i: self.heads[i].layer)
        residual: torch.Tensor | None = None
        rows_prompt = torch.empty(0, dtype=torch.long)
        rows_head_index = torch.empty(0, dtype=torch.long)  # index into self.heads
        with torch.inference_mode():
            for layer in self.layers():
                joining = [i for i in order if self.heads[i].layer == layer]
                if joining:
                    new = self.base.inputs[layer].repeat(len(joining), 1, 1)
                    residual = new if residual is None else torch.cat([residual, new])
                    rows_prompt = torch.cat([rows_prompt, torch.arange(batch).repeat(len(joining))])
                    rows_head_index = torch.cat([rows_head_index, torch.tensor(joining).repeat_interleave(batch)])
                assert residual is not None
                outputs = []
                for start in range(0, residual.shape[0], self.max_rows_per_call):
                    stop = min(start + self.max_rows_per_call, residual.shape[0])
                    outputs.append(
                        self._run_block(
                            layer, residual[start:stop], rows_prompt[start:stop], rows_head_index[start:stop]
                        )
                    )
                residual = torch.cat(outputs)
                yield layer
            assert residual is not None
            final = residual[torch.arange(residual.shape[0]), self.answer_positions[rows_prompt]]
            row_values = self.metric(final, rows_prompt)
        values = torch.empty(len(self.heads), batch, dtype=row_values.dtype)
        values[rows_head_index, rows_prompt] = row_values
        self.values = values

    def _run_block(
        self, layer: int, residual: torch.Tensor, rows_prompt: torch.Tensor, rows_head_index: torch.Tensor
    ) -> torch.Tensor:
        heads_here = torch.tensor([self.heads[i].layer == layer for i in rows_head_index.tolist()], dtype=torch.bool)
        hook_name = f"blocks.{layer}.attn.hook_z"
        fwd_hooks = []
        if bool(heads_here.any()):
            rows = heads_here.nonzero().squeeze(1)
            head_ids = torch.tensor([self.heads[i].head for i in rows_head_index[rows].tolist()])
            prompts = rows_prompt[rows]
            source = self.source_z[layer][prompts, :, head_ids]  # [k, seq, d_head]
            mask = self.patch_mask[prompts].unsqueeze(-1)  # [k, seq, 1]

            def patch(z: torch.Tensor, hook: Any) -> torch.Tensor:
                z = z.clone()
                current = z[rows, :, head_ids]
                z[rows, :, head_ids] = torch.where(mask, source, current)
                return z

            fwd_hooks.append((hook_name, patch))
        call_kwargs = _rows_kwargs(self.base.kwargs[layer], rows_prompt, self.base.batch_size)
        with self.bridge.hooks(fwd_hooks=fwd_hooks):
            return _block_output(self.bridge.blocks[layer](residual, **call_kwargs))


def collect_z(bridge: Any, input_ids: torch.Tensor, layers: list[int]) -> dict[int, torch.Tensor]:
    """``hook_z`` of the given layers from one forward of ``input_ids``."""
    return capture_forward(bridge, input_ids, z_layers=layers).z


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

    fwd_hooks = [(f"blocks.{layer}.attn.hook_z", keep(layer)) for layer in layers]
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
