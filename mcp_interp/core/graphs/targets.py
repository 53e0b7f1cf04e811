"""The logit nodes of an attribution graph: which output tokens it explains, and how each is read out.

Default (circuit-tracer's *salient logits*): the most probable next tokens, in order, until their probabilities
sum to ``desired_probability`` (0.95), at most ``max_logits`` (10). Or tokens the caller names (each one token
of the model's tokenizer, as an answer is tokenized: ``engine.answers``). Each is read out as its *demeaned*
logit, logit_k − mean_v logit_v = u_k · n with u_k = W_U[k] − mean_v W_U[v] and n the final norm's output at
the last position: the common shift of every logit (which softmax ignores) is not attributed to anything. A
logit node's weight in every influence computation is its probability.

Soft-capped logits (Gemma-2: logits = c · tanh(x / c), c = 30). The logit nodes are the *pre-cap* logits x
(demeaned, u_k · n as above), and the probabilities — which tokens are salient, each node's weight — are the
model's own: the softmax of the capped logits. Why the pre-cap logit:

* it is what the graph can explain exactly. x is a linear read-out of n, so a logit node's incoming edges are
  exact direct effects that add up to it (with the graph's constant terms), and the replacement model's checks
  compare like with like. The capped logit with tanh's derivative frozen at the real run (each edge × (1 − (y/c)²))
  is linear too, but only a first-order approximation: its edges add up to t_k·x_k − mean_v t_v·x_v (t the frozen
  derivatives, one per token, the mean term reading every token's own), not to the capped demeaned logit the node
  would claim to be;
* it is circuit-tracer's treatment, so a graph here means what a circuit-tracer or Neuronpedia graph of Gemma-2
  means. Its logit vectors are demeaned unembedding columns (``circuit_tracer/attribution/targets.py``
  ``_compute_logit_vecs``, lines 376–411 at decoderesearch/circuit-tracer 4bb8c0e) injected as gradients at
  ``unembed.hook_pre`` (``attribution/context_transformerlens.py`` line 90) — before TransformerLens applies the
  cap after ``unembed.hook_post`` (``replacement_model/replacement_model_transformerlens.py`` lines 722–728 add
  it back by hand); its salient-logit probabilities are ``softmax`` (``targets.py`` line 208) of ``ctx.logits``
  (``attribute_transformerlens.py`` line 168), the model's forward output with the cap
  (``replacement_model_transformerlens.py`` line 449); and its own Gemma-2 edge checks run under
  ``model.zero_softcap()`` "as the logits will otherwise be off" (``tests/test_attributions_gemma.py`` 402–403);
* c · tanh(· / c) is increasing and 1-Lipschitz: tokens rank the same before and after the cap, and an error in
  pre-cap logits bounds the same error after it. A change Δx of a pre-cap logit moves the model's logit by about
  (1 − (y/c)²) · Δx, y the capped logit; the result's notes give that factor for the top target.
"""

from __future__ import annotations

import math
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
    probabilities: torch.Tensor  # [k], under the model's next-token distribution (after any soft-cap)
    logits: list[float]  # the logits before any final soft-cap (what the nodes read, not demeaned)
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
    """The logit nodes for the last position's pre-cap ``logits`` ``[vocab]`` (see the module docstring)."""
    probabilities = torch.softmax(model.backend.soft_cap(logits.double()), dim=-1).float()
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


def softcap_note(model: Any, targets: LogitTargets) -> str | None:
    """What a result says on a model that soft-caps its logits (None on one that does not): which logits its numbers
    are of, which probabilities, and the cap's local slope at the first target (module docstring)."""
    cap = model.backend.final_logit_softcap()
    if cap is None:
        return None
    capped = cap * math.tanh(targets.logits[0] / cap)
    return (
        f"This model soft-caps its logits (logit = {cap:g} · tanh(x / {cap:g})): every logit node, edge into one and "
        "logit change here is of the pre-cap logit x (demeaned), which the graph explains exactly, as circuit-tracer "
        "does; probabilities (and so the salient targets and influence weights) are the model's own, after the cap. "
        f"At {targets.tokens[0]!r} (x = {targets.logits[0]:.4g}, capped {capped:.4g}) a change Δx moves the model's "
        f"logit by about {1 - (capped / cap) ** 2:.3g} · Δx."
    )
