"""The measurement behind ``loss``: next-token cross-entropy and top-1 accuracy of whole texts.

For a text of n tokens the model predicts tokens 1..n-1 from the tokens before each; the loss of
token k is −log P(t_k | t_<k) in nats (≥ 0; log of the vocabulary size is the loss of a uniform
guess) and it is "correct" when t_k was the model's top-1 prediction (ties count against it: the
arg-max picks one token). With an intervention, the same numbers are computed without it too, so
"what does ablating this head cost?" is one call. Padding is never predicted nor scored.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mcp_interp.core.engine.interventions import Ablation, ablation_from_spec, prepare_ablation
from mcp_interp.core.engine.metrics import token_losses
from mcp_interp.core.engine.tokens import Batch, encode, token_strings
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.common import Intervention
from mcp_interp.schemas.localize import LossMeasurement, TextLoss


def _run(model: LoadedModel, batch: Batch, ablation: Ablation | None) -> torch.Tensor:
    hooks = prepare_ablation(model.bridge, batch, ablation).hooks if ablation is not None else []
    with torch.inference_mode(), model.bridge.hooks(fwd_hooks=hooks):
        return model.bridge(batch.input_ids, return_type="logits")


def text_losses(model: LoadedModel, texts: Sequence[str], intervention: Intervention | None = None) -> LossMeasurement:
    batch = encode(model.tokenizer, texts, model.device)
    short = [i for i, n in enumerate(batch.lengths) if n < 2]
    if short:
        raise InputError(
            f"Text {short[0]} ({batch.texts[short[0]]!r}) has fewer than 2 tokens: loss needs at least one "
            "token to predict from another. Pass longer texts."
        )
    ablation = ablation_from_spec(intervention, model.bridge.cfg, model)
    loss, hit, scored = token_losses(_run(model, batch, ablation), batch)
    rows = []
    for i, text in enumerate(batch.texts):
        n = batch.lengths[i] - 1
        row_loss, row_hit = [float(v) for v in loss[i, :n]], [bool(v) for v in hit[i, :n]]
        rows.append(
            TextLoss(
                text=text,
                tokens=token_strings(model.tokenizer, batch.ids(i)),
                loss=row_loss,
                correct=row_hit,
                mean_loss=sum(row_loss) / n,
                accuracy=sum(row_hit) / n,
            )
        )
    measurement = LossMeasurement(
        intervention=ablation.describe() if ablation is not None else None,
        texts=rows,
        mean_loss=float(loss[scored].mean()),
        accuracy=float(hit[scored].to(torch.float64).mean()),
    )
    if ablation is not None:
        clean_loss, clean_hit, _ = token_losses(_run(model, batch, None), batch)
        measurement.clean_mean_loss = float(clean_loss[scored].mean())
        measurement.clean_accuracy = float(clean_hit[scored].to(torch.float64).mean())
        measurement.notes.append(
            f"The intervention changes the mean loss by {measurement.mean_loss - measurement.clean_mean_loss:+.4f} "
            f"nats and the accuracy by {measurement.accuracy - measurement.clean_accuracy:+.3f}."
        )
    return measurement
