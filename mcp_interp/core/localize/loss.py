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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from mcp_interp.core.engine.ablation.targets import Ablation, prepare_ablation
from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import Job, drain
from mcp_interp.core.engine.numbers.metrics import token_losses
from mcp_interp.core.engine.references import Lookup, resolve_intervention
from mcp_interp.core.engine.text.conventions import FirstKeyAttention, attention_sink_note
from mcp_interp.core.engine.text.tokens import Batch, encode, encode_ids, token_strings
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import Intervention
from mcp_interp.schemas.localize import LossMeasurement, TextLoss

TEXTS_PER_STEP = 4  # texts per forward: a cancel frees the model within one such forward


def _batch(model: LoadedModel, texts: Sequence[str] | None, token_ids: Sequence[Sequence[int]] | None) -> Batch:
    if (texts is None) == (token_ids is None):
        raise InputError(
            "Pass `texts` (tokenized by the server's rule) or `token_ids` (run exactly as given, e.g. `induction`'s "
            "`sequences`), not both."
        )
    if token_ids is not None:
        return encode_ids(model.tokenizer, token_ids, int(model.cfg.d_vocab), model.device)
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


@dataclass(kw_only=True)
class LossJob(Job[LossMeasurement]):
    """``loss`` as a job: the texts run ``TEXTS_PER_STEP`` at a time (clean, then under the intervention; a mean or
    resample intervention first reads its replacements from the clean chunks), a step per forward."""

    model: LoadedModel
    texts: Sequence[str] | None = None
    intervention: Intervention | None = None
    token_ids: Sequence[Sequence[int]] | None = None
    positions: Sequence[int] | None = None
    lookup: Lookup | None = None  # the server's store, for an intervention naming a direction://
    result: LossMeasurement | None = field(default=None, init=False)

    def total_steps(self) -> int:
        n = len(self.texts if self.texts is not None else self.token_ids or [])
        chunks = -(-n // TEXTS_PER_STEP)
        if self.intervention is None:
            return chunks
        return chunks * (3 if self.intervention.method in ("mean", "resample") else 2)

    def steps(self) -> Iterator[str]:
        model = self.model
        require(model.backend, "loss")
        batch = _batch(model, self.texts, self.token_ids)
        short = [i for i, n in enumerate(batch.lengths) if n < 2]
        if short:
            raise InputError(
                f"Text {short[0]} ({batch.texts[short[0]]!r}) has fewer than 2 tokens: loss needs at least one "
                "token to predict from another. Pass longer texts."
            )
        span = _span(batch, self.positions)
        ablation = resolve_intervention(self.intervention, model, self.lookup)
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
                    acts = model.backend.capture(batch.input_ids[rows], names).acts
                    for name in names:
                        parts[name].append(acts[name])
                    yield f"replacements: texts {rows[0] + 1}–{rows[-1] + 1}"
                clean = {name: torch.cat(values) for name, values in parts.items()}
            prepared = prepare_ablation(model, batch, ablation, clean=clean)
        runs = [None, prepared] if prepared is not None else [None]
        losses: list[tuple[torch.Tensor, torch.Tensor]] = []
        sink_rows: list[tuple[float, float, int]] = []  # per clean chunk: (share, uniform, rows with ≥ 2 tokens)
        for run in runs:
            loss_rows, hit_rows = [], []
            for rows in chunks:
                sink = FirstKeyAttention(model.cfg.n_layers)
                edits = run.edits_for(rows) if run is not None else sink.observers(model.backend)
                logits = model.backend.logits(batch.input_ids[rows], edits)
                lengths = [batch.lengths[i] for i in rows]
                if run is None:
                    sink_rows.append((*sink.share(lengths), sum(n >= 2 for n in lengths)))
                loss, hit, _ = token_losses(logits, Batch(
                    texts=[batch.texts[i] for i in rows], input_ids=batch.input_ids[rows],
                    attention_mask=batch.attention_mask[rows], answer_positions=batch.answer_positions[rows],
                ))  # fmt: skip
                loss_rows.append(loss)
                hit_rows.append(hit)
                yield f"{'intervention' if run is not None else 'clean'}: texts {rows[0] + 1}–{rows[-1] + 1}"
            losses.append((torch.cat(loss_rows), torch.cat(hit_rows)))
        result = measurement(model, batch, span, losses[-1], losses[0] if prepared is not None else None, ablation)
        counted = sum(n for _, _, n in sink_rows) or 1
        share = sum(s * n for s, _, n in sink_rows) / counted  # the mean over rows, as one forward would give
        uniform = sum(u * n for _, u, n in sink_rows) / counted
        fix = "Tokens right after it may show a higher loss for that reason; a neutral prefix in front moves the sink."
        note = attention_sink_note(model.tokenizer, share, uniform, result.texts[0].tokens[0], fix)
        result.notes += [note] if note is not None else []
        self.result = result


def text_losses(
    model: LoadedModel,
    texts: Sequence[str] | None = None,
    intervention: Intervention | None = None,
    token_ids: Sequence[Sequence[int]] | None = None,
    positions: Sequence[int] | None = None,
) -> LossMeasurement:
    """``LossJob`` run to the end here."""
    job = LossJob(model=model, texts=texts, intervention=intervention, token_ids=token_ids, positions=positions)
    return drain(job)


def measurement(
    model: LoadedModel,
    batch: Batch,
    span: torch.Tensor,
    measured: tuple[torch.Tensor, torch.Tensor],
    clean: tuple[torch.Tensor, torch.Tensor] | None,
    ablation: Ablation | None,
) -> LossMeasurement:
    """Per text and overall loss and accuracy (``measured``: loss and top-1 hits [texts, seq − 1]) over the scored
    predictions ``span``; ``clean``: the same without the intervention."""
    loss, hit = measured
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
    result = LossMeasurement(
        intervention=ablation.describe() if ablation is not None else None,
        texts=rows,
        mean_loss=float(loss[span].mean()),
        accuracy=float(hit[span].to(torch.float64).mean()),
    )
    if clean is not None:
        clean_loss, clean_hit = clean
        result.clean_mean_loss = float(clean_loss[span].mean())
        result.clean_accuracy = float(clean_hit[span].to(torch.float64).mean())
        result.notes.append(
            f"The intervention changes the mean loss by {result.mean_loss - result.clean_mean_loss:+.4f} "
            f"nats and the accuracy by {result.accuracy - result.clean_accuracy:+.3f}."
        )
    return result
