"""What one forward pass gives back (``Run``) and what the patching sweep needs to re-run a block by itself
(``BlockTrace``): the values a backend hands to the families.

Why the final residual: almost every measurement reads only the answer positions, so a backend can stop the forward
right after the last block (``output="final"``) and skip the vocabulary projection of every position — the largest
matmul of a small model — leaving callers to unembed only the rows they read (``Backend.logits_from_residual``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

Output = Literal["logits", "final", "none"]
"""What a forward returns besides its captures: the logits of every position, the final residual (the forward
stopped after the last block, before the final norm), or nothing."""

Mode = Literal["inference", "no_grad", "grad"]
"""How autograd treats a forward: ``inference`` (torch.inference_mode: fastest; its tensors never enter a graph),
``no_grad`` (plain tensors a later gradient computation may read), ``grad`` (the graph kept for ``backward``)."""


@dataclass
class BlockTrace:
    """What a patched run needs from one real forward of the base batch."""

    inputs: list[torch.Tensor]  # residual entering block l, [batch, seq, d_model]
    kwargs: list[dict[str, Any]]  # keyword arguments the model passed to block l
    final: torch.Tensor  # output of the last block (before the final norm), [batch, seq, d_model]
    batch_size: int


@dataclass
class Run:
    """One forward pass: its logits or final residual (``Output``), the values captured at the points asked for
    (after the run's edits at those points), and with ``trace`` each block's input and call arguments."""

    logits: torch.Tensor | None = None  # [batch, seq, vocab]
    final: torch.Tensor | None = None  # [batch, seq, d_model], before the final norm
    acts: dict[str, torch.Tensor] = field(default_factory=dict)  # point -> its value
    trace: BlockTrace | None = None


@dataclass
class Capture:
    """A forward stopped after the last block (``Backend.capture``): the final residual ``[batch, seq, d_model]``
    (before the final norm), the values at the points asked for, and with ``trace`` the blocks' inputs."""

    final: torch.Tensor
    acts: dict[str, torch.Tensor]
    trace: BlockTrace | None = None
    logits: torch.Tensor | None = None  # [batch, seq, vocab] where the backend returns them anyway (remote backends)
