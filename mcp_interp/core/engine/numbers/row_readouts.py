"""The metrics patching reads at the answer position, for thousands of patched rows at once.

Each readout maps rows of final residuals (before the final norm, ``[rows, d_model]``) and
each row's prompt index to one float64 number per row (``from_residual``, used by exact
patching), and the same from logits (``from_logits``, differentiable, used by attribution):

* ``logit_diff`` — logit(correct) − logit(incorrect), unbounded;
* ``log_prob`` — log P(correct), ≤ 0;
* ``kl`` — KL(clean‖run) in nats, ≥ 0 and 0 for the clean run: needs no answer at all;
* the log-probabilities of several tokens per row (``TokenLogProbsReadout``), from which ``patching.rows`` builds the
  metrics of sets and sequences (``prob_diff`` among them).

Full-vocabulary readouts are computed in chunks of rows so memory stays bounded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

# A metric per row: (final residuals or answer logits [rows, width], each row's prompt index [rows]) → [rows].
RowMetric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

ROWS_PER_CHUNK = 256  # rows × vocabulary floats per chunk: 256 × 49k × 4 B ≈ 50 MB


class Readout(Protocol):
    def from_residual(self, residual: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor: ...

    def from_logits(self, logits: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor: ...


class LogitDiffReadout:
    """logit(correct[p]) − logit(incorrect[p]) for rows of prompt p, float64.

    ``from_residual`` applies the final norm and then only the two unembedding rows it needs:
    the full vocabulary projection of thousands of patched rows would cost more than the
    patched runs' attention. Falls back to the full unembedding when the model's unembedding
    is not a plain linear layer. A model that soft-caps its final logits (Gemma-2) has each of
    the two logits capped before the difference, as its forward does.
    """

    def __init__(self, backend: Any, correct: torch.Tensor, incorrect: torch.Tensor) -> None:
        self.backend, self.correct, self.incorrect = backend, correct, incorrect
        self.cap = backend.final_logit_softcap()
        unembedding = backend.unembedding() if backend.supports("weights") else None
        self.weight = unembedding[0] if unembedding is not None else None
        self.bias = unembedding[1] if unembedding is not None else None

    def from_logits(self, logits: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        good = logits.gather(1, self.correct[prompts].unsqueeze(1)).to(torch.float64)
        bad = logits.gather(1, self.incorrect[prompts].unsqueeze(1)).to(torch.float64)
        return (good - bad).squeeze(1)

    def from_residual(self, residual: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            return self.from_logits(self.backend.logits_from_residual(residual), prompts)
        # The norm runs in the model's dtype (it is the model's computation); the two dot products are taken in
        # float32 at least, so a bfloat16/float16 model's logit difference is not rounded twice more.
        normed = self.backend.final_norm(residual)
        wide = torch.promote_types(normed.dtype, torch.float32)
        normed = normed.to(wide)
        good, bad = self.correct[prompts], self.incorrect[prompts]
        if self.cap is None:
            diff = (normed * (self.weight[good].to(wide) - self.weight[bad].to(wide))).sum(dim=-1)
            if self.bias is not None:
                diff = diff + self.bias[good].to(wide) - self.bias[bad].to(wide)
            return diff.to(torch.float64)
        logits = [(normed * self.weight[t].to(wide)).sum(dim=-1) for t in (good, bad)]
        if self.bias is not None:
            logits = [logit + self.bias[t].to(wide) for logit, t in zip(logits, (good, bad), strict=True)]
        capped = [self.backend.soft_cap(logit.to(torch.float64)) for logit in logits]
        return capped[0] - capped[1]


class _FullVocabulary:
    """``from_residual`` through the model's final norm and whole unembedding, chunked."""

    backend: Any

    def from_logits(self, logits: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def from_residual(self, residual: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        pieces = [
            self.from_logits(
                self.backend.logits_from_residual(residual[lo : lo + ROWS_PER_CHUNK]), prompts[lo : lo + ROWS_PER_CHUNK]
            )
            for lo in range(0, residual.shape[0], ROWS_PER_CHUNK)
        ]
        return torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.float64)


class LogProbReadout(_FullVocabulary):
    """log P(correct[p]) for rows of prompt p (≤ 0; 0 = certain)."""

    def __init__(self, backend: Any, correct: torch.Tensor) -> None:
        self.backend, self.correct = backend, correct

    def from_logits(self, logits: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        log_probs = torch.log_softmax(logits.to(torch.float64), dim=-1)
        return log_probs.gather(1, self.correct[prompts].unsqueeze(1)).squeeze(1)


class TokenLogProbsReadout(_FullVocabulary):
    """log P(t) of every token row r reads (``reads[r]``, ``[rows, K]``; an unused slot, −1, reads 0), float64: the
    teacher-forced rows of answers that are sets or sequences (``patching.rows``), folded into a pair metric there."""

    def __init__(self, backend: Any, reads: torch.Tensor) -> None:
        self.backend, self.reads = backend, reads

    def from_logits(self, logits: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        log_probs = torch.log_softmax(logits.to(torch.float64), dim=-1)
        tokens = self.reads[prompts].to(logits.device)
        return log_probs.gather(1, tokens.clamp(min=0)).masked_fill(tokens < 0, 0.0)


class AnswerSetReadout(_FullVocabulary):
    """A metric of answers that are sets of single tokens (a single token is a set of one), per row of prompt p,
    float64 and differentiable: ``logit_diff`` = log P(correct[p]) − log P(incorrect[p]), each the log of its members'
    summed probability (for two single tokens, the logit difference); ``prob_diff`` = P(correct[p]) − P(incorrect[p]),
    in [−1, 1]. ``correct``/``incorrect`` are ``[prompts, members]`` token ids padded with −1."""

    def __init__(self, backend: Any, correct: torch.Tensor, incorrect: torch.Tensor, metric: str) -> None:
        self.backend, self.correct, self.incorrect, self.metric = backend, correct, incorrect, metric

    def from_logits(self, logits: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        log_probs = torch.log_softmax(logits.to(torch.float64), dim=-1)

        def mass(members: torch.Tensor) -> torch.Tensor:
            tokens = members[prompts].to(logits.device)
            picked = log_probs.gather(1, tokens.clamp(min=0)).masked_fill(tokens < 0, float("-inf"))
            return torch.logsumexp(picked, dim=-1)

        good, bad = mass(self.correct), mass(self.incorrect)
        return good.exp() - bad.exp() if self.metric == "prob_diff" else good - bad


class KLReadout(_FullVocabulary):
    """KL(clean‖run) = Σ_t P_clean(t) (log P_clean(t) − log P_run(t)) for rows of prompt p, nats, ≥ 0."""

    def __init__(self, backend: Any, clean_logits: torch.Tensor) -> None:
        self.backend = backend
        self.clean_log_probs = torch.log_softmax(clean_logits.detach().to(torch.float64), dim=-1)  # [batch, vocab]

    def from_logits(self, logits: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        log_q = torch.log_softmax(logits.to(torch.float64), dim=-1)
        log_p = self.clean_log_probs[prompts]
        return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


def make_readout(
    name: str,
    backend: Any,
    correct: torch.Tensor | None,
    incorrect: torch.Tensor | None,
    clean_logits: torch.Tensor | None,
) -> Readout:
    """The readout called ``name`` (``logit_diff``, ``log_prob`` or ``kl``) with what it needs."""
    if name == "logit_diff":
        assert correct is not None and incorrect is not None
        return LogitDiffReadout(backend, correct, incorrect)
    if name == "log_prob":
        assert correct is not None
        return LogProbReadout(backend, correct)
    assert clean_logits is not None
    return KLReadout(backend, clean_logits)
