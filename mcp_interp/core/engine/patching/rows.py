"""How ``patch`` reads answers of several tokens: one patched row per answer token.

Patching reads one position per row. An answer of several tokens t1…tn (teacher-forced) needs
log P(t_k | prompt, t_<k) at n positions, so each pair becomes n rows: the prompt followed by
t_<k, read at its last position for t_k. Clean and corrupt rows get the same continuation, so they
stay minimal pairs of equal length that differ where the prompts differ. The pair's metric is then
rebuilt from its rows (``RowPlan.combine``):

    log P(answer) = logsumexp over alternatives of Σ_k log P(t_k | …)   (a single string: one alternative)
    logit_diff     = log P(correct) − log P(incorrect);   log_prob = log P(correct)

Single-token answers keep one row per pair and the plain metric (``RowPlan.identity``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mcp_interp.core.engine.text.answers import Answer, batch_of_ids
from mcp_interp.core.engine.text.tokens import Batch


@dataclass
class RowPlan:
    """Rows of the patched batches and how they fold back into one value per pair."""

    n_pairs: int
    row_pair: torch.Tensor  # [R] the pair each row comes from
    continuations: list[list[int]]  # [R] tokens appended to the pair's prompt
    targets: torch.Tensor | None = None  # [R] token whose log-prob each row reads (sequence mode)
    row_group: torch.Tensor | None = None  # [R] index of the row's (pair, role, alternative)
    group_key: list[tuple[int, int]] | None = None  # per group: (pair, role); role +1 correct, −1 incorrect

    @classmethod
    def identity(cls, n_pairs: int) -> RowPlan:
        return cls(n_pairs, torch.arange(n_pairs), [[] for _ in range(n_pairs)])

    @classmethod
    def sequences(cls, correct: Sequence[Answer], incorrect: Sequence[Answer] | None) -> RowPlan:
        """One row per answer token of every alternative; ``incorrect`` None for log_prob."""
        pairs, continuations, targets, groups, keys = [], [], [], [], []
        roles = [(1, correct)] + ([(-1, incorrect)] if incorrect is not None else [])
        for pair in range(len(correct)):
            for role, answers in roles:
                for alternative in answers[pair].alternatives:
                    keys.append((pair, role))
                    for k, token in enumerate(alternative):
                        pairs.append(pair)
                        continuations.append(list(alternative[:k]))
                        targets.append(token)
                        groups.append(len(keys) - 1)
        return cls(len(correct), torch.tensor(pairs), continuations, torch.tensor(targets), torch.tensor(groups), keys)

    @property
    def is_identity(self) -> bool:
        return self.targets is None

    def extend(self, batch: Batch) -> Batch:
        """The rows' batch: each row's pair prompt followed by its continuation."""
        if self.is_identity:
            return batch
        sequences = [batch.ids(int(p)) + c for p, c in zip(self.row_pair, self.continuations, strict=True)]
        return batch_of_ids(sequences, [len(s) - 1 for s in sequences], batch.input_ids.device, batch.pad_id)

    def combine(self, values: torch.Tensor) -> torch.Tensor:
        """Row values ``[..., R]`` (log-probs of the rows' targets) → the pair metric ``[..., n_pairs]``."""
        if self.is_identity:
            return values
        assert self.row_group is not None and self.group_key is not None
        shape = values.shape[:-1]
        per_group = torch.zeros(*shape, len(self.group_key), dtype=values.dtype).index_add_(-1, self.row_group, values)
        out = torch.zeros(*shape, self.n_pairs, dtype=values.dtype)
        for key in dict.fromkeys(self.group_key):
            members = [g for g, k in enumerate(self.group_key) if k == key]
            out[..., key[0]] += key[1] * torch.logsumexp(per_group[..., members], dim=-1)
        return out

    def fold(self, base: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """First-order change of the pair metric for row changes ``delta [..., R]`` (attribution):
        Σ_r ∂combine/∂v_r · delta_r, the gradient taken at the row values ``base [R]``."""
        if self.is_identity:
            return delta
        weights = torch.func.jacrev(self.combine)(base.to(torch.float64))  # [n_pairs, R]
        return delta.to(torch.float64) @ weights.T
