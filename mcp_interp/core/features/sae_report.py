"""The two SAE measurements: ``sae`` (one text: its top features per token and how well the SAE
fits the model there) and ``sae_features`` (chosen features on each token of many texts).

Definitions, with x_t the model's activation at the SAE's hook on token t of the text (t = 0..n−1),
x̂_t the SAE's reconstruction and a_t its feature activations:

* fraction of variance explained = 1 − Σ_t ‖x_t − x̂_t‖² / Σ_t ‖x_t − x̄‖², x̄ = (1/n) Σ_t x_t, over
  every token of the text (and, separately, over tokens 1..n−1: the first token is often an
  attention sink whose outlier norm dominates both sums). 1 is perfect, 0 is no better than the
  mean, negative is worse than the mean. Sums in float64.
* L0 = (1/n) Σ_t #{i : a_t,i > 0}.
* losses: mean next-token cross-entropy (nats) over the text's n−1 predictions, for the clean
  model, with x̂ replacing x at the hook at every position ("spliced"), and with 0 replacing x at
  every position ("zero ablation"); loss recovered = (zero − spliced) / (zero − clean).

The text is tokenized by the project's one rule (``engine.tokens.encode``); everything runs under
``torch.inference_mode()``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

import mcp_interp.state.limits as limits
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.dictionaries.sae import SparseAutoencoder, splice_edits
from mcp_interp.core.engine.jobs import Job
from mcp_interp.core.engine.numbers.metrics import token_losses
from mcp_interp.core.engine.references import sae_dictionary
from mcp_interp.core.engine.text.tokens import Batch, encode, token_ids, token_strings
from mcp_interp.errors import InputError
from mcp_interp.schemas.sae import (
    FeatureActivation,
    FeatureOnText,
    FeatureReport,
    SaeFeaturesMeasurement,
    SaeInfo,
    SaeMeasurement,
    SaeToken,
    TextTokens,
)

MAX_TOP_K = 100
MAX_FEATURES = 256  # feature ids in one `sae_features` call
MAX_FEATURE_VALUES = 65_536  # features × tokens returned by one `sae_features` call
MAX_HEATMAP_FEATURES = 40  # columns of the token × feature heatmap
TINY_LOSS_GAP = 0.01  # nats: below this, loss_recovered divides by almost nothing
FORWARD_TEXTS = 32  # texts per forward pass in `sae_features`
ENCODE_ROWS = 1024  # tokens encoded at once ([rows, d_sae] float32 each)


@dataclass(frozen=True)
class SaeHeatmap:
    """What the token × feature figure shows: ``values[t][j]`` is feature ``features[j]`` on token t."""

    tokens: list[str]
    features: list[int]
    values: list[list[float]]
    title: str


def sae_info(sae: SparseAutoencoder) -> SaeInfo:
    return SaeInfo(
        folder=sae.folder,
        architecture=sae.architecture,
        hook_name=sae.saelens_hook,
        bridge_hook=sae.hook_name,
        layer=sae.layer,
        d_in=sae.d_in,
        d_sae=sae.d_sae,
        k=getattr(sae, "k", None),
        apply_b_dec_to_input=sae.apply_b_dec_to_input,
        model_name=sae.model_name,
    )


def read_activations(model: LoadedModel, sae: SparseAutoencoder, input_ids: torch.Tensor) -> torch.Tensor:
    """The value of the SAE's hook on ``input_ids`` ([batch, seq, ...]); the forward stops right after it."""
    return model.backend.run(input_ids, capture=[sae.hook_name], stop_at=sae.hook_name).acts[sae.hook_name]


def _check_width(x: torch.Tensor, sae: SparseAutoencoder) -> None:
    if x.shape[-1] != sae.d_in:
        raise InputError(
            f"The SAE's `d_in` = {sae.d_in} but the model's {sae.saelens_hook} has width {x.shape[-1]}: the SAE was "
            "trained for another model. Use an SAE trained on this model."
        )


def _fve(x: torch.Tensor, x_hat: torch.Tensor) -> float | None:
    """1 − Σ‖x − x̂‖² / Σ‖x − x̄‖² over the rows of ``x`` (float64); None without variance."""
    if x.shape[0] < 2:
        return None
    total = float(((x - x.mean(dim=0)) ** 2).sum())
    if not total > 0:
        return None
    return 1.0 - float(((x - x_hat) ** 2).sum()) / total


def sae_report(model: LoadedModel, text: str, folder: str, top_k: int = 10) -> tuple[SaeMeasurement, SaeHeatmap]:
    """The SAE in ``folder`` on ``text``: top features per token, FVE, L0 and the spliced-in loss; and the
    data of the token × feature heatmap (the union of the tokens' top features, at most 40 columns)."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
        raise InputError(f"`top_k` must be an integer from 1 to {MAX_TOP_K}, got {top_k!r}.")
    if not isinstance(text, str):
        raise InputError(f"`text` must be one string, got {type(text).__name__}; `sae_features` takes a list.")
    sae = sae_dictionary(folder, model)
    batch = encode(model.tokenizer, [text], model.device)
    n = batch.lengths[0]
    tokens = token_strings(model.tokenizer, batch.ids(0))
    clean = model.backend.run(batch.input_ids, capture=[sae.hook_name])
    assert clean.logits is not None
    clean_logits = clean.logits
    with torch.inference_mode():
        x = sae.to_input(clean.acts[sae.hook_name])[0]
        _check_width(x, sae)
        acts = sae.encode(x)
        x_hat = sae.decode(acts)
        losses = _losses(model, batch, sae, clean_logits) if n >= 2 else None
    x64, x_hat64 = x.to(torch.float64), x_hat.to(torch.float64)
    error = ((x64 - x_hat64) ** 2).sum(dim=-1)
    norms = x64.norm(dim=-1)
    active = acts > 0
    l0 = active.sum(dim=-1)
    top_values, top_ids = acts.topk(min(top_k, sae.d_sae), dim=-1)
    per_token = []
    for t in range(n):
        squared_norm = float(norms[t]) ** 2
        per_token.append(
            SaeToken(
                position=t,
                token=tokens[t],
                l0=int(l0[t]),
                relative_error=float(error[t]) / squared_norm if squared_norm > 0 else None,
                activation_norm=float(norms[t]),
                top_features=[
                    FeatureActivation(feature=int(i), activation=float(v))
                    for v, i in zip(top_values[t], top_ids[t], strict=True)
                    if v > 0
                ],
            )
        )
    measurement = SaeMeasurement(
        sae=sae_info(sae),
        text=text,
        tokens=tokens,
        top_k=top_k,
        per_token=per_token,
        fraction_variance_explained=_fve(x64, x_hat64),
        fraction_variance_explained_excluding_first=_fve(x64[1:], x_hat64[1:]) if n >= 3 else None,
        l0=float(l0.to(torch.float64).mean()),
        features_active=int(active.any(dim=0).sum()),
        clean_loss=None if losses is None else losses[0],
        spliced_loss=None if losses is None else losses[1],
        zero_ablation_loss=None if losses is None else losses[2],
        loss_recovered=_recovered(losses),
        notes=list(sae.notes),
    )
    heatmap = _heatmap(measurement, acts)
    _add_notes(measurement, norms, heatmap)
    return measurement, heatmap


def _losses(
    model: LoadedModel, batch: Batch, sae: SparseAutoencoder, clean_logits: torch.Tensor
) -> tuple[float, float, float]:
    """Mean next-token loss (nats) clean, with the reconstruction spliced in, and with the activation zeroed."""
    spliced_logits = model.backend.logits(batch.input_ids, splice_edits(sae, sae.reconstruct))
    zero_logits = model.backend.logits(batch.input_ids, splice_edits(sae, torch.zeros_like))
    means = []
    for logits in (clean_logits, spliced_logits, zero_logits):
        loss, _, scored = token_losses(logits, batch)
        means.append(float(loss[scored].mean()))
    return means[0], means[1], means[2]


def _recovered(losses: tuple[float, float, float] | None) -> float | None:
    """(zero − spliced) / (zero − clean), None without losses or with a zero denominator."""
    if losses is None:
        return None
    clean, spliced, zero = losses
    return (zero - spliced) / (zero - clean) if zero != clean else None


def _heatmap(measurement: SaeMeasurement, acts: torch.Tensor) -> SaeHeatmap:
    union = sorted({f.feature for token in measurement.per_token for f in token.top_features})
    peak = {f: float(acts[:, f].max()) for f in union}
    chosen = sorted(union, key=lambda f: (-peak[f], f))[:MAX_HEATMAP_FEATURES]
    values = acts[:, chosen].tolist() if chosen else [[] for _ in measurement.tokens]
    if len(union) > len(chosen):
        measurement.notes.append(
            f"The heatmap shows {len(chosen)} of the {len(union)} features that are in some token's top "
            f"{measurement.top_k}: those with the largest activation on this text."
        )
    title = f"{measurement.sae.architecture} SAE at {measurement.sae.hook_name}: top features per token"
    return SaeHeatmap(tokens=measurement.tokens, features=chosen, values=values, title=title)


def _add_notes(measurement: SaeMeasurement, norms: torch.Tensor, heatmap: SaeHeatmap) -> None:
    notes = measurement.notes
    if measurement.l0 == 0:
        notes.append(
            "No feature fires on any token of this text (L0 = 0): the SAE is dead here and reconstructs every token "
            "as b_dec. The SAE may belong to another model or hook, or expect differently scaled activations."
        )
    fve = measurement.fraction_variance_explained
    if fve is None:
        notes.append("fraction_variance_explained is undefined: it needs at least 2 tokens whose activations differ.")
    elif fve < 0:
        notes.append(
            f"fraction_variance_explained = {fve:.3f} < 0: the reconstruction is further from the activations than "
            "their mean is. The SAE does not fit this model/hook on this text."
        )
    n = len(measurement.tokens)
    if n >= 3:
        rest = float(norms[1:].median())
        first = float(norms[0])
        if rest > 0 and first > 10 * rest:
            notes.append(
                f"The first token's activation norm ({first:.1f}) is {first / rest:.0f}× the median "
                "of the others: it dominates the variance sums; see fraction_variance_explained_excluding_first."
            )
    if measurement.clean_loss is None:
        notes.append("The text has 1 token: there is no next-token prediction, so the losses are not defined.")
        return
    assert measurement.zero_ablation_loss is not None and measurement.spliced_loss is not None
    gap = measurement.zero_ablation_loss - measurement.clean_loss
    if abs(gap) < TINY_LOSS_GAP:
        notes.append(
            f"Zero-ablating the hook changes the loss by only {gap:+.4f} nats, so loss_recovered divides by almost "
            "nothing and is unreliable; compare spliced_loss with clean_loss directly."
        )
    elif gap < 0:
        notes.append(
            f"Zero-ablating the hook lowers the loss ({gap:+.4f} nats): the zero baseline is not a worst case here, "
            "so read loss_recovered with care."
        )
    recovered = measurement.loss_recovered
    if recovered is not None and recovered < 0 and gap >= TINY_LOSS_GAP:
        notes.append(
            f"loss_recovered = {recovered:.3f} < 0: splicing the SAE in costs more than zeroing the activation."
        )


# --- sae_features ---------------------------------------------------------------------------------


@dataclass(kw_only=True)
class SaeFeaturesJob(Job[SaeFeaturesMeasurement]):
    """``sae_features`` as a job: one step per forward of ``FORWARD_TEXTS`` texts, so a cancel frees the model within
    one of them."""

    model: LoadedModel
    texts: Sequence[str]
    sae: str
    features: Sequence[int]
    result: SaeFeaturesMeasurement | None = field(default=None, init=False)

    def total_steps(self) -> int:
        n = 1 if isinstance(self.texts, str) else len(self.texts)
        return -(-n // FORWARD_TEXTS) + 1

    def steps(self) -> Iterator[str]:
        holder: list[SaeFeaturesMeasurement] = []
        yield from sae_feature_steps(self.model, self.texts, self.sae, self.features, holder)
        self.result = holder[0]


def sae_feature_activations(
    model: LoadedModel, texts: Sequence[str], folder: str, features: Sequence[int]
) -> SaeFeaturesMeasurement:
    """``sae_feature_steps`` run to the end here."""
    holder: list[SaeFeaturesMeasurement] = []
    for _ in sae_feature_steps(model, texts, folder, features, holder):
        pass
    return holder[0]


def sae_feature_steps(
    model: LoadedModel,
    texts: Sequence[str],
    folder: str,
    features: Sequence[int],
    into: list[SaeFeaturesMeasurement],
) -> Iterator[str]:
    """Each requested feature's activation on every token of every text, and its maximum per text (appended to
    ``into``); a progress message per forward."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts:
        raise InputError("`texts` is empty: pass a list of strings.")
    limits.check("max_prompts", len(texts), "Number of texts")
    if isinstance(features, int) and not isinstance(features, bool):
        features = [features]
    features = list(features)
    if not features:
        raise InputError("`features` is empty: pass feature ids, e.g. [1234, 77].")
    if len(features) > MAX_FEATURES:
        raise InputError(f"`features` has {len(features)} ids; at most {MAX_FEATURES} per call. Split the request.")
    sae = sae_dictionary(folder, model)
    bad = [f for f in features if isinstance(f, bool) or not isinstance(f, int) or not 0 <= f < sae.d_sae]
    if bad:
        raise InputError(
            f"`features`: {bad[0]!r} is not a feature of this SAE; its feature ids are 0..{sae.d_sae - 1} "
            f"(d_sae = {sae.d_sae})."
        )
    chosen = list(dict.fromkeys(features))
    lengths = [len(token_ids(model.tokenizer, text)) for text in texts]
    values = len(chosen) * sum(lengths)
    if values > MAX_FEATURE_VALUES:
        raise InputError(
            f"{len(chosen)} features × {sum(lengths)} tokens = {values} activations, more than one call returns "
            f"({MAX_FEATURE_VALUES}). Ask for fewer features, or fewer/shorter texts."
        )
    index = torch.tensor(chosen, device=sae.W_enc.device)
    rows: list[torch.Tensor] = []  # per text: [tokens, features]
    token_lists: list[list[str]] = []
    for start in range(0, len(texts), FORWARD_TEXTS):
        batch = encode(model.tokenizer, texts[start : start + FORWARD_TEXTS], model.device)
        with torch.inference_mode():
            x = sae.to_input(read_activations(model, sae, batch.input_ids))
            _check_width(x, sae)
            real = x[batch.attention_mask.bool()]  # [tokens, d_in], text by text
            acts = torch.cat(
                [sae.encode(real[i : i + ENCODE_ROWS])[:, index] for i in range(0, real.shape[0], ENCODE_ROWS)]
            )
        rows.extend(acts.split(batch.lengths))
        token_lists.extend(token_strings(model.tokenizer, batch.ids(i)) for i in range(len(batch.texts)))
        yield f"texts {start + 1}–{min(start + FORWARD_TEXTS, len(texts))} of {len(texts)}"
    reports = []
    for j, feature in enumerate(chosen):
        per_text = []
        for text_acts, tokens in zip(rows, token_lists, strict=True):
            column = text_acts[:, j]
            position = int(column.argmax())
            per_text.append(
                FeatureOnText(
                    activations=[float(v) for v in column],
                    max=float(column[position]),
                    max_position=position,
                    max_token=tokens[position],
                )
            )
        everything = torch.cat([text_acts[:, j] for text_acts in rows])
        reports.append(
            FeatureReport(
                feature=feature,
                texts=per_text,
                max=float(everything.max()),
                active_fraction=float((everything > 0).to(torch.float64).mean()),
            )
        )
    measurement = SaeFeaturesMeasurement(
        sae=sae_info(sae),
        texts=[TextTokens(text=t, tokens=tokens) for t, tokens in zip(texts, token_lists, strict=True)],
        features=reports,
        notes=list(sae.notes),
    )
    silent = [r.feature for r in reports if r.max == 0]
    if silent:
        shown = ", ".join(str(f) for f in silent[:10]) + (" …" if len(silent) > 10 else "")
        measurement.notes.append(
            f"{len(silent)} of the {len(reports)} features are 0 on every token of these texts: {shown}."
        )
    if len(chosen) < len(features):
        measurement.notes.append("Repeated feature ids were reported once.")
    into.append(measurement)
    yield "features reported"
