"""Gaussian-noise corruption, as causal tracing runs it (Meng et al. 2022, ROME): the corrupt run is the clean prompt
itself with N(0, σ²) noise added to every coordinate of the token embeddings at the corrupted positions (the
subject's tokens), σ = ``scale`` × the standard deviation of the embeddings' coordinates (ROME: 3×); each prompt is
corrupted ``samples`` times with independent noise and every corrupt metric is the mean over those draws.

The embeddings' spread is read from the token embedding matrix over the whole vocabulary where the backend serves
weights, else from the prompts' own embeddings (a remote model's matrix stays there); the result says which. The
noise enters at ``hook_embed`` (the token embeddings, before any positional embedding), so every later activation of
the corrupt run — the patching sweep's trace included — is the noised run's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mcp_interp.core.engine.backend.edits import Add
from mcp_interp.core.engine.backend.points import HOOK_EMBED
from mcp_interp.core.engine.text.tokens import Batch
from mcp_interp.errors import InputError
from mcp_interp.schemas.localize import NoiseCorruption, NoiseInfo


def noised_positions(tokenizer: Any, prompts: Sequence[str], spec: NoiseCorruption) -> list[list[int]]:
    """Per prompt, the token positions to noise: ``spec.positions`` as given, or the tokens covering the prompt's
    subject (its first occurrence, by the tokenizer's character offsets)."""
    if (spec.positions is None) == (spec.subjects is None):
        raise InputError(
            "`noise` needs exactly one of `positions` (token indices) or `subjects` (text in each prompt)."
        )
    if spec.positions is not None:
        if not spec.positions:
            raise InputError("`noise.positions` must name at least one token index.")
        return [sorted(set(spec.positions))] * len(prompts)
    subjects = [spec.subjects] * len(prompts) if isinstance(spec.subjects, str) else list(spec.subjects or [])
    if len(subjects) != len(prompts):
        raise InputError(
            f"`noise.subjects` has {len(subjects)} entries for {len(prompts)} prompts: give one per prompt."
        )
    out = []
    for i, (prompt, subject) in enumerate(zip(prompts, subjects, strict=True)):
        start = prompt.find(subject) if subject else -1
        if start < 0:
            raise InputError(f"`noise.subjects[{i}]` {subject!r} does not occur in prompt {i} ({prompt!r}).")
        end = start + len(subject)
        offsets = tokenizer(prompt, return_offsets_mapping=True)["offset_mapping"]
        tokens = [p for p, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
        if not tokens:
            raise InputError(f"`noise.subjects[{i}]` {subject!r} covers no token of prompt {i}.")
        out.append(tokens)
    return out


@dataclass(frozen=True)
class Noise:
    """The noise of every corrupt row, ``[rows, seq, d_model]`` (0 off the noised positions), and what it was."""

    values: torch.Tensor
    info: NoiseInfo

    def edit(self, rows: torch.Tensor, width: int) -> Add:
        """The edit that corrupts a batch whose row r is corrupt row ``rows[r]`` and ``width`` tokens wide (rows
        extended by an answer's tokens keep their prompt's noise and get none on the continuation)."""
        values = self.values[rows.to(self.values.device)]
        if values.shape[1] < width:
            values = torch.cat([values, values.new_zeros(values.shape[0], width - values.shape[1], values.shape[2])], 1)
        return Add(HOOK_EMBED, values[:, :width])


def draw_noise(backend: Any, batch: Batch, positions: list[list[int]], spec: NoiseCorruption) -> Noise:
    """Noise for ``batch`` (each prompt repeated ``spec.samples`` times in a row, ``positions`` per distinct prompt)."""
    std, where = _embedding_std(backend, batch)
    sigma = spec.scale * std
    rows, width = batch.input_ids.shape
    d_model = int(backend.cfg.d_model)
    generator = torch.Generator(device="cpu").manual_seed(spec.seed)
    noise = torch.randn((rows, width, d_model), generator=generator, dtype=torch.float32) * sigma
    mask = torch.zeros((rows, width, 1), dtype=torch.float32)
    for r in range(rows):
        for p in positions[r // spec.samples]:
            if p >= batch.lengths[r]:
                raise InputError(f"`noise` position {p} is past the end of prompt {r // spec.samples}.")
            mask[r, p] = 1.0
    info = NoiseInfo(sigma=sigma, scale=spec.scale, embedding_std=std, std_of=where, samples=spec.samples,
                     seed=spec.seed, positions=positions)  # fmt: skip
    return Noise((noise * mask).to(batch.input_ids.device), info)


def _embedding_std(backend: Any, batch: Batch) -> tuple[float, str]:
    if backend.supports("weights"):
        return float(backend.token_embeddings().to(torch.float64).std()), "the token embedding matrix (every token)"
    acts = backend.capture(batch.input_ids, [HOOK_EMBED]).acts[HOOK_EMBED]
    real = acts[batch.attention_mask.bool()].to(torch.float64)
    return float(real.std()), "the prompts' own token embeddings (the backend serves no weights)"
