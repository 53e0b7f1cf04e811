"""Displacement-matched control tokens for the causal-swap protocol.

The real edit moves the activation along ``v_target − v_source`` (scaled by the source's
coordinate). A control edit is the same operation towards a *random* token ``t`` whose lens
vector is as far from the source's as the target's is:

    | ‖v_t − v_src‖ − ‖v_tgt − v_src‖ | ≤ tolerance · ‖v_tgt − v_src‖

so a real success cannot be explained by "any edit of that size breaks the answer". The
source, the target, both answers and every atom of the active support are never drawn (nor, by
the caller, special tokens and unembedding rows beyond the tokenizer's vocabulary).

**One control token per seed for a whole swap, at every layer.** The real arm of a swap
(function, source, target) is the same token — the target — at every layer it is edited at, so
each control is one token too: drawn once per seed from the tokens that qualify at *every* one of
those layers (``SharedPool``, the intersection of the per-layer pools; the Jacobian lens's
dictionary ``v_t = J_ℓᵀ W_U[:, t]`` and the active support both change with ℓ, so a token matched
at one layer need not be at another). Then, under the null that the target is just another
displacement-matched token, the columns real, control₁ … control_m of a swap's trials are
exchangeable *as columns* — which is what the relabelling test in ``swap.summary`` needs; a
control redrawn per trial would make the real column one token and the control columns many,
and a token effect shared by the real column's trials then looks like an effect. The same holds
across the prompts a target is swapped into (the real arm is the target's token in all of them),
and there a control cannot follow: a token matched to every source's displacement at every layer
practically never exists (on the default benchmark not one, for any target). So the tests use one
swap per target (``swap.summary.tested_swaps``). A benchmark never draws a corpus word as a
control: a concept is another target's real arm.

The draw is uniform over the qualifying ids (sorted ascending) with a **CPU** ``torch.Generator``
seeded by (seed, swap) (``swap_seed``), so a seed names the same token on every device and each
swap draws its own; the controls of one swap are distinct tokens (a seed whose draw repeats an
earlier seed's token draws again from its own generator). A benchmark also keeps one target's
controls out of other targets' swaps while the pool allows, and clusters the targets whose tested
swaps still share a token (``swap.summary``). Distances are computed in float64 on the CPU for the same reason. An empty
candidate set is reported, never papered over by widening the tolerance.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

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


@dataclass
class SharedPool:
    """The tokens that qualify as a control of one swap at every layer added so far: the intersection of the
    per-layer pools (``add`` one per layer the swap is edited at, then ``draw``)."""

    candidates: torch.Tensor | None = None  # ascending ids; None until a layer is added
    layer_sizes: dict[int, int] = field(default_factory=dict)  # each layer's own pool size
    nearest_ratio: float | None = None  # the worst layer's closest relative mismatch (why a pool is empty)

    def add(self, layer: int, pool: ControlPool) -> None:
        self.layer_sizes[layer] = int(pool.candidates.numel())
        if pool.nearest_ratio is not None:
            self.nearest_ratio = max(self.nearest_ratio or 0.0, pool.nearest_ratio)
        if self.candidates is None:
            self.candidates = pool.candidates
        else:
            self.candidates = self.candidates[torch.isin(self.candidates, pool.candidates)]

    def exclude(self, tokens: Iterable[int]) -> None:
        """Drop ``tokens`` from the candidates (a benchmark's corpus words: a concept is another target's real arm)."""
        if self.candidates is not None:
            self.candidates = self.candidates[~torch.isin(self.candidates, torch.tensor(sorted(set(tokens))).long())]

    @property
    def size(self) -> int:
        return 0 if self.candidates is None else int(self.candidates.numel())


def draw_control(candidates: torch.Tensor, seed: int, taken: Sequence[int] = ()) -> int:
    """One token id drawn uniformly from ``candidates`` with a CPU generator seeded by ``seed``; a draw in ``taken``
    is redrawn from the same generator (so the tokens of one swap's seeds are distinct)."""
    if candidates.numel() <= len(set(taken) & set(candidates.tolist())):
        raise ValueError("the control pool has no token left to draw")
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    while True:
        token = int(candidates[int(torch.randint(candidates.numel(), (1,), generator=generator))])
        if token not in taken:
            return token


def swap_seed(seed: int, swap: str) -> int:
    """The generator seed of control ``seed`` for one swap (``swap`` names it, 'function/source→target'): a stable
    hash of both, so each swap draws its own controls. Seeded by ``seed`` alone, swaps with similar pools drew the
    same tokens, which tied different targets' tests together (a shared token's effect counts in both: the tests'
    size rose to 0.107)."""
    digest = hashlib.sha256(f"{int(seed)}\x00{swap}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 2**63


def draw_controls(candidates: torch.Tensor, seeds: Sequence[int], swap: str) -> list[int]:
    """One distinct control token per seed, in seed order (``draw_control`` with ``swap_seed(seed, swap)``); needs at
    least ``len(seeds)`` candidates."""
    if candidates.numel() < len(seeds):
        raise ValueError(f"{candidates.numel()} candidate token(s) for {len(seeds)} seeds")
    tokens: list[int] = []
    for seed in seeds:
        tokens.append(draw_control(candidates, swap_seed(seed, swap), tokens))
    return tokens
