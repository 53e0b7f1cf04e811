"""The logit lens: the final norm and unembedding applied to the residual after every layer, at the answer."""

from __future__ import annotations

import torch

from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.points import HOOK_EMBED, hook_out
from mcp_interp.core.engine.numbers import metrics
from mcp_interp.core.engine.text.answers import resolve_answer
from mcp_interp.core.lens.reading import CORRELATIONAL, read_run, single_prompt
from mcp_interp.errors import InputError
from mcp_interp.schemas.lens import LensLayer, LogitLensMeasurement, TokenProb


def _unembed(model: LoadedModel, residual: torch.Tensor) -> torch.Tensor:
    """Final norm + unembedding of residual vectors [..., d_model] → logits [..., vocab]."""
    shape = residual.shape
    with torch.inference_mode():
        return model.backend.logits_from_residual(residual.reshape(-1, shape[-1])).reshape(*shape[:-1], -1)


EMBED_LAYER = -1  # the layer index of the embedding row: read before block 0


def layer_label(layer: int) -> str:
    """A lens row's layer as a figure axis or a sentence shows it: 'embed' or the block index."""
    return "embed" if layer == EMBED_LAYER else str(layer)


def logit_lens(model: LoadedModel, prompt: str, target: str | None = None, top_k: int = 5) -> LogitLensMeasurement:
    """Final norm + unembedding applied to the residual after every block, at the answer position."""
    require(model.backend, "logit_lens")
    if not 1 <= top_k <= 50:
        raise InputError(f"top_k must be between 1 and 50, got {top_k}.")
    batch = single_prompt(model, prompt)
    n_layers = model.cfg.n_layers
    names = [HOOK_EMBED] + [hook_out(layer) for layer in range(n_layers)]
    logits, cache = read_run(model, batch.input_ids, names)
    assert logits is not None
    position = int(batch.answer_positions[0])
    final = logits[0, position].to(torch.float64)
    target_id = resolve_answer(model.tokenizer, target) if target is not None else int(final.argmax())
    stack = torch.stack([cache[name][0, position] for name in names])  # [n_layers + 1, d_model]
    lens_logits = _unembed(model, stack).to(torch.float64)
    probs = torch.softmax(lens_logits, dim=-1)
    tied = metrics.ties_with(lens_logits, [target_id] * lens_logits.shape[0])
    rows = []
    for i, layer in enumerate(range(EMBED_LAYER, n_layers)):  # row 0: the embedding; row i: block i − 1's output
        top = torch.topk(probs[i], top_k)
        rows.append(
            LensLayer(
                layer=layer,
                site="embed" if layer == EMBED_LAYER else "resid_post",
                top=[
                    TokenProb(token=model.tokenizer.decode([int(t)]), id=int(t), prob=float(p))
                    for p, t in zip(top.values, top.indices, strict=True)
                ],
                target_prob=float(probs[i, target_id]),
                target_rank=int((lens_logits[i] > lens_logits[i, target_id]).sum()),
                target_tied=int(tied[i]),
            )
        )
    first = None  # a shared first place (a flat or tied row) is not top-1
    for i in range(len(rows)):
        if all(row.target_rank == 0 and row.target_tied == 0 for row in rows[i:]):
            first = rows[i].layer
            break
    notes = [CORRELATIONAL.format(what="The logit lens")]
    notes.append(
        "Early layers are read through the final norm and unembedding, which they were not trained to feed; "
        "low early probabilities mean 'not yet linearly readable', not 'absent'."
    )
    model_top = int(final.argmax())
    sharing = int(metrics.top_ties(final.unsqueeze(0))[0])
    if sharing > 1:
        notes.append(
            f"The model's output here is flat or tied: {sharing} tokens share the top logit, so it has no top-1 "
            "(no value)" + ("; the target was picked among them by index." if target is None else ".")
        )
    tied_rows = [row.layer for row in rows if row.target_rank == 0 and row.target_tied > 0]
    if tied_rows:
        notes.append(
            f"At layer(s) {', '.join(layer_label(x) for x in tied_rows[:6])} the target shares the top logit with "
            "other tokens: a tie, not top-1 (target_tied)."
        )
    if model_top != target_id and sharing == 1:
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
