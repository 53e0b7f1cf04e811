"""What every lens reader shares: one prompt's batch, a forward that keeps only the hooks asked for, and the
caveat every correlational reading carries.

All four readers (logit lens, direct logit attribution, attention, induction) are *correlational*: they
describe what the model computes on this input, not what would happen if a component were removed. For
causal claims use ablation or patching.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mcp_interp.core.engine.text.tokens import Batch, encode
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel

CORRELATIONAL = (
    "{what} is correlational: it shows what each part contributes in this run, not what happens when it is "
    "removed. Confirm a component's role with ablate_head or patch_heads before calling it causal."
)


def single_prompt(model: LoadedModel, prompt: str) -> Batch:
    if not isinstance(prompt, str) or not prompt:
        raise InputError("`prompt` must be a non-empty string.")
    return encode(model.tokenizer, [prompt], model.device)


def run_with_cache(model: LoadedModel, input_ids: torch.Tensor, names: Sequence[str]) -> tuple[torch.Tensor, Any]:
    wanted = set(names)
    with torch.inference_mode():
        return model.bridge.run_with_cache(input_ids, names_filter=lambda name: name in wanted)
