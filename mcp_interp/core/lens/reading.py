"""What every lens reader shares: one prompt's batch, a forward that keeps only the points asked for, and the
caveat every correlational reading carries.

All four readers (logit lens, direct logit attribution, attention, induction) are *correlational*: they
describe what the model computes on this input, not what would happen if a component were removed. For
causal claims use ablation or patching.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.tokens import Batch, encode
from mcp_interp.errors import InputError

CORRELATIONAL = (
    "{what} is correlational: it shows what each part contributes in this run, not what happens when it is "
    "removed. Confirm a component's role with ablate_head or patch_heads before calling it causal."
)


def single_prompt(model: LoadedModel, prompt: str) -> Batch:
    if not isinstance(prompt, str) or not prompt:
        raise InputError("`prompt` must be a non-empty string.")
    return encode(model.tokenizer, [prompt], model.device)


def read_run(
    model: LoadedModel, input_ids: torch.Tensor, names: Sequence[str], logits: bool = True
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """One forward of ``input_ids``: its logits (or None with ``logits=False``, the forward then stops after the
    last block) and the values at ``names``."""
    run = model.backend.run(input_ids, capture=names, output="logits" if logits else "final")
    return run.logits, run.acts
