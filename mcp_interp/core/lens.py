"""Reading the residual stream: logit lens, direct logit attribution, attention patterns, induction.

All four are *correlational*: they describe what the model computes on this input, not what
would happen if a component were removed. For causal claims use ablation or patching.

The residual stream at the answer position decomposes exactly as
``final = embed + Σ_l (attn_out_l + mlp_out_l)`` and ``attn_out_l = Σ_h z_h W_O^h + b_O``; the
logit is ``W_U · norm(final) + b_U``. Freezing the final norm's scale at its value in the real
run makes the logit linear in the components, which is what direct logit attribution uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mcp_interp import limits
from mcp_interp.core.bridge import (
    FINAL_NORM_SCALE,
    HOOK_EMBED,
    attn_output_projection,
    final_norm_module,
    hook_attn_out,
    hook_in,
    hook_mlp_out,
    hook_out,
    hook_pattern,
    hook_z,
    logits_from_residual,
    unembed_linear,
)
from mcp_interp.core.heads import parse_head
from mcp_interp.core.tokens import encode, resolve_answer, token_strings
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.lens import (
    AttendedToken,
    AttentionMeasurement,
    Contribution,
    DLAMeasurement,
    InductionMeasurement,
    LensLayer,
    LogitLensMeasurement,
    TokenProb,
)

CORRELATIONAL = (
    "{what} is correlational: it shows what each part contributes in this run, not what happens when it is "
    "removed. Confirm a component's role with ablate_head or patch_heads before calling it causal."
)


def _single_prompt(model: LoadedModel, prompt: str) -> Any:
    if not isinstance(prompt, str) or not prompt:
        raise InputError("`prompt` must be a non-empty string.")
    return encode(model.tokenizer, [prompt], model.device)


def _run_with_cache(model: LoadedModel, input_ids: torch.Tensor, names: Sequence[str]) -> tuple[torch.Tensor, Any]:
    wanted = set(names)
    with torch.inference_mode():
        return model.bridge.run_with_cache(input_ids, names_filter=lambda name: name in wanted)


def _unembed(model: LoadedModel, residual: torch.Tensor) -> torch.Tensor:
    """Final norm + unembedding of residual vectors [..., d_model] → logits [..., vocab]."""
    shape = residual.shape
    with torch.inference_mode():
        return logits_from_residual(model.bridge, residual.reshape(-1, shape[-1])).reshape(*shape[:-1], -1)


def logit_lens(model: LoadedModel, prompt: str, target: str | None = None, top_k: int = 5) -> LogitLensMeasurement:
    """Final norm + unembedding applied to the residual after every block, at the answer position."""
    if not 1 <= top_k <= 50:
        raise InputError(f"top_k must be between 1 and 50, got {top_k}.")
    batch = _single_prompt(model, prompt)
    n_layers = model.bridge.cfg.n_layers
    names = [HOOK_EMBED] + [hook_out(layer) for layer in range(n_layers)]
    logits, cache = _run_with_cache(model, batch.input_ids, names)
    position = int(batch.answer_positions[0])
    final = logits[0, position].to(torch.float64)
    target_id = resolve_answer(model.tokenizer, target) if target is not None else int(final.argmax())
    stack = torch.stack([cache[name][0, position] for name in names])  # [n_layers + 1, d_model]
    lens_logits = _unembed(model, stack).to(torch.float64)
    probs = torch.softmax(lens_logits, dim=-1)
    labels = ["embed"] + [str(layer) for layer in range(n_layers)]
    rows = []
    for i, label in enumerate(labels):
        top = torch.topk(probs[i], top_k)
        rows.append(
            LensLayer(
                layer=label,
                top=[
                    TokenProb(token=model.tokenizer.decode([int(t)]), id=int(t), prob=float(p))
                    for p, t in zip(top.values, top.indices, strict=True)
                ],
                target_prob=float(probs[i, target_id]),
                target_rank=int((lens_logits[i] > lens_logits[i, target_id]).sum()),
            )
        )
    first = None
    for i in range(len(rows)):
        if all(row.target_rank == 0 for row in rows[i:]):
            first = rows[i].layer
            break
    notes = [CORRELATIONAL.format(what="The logit lens")]
    notes.append(
        "Early layers are read through the final norm and unembedding, which they were not trained to feed; "
        "low early probabilities mean 'not yet linearly readable', not 'absent'."
    )
    model_top = int(final.argmax())
    if model_top != target_id:
        notes.append(f"The target is not the model's top-1 (which is {model.tokenizer.decode([model_top])!r}).")
    return LogitLensMeasurement(
        prompt=prompt,
        target=model.tokenizer.decode([target_id]),
        target_id=target_id,
        answer_position=position,
        layers=rows,
        first_top1_layer=first,
        final_prob=float(torch.softmax(final, -1)[target_id]),
        notes=notes,
    )


def _unembedding(model: LoadedModel) -> tuple[torch.Tensor, torch.Tensor | None]:
    linear = unembed_linear(model.bridge)
    if linear is None:
        raise InputError("Direct logit attribution needs a linear unembedding; this model's is not one.")
    return linear.weight.detach(), None if linear.bias is None else linear.bias.detach()


def _final_norm(model: LoadedModel) -> tuple[str, torch.Tensor | None, torch.Tensor | None]:
    """('rms' | 'layer', weight, bias) of the final norm."""
    inner = final_norm_module(model.bridge)
    weight, bias = getattr(inner, "weight", None), getattr(inner, "bias", None)
    kind = "layer" if isinstance(inner, torch.nn.LayerNorm) else "rms"
    return kind, None if weight is None else weight.detach(), None if bias is None else bias.detach()


def head_outputs(model: LoadedModel, layer: int, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What each head writes to the residual, and the output projection's bias, at one position.

    ``z`` is [n_heads, d_head]. Uses the model's own output projection (Linear or GPT-2's
    Conv1D alike): head h's output is o(z with only head h kept) − o(0), and o(0) is the bias.
    Returns ([n_heads, d_model], [d_model]).
    """
    n_heads, d_head = z.shape
    inputs = torch.zeros(n_heads + 1, n_heads, d_head, dtype=z.dtype, device=z.device)
    inputs[torch.arange(n_heads), torch.arange(n_heads)] = z
    o_proj = attn_output_projection(model.bridge, layer)
    with torch.inference_mode():
        out = o_proj(inputs.reshape(n_heads + 1, n_heads * d_head))
    bias = out[-1]
    return out[:-1] - bias, bias


def dla(model: LoadedModel, prompt: str, answer: str, baseline: str | None = None, top_k: int = 10) -> DLAMeasurement:
    """Direct logit attribution of embeddings, every head and every MLP at the answer position.

    With the final norm's scale frozen, logit(answer) − logit(baseline) is a sum of one term per
    component plus a bias term (unembedding bias, and for LayerNorm the norm bias). For a
    LayerNorm the components are centred first (its mean subtraction is linear too), so the sum
    stays exact; ``residual_error`` reports the float rounding left over.
    """
    if not 1 <= top_k <= 100:
        raise InputError(f"top_k must be between 1 and 100, got {top_k}.")
    batch = _single_prompt(model, prompt)
    cfg = model.bridge.cfg
    n_layers, n_heads = cfg.n_layers, cfg.n_heads
    answer_id = resolve_answer(model.tokenizer, answer)
    baseline_id = resolve_answer(model.tokenizer, baseline) if baseline is not None else None
    names = [hook_in(0), FINAL_NORM_SCALE, hook_out(n_layers - 1)]
    for layer in range(n_layers):
        names += [hook_z(layer), hook_mlp_out(layer), hook_attn_out(layer)]
    logits, cache = _run_with_cache(model, batch.input_ids, names)
    pos = int(batch.answer_positions[0])
    w_u, b_u = _unembedding(model)
    kind, norm_w, norm_b = _final_norm(model)
    direction = w_u[answer_id].to(torch.float64)
    measured = float(logits[0, pos, answer_id])
    bias_term = float(b_u[answer_id]) if b_u is not None else 0.0
    if baseline_id is not None:
        direction = direction - w_u[baseline_id].to(torch.float64)
        measured -= float(logits[0, pos, baseline_id])
        bias_term -= float(b_u[baseline_id]) if b_u is not None else 0.0
    scale = float(cache[FINAL_NORM_SCALE][0, pos].reshape(-1)[0])
    gain = norm_w.to(torch.float64) if norm_w is not None else torch.ones_like(direction)
    read = direction * gain / scale  # d(quantity)/d(residual) with the scale frozen
    if kind == "layer" and norm_b is not None:
        bias_term += float((direction * norm_b.to(torch.float64)).sum())

    def contribution(vector: torch.Tensor) -> float:
        vector = vector.to(torch.float64)
        if kind == "layer":
            vector = vector - vector.mean(dim=-1, keepdim=True)
        return float((vector * read).sum(dim=-1))

    # The residual entering block 0: token (and, where the model has them, position) embeddings.
    embed = contribution(cache[hook_in(0)][0, pos])
    heads: list[list[float]] = []
    mlps: list[float] = []
    attn_biases: list[float] = []
    for layer in range(n_layers):
        per_head, bias = head_outputs(model, layer, cache[hook_z(layer)][0, pos])
        heads.append([contribution(per_head[h]) for h in range(n_heads)])
        attn_biases.append(contribution(bias) if bool(bias.any()) else 0.0)
        mlps.append(contribution(cache[hook_mlp_out(layer)][0, pos]))
    total = embed + sum(map(sum, heads)) + sum(mlps) + sum(attn_biases) + bias_term
    components = [Contribution(component="embed", value=embed)]
    components += [
        Contribution(component=f"L{layer}H{h}", value=heads[layer][h])
        for layer in range(n_layers)
        for h in range(n_heads)
    ]
    components += [Contribution(component=f"L{layer}MLP", value=mlps[layer]) for layer in range(n_layers)]
    components += [Contribution(component=f"L{layer}attn_bias", value=v) for layer, v in enumerate(attn_biases) if v]
    components.sort(key=lambda c: -abs(c.value))
    quantity = "logit(answer) − logit(baseline)" if baseline_id is not None else "logit(answer)"
    notes = [CORRELATIONAL.format(what="Direct logit attribution")]
    notes.append(
        "Only direct effects are counted: a head that matters by feeding later layers (e.g. an induction "
        "head's inputs) can have a small DLA."
    )
    if baseline_id is None:
        notes.append(
            "Without a baseline the decomposed quantity is a raw logit, which shifts with every token's logit; "
            "pass `baseline` for a contrast that cancels that shift."
        )
    return DLAMeasurement(
        prompt=prompt,
        answer=model.tokenizer.decode([answer_id]),
        baseline=model.tokenizer.decode([baseline_id]) if baseline_id is not None else None,
        quantity=quantity,
        measured=measured,
        total=total,
        residual_error=measured - total,
        bias_term=bias_term,
        final_norm_scale=scale,
        embed=embed,
        heads=heads,
        mlps=mlps,
        attn_biases=attn_biases,
        top=components[:top_k],
        notes=notes,
    )


def attention(model: LoadedModel, prompt: str, layer: int, head: int, top_k: int = 5) -> AttentionMeasurement:
    cfg = model.bridge.cfg
    parse_head({"layer": layer, "head": head}, cfg.n_layers, cfg.n_heads)
    batch = _single_prompt(model, prompt)
    name = hook_pattern(layer)
    _, cache = _run_with_cache(model, batch.input_ids, [name])
    pattern = cache[name][0, head].to(torch.float64)  # [query, key]
    ids = batch.ids(0)
    tokens = token_strings(model.tokenizer, ids)
    pos = int(batch.answer_positions[0])
    row = pattern[pos]
    top = torch.topk(row, min(top_k, row.shape[0]))
    return AttentionMeasurement(
        prompt=prompt,
        layer=layer,
        head=head,
        tokens=tokens,
        pattern=[[round(float(v), 6) for v in r] for r in pattern],
        answer_position=pos,
        top_attended=[
            AttendedToken(position=int(i), token=tokens[int(i)], weight=float(w))
            for w, i in zip(top.values, top.indices, strict=True)
        ],
        notes=[CORRELATIONAL.format(what="An attention pattern")],
    )


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
    _, cache = _run_with_cache(model, tokens, names)
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
