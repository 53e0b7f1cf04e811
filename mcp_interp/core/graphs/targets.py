"""The logit nodes of an attribution graph: which output tokens it explains, and how each is read out.

Default (circuit-tracer's *salient logits*): the most probable next tokens, in order, until their probabilities
sum to ``desired_probability`` (0.95), at most ``max_logits`` (10). Or tokens the caller names (each one token
of the model's tokenizer, as an answer is tokenized: ``engine.answers``). Each is read out as its *demeaned*
logit, logit_k − mean_v logit_v = u_k · n with u_k = W_U[k] − mean_v W_U[v] and n the final norm's output at
the last position: the common shift of every logit (which softmax ignores) is not attributed to anything. A
logit node's weight in every influence computation is its probability.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mcp_interp.core.engine.text.answers import resolve_answer
from mcp_interp.core.engine.text.tokens import token_strings
from mcp_interp.errors import InputError

MAX_LOGITS = 10
DESIRED_PROBABILITY = 0.95
MAX_GIVEN_TARGETS = 32


@dataclass(frozen=True)
class LogitTargets:
    ids: list[int]
    tokens: list[str]
    probabilities: torch.Tensor  # [k], under the model's next-token distribution
    logits: list[float]  # the raw logits
    vectors: torch.Tensor  # [k, d_model], the demeaned unembedding rows
    salient: bool  # chosen by probability (True) or given by the caller

    def __len__(self) -> int:
        return len(self.ids)


def unembedding_matrix(model: Any) -> torch.Tensor:
    """``[vocab, d_model]``: the unembedding matrix, or an InputError for a model whose read-out is not linear."""
    unembedding = model.backend.unembedding()
    if unembedding is None:
        raise InputError(
            "This model's unembedding is not a plain linear layer, so its logits are not a linear read-out of the "
            "final norm's output and an attribution graph's logit edges would not be exact: not supported."
        )
    return unembedding[0]


def logit_targets(
    model: Any,
    logits: torch.Tensor,
    targets: Sequence[str] | None,
    max_logits: int = MAX_LOGITS,
    desired_probability: float = DESIRED_PROBABILITY,
) -> LogitTargets:
    """The logit nodes for the last position's ``logits`` ``[vocab]`` (see the module docstring)."""
    probabilities = torch.softmax(logits.double(), dim=-1).float()
    if targets is None:
        top_p, top_ids = probabilities.topk(min(max_logits, int(probabilities.numel())))
        cutoff = int(torch.searchsorted(torch.cumsum(top_p, 0), torch.tensor(desired_probability))) + 1
        ids = [int(i) for i in top_ids[: min(cutoff, len(top_ids))]]
    else:
        if isinstance(targets, str) or not list(targets):
            raise InputError(
                "`targets` must be a non-empty list of output tokens, e.g. [' Paris', ' London'] (or omitted for the "
                "most probable next tokens)."
            )
        if len(targets) > MAX_GIVEN_TARGETS:
            raise InputError(f"`targets` lists {len(targets)} tokens; at most {MAX_GIVEN_TARGETS} logit nodes.")
        ids = list(dict.fromkeys(resolve_answer(model.tokenizer, t) for t in targets))
    weight = unembedding_matrix(model)
    index = torch.tensor(ids, device=weight.device)
    vectors = (weight[index] - weight.mean(dim=0, keepdim=True)).detach().float()
    return LogitTargets(
        ids=ids,
        tokens=token_strings(model.tokenizer, ids),
        probabilities=probabilities[index.to(probabilities.device)],
        logits=[float(logits[i]) for i in ids],
        vectors=vectors,
        salient=targets is None,
    )
