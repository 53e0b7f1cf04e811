"""Direct logit attribution: what every head, every MLP and the embeddings write directly to a logit (difference).

The residual stream at the answer position decomposes exactly as
``final = embed + Σ_l (attn_out_l + mlp_out_l)`` and ``attn_out_l = Σ_h z_h W_O^h + b_O``; the
logit is ``W_U · norm(final) + b_U``. Freezing the final norm's scale at its value in the real
run makes the logit linear in the components, which is what direct logit attribution uses.

On post-norm blocks (Gemma-2/3, OLMo-2) ``attn_out_l = γ ⊙ (Σ_h z_h W_O^h + b_O) / s_l`` — a norm of the
heads' sum; its scale s_l is frozen at its value in the run too, so each head's share γ ⊙ z_h W_O^h / s_l is
again a term of the stream and the parts still sum to the measured value. A model that soft-caps its final
logits (Gemma-2: c·tanh(x/c)) is decomposed before the cap (``measured`` is the logit before it), since the
cap is not linear.
"""

from __future__ import annotations

from typing import Any

import torch

from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.points import (
    hook_attn_out,
    hook_in,
    hook_mlp_out,
    hook_out,
    hook_z,
)
from mcp_interp.core.engine.text.answers import resolve_answer
from mcp_interp.core.lens.reading import CORRELATIONAL, read_run, single_prompt
from mcp_interp.errors import InputError
from mcp_interp.schemas.lens import Contribution, DLAMeasurement


def _unembedding(model: LoadedModel) -> tuple[torch.Tensor, torch.Tensor | None]:
    unembedding = model.backend.unembedding()
    if unembedding is None:
        raise InputError("Direct logit attribution needs a linear unembedding; this model's is not one.")
    return unembedding


def _through_post_norm(
    model: LoadedModel, layer: int, cache: Any, pos: int, per_head: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each head's share of ``attn_out`` and the bias's, through block ``layer``'s post-attention norm (if any)
    with its scale frozen at its value in the run: γ ⊙ centred?(v) / s, the norm's own bias added once."""
    post = model.backend.attention_write_norm(layer)
    if post is None:
        return per_head, bias
    kind, gain, beta = model.backend.norm(layer, post)
    scale = cache[model.backend.norm_scale_point(layer, post)][0, pos].to(torch.float64).reshape(-1)[0]

    def frozen(v: torch.Tensor) -> torch.Tensor:
        v = v.to(torch.float64)
        return (v - v.mean(dim=-1, keepdim=True) if kind == "layer" else v) * gain / scale

    return frozen(per_head), frozen(bias) + (beta if beta is not None else 0.0)


def dla(model: LoadedModel, prompt: str, answer: str, baseline: str | None = None, top_k: int = 10) -> DLAMeasurement:
    """Direct logit attribution of embeddings, every head and every MLP at the answer position.

    With the final norm's scale frozen, logit(answer) − logit(baseline) is a sum of one term per
    component plus a bias term (unembedding bias, and for LayerNorm the norm bias). For a
    LayerNorm the components are centred first (its mean subtraction is linear too), so the sum
    stays exact; ``residual_error`` reports the float rounding left over.
    """
    require(model.backend, "dla")
    if not 1 <= top_k <= 100:
        raise InputError(f"top_k must be between 1 and 100, got {top_k}.")
    batch = single_prompt(model, prompt)
    cfg = model.cfg
    n_layers, n_heads = cfg.n_layers, cfg.n_heads
    answer_id = resolve_answer(model.tokenizer, answer)
    baseline_id = resolve_answer(model.tokenizer, baseline) if baseline is not None else None
    scale_point = model.backend.final_norm_scale_point()
    names = [hook_in(0), hook_out(n_layers - 1), *([scale_point] if scale_point is not None else [])]
    for layer in range(n_layers):
        names += [hook_z(layer), hook_mlp_out(layer), hook_attn_out(layer)]
        post = model.backend.attention_write_norm(layer)
        names += [model.backend.norm_scale_point(layer, post)] if post is not None else []
    logits, cache = read_run(model, batch.input_ids, names)
    assert logits is not None
    pos = int(batch.answer_positions[0])
    w_u, b_u = _unembedding(model)
    kind, gain, norm_b = model.backend.norm()
    cap = model.backend.final_logit_softcap()
    answer_logits = logits[0, pos].to(torch.float64)
    if cap is not None:  # the logits before the cap, which is what the components add up to
        answer_logits = cap * torch.atanh(answer_logits / cap)
    direction = w_u[answer_id].to(torch.float64)
    measured = float(answer_logits[answer_id])
    bias_term = float(b_u[answer_id]) if b_u is not None else 0.0
    if baseline_id is not None:
        direction = direction - w_u[baseline_id].to(torch.float64)
        measured -= float(answer_logits[baseline_id])
        bias_term -= float(b_u[baseline_id]) if b_u is not None else 0.0
    scale = float(cache[scale_point][0, pos].reshape(-1)[0]) if scale_point is not None else 1.0
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
        per_head, bias = model.backend.head_writes(layer, cache[hook_z(layer)][0, pos])
        per_head, bias = _through_post_norm(model, layer, cache, pos, per_head, bias)
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
    if any(model.backend.attention_write_norm(layer) is not None for layer in range(n_layers)):
        notes.append(
            "This model normalises each attention layer's head sum before adding it to the residual stream "
            "(post-norm): a head's term is its share of that layer's attn_out with the post-norm's scale frozen "
            "at its value in this run, like the final norm's."
        )
    if cap is not None:
        notes.append(
            f"This model soft-caps its final logits ({cap:g}·tanh(x/{cap:g})): the decomposed quantity is the logit "
            "difference before the cap (`measured` included), since the cap is not linear."
        )
    if baseline_id == answer_id:
        notes.append(
            "The answer and the baseline are the same token: logit(answer) − logit(baseline) and every component's "
            "term are 0 by construction. Pass a different baseline (or none, for the raw logit)."
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
