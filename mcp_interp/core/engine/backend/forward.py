"""One forward pass, recorded: the final residual, chosen hooks' values, and each block's inputs.

Why a module of its own: almost every measurement starts from "run the batch once and keep what
you need", and most need neither the final norm nor the vocabulary projection of every position
(they read the answer position only). ``capture_forward`` stops the forward right after the last
block by raising ``StopForward`` from a hook, so that projection — the largest matmul of a small
model — is never computed. ``trace`` additionally records what the patching sweep needs to re-run
a block by itself: the residual entering it and the keyword arguments the model called it with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mcp_interp.core.engine.backend.bridge import block_output, hook_z


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


class StopForward(Exception):
    """Raised by a hook once everything a caller needs has been computed: the rest of the forward is skipped."""


def stop_after_last_block(bridge: Any, keep: list[torch.Tensor]) -> Any:
    """A forward hook handle on the last block that appends its output to ``keep`` and stops the forward."""

    def stop(module: Any, args: Any, output: Any) -> None:
        keep.append(block_output(output))
        raise StopForward

    return bridge.blocks[len(bridge.blocks) - 1].register_forward_hook(stop)


def capture_forward(
    bridge: Any,
    input_ids: torch.Tensor,
    names: Sequence[str] = (),
    trace: bool = False,
    hooks: Sequence[tuple[str, Callable[..., Any]]] = (),
) -> Capture:
    """Run ``input_ids`` once (under the forward ``hooks`` if given, e.g. an ablation's), recording the hooks
    ``names`` and, with ``trace``, each block's residual input and call arguments. The vocabulary projection is
    skipped: callers unembed only the answer positions."""
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

    handles = []
    if trace:
        handles = [
            block.register_forward_pre_hook(recorder(i), with_kwargs=True) for i, block in enumerate(bridge.blocks)
        ]
    handles.append(stop_after_last_block(bridge, final))
    fwd_hooks = [*hooks, *((name, keep(name)) for name in names)]
    try:
        with torch.inference_mode(), bridge.hooks(fwd_hooks=fwd_hooks):
            bridge(input_ids, return_type=None)
    except StopForward:
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
        block_trace = BlockTrace(inputs, kwargs, final[0].detach(), input_ids.shape[0])  # type: ignore[arg-type]
    return Capture(final=final[0].detach(), acts=acts, trace=block_trace)


def trace_blocks(bridge: Any, input_ids: torch.Tensor) -> BlockTrace:
    """Each block's residual input and call arguments from one forward of ``input_ids``."""
    trace = capture_forward(bridge, input_ids, trace=True).trace
    assert trace is not None
    return trace


def collect_z(bridge: Any, input_ids: torch.Tensor, layers: list[int]) -> dict[int, torch.Tensor]:
    """``hook_z`` of the given layers from one forward of ``input_ids``."""
    acts = capture_forward(bridge, input_ids, [hook_z(layer) for layer in layers]).acts
    return {layer: acts[hook_z(layer)] for layer in layers}
