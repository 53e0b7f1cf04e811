"""Induction scores: every head's attention on random tokens repeated twice, to the token after the earlier copy."""

from __future__ import annotations

import torch

import mcp_interp.state.limits as limits
from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.points import hook_pattern
from mcp_interp.core.engine.text.conventions import FirstKeyAttention, attention_sink_note
from mcp_interp.core.engine.text.tokens import adds_bos, token_ids, token_strings
from mcp_interp.core.lens.reading import read_run
from mcp_interp.errors import InputError
from mcp_interp.schemas.lens import Contribution, InductionMeasurement


def induction_tokens(model: LoadedModel, seq_len: int, n_seqs: int, seed: int) -> torch.Tensor:
    """``n_seqs`` random sequences repeated twice, [n_seqs, 2·seq_len], from a seeded CPU generator.

    Special tokens are excluded; the same seed gives the same tokens on every device.
    """
    special = set(model.tokenizer.all_special_ids)
    allowed = torch.tensor([t for t in range(model.cfg.d_vocab) if t not in special and t < len(model.tokenizer)])
    generator = torch.Generator(device="cpu").manual_seed(seed)
    half = allowed[torch.randint(len(allowed), (n_seqs, seq_len), generator=generator)]
    return torch.cat([half, half], dim=1)


def induction(
    model: LoadedModel, seq_len: int = 50, n_seqs: int = 8, seed: int = 0, prefix: str | None = None
) -> InductionMeasurement:
    """Per head: mean attention from each position i of the second copy to i − seq_len + 1.

    That key is the token *after* the earlier occurrence of the current token — where an
    induction head looks to predict the next token by copying. Each sequence is the tokenization
    rule's start (BOS when the tokenizer prepends one) or ``prefix``'s tokens, then the random half
    twice; the sequences, and the positions an induction head lets the model predict, come back so
    ``loss`` can measure exactly what these heads should lower.
    """
    require(model.backend, "induction")
    if not 2 <= seq_len <= 512:
        raise InputError(f"seq_len must be between 2 and 512, got {seq_len}.")
    if not 1 <= n_seqs <= 64:
        raise InputError(f"n_seqs must be between 1 and 64, got {n_seqs}.")
    if prefix is not None and (not isinstance(prefix, str) or not prefix.strip()):
        raise InputError(f"`prefix` must be a non-empty text (e.g. 'Words:') or omitted, got {prefix!r}.")
    cfg, tokenizer = model.cfg, model.tokenizer
    start = token_ids(tokenizer, prefix) if prefix is not None else []
    if prefix is None and adds_bos(tokenizer):
        start = [int(tokenizer.bos_token_id)]
    width = len(start) + 2 * seq_len
    limits.check("max_prompts", n_seqs, "n_seqs")
    limits.check("max_tokens", width, "2 × seq_len + the prefix (tokens per sequence)")
    if width > cfg.n_ctx:
        raise InputError(
            f"{width} tokens per sequence (2 × seq_len + prefix) exceed the model's context of {cfg.n_ctx}."
        )
    repeated = induction_tokens(model, seq_len, n_seqs, seed)
    tokens = torch.cat([torch.tensor([start] * n_seqs, dtype=torch.long).reshape(n_seqs, len(start)), repeated], 1)
    names = [hook_pattern(layer) for layer in range(cfg.n_layers)]
    _, cache = read_run(model, tokens.to(model.device), names, logits=False)
    offset = len(start)
    queries = torch.arange(offset + seq_len, offset + 2 * seq_len)
    keys = queries - seq_len + 1
    scores = []
    sink = FirstKeyAttention(cfg.n_layers)
    for name in names:
        pattern = cache[name].to(torch.float64)  # [n_seqs, n_heads, q, k]
        scores.append(pattern[:, :, queries, keys].mean(dim=(0, 2)).tolist())
        sink.add(pattern)
    ranked = sorted(
        (
            Contribution(component=f"L{layer}H{h}", value=scores[layer][h])
            for layer in range(cfg.n_layers)
            for h in range(cfg.n_heads)
        ),
        key=lambda c: -c.value,
    )
    notes = [
        "A high induction score shows the attention pattern of an induction head on repeated random tokens; "
        "whether the head uses it to predict the next token is a causal question: `loss` with `token_ids` = "
        "`sequences`, `positions` = `predicted_positions` and an `intervention` that ablates it measures that."
    ]
    if not start:
        fix = (
            "Here it is the first random token; pass `prefix` (e.g. 'Words:') so the sink falls on a token outside the "
            "repeated sequence (on SmolLM2 that lowers the second copy's loss from 2.25 to 1.49 nats)."
        )
        note = attention_sink_note(
            tokenizer, *sink.share([width] * n_seqs), token_strings(tokenizer, [int(tokens[0, 0])])[0], fix
        )
        notes += [note] if note is not None else []
    return InductionMeasurement(
        seq_len=seq_len,
        n_seqs=n_seqs,
        seed=seed,
        prefix=prefix,
        scores=scores,
        heads=ranked,
        sequences=tokens.tolist(),
        predicted_positions=list(range(offset + seq_len + 1, offset + 2 * seq_len)),
        notes=notes,
    )
