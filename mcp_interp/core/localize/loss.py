"""The measurement behind ``loss``: next-token cross-entropy and top-1 accuracy of whole texts.

For a text of n tokens the model predicts tokens 1..n-1 from the tokens before each; the loss of
token k is −log P(t_k | t_<k) in nats (≥ 0; log of the vocabulary size is the loss of a uniform
guess) and it is "correct" when t_k was the model's top-1 prediction (ties count against it: the
arg-max picks one token). With an intervention, the same numbers are computed without it too, so
"what does ablating this head cost?" is one call. Padding is never predicted nor scored.

Texts are tokenized by the server's rule; ``token_ids`` are run exactly as given (e.g. ``induction``'s
sequences, which a decode-and-retokenize round trip would not reproduce). ``positions`` restricts the means to
the predictions of those token indices (e.g. ``induction``'s ``predicted_positions``, the second copy).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mcp_interp.core.engine.conventions import FirstKeyAttention, attention_sink_note
from mcp_interp.core.engine.interventions import Ablation, ablation_from_spec, prepare_ablation
from mcp_interp.core.engine.metrics import token_losses
from mcp_interp.core.engine.sites import Hook
from mcp_interp.core.engine.tokens import Batch, encode, encode_ids, token_strings
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.common import Intervention
from mcp_interp.schemas.localize import LossMeasurement, TextLoss


def _run(model: LoadedModel, batch: Batch, ablation: Ablation | None, extra: list[Hook] | None = None) -> torch.Tensor:
    hooks = prepare_ablation(model.bridge, batch, ablation).hooks if ablation is not None else []
    with torch.inference_mode(), model.bridge.hooks(fwd_hooks=[*hooks, *(extra or [])]):
        return model.bridge(batch.input_ids, return_type="logits")


def _batch(model: LoadedModel, texts: Sequence[str] | None, token_ids: Sequence[Sequence[int]] | None) -> Batch:
    if (texts is None) == (token_ids is None):
        raise InputError(
            "Pass `texts` (tokenized by the server's rule) or `token_ids` (run exactly as given, e.g. `induction`'s "
            "`sequences`), not both."
        )
    if token_ids is not None:
        return encode_ids(model.tokenizer, token_ids, int(model.bridge.cfg.d_vocab), model.device)
    assert texts is not None
    return encode(model.tokenizer, texts, model.device)


def _span(batch: Batch, positions: Sequence[int] | None) -> torch.Tensor:
    """[batch, seq − 1]: which predictions are scored — index k − 1 is token k's, for k in ``positions`` (default
    every real token after the first)."""
    real = batch.attention_mask[:, 1:].bool()
    if positions is None:
        return real
    chosen = sorted(set(positions)) if isinstance(positions, list | tuple) else []
    shortest = min(batch.lengths)
    bad = [k for k in chosen if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < shortest]
    if not chosen or bad:
        raise InputError(
            f"`positions` must be token indices k with 1 ≤ k < {shortest} (the shortest text has {shortest} tokens; "
            f"token 0 has nothing before it to be predicted from); got {positions!r}."
        )
    span = torch.zeros_like(real)
    span[:, [k - 1 for k in chosen]] = True
    return span & real


def text_losses(
    model: LoadedModel,
    texts: Sequence[str] | None = None,
    intervention: Intervention | None = None,
    token_ids: Sequence[Sequence[int]] | None = None,
    positions: Sequence[int] | None = None,
) -> LossMeasurement:
    batch = _batch(model, texts, token_ids)
    short = [i for i, n in enumerate(batch.lengths) if n < 2]
    if short:
        raise InputError(
            f"Text {short[0]} ({batch.texts[short[0]]!r}) has fewer than 2 tokens: loss needs at least one "
            "token to predict from another. Pass longer texts."
        )
    span = _span(batch, positions)
    ablation = ablation_from_spec(intervention, model.bridge.cfg, model)
    sink = FirstKeyAttention(model.bridge.cfg.n_layers)
    clean_logits = _run(model, batch, None, sink.hooks())
    logits = clean_logits if ablation is None else _run(model, batch, ablation)
    loss, hit, _ = token_losses(logits, batch)
    rows = []
    for i, text in enumerate(batch.texts):
        n, where = batch.lengths[i] - 1, span[i]
        row_loss, row_hit = [float(v) for v in loss[i, :n]], [bool(v) for v in hit[i, :n]]
        rows.append(
            TextLoss(
                text=text,
                tokens=token_strings(model.tokenizer, batch.ids(i)),
                loss=row_loss,
                correct=row_hit,
                mean_loss=float(loss[i][where].mean()),
                accuracy=float(hit[i][where].to(torch.float64).mean()),
                scored_positions=[k + 1 for k in where.nonzero().flatten().tolist()],
            )
        )
    measurement = LossMeasurement(
        intervention=ablation.describe() if ablation is not None else None,
        texts=rows,
        mean_loss=float(loss[span].mean()),
        accuracy=float(hit[span].to(torch.float64).mean()),
    )
    if ablation is not None:
        clean_loss, clean_hit, _ = token_losses(clean_logits, batch)
        measurement.clean_mean_loss = float(clean_loss[span].mean())
        measurement.clean_accuracy = float(clean_hit[span].to(torch.float64).mean())
        measurement.notes.append(
            f"The intervention changes the mean loss by {measurement.mean_loss - measurement.clean_mean_loss:+.4f} "
            f"nats and the accuracy by {measurement.accuracy - measurement.clean_accuracy:+.3f}."
        )
    first = rows[0].tokens[0]
    fix = "Tokens right after it may show a higher loss for that reason; a neutral prefix in front moves the sink."
    note = attention_sink_note(model.tokenizer, *sink.share(batch.lengths), first, fix)
    measurement.notes += [note] if note is not None else []
    return measurement
