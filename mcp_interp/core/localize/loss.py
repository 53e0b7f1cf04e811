"""The measurement behind ``loss``: next-token cross-entropy and top-1 accuracy of whole texts.

For a text of n tokens the model predicts tokens 1..n-1 from the tokens before each; the loss of
token k is −log P(t_k | t_<k) in nats (≥ 0; log of the vocabulary size is the loss of a uniform
guess) and it is "correct" when t_k was the model's top-1 prediction (ties count against it: the
arg-max picks one token). With an intervention, the same numbers are computed without it too, so
"what does ablating this head cost?" is one call. Padding is never predicted nor scored.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from mcp_interp.core.engine.forward import capture_forward
from mcp_interp.core.engine.interventions import Ablation, ablation_from_spec, prepare_ablation
from mcp_interp.core.engine.jobs import Job, drain
from mcp_interp.core.engine.metrics import token_losses
from mcp_interp.core.engine.tokens import Batch, encode, token_strings
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.common import Intervention
from mcp_interp.schemas.localize import LossMeasurement, TextLoss

TEXTS_PER_STEP = 4  # texts per forward: a cancel frees the model within one such forward


@dataclass(kw_only=True)
class LossJob(Job[LossMeasurement]):
    """``loss`` as a job: the texts run ``TEXTS_PER_STEP`` at a time (clean, then under the intervention; a mean or
    resample intervention first reads its replacements from the clean chunks), a step per forward."""

    model: LoadedModel
    texts: Sequence[str]
    intervention: Intervention | None = None
    result: LossMeasurement | None = field(default=None, init=False)

    def total_steps(self) -> int:
        chunks = -(-len(self.texts) // TEXTS_PER_STEP)
        if self.intervention is None:
            return chunks
        return chunks * (3 if self.intervention.method in ("mean", "resample") else 2)

    def steps(self) -> Iterator[str]:
        model = self.model
        batch = encode(model.tokenizer, self.texts, model.device)
        short = [i for i, n in enumerate(batch.lengths) if n < 2]
        if short:
            raise InputError(
                f"Text {short[0]} ({batch.texts[short[0]]!r}) has fewer than 2 tokens: loss needs at least one "
                "token to predict from another. Pass longer texts."
            )
        ablation = ablation_from_spec(self.intervention, model.bridge.cfg, model)
        chunks = [
            list(range(i, min(i + TEXTS_PER_STEP, len(batch.texts))))
            for i in range(0, len(batch.texts), TEXTS_PER_STEP)
        ]
        prepared = None
        if ablation is not None:
            clean: dict[str, torch.Tensor] | None = None
            if ablation.method in ("mean", "resample"):
                names = sorted({t.hook() for t in ablation.targets})
                parts: dict[str, list[torch.Tensor]] = {name: [] for name in names}
                for rows in chunks:
                    acts = capture_forward(model.bridge, batch.input_ids[rows], names).acts
                    for name in names:
                        parts[name].append(acts[name])
                    yield f"replacements: texts {rows[0] + 1}–{rows[-1] + 1}"
                clean = {name: torch.cat(values) for name, values in parts.items()}
            prepared = prepare_ablation(model, batch, ablation, clean=clean)
        runs = [None, prepared] if prepared is not None else [None]
        losses: list[tuple[torch.Tensor, torch.Tensor]] = []
        for run in runs:
            loss_rows, hit_rows = [], []
            for rows in chunks:
                hooks = run.hooks_for(rows) if run is not None else []
                with torch.inference_mode(), model.bridge.hooks(fwd_hooks=hooks):
                    logits = model.bridge(batch.input_ids[rows], return_type="logits")
                loss, hit, _ = token_losses(logits, Batch(
                    texts=[batch.texts[i] for i in rows], input_ids=batch.input_ids[rows],
                    attention_mask=batch.attention_mask[rows], answer_positions=batch.answer_positions[rows],
                ))  # fmt: skip
                loss_rows.append(loss)
                hit_rows.append(hit)
                yield f"{'intervention' if run is not None else 'clean'}: texts {rows[0] + 1}–{rows[-1] + 1}"
            losses.append((torch.cat(loss_rows), torch.cat(hit_rows)))
        self.result = measurement(model, batch, losses[-1], losses[0] if prepared is not None else None, ablation)


def text_losses(model: LoadedModel, texts: Sequence[str], intervention: Intervention | None = None) -> LossMeasurement:
    """``LossJob`` run to the end here."""
    return drain(LossJob(model=model, texts=texts, intervention=intervention))


def measurement(
    model: LoadedModel,
    batch: Batch,
    measured: tuple[torch.Tensor, torch.Tensor],
    clean: tuple[torch.Tensor, torch.Tensor] | None,
    ablation: Ablation | None,
) -> LossMeasurement:
    """Per text and overall loss and accuracy (``measured``: loss and top-1 hits [texts, seq − 1]); ``clean``: the
    same without the intervention."""
    loss, hit = measured
    scored = batch.attention_mask[:, 1:].bool()
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
    result = LossMeasurement(
        intervention=ablation.describe() if ablation is not None else None,
        texts=rows,
        mean_loss=float(loss[scored].mean()),
        accuracy=float(hit[scored].to(torch.float64).mean()),
    )
    if clean is not None:
        clean_loss, clean_hit = clean
        result.clean_mean_loss = float(clean_loss[scored].mean())
        result.clean_accuracy = float(clean_hit[scored].to(torch.float64).mean())
        result.notes.append(
            f"The intervention changes the mean loss by {result.mean_loss - result.clean_mean_loss:+.4f} "
            f"nats and the accuracy by {result.accuracy - result.clean_accuracy:+.3f}."
        )
    return result
