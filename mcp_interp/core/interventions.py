"""Head ablation on ``hook_z`` (the per-head input to the attention output projection).

Ablating on ``hook_z`` rather than on the attention pattern or the values works unchanged for
grouped-query attention: each query head has its own slice of z even when it shares keys and
values with other heads. Three ways to remove a head's contribution, from crudest to gentlest:

* ``zero``     — z = 0. Simple, but pushes the model off-distribution (a head is rarely 0).
* ``mean``     — z = the head's mean over this batch at the same kind of position: per position
  when every prompt has the same token length, else per distance from each prompt's last token
  (so the answer position is replaced by the mean answer-position z, never by a mean dominated by
  other positions such as the first token).
* ``resample`` — each prompt gets another prompt's z (a seeded permutation with no fixed
  points), keeping z on-distribution while removing prompt-specific information.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from mcp_interp.core.bridge import hook_z
from mcp_interp.core.heads import Head, PositionSpec, parse_heads, position_mask
from mcp_interp.core.tokens import Batch
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import AblationSpec, Intervention

AblationMethod = Literal["zero", "mean", "resample"]
MeanOver = Literal["per_position", "per_position_from_end"]
Hook = tuple[str, Callable[[torch.Tensor, Any], torch.Tensor]]


@dataclass(frozen=True)
class Ablation:
    heads: list[Head]
    method: AblationMethod = "zero"
    positions: PositionSpec = "all"
    seed: int = 0

    def describe(self) -> str:
        heads = ", ".join(str(h) for h in self.heads)
        return f"{self.method}-ablate {heads} at positions {self.positions or 'all'}"


@dataclass(frozen=True)
class PreparedAblation:
    """Forward hooks that apply an ablation to one batch, and how the replacement was formed."""

    hooks: list[Hook]
    mean_over: MeanOver | None = None
    permutation: list[int] | None = None


def derangement(n: int, seed: int) -> list[int]:
    """A uniformly random permutation of 0..n-1 with no fixed points, from a seeded CPU generator.

    Rejection sampling: about 1/e of permutations qualify, so a handful of draws suffice; the
    same seed gives the same permutation on every device.
    """
    if n < 2:
        raise InputError("Resample ablation needs at least 2 prompts: each prompt takes another prompt's activation.")
    generator = torch.Generator(device="cpu").manual_seed(seed)
    for _ in range(10_000):
        perm = torch.randperm(n, generator=generator)
        if bool((perm != torch.arange(n)).all()):
            return [int(i) for i in perm]
    raise RuntimeError("no derangement found")  # pragma: no cover - probability ~ (1 - 1/e)^10000


def mean_replacement(z: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, MeanOver]:
    """The batch mean of ``z`` ([batch, seq, heads, d_head]) at each real position's own kind of position.

    ``per_position``: no prompt is padded, so position i is replaced by the mean over prompts of
    position i. ``per_position_from_end``: prompts differ in length, so a position k tokens before
    its prompt's last token is replaced by the mean over prompts of the token k before *their* last
    (prompts shorter than k + 1 tokens are left out of that mean). Padding entries stay 0: they are
    never selected for replacement.
    """
    real = attention_mask.bool()
    if bool(real.all()):
        return z.mean(dim=0, keepdim=True).expand_as(z), "per_position"
    from_end = real.flip(1).cumsum(1).flip(1) - 1  # real tokens after this one, in its own prompt
    replacement = torch.zeros_like(z)
    for distance in range(int(real.sum(dim=1).max())):
        same_kind = real & (from_end == distance)  # at most one position per prompt
        replacement[same_kind] = z[same_kind].mean(dim=0)
    return replacement, "per_position_from_end"


def prepare_ablation(bridge: Any, batch: Batch, ablation: Ablation) -> PreparedAblation:
    """Build the hooks; mean/resample first read the heads' clean z from one forward of the batch."""
    if ablation.method not in ("zero", "mean", "resample"):
        raise InputError(f"Unknown ablation method {ablation.method!r}; use 'zero', 'mean' or 'resample'.")
    mask = position_mask(ablation.positions, batch.attention_mask, batch.answer_positions)
    layers = sorted({h.layer for h in ablation.heads})
    permutation = None
    if ablation.method == "resample":
        lengths = batch.lengths
        if len(set(lengths)) > 1:
            raise InputError(
                f"Resample ablation needs prompts of equal token length (got lengths {lengths}): a prompt's "
                "activation is swapped in position by position. Use method 'mean', or equal-length prompts."
            )
        permutation = derangement(len(lengths), ablation.seed)
    replacements: dict[int, torch.Tensor] = {}
    mean_over: MeanOver | None = None
    if ablation.method in ("mean", "resample"):
        from mcp_interp.core.patching import collect_z

        clean_z = collect_z(bridge, batch.input_ids, layers)
        for layer, z in clean_z.items():
            if ablation.method == "mean":
                replacements[layer], mean_over = mean_replacement(z, batch.attention_mask)
            else:
                replacements[layer] = z[torch.tensor(permutation)]

    def make_hook(layer: int, heads: list[int]) -> Callable[[torch.Tensor, Any], torch.Tensor]:
        head_index = torch.tensor(heads)
        where = mask[:, :, None, None]

        def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:
            new = z.clone()
            if ablation.method == "zero":
                replacement = torch.zeros_like(z[:, :, head_index])
            else:
                replacement = replacements[layer][:, :, head_index].to(z.dtype)
            new[:, :, head_index] = torch.where(where, replacement, z[:, :, head_index])
            return new

        return hook

    hooks: list[Hook] = [
        (hook_z(layer), make_hook(layer, [h.head for h in ablation.heads if h.layer == layer])) for layer in layers
    ]
    return PreparedAblation(hooks=hooks, mean_over=mean_over, permutation=permutation)


def ablation_from_spec(spec: AblationSpec | Intervention | None, n_layers: int, n_heads: int) -> Ablation | None:
    """The core ``Ablation`` for a tool's ``intervention`` / ablation arguments (None passes through)."""
    if spec is None:
        return None
    if isinstance(spec, Intervention):
        spec = spec.ablate
    heads = spec.heads if isinstance(spec.heads, list) else [spec.heads]
    raw = [h.model_dump() if not isinstance(h, str) else h for h in heads]
    return Ablation(parse_heads(raw, n_layers, n_heads), spec.method, spec.positions, spec.seed)
