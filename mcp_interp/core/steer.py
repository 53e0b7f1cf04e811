"""Activation addition ("ActAdd"): steer generation with a difference of residual streams.

The steering vector is resid(positive) − resid(negative) entering block ``layer``, each read at
its prompt's last token (where the prompt's meaning is summarised); ``coefficient`` times it is
added to the residual entering that block at every position of the prompt and of the generated
tokens. Continuations are greedy, so the only randomness is none: ``seed`` is recorded and
fixes torch's generator in case a model samples internally (e.g. dropout left on).

A steered text that merely repeats itself is a broken model, not a steered one; the result
measures repetition (repeated 3-grams) in both continuations and says so in ``notes``.
"""

from __future__ import annotations

from typing import Any

import torch

from mcp_interp import limits
from mcp_interp.core.bridge import hook_in
from mcp_interp.core.tokens import encode
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.lens import SteerMeasurement

DEGENERATE = 0.5  # fraction of repeated 3-grams above which a continuation is called degenerate


def repetition(ids: list[int]) -> float:
    """Fraction of 3-grams that already occurred earlier in ``ids`` (0 = none repeated)."""
    grams = [tuple(ids[i : i + 3]) for i in range(len(ids) - 2)]
    if not grams:
        return 0.0
    seen: set[tuple[int, ...]] = set()
    repeated = 0
    for gram in grams:
        repeated += gram in seen
        seen.add(gram)
    return repeated / len(grams)


def _resid_at_last(model: LoadedModel, text: str, layer: int) -> torch.Tensor:
    batch = encode(model.tokenizer, [text], model.device)
    name = hook_in(layer)
    with torch.inference_mode():
        _, cache = model.bridge.run_with_cache(batch.input_ids, names_filter=lambda n: n == name)
    return cache[name][0, int(batch.answer_positions[0])].detach().clone()


def greedy(model: LoadedModel, ids: list[int], max_new_tokens: int, hooks: list[Any]) -> list[int]:
    """Greedy continuation, one full forward per token (short prompts: no cache needed)."""
    out = list(ids)
    eos = model.tokenizer.eos_token_id
    with torch.inference_mode(), model.bridge.hooks(fwd_hooks=hooks):
        for _ in range(max_new_tokens):
            logits = model.bridge(torch.tensor([out], device=model.device), return_type="logits")
            token = int(logits[0, -1].argmax())
            out.append(token)
            if token == eos:
                break
    return out[len(ids) :]


def steer(
    model: LoadedModel,
    prompt: str,
    positive: str,
    negative: str,
    layer: int,
    coefficient: float,
    max_new_tokens: int = 20,
    seed: int = 0,
) -> SteerMeasurement:
    n_layers = model.bridge.cfg.n_layers
    if not 0 <= layer < n_layers:
        raise InputError(f"layer {layer} does not exist; this model has layers 0..{n_layers - 1}.")
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be at least 1, got {max_new_tokens}.")
    limits.check("max_new_tokens", max_new_tokens, "max_new_tokens")
    if not (coefficient == coefficient) or abs(coefficient) > 1e4:
        raise InputError(f"coefficient must be a finite number with |c| ≤ 10000, got {coefficient}.")
    for name, text in (("prompt", prompt), ("positive", positive), ("negative", negative)):
        if not isinstance(text, str) or not text:
            raise InputError(f"`{name}` must be a non-empty string.")
    torch.manual_seed(seed)
    vector = _resid_at_last(model, positive, layer) - _resid_at_last(model, negative, layer)
    prompt_ids = encode(model.tokenizer, [prompt]).ids(0)
    residual_norm = float(_resid_at_last(model, prompt, layer).norm())

    def add(resid: torch.Tensor, hook: Any) -> torch.Tensor:
        return resid + coefficient * vector.to(resid.dtype)

    baseline_ids = greedy(model, prompt_ids, max_new_tokens, [])
    steered_ids = greedy(model, prompt_ids, max_new_tokens, [(hook_in(layer), add)])
    rep_base, rep_steer = repetition(baseline_ids), repetition(steered_ids)
    notes = []
    if rep_steer >= DEGENERATE:
        notes.append(
            f"The steered continuation degenerates ({rep_steer:.0%} of its 3-grams repeat, baseline "
            f"{rep_base:.0%}): this is the model breaking, not evidence of steering. Try a smaller coefficient "
            "or another layer."
        )
    if steered_ids == baseline_ids:
        notes.append("The steered continuation is identical to the baseline: no visible effect at this strength.")
    scale = abs(coefficient) * float(vector.norm())
    if residual_norm > 0 and scale > 4 * residual_norm:
        notes.append(
            f"The added vector (norm {scale:.1f}) is {scale / residual_norm:.1f}× the residual's norm "
            f"({residual_norm:.1f}) at layer {layer}: it dominates the stream rather than nudging it."
        )
    return SteerMeasurement(
        prompt=prompt,
        positive=positive,
        negative=negative,
        layer=layer,
        coefficient=coefficient,
        vector_norm=float(vector.norm()),
        residual_norm=residual_norm,
        baseline_text=model.tokenizer.decode(baseline_ids),
        steered_text=model.tokenizer.decode(steered_ids),
        repetition_baseline=rep_base,
        repetition_steered=rep_steer,
        notes=notes,
    )
