"""Where the attention sink sits: a convention of the model that changes what a measurement on a text means.

Most trained transformers park much of every head's attention on the first token of the context (the
*attention sink*), whatever that token is. A tokenizer that prepends BOS gives the sink a token of its own;
one that does not (SmolLM2's) makes the first token of the text the sink, so that token is not read like the
others and the tokens right after it are predicted from a context that has no neutral first position. On
SmolLM2, repeated random tokens measured: the second copy's loss is 2.25 nats with the first random token as
the sink and 1.49 with the prefix "Words:" in front (8 × 50 tokens, seed 0) — so tools that read attention or
loss on a text (``attention``, ``induction``, ``loss``) say so when it happens.

It happens when the model adds no BOS and the first token takes a large share of the attention: the mean,
over layers, heads and queries 1..n−1, of the attention on key 0 is at least ``SINK_SHARE`` and at least
``SINK_OVER_UNIFORM`` times what uniform causal attention would give it (mean of 1/(q+1)). Measured: 0.47 on
SmolLM2's random tokens (uniform 0.04), 0.60 on an English sentence; a random `tiny` model stays near uniform.
"""

from __future__ import annotations

from typing import Any

import torch

from mcp_interp.core.engine.backend.edits import Edit, observe
from mcp_interp.core.engine.backend.points import hook_pattern
from mcp_interp.core.engine.text.tokens import adds_bos

SINK_SHARE = 0.3
SINK_OVER_UNIFORM = 3.0


class FirstKeyAttention:
    """Observers that keep, for every layer, the attention each query pays to key 0 (``[batch, heads, q]``,
    a sliver of the pattern), then ``share`` over the real queries of each row."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.kept: list[torch.Tensor] = []

    def observers(self, backend: Any) -> list[Edit]:
        """One observer per layer's pattern; none on a backend that does not serve patterns (vLLM fuses them away),
        where ``share`` is then (0, 0) and no sink note is written."""
        if not backend.has_point(hook_pattern(0)):
            return []
        return [observe(hook_pattern(layer), self.add) for layer in range(self.n_layers)]

    def add(self, pattern: torch.Tensor) -> None:
        """Record one layer's full pattern ``[batch, heads, q, k]`` (when the caller already has it)."""
        self.kept.append(pattern[:, :, :, 0].detach().to(torch.float64))

    def share(self, lengths: list[int]) -> tuple[float, float]:
        """(mean attention on the first token, the same under uniform causal attention) over layers, heads and
        the real queries 1..n−1 of every row; (0, 0) when no row has two tokens."""
        if not self.kept:
            return 0.0, 0.0
        first = torch.stack(self.kept).mean(dim=(0, 2))  # [batch, q]: mean over layers and heads
        shares, uniform = [], []
        for row, n in enumerate(lengths):
            if n < 2:
                continue
            shares.append(first[row, 1:n].mean())
            uniform.append((1.0 / torch.arange(2, n + 1, dtype=torch.float64)).mean())
        if not shares:
            return 0.0, 0.0
        return float(torch.stack(shares).mean()), float(torch.stack(uniform).mean())


def attention_sink_note(tokenizer: Any, share: float, uniform: float, first_token: str, fix: str) -> str | None:
    """The note a reader needs when the first token of an un-BOS'd text is the attention sink; None otherwise.
    ``fix`` says what to do about it in the calling tool's terms."""
    if adds_bos(tokenizer) or share < max(SINK_SHARE, SINK_OVER_UNIFORM * uniform):
        return None
    return (
        f"This model's tokenizer adds no BOS token, so the first token of the text ({first_token!r}) is the attention "
        f"sink: it takes {share:.0%} of the attention on average over layers, heads and later tokens (uniform "
        f"attention would give it {uniform:.0%}). It is then not read like the other tokens, and the tokens right "
        f"after it are predicted without a neutral first position. {fix}"
    )
