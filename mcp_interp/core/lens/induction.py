"""Induction scores: every head's attention on random tokens repeated twice, to the token after the earlier copy."""

from __future__ import annotations

import torch

from mcp_interp import limits
from mcp_interp.core.engine.bridge import hook_pattern
from mcp_interp.core.lens.reading import run_with_cache
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.lens import Contribution, InductionMeasurement


def induction_tokens(model: LoadedModel, seq_len: int, n_seqs: int, seed: int) -> torch.Tensor:
    """``n_seqs`` random sequences repeated twice, [n_seqs, 2·seq_len], from a seeded CPU generator.

    Special tokens are excluded; the same seed gives the same tokens on every device.
    """
    special = set(model.tokenizer.all_special_ids)
    allowed = torch.tensor(
        [t for t in range(model.bridge.cfg.d_vocab) if t not in special and t < len(model.tokenizer)]
    )
    generator = torch.Generator(device="cpu").manual_seed(seed)
    half = allowed[torch.randint(len(allowed), (n_seqs, seq_len), generator=generator)]
    return torch.cat([half, half], dim=1)


def induction(model: LoadedModel, seq_len: int = 50, n_seqs: int = 8, seed: int = 0) -> InductionMeasurement:
    """Per head: mean attention from each position i of the second copy to i − seq_len + 1.

    That key is the token *after* the earlier occurrence of the current token — where an
    induction head looks to predict the next token by copying.
    """
    if not 2 <= seq_len <= 512:
        raise InputError(f"seq_len must be between 2 and 512, got {seq_len}.")
    if not 1 <= n_seqs <= 64:
        raise InputError(f"n_seqs must be between 1 and 64, got {n_seqs}.")
    cfg = model.bridge.cfg
    limits.check("max_prompts", n_seqs, "n_seqs")
    limits.check("max_tokens", 2 * seq_len, "2 × seq_len (tokens per sequence)")
    if 2 * seq_len > cfg.n_ctx:
        raise InputError(f"2 × seq_len = {2 * seq_len} exceeds the model's context of {cfg.n_ctx} tokens.")
    tokens = induction_tokens(model, seq_len, n_seqs, seed).to(model.device)
    names = [hook_pattern(layer) for layer in range(cfg.n_layers)]
    _, cache = run_with_cache(model, tokens, names)
    queries = torch.arange(seq_len, 2 * seq_len)
    keys = queries - seq_len + 1
    scores = []
    for name in names:
        pattern = cache[name].to(torch.float64)  # [n_seqs, n_heads, q, k]
        scores.append(pattern[:, :, queries, keys].mean(dim=(0, 2)).tolist())
    ranked = sorted(
        (
            Contribution(component=f"L{layer}H{h}", value=scores[layer][h])
            for layer in range(cfg.n_layers)
            for h in range(cfg.n_heads)
        ),
        key=lambda c: -c.value,
    )
    return InductionMeasurement(
        seq_len=seq_len,
        n_seqs=n_seqs,
        seed=seed,
        scores=scores,
        heads=ranked,
        notes=[
            "A high induction score shows the attention pattern of an induction head on repeated random tokens; "
            "whether the head uses it to predict the next token is a causal question: "
            "`loss` with an `intervention` that ablates it measures that."
        ],
    )
