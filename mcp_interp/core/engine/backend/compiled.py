"""The local backend for a compiled RASP program: ``LocalBackend`` with its padding masked out of attention.

A compiled program's attention is bidirectional (tracr compiles non-causal models), so in a right-padded batch a real
position would read the padding after it, which a causal model never does. Every forward of a batch holding the
padding token gets ``attention_mask = (ids != PAD)``: the keys at padding are masked, and each row equals tracr's
own forward of its unpadded input (measured: every residual equal to 0.0 on 30 inputs of mixed lengths in one
batch). Block calls of the patching sweep re-use the mask from the traced forward's keyword arguments.

A batch wider than the position embedding (``max_seq_len`` values + BOS) is refused before it indexes past it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mcp_interp.core.engine.backend.edits import Edit
from mcp_interp.core.engine.backend.forward import Mode, Output, Run
from mcp_interp.core.engine.backend.local import LocalBackend
from mcp_interp.errors import InputError

ARCHITECTURE = "TracrProgram"


class CompiledBackend(LocalBackend):
    """``LocalBackend`` on a compiled program's bridge (TransformerLens' ``boot_native``), padding masked."""

    def __init__(self, bridge: Any, device: str, pad_id: int, program: Any) -> None:
        super().__init__(bridge, device)
        self.pad_id = pad_id
        self.program = program  # loader.program.CompiledProgram: what model_info states
        self.causal = str(getattr(self.cfg, "attention_dir", "causal")) == "causal"  # tracr's: "bidirectional"

    def run(
        self,
        input_ids: torch.Tensor,
        *,
        capture: Sequence[str] = (),
        edits: Sequence[Edit] = (),
        output: Output = "logits",
        stop_at: str | None = None,
        trace: bool = False,
        mode: Mode = "inference",
        attention_mask: torch.Tensor | None = None,
    ) -> Run:
        n_ctx = int(self.cfg.n_ctx)
        if input_ids.shape[-1] > n_ctx:
            raise InputError(
                f"A prompt of {input_ids.shape[-1]} tokens is longer than this compiled program takes: at most "
                f"{n_ctx - 1} input values after BOS (its max_seq_len)."
            )
        if attention_mask is None and bool((input_ids == self.pad_id).any()):
            attention_mask = (input_ids != self.pad_id).long()
        return super().run(input_ids, capture=capture, edits=edits, output=output, stop_at=stop_at, trace=trace,
                           mode=mode, attention_mask=attention_mask)  # fmt: skip

    def architecture(self) -> str:
        """No Hugging Face class: a tracr program on TransformerLens' native model."""
        return ARCHITECTURE
