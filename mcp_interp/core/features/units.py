"""The four kinds of feature an assistant can name, each as one number per token read at one point of the model.

| kind | written as | activation | point read |
|---|---|---|---|
| MLP neuron | ``"L6N562"`` | the down projection's input (act(gate) · up when gated) | ``mlp.hook_post`` |
| residual direction | ``{layer, direction}`` | the projection on the unit direction | ``resid_post`` (``hook_out``) |
| SAE feature | ``{sae, feature}`` | its encoder activation | the SAE's hook |
| transcoder feature | ``{transcoders, layer, feature}`` | its encoder activation | the transcoder's input hook |

Features that share a point (every neuron of one layer, every feature of one SAE) share one captured value, which
is what ``activations`` caches. Each kind also says what it writes to the residual stream per unit of activation
(``output``), from which ``logit_effects`` reads the tokens it promotes and suppresses directly.

References (``direction://``, SAE and transcoder folders) are loaded here, on the model thread, when a job is built.
"""

from __future__ import annotations

import hashlib
import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import TypeAdapter, ValidationError

from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.options import parse_dtype
from mcp_interp.core.engine.backend.points import hook_mlp_post, hook_out
from mcp_interp.core.engine.dictionaries.sae import SparseAutoencoder
from mcp_interp.core.engine.dictionaries.transcoders import Transcoders
from mcp_interp.core.engine.references import Lookup, is_direction_uri, load_direction, sae_dictionary, transcoder_set
from mcp_interp.core.engine.text.tokens import token_strings
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import DirectionRef
from mcp_interp.schemas.naming import (
    FEATURE_DESCRIPTION,
    FeatureInfo,
    FeatureKind,
    FeatureSpec,
    OutputTokens,
    SaeFeatureRef,
    TokenEffect,
    TranscoderFeatureRef,
)

NEURON_NAME = re.compile(r"^\s*L(\d+)N(\d+)\s*$", re.IGNORECASE)
DICTIONARY_ROWS = 1024  # tokens encoded at once by a dictionary ([rows, d_sae] floats)
RESIDUAL_SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
TOP_TOKENS = 10
EFFECT_METHOD = (
    "effect = W_U · (γ ⊙ v) (a LayerNorm's centring applied to v first): the change of each logit when v is added to "
    "the final residual stream, with the final norm's scale 1/rms frozen at 1 and its gain γ applied; the real change "
    "is this times the positive scale of the residual v lands in, so the ranking is exact but the magnitudes are "
    "relative. Direct path only: later layers' reactions are ignored."
)


@dataclass(frozen=True)
class NamedFeature(ABC):
    """One feature: where it is read (``point``), how a token's activation comes from that point's value, and what
    it writes to the residual stream."""

    kind: FeatureKind
    key: str
    description: str
    layer: int
    point: str

    @abstractmethod
    def activations(self, values: torch.Tensor) -> torch.Tensor:
        """``[rows]`` float32 activations of tokens whose values at ``point`` are ``values`` ``[rows, ...]``."""

    @abstractmethod
    def output(self, model: LoadedModel) -> tuple[torch.Tensor | None, str]:
        """The ``[d_model]`` vector the feature writes per unit of activation and what it is, or None and why not."""

    def info(self) -> FeatureInfo:
        return FeatureInfo(
            kind=self.kind, key=self.key, description=self.description, layer=self.layer, point=self.point
        )


@dataclass(frozen=True)
class NamedNeuron(NamedFeature):
    neuron: int

    def activations(self, values: torch.Tensor) -> torch.Tensor:
        return values[:, self.neuron].float()

    def output(self, model: LoadedModel) -> tuple[torch.Tensor | None, str]:
        onehot = torch.zeros(1, int(model.cfg.d_mlp), device=model.device)
        onehot[0, self.neuron] = 1.0
        writes = model.backend.mlp_writes(self.layer, onehot)
        if writes is None:
            return None, f"layer {self.layer}'s MLP has no down projection of its own"
        return writes[0], f"neuron {self.neuron}'s output weights: column {self.neuron} of layer {self.layer}'s W_out"


@dataclass(frozen=True)
class NamedDirection(NamedFeature):
    unit: torch.Tensor  # [d_model], norm 1

    def activations(self, values: torch.Tensor) -> torch.Tensor:
        return (values.float() @ self.unit.to(values.device).float()).float()

    def output(self, model: LoadedModel) -> tuple[torch.Tensor | None, str]:
        return self.unit, f"the unit direction itself, added to layer {self.layer}'s resid_post"


@dataclass(frozen=True)
class NamedSaeFeature(NamedFeature):
    sae: SparseAutoencoder
    feature: int

    def activations(self, values: torch.Tensor) -> torch.Tensor:
        x = self.sae.to_input(values)
        if x.shape[-1] != self.sae.d_in:
            raise InputError(f"The SAE's d_in = {self.sae.d_in} but {self.sae.saelens_hook} has width {x.shape[-1]}.")
        parts = [
            self.sae.encode(x[i : i + DICTIONARY_ROWS])[:, self.feature] for i in range(0, x.shape[0], DICTIONARY_ROWS)
        ]
        return torch.cat(parts).float() if parts else torch.zeros(0)

    def output(self, model: LoadedModel) -> tuple[torch.Tensor | None, str]:
        row = self.sae.W_dec[self.feature].detach()
        where = f"decoder row {self.feature} of the SAE at {self.sae.saelens_hook}"
        if self.sae.site in RESIDUAL_SITES:
            return row, where
        if self.sae.site == "mlp_post":
            writes = model.backend.mlp_writes(self.layer, row[None])
            return (
                (None, "the MLP has no down projection") if writes is None else (writes[0], f"{where}, through W_out")
            )
        heads = row.reshape(int(model.cfg.n_heads), -1)
        per_head, _ = model.backend.head_writes(self.layer, heads)
        return per_head.sum(dim=0), f"{where}, through the attention output projection W_O"


@dataclass(frozen=True)
class NamedTranscoderFeature(NamedFeature):
    transcoders: Transcoders
    feature: int

    def activations(self, values: torch.Tensor) -> torch.Tensor:
        parts = [
            self.transcoders.encode(self.layer, values[i : i + DICTIONARY_ROWS])[:, self.feature]
            for i in range(0, values.shape[0], DICTIONARY_ROWS)
        ]
        return torch.cat(parts).float() if parts else torch.zeros(0)

    def output(self, model: LoadedModel) -> tuple[torch.Tensor | None, str]:
        layers = self.transcoders.output_layers(self.layer)
        rows = [self.transcoders.decoder_rows(self.layer, [self.feature], out)[0] for out in layers]
        spread = f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}..{layers[-1]}, summed"
        return torch.stack(rows).sum(dim=0).detach(), f"its decoder row(s) at {spread} (MLP-output writes)"


def parse_feature(spec: FeatureSpec | Any, model: LoadedModel, lookup: Lookup | None = None) -> NamedFeature:
    """The feature ``spec`` names (as the tools' argument types it; a plain dict from Python is typed first), checked
    against the model, its references resolved; an ``InputError`` saying what is wrong and what is accepted
    otherwise."""
    if not isinstance(spec, str | DirectionRef | SaeFeatureRef | TranscoderFeatureRef):
        try:
            spec = FEATURE_SPEC.validate_python(spec)
        except ValidationError:
            raise InputError(f"`feature` {spec!r} is not a feature; give one of: {FEATURE_DESCRIPTION}") from None
    if isinstance(spec, str):
        return _neuron(spec, model)
    if isinstance(spec, DirectionRef):
        return _direction(spec.layer, spec.direction, model, lookup)
    if isinstance(spec, SaeFeatureRef):
        sae = sae_dictionary(spec.sae, model)
        feature = _index(spec.feature, sae.d_sae, "SAE feature", f"this SAE has d_sae = {sae.d_sae}")
        return NamedSaeFeature(
            kind="sae",
            key=f"sae {sae.folder} #{feature}",
            description=(f"feature {feature} of the {sae.describe()}: its encoder activation"),
            layer=sae.layer,
            point=sae.hook_name,
            sae=sae,
            feature=feature,
        )
    transcoders = transcoder_set(spec.transcoders, model)
    layer = _index(spec.layer, transcoders.n_layers, "layer", f"the transcoders have {transcoders.n_layers}")
    feature = _index(
        spec.feature,
        transcoders.d_transcoder,
        "transcoder feature",
        f"each layer has {transcoders.d_transcoder}",
    )
    return NamedTranscoderFeature(
        kind="transcoder",
        key=f"transcoders {transcoders.folder} L{layer} #{feature}",
        description=f"feature {feature} of layer {layer} of {transcoders.describe()}: its encoder activation",
        layer=layer,
        point=transcoders.input_hooks[layer],
        transcoders=transcoders,
        feature=feature,
    )


FEATURE_SPEC: TypeAdapter[FeatureSpec] = TypeAdapter(FeatureSpec)


def _index(value: Any, size: int, what: str, why: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise InputError(f"{what} {value!r} does not exist: {why}, numbered 0..{size - 1}.")
    return value


def _neuron(spec: str, model: LoadedModel) -> NamedNeuron:
    match = NEURON_NAME.match(spec)
    if match is None:
        hint = " Name one neuron (not a list)." if "," in spec else ""
        raise InputError(f"`feature` {spec[:80]!r} is not a feature name.{hint} Give one of: {FEATURE_DESCRIPTION}")
    cfg = model.cfg
    layer = _index(int(match.group(1)), int(cfg.n_layers), "layer", f"this model has {cfg.n_layers} layers")
    require(model.backend, "neuron_features")
    d_mlp = int(cfg.d_mlp or 0)
    neuron = int(match.group(2))
    if not neuron < d_mlp:
        raise InputError(f"{spec.strip()!r}: neuron {neuron} is out of range; each MLP has neurons 0..{d_mlp - 1}.")
    return NamedNeuron(
        kind="neuron",
        key=f"L{layer}N{neuron}",
        description=(
            f"neuron {neuron} of layer {layer}'s MLP: the input of its down projection (act(gate) · up for a gated MLP)"
        ),
        layer=layer,
        point=hook_mlp_post(layer),
        neuron=neuron,
    )


def _direction(layer: Any, direction: Any, model: LoadedModel, lookup: Lookup | None) -> NamedDirection:
    n_layers, d_model = int(model.cfg.n_layers), int(model.cfg.d_model)
    layer = _index(layer, n_layers, "layer", f"this model has {n_layers} layers")
    if isinstance(direction, str):
        if not is_direction_uri(direction) or lookup is None:
            raise InputError(f"`direction` {direction[:80]!r}: give d_model floats or a direction:// URI from probe.")
        stored = load_direction(direction, lookup, model)
        if stored.layer != layer:
            raise InputError(f"{direction} was fitted on layer {stored.layer}'s resid_post, not layer {layer}'s.")
        values, name = stored.vector, f"L{layer} {direction}"
    else:
        values = direction if isinstance(direction, list) else []
        ok = len(values) == d_model and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        if not ok or not all(math.isfinite(v) for v in values):
            raise InputError(f"`direction` must be {d_model} finite numbers (d_model) or a direction:// URI.")
        digest = hashlib.sha256(torch.tensor(values, dtype=torch.float64).numpy().tobytes()).hexdigest()[:12]
        name = f"L{layer} direction sha256:{digest}"
    vector = torch.tensor(values, dtype=torch.float64)
    norm = float(vector.norm())
    if not norm > 0:
        raise InputError("`direction` is the zero vector: it has no direction to project on.")
    unit = (vector / norm).to(torch.float32).to(model.device)
    return NamedDirection(
        kind="direction",
        key=name,
        description=(f"the projection of layer {layer}'s resid_post on a unit direction (x · u)"),
        layer=layer,
        point=hook_out(layer),
        unit=unit,
    )


def logit_effects(model: LoadedModel, vector: torch.Tensor, writes: str, top: int = TOP_TOKENS) -> OutputTokens:
    """The tokens ``vector`` (added to the final residual stream) promotes and suppresses most, directly
    (``EFFECT_METHOD``). Ids beyond the tokenizer's vocabulary (padding rows of the unembedding) are left out."""
    kind, gain, _ = model.backend.norm()
    v = vector.detach().to(torch.float64).to(gain.device)
    if kind == "layer":
        v = v - v.mean()
    normed = torch.stack([gain * v, torch.zeros_like(v)])
    with torch.inference_mode():
        logits = model.backend.logits_from_normed(normed.to(parse_dtype(model.dtype)).to(model.device))
    effect = (logits[0].to(torch.float64) - logits[1].to(torch.float64))[: len(model.tokenizer)]
    order = torch.argsort(effect, descending=True, stable=True)
    k = min(top, effect.shape[0])

    def rows(ids: torch.Tensor) -> list[TokenEffect]:
        names = token_strings(model.tokenizer, [int(i) for i in ids])
        return [TokenEffect(token=n, token_id=int(i), effect=float(effect[i])) for n, i in zip(names, ids, strict=True)]

    return OutputTokens(
        writes=writes,
        method=EFFECT_METHOD,
        vector_norm=float(vector.double().norm()),
        promoted=rows(order[:k]),
        suppressed=rows(order.flip(0)[:k]),
    )
