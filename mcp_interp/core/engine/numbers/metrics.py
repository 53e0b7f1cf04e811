"""Metrics read at the answer position. Each returns a ``Score``: the mean and every example.

All arithmetic is done in float64 on the logits the model produced, so a metric never adds
rounding of its own to what the model computed. Inputs are ``[batch, vocab]`` logits already
taken at each prompt's answer position (``at_answer_positions``).

What each metric can and cannot see (the reason every tool reports several):

* logit difference moves continuously, but only looks at two tokens;
* KL sees the whole distribution, but stays small when probability mass the answer loses is
  small in absolute terms, even if the logit difference collapsed;
* rank is robust and readable, but saturates at 0: once the answer is top-1, it cannot show a
  strengthening and hides a weakening that keeps it on top;
* log-prob is the quantity a loss trains, but mixes the answer's logit with the normaliser.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mcp_interp.schemas.common import Score


def score_of(per_example: torch.Tensor) -> Score:
    """A ``Score`` from one value per prompt: ``value`` is their mean (NaN for an empty batch)."""
    values = [float(v) for v in per_example.detach().to("cpu", torch.float64)]
    return Score(value=float(sum(values) / len(values)) if values else math.nan, per_example=values)


def at_answer_positions(logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``[batch, seq, vocab]`` logits → ``[batch, vocab]`` at each prompt's answer position."""
    batch = torch.arange(logits.shape[0], device=logits.device)
    return logits[batch, positions.to(logits.device)]


def _ids(ids: torch.Tensor | list[int], logits: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(ids, dtype=torch.long, device=logits.device)


def token_logits(logits: torch.Tensor, ids: torch.Tensor | list[int]) -> torch.Tensor:
    """The logit of each prompt's answer token, float64, shape ``[batch]``."""
    index = _ids(ids, logits).unsqueeze(1)
    return logits.gather(1, index).squeeze(1).to(torch.float64)


def logit_difference(
    logits: torch.Tensor, correct: torch.Tensor | list[int], incorrect: torch.Tensor | list[int]
) -> Score:
    """logit(correct) − logit(incorrect) per prompt. Positive: the model prefers `correct`.

    Unbounded, in nats of log-odds between the two tokens (the normaliser cancels).
    """
    return score_of(token_logits(logits, correct) - token_logits(logits, incorrect))


def kl_divergence(p_logits: torch.Tensor, q_logits: torch.Tensor) -> Score:
    """KL(P‖Q) = Σ_t P(t) (log P(t) − log Q(t)) per prompt, in nats; ≥ 0, 0 iff P = Q.

    P is the reference run (e.g. clean), Q the compared one (e.g. intervened).
    """
    log_p = torch.log_softmax(p_logits.to(torch.float64), dim=-1)
    log_q = torch.log_softmax(q_logits.to(torch.float64), dim=-1)
    per_example = (log_p.exp() * (log_p - log_q)).sum(dim=-1)
    return score_of(per_example.clamp_min(0.0))


def answer_logprob(logits: torch.Tensor, ids: torch.Tensor | list[int], as_loss: bool = False) -> Score:
    """log P(answer) per prompt (≤ 0; 0 = certain). ``as_loss`` negates it: cross-entropy, ≥ 0."""
    log_probs = torch.log_softmax(logits.to(torch.float64), dim=-1)
    values = log_probs.gather(1, _ids(ids, logits).unsqueeze(1)).squeeze(1)
    return score_of(-values if as_loss else values)


# Logits this close (relative to max(1, |logit|)) are a tie. A compiled program's outputs are exactly 1 and 0, and a
# flat output (every logit equal) has float noise of ~1e-7 at most: an argmax there is no winner.
LOGIT_TIE_TOLERANCE = 1e-5


def ties_with(logits: torch.Tensor, ids: torch.Tensor | list[int]) -> torch.Tensor:
    """Per row [batch], how many *other* tokens have a logit equal to the answer's (within ``LOGIT_TIE_TOLERANCE``)."""
    values = logits.to(torch.float64)
    target = token_logits(values, ids).unsqueeze(1)
    close = (values - target).abs() <= LOGIT_TIE_TOLERANCE * target.abs().clamp(min=1.0)
    return close.sum(dim=1) - 1


def top_ties(logits: torch.Tensor) -> torch.Tensor:
    """Per row [batch], how many tokens share the top logit (1: a single winner; the vocabulary: a flat output)."""
    return ties_with(logits, logits.argmax(dim=-1)) + 1


def answer_ranks(logits: torch.Tensor, ids: torch.Tensor | list[int]) -> Score:
    """Number of tokens whose logit is strictly above the answer's: 0 = top-1.

    Ties count in the answer's favour (optimistic), so a rank is never worsened by a tie.
    """
    target = token_logits(logits, ids).unsqueeze(1)
    return score_of((logits.to(torch.float64) > target).sum(dim=1).to(torch.float64))


def recovered_fraction(
    patched: torch.Tensor | list[float],
    clean: torch.Tensor | list[float],
    corrupt: torch.Tensor | list[float],
) -> Score:
    """(patched − corrupt) / (clean − corrupt): 1 = the clean behaviour, 0 = the corrupt one.

    ``value`` is the ratio of the means (the usual convention for a batch of minimal pairs: one
    small clean−corrupt gap cannot blow it up); ``per_example`` is each pair's own ratio, NaN
    where that pair's clean and corrupt values are equal.
    """
    p, c, k = (torch.as_tensor(x, dtype=torch.float64) for x in (patched, clean, corrupt))
    gap = c - k
    per_example = torch.where(gap != 0, (p - k) / torch.where(gap != 0, gap, 1.0), torch.nan)
    mean_gap = float(gap.mean())
    value = float((p.mean() - k.mean()) / mean_gap) if mean_gap != 0 else math.nan
    return Score(value=value, per_example=[float(v) for v in per_example])


def token_losses(logits: torch.Tensor, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Next-token cross-entropy of every position: per position k (predicting token k+1 of ``batch.input_ids``)
    the loss −log P(t_k+1 | t_≤k) [batch, seq-1] (nats, float64), whether t_k+1 was the top-1, and the mask of
    positions whose next token is real (a ``tokens.Batch``: padding is never predicted nor scored)."""
    log_probs = torch.log_softmax(logits[:, :-1].to(torch.float64), dim=-1)
    targets = batch.input_ids[:, 1:]
    loss = -log_probs.gather(2, targets.unsqueeze(-1)).squeeze(-1)
    hit = logits[:, :-1].argmax(dim=-1) == targets
    scored = batch.attention_mask[:, 1:].bool()
    return loss, hit, scored
