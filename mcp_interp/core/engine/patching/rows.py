"""How ``patch`` reads answers that are not one token each: sets, sequences, and sets of sequences, as patched rows.

Patching reads one position per row. An answer alternative of tokens t1…tn (teacher-forced) needs
log P(t_k | prompt, t_<k) for every k: the prompt followed by t_<k, read at its last position. Rows are the distinct
(pair, continuation) inputs every alternative of the pair needs, and each row reads the log-probabilities of several
tokens at once (``reads``, ``[rows, K]``), so alternatives that share a prefix share their rows: a set of single tokens
is one row per pair whatever its size (one forward, as for a single token), and the 100 two-digit years of
greater-than on a digit-splitting tokenizer are 11 rows per pair (the prompt, and the prompt plus each first digit),
not 200. Clean and corrupt rows get the same continuation, so they stay minimal pairs of equal length that differ
where the prompts differ. The pair's metric is rebuilt from its rows (``RowPlan.combine``):

    log P(alternative) = Σ_k log P(t_k | prompt, t_<k);   log P(set) = logsumexp over its alternatives
    logit_diff = log P(correct) − log P(incorrect)   (for two single tokens: logit(a) − logit(b))
    log_prob   = log P(correct)
    prob_diff  = P(correct) − P(incorrect)   (probability mass, in [−1, 1]; Hanna et al.'s greater-than metric)

Single-token answers read with ``logit_diff``, ``log_prob`` or ``kl`` keep one row per pair and the plain readout
(``RowPlan.identity``, the fast path). ``combine`` is differentiable, so attribution takes the gradient of the pair
metric itself (``objective``) and a row's first-order term is its share of its pair's change (``to_pairs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from mcp_interp.core.engine.text.answers import Answer, batch_of_ids
from mcp_interp.core.engine.text.tokens import Batch
from mcp_interp.schemas.common import PatchMetric

UNUSED_SLOT = -1  # a read slot no alternative uses


@dataclass
class RowPlan:
    """Rows of the patched batches, the tokens each reads, and how their log-probabilities fold into one value per
    pair. ``reads`` None: the identity plan (one row per pair, the metric read directly)."""

    n_pairs: int
    row_pair: torch.Tensor  # [R] the pair each row comes from
    continuations: list[list[int]]  # [R] tokens appended to the pair's prompt
    reads: torch.Tensor | None = None  # [R, K] tokens whose log-prob each row reads (UNUSED_SLOT: unused slot)
    metric: PatchMetric = "logit_diff"
    # Flat indices (row * K + slot) of each alternative's reads, padded with R * K (a zero appended): [A, L]
    alternative_reads: torch.Tensor | None = field(default=None, repr=False)
    # Alternatives of each (pair, role) group, padded with A (a −inf appended): [G, M]; groups: pair p's correct is
    # group 2p, its incorrect 2p + 1 (absent for log_prob: all −inf, never read)
    group_alternatives: torch.Tensor | None = field(default=None, repr=False)

    @classmethod
    def identity(cls, n_pairs: int) -> RowPlan:
        return cls(n_pairs, torch.arange(n_pairs), [[] for _ in range(n_pairs)])

    @classmethod
    def answers(cls, metric: PatchMetric, correct: Sequence[Answer], incorrect: Sequence[Answer] | None) -> RowPlan:
        """The rows and reads ``correct`` (and ``incorrect``, None for log_prob) need, shared wherever alternatives
        share a prefix."""
        rows: dict[tuple[int, tuple[int, ...]], int] = {}
        slots: list[dict[int, int]] = []
        alternatives: list[list[tuple[int, int]]] = []
        groups: list[list[int]] = [[] for _ in range(2 * len(correct))]
        for pair in range(len(correct)):
            for role, answers in ((0, correct), (1, incorrect)):
                if answers is None:
                    continue
                for alternative in answers[pair].alternatives:
                    reads = []
                    for k, token in enumerate(alternative):
                        row = rows.setdefault((pair, tuple(alternative[:k])), len(rows))
                        if row == len(slots):
                            slots.append({})
                        slot = slots[row].setdefault(token, len(slots[row]))
                        reads.append((row, slot))
                    groups[2 * pair + role].append(len(alternatives))
                    alternatives.append(reads)
        width = max(len(s) for s in slots)
        read_tokens = torch.full((len(rows), width), UNUSED_SLOT, dtype=torch.long)
        for row, tokens in enumerate(slots):
            for token, slot in tokens.items():
                read_tokens[row, slot] = token
        pad_read = len(rows) * width
        longest = max(len(a) for a in alternatives)
        alternative_reads = torch.full((len(alternatives), longest), pad_read, dtype=torch.long)
        for a, reads in enumerate(alternatives):
            for j, (row, slot) in enumerate(reads):
                alternative_reads[a, j] = row * width + slot
        most = max(len(g) for g in groups)
        group_alternatives = torch.full((len(groups), most), len(alternatives), dtype=torch.long)
        for g, members in enumerate(groups):
            group_alternatives[g, : len(members)] = torch.tensor(members, dtype=torch.long)
        keys = list(rows)
        return cls(
            len(correct),
            torch.tensor([pair for pair, _ in keys]),
            [list(prefix) for _, prefix in keys],
            read_tokens,
            metric,
            alternative_reads,
            group_alternatives,
        )

    @property
    def is_identity(self) -> bool:
        return self.reads is None

    @property
    def n_rows(self) -> int:
        return int(self.row_pair.shape[0])

    def extend(self, batch: Batch) -> Batch:
        """The rows' batch: each row's pair prompt followed by its continuation."""
        if self.is_identity:
            return batch
        sequences = [batch.ids(int(p)) + c for p, c in zip(self.row_pair, self.continuations, strict=True)]
        return batch_of_ids(sequences, [len(s) - 1 for s in sequences], batch.input_ids.device, batch.pad_id)

    def combine(self, values: torch.Tensor) -> torch.Tensor:
        """Row values → the pair metric ``[..., n_pairs]``: ``[..., R]`` for the identity plan (returned as they are),
        else the log-probabilities of every row's reads ``[..., R, K]`` (see the module docstring)."""
        if self.is_identity:
            return values
        assert self.alternative_reads is not None and self.group_alternatives is not None
        flat = values.reshape(*values.shape[:-2], -1).to(torch.float64)
        flat = torch.cat([flat, flat.new_zeros(*flat.shape[:-1], 1)], dim=-1)
        per_alternative = flat[..., self.alternative_reads].sum(dim=-1)  # [..., A]
        minus_inf = per_alternative.new_full((*per_alternative.shape[:-1], 1), float("-inf"))
        per_alternative = torch.cat([per_alternative, minus_inf], dim=-1)
        per_group = torch.logsumexp(per_alternative[..., self.group_alternatives], dim=-1)  # [..., 2 * pairs]
        good, bad = per_group[..., 0::2], per_group[..., 1::2]
        if self.metric == "log_prob":
            return good
        if self.metric == "prob_diff":
            return good.exp() - bad.exp()
        return good - bad

    def objective(self, values: torch.Tensor) -> torch.Tensor:
        """The sum of the pair metrics: what attribution differentiates (pairs are independent, so a row's gradient
        is its own pair's)."""
        return self.combine(values).sum()

    def to_pairs(self, per_row: torch.Tensor) -> torch.Tensor:
        """First-order terms per row ``[..., R]`` (each row's share of its pair's metric change) → per pair."""
        if self.is_identity:
            return per_row
        out = per_row.new_zeros(*per_row.shape[:-1], self.n_pairs)
        return out.index_add_(-1, self.row_pair.to(per_row.device), per_row)
