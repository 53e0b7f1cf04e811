"""Displacement-matched control tokens for the causal-swap protocol.

The real edit moves the activation along ``v_target − v_source`` (scaled by the source's
coordinate). A control edit is the same operation towards a *random* token ``t`` whose lens
vector is as far from the source's as the target's is:

    | ‖v_t − v_src‖ − ‖v_tgt − v_src‖ | ≤ tolerance · ‖v_tgt − v_src‖

so a real success cannot be explained by "any edit of that size breaks the answer". The
source, the target, both answers and every atom of the active support are never drawn (nor, by
the caller, special tokens and unembedding rows beyond the tokenizer's vocabulary). The
draw is uniform over the qualifying ids (sorted ascending) with a seeded **CPU**
``torch.Generator``, so a seed names the same token on every device. Distances are computed in
float64 on the CPU for the same reason. An empty candidate set is reported, never papered over
by widening the tolerance.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ControlPool:
    """The tokens a control may be drawn from, for one (source, target, dictionary)."""

    candidates: torch.Tensor  # ascending token ids, CPU long
    reference_distance: float  # ‖v_tgt − v_src‖
    tolerance: float
    nearest_ratio: float | None  # the best |d_t − ref| / ref over non-excluded tokens (why a pool is empty)


def distances_from(dictionary: torch.Tensor, source_id: int) -> torch.Tensor:
    """‖v_t − v_src‖ for every row t, float64 on the CPU."""
    rows = dictionary.detach().to("cpu", torch.float64)
    return torch.linalg.vector_norm(rows - rows[source_id], dim=1)


def control_pool(
    dictionary: torch.Tensor,
    source_id: int,
    target_id: int,
    excluded: Iterable[int],
    tolerance: float,
    distances: torch.Tensor | None = None,
) -> ControlPool:
    """Every token whose displacement from the source matches the target's within ``tolerance``.

    ``distances`` may pass precomputed ``distances_from(dictionary, source_id)`` (reused across
    targets of one source).
    """
    if not tolerance >= 0:
        raise ValueError(f"control tolerance must be >= 0, got {tolerance}")
    if distances is None:
        distances = distances_from(dictionary, source_id)
    reference = float(distances[target_id])
    allowed = torch.ones(distances.shape[0], dtype=torch.bool)
    allowed[[source_id, target_id, *excluded]] = False
    mismatch = (distances - reference).abs()
    qualifying = allowed & (mismatch <= tolerance * reference)
    nearest = float(mismatch[allowed].min()) / reference if bool(allowed.any()) and reference > 0 else None
    return ControlPool(
        candidates=torch.nonzero(qualifying).flatten(),
        reference_distance=reference,
        tolerance=tolerance,
        nearest_ratio=nearest,
    )


def draw_control(pool: ControlPool, seed: int) -> int:
    """One token id drawn uniformly from the pool with a CPU generator seeded by ``seed``."""
    if pool.candidates.numel() == 0:
        raise ValueError("the control pool is empty")
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    index = int(torch.randint(pool.candidates.numel(), (1,), generator=generator))
    return int(pool.candidates[index])
