"""References to what lives outside the request — stored directions, SAE and transcoder folders — resolved to loaded
objects by one resolver, before anything is parsed.

Why one step of its own: reading a dictionary's weights is I/O (and a large one can take seconds). Done here, on the
model thread inside the measurement or job (the toolkit builds jobs there too), it never blocks the server's event
loop, it happens once per request, and parsing an intervention (``ablation.targets``) does none.

* ``direction://{id}`` — a direction a probe found, stored as JSON (``schemas.common.StoredDirection``): the unit
  vector in one layer's output residual stream, the statistics of the texts' projections onto it, and the fingerprint
  of the weights it was fitted on. Wherever a raw vector is accepted — ``{"layer": 12, "direction": "direction://…"}``
  — the URI is replaced by its vector; a direction fitted on other weights (same shape is not same model) or an
  unknown id is refused. Resolving one needs ``lookup`` (the server's store).
* ``{"sae": folder, "features": [...]}`` — the SAE is loaded (``dictionaries.saelens``) into ``LoadedSaeFeatures``.
* ``{"transcoders": folder or hub id, "layer": l, "features": [...]}`` — the set is loaded
  (``dictionaries.transcoder_format``) into ``LoadedTranscoderFeatures``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.dictionaries.sae import SparseAutoencoder
from mcp_interp.core.engine.dictionaries.saelens import load_sae
from mcp_interp.core.engine.dictionaries.transcoder_format import load_transcoders
from mcp_interp.core.engine.dictionaries.transcoders import TranscoderFeature, Transcoders
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import (
    DirectionRef,
    Intervention,
    SaeFeaturesRef,
    StoredDirection,
    TranscoderFeaturesRef,
)

DIRECTION_SCHEME = "direction://"
Lookup = Callable[[str], bytes]  # id → the stored JSON; raises LookupError for an unknown id


def encode_direction(direction: StoredDirection) -> bytes:
    return direction.model_dump_json().encode("utf-8")


def load_direction(uri: str, lookup: Lookup, model: LoadedModel) -> StoredDirection:
    """The stored direction behind ``uri``, checked against the loaded model."""
    if not isinstance(uri, str) or not uri.startswith(DIRECTION_SCHEME):
        raise InputError(f"{str(uri)[:100]!r} is not a direction URI; they look like direction://<32 hex> (probe).")
    try:
        data = lookup(uri[len(DIRECTION_SCHEME) :])
        direction = StoredDirection.model_validate(json.loads(data))
    except LookupError as exc:
        raise InputError(f"{exc} Run `probe` again to get a direction URI.") from None
    except (ValueError, ValidationError) as exc:
        raise InputError(f"{uri} is not a readable stored direction ({str(exc)[:200]}).") from None
    if direction.model_fingerprint != model.fingerprint:
        raise InputError(
            f"{uri} was fitted on model {direction.model_name!r} (weights {direction.model_fingerprint[:12]}…), not "
            f"on the loaded {model.name!r} ({model.fingerprint[:12]}…): a residual direction only means something "
            "in the weights it came from. Fit a probe on this model."
        )
    if len(direction.vector) != model.cfg.d_model:
        d_model = model.cfg.d_model
        raise InputError(f"{uri} has {len(direction.vector)} numbers; this model's d_model is {d_model}.")
    return direction


@dataclass(frozen=True)
class LoadedSaeFeatures:
    """An SAE-features target with its dictionary loaded (``source``: the folder it was named by)."""

    sae: SparseAutoencoder
    features: Any  # as the caller gave them: checked when the target is parsed
    source: str


@dataclass(frozen=True)
class LoadedTranscoderFeatures:
    """A transcoder-features target with its set loaded."""

    transcoders: Transcoders
    layer: Any
    features: Any


def resolve_references(spec: Any, model: LoadedModel, lookup: Lookup | None = None) -> Any:
    """``spec`` (an ``Intervention``; anything else is returned unchanged) with every reference in its targets
    resolved: ``direction://`` URIs to their vectors (with ``lookup``), SAE and transcoder folders to loaded
    dictionaries. Targets already resolved, and targets that name no reference, pass through as they are."""
    if not isinstance(spec, Intervention):
        return spec
    return spec.model_copy(update={"ablate": [_resolved(t, model, lookup) for t in spec.ablate]})


def _resolved(target: Any, model: LoadedModel, lookup: Lookup | None) -> Any:
    if isinstance(target, DirectionRef | SaeFeaturesRef | TranscoderFeaturesRef):
        target = target.model_dump()
    if not isinstance(target, Mapping):
        return target
    keys = set(target)
    if keys == {"layer", "direction"} and isinstance(target["direction"], str):
        if not target["direction"].startswith(DIRECTION_SCHEME):
            return target  # not a reference: parsing says what a direction must be
        if lookup is None:
            raise InputError(
                f"{target['direction']} is a stored direction, which only the server's store holds; pass its vector "
                "(the direction:// resource's `vector`) when calling mcp_interp without the server."
            )
        return {"layer": target["layer"], "direction": _vector_at(target["layer"], target["direction"], lookup, model)}
    if keys == {"sae", "features"}:
        return LoadedSaeFeatures(load_sae(target["sae"], model), target["features"], str(target["sae"]))
    if keys == {"transcoders", "layer", "features"}:
        return LoadedTranscoderFeatures(load_transcoders(target["transcoders"], model), target["layer"],
                                        target["features"])  # fmt: skip
    return target


def steered_feature(
    model: LoadedModel, sae: str | None, transcoders: str | None, layer: int | None, feature: int | None
) -> tuple[SparseAutoencoder, int] | TranscoderFeature | None:
    """The SAE or transcoder feature `steer` names, loaded, or None when it names neither."""
    if sae is not None and transcoders is not None:
        raise InputError("Give `sae` or `transcoders` (with `feature`), not both.")
    if transcoders is not None:
        if feature is None or layer is None:
            raise InputError("Give `transcoders`, `layer` and `feature` to steer along a transcoder feature.")
        loaded = load_transcoders(transcoders, model)
        if not 0 <= layer < loaded.n_layers:
            raise InputError(f"layer {layer} does not exist; the transcoders have layers 0..{loaded.n_layers - 1}.")
        return TranscoderFeature(loaded, layer, feature)
    if (sae is None) != (feature is None):
        raise InputError("Give both `sae` (the folder) and `feature` (its id) to steer along an SAE feature.")
    return None if sae is None or feature is None else (load_sae(sae, model), feature)


def _vector_at(layer: int, uri: str, lookup: Lookup, model: LoadedModel) -> list[float]:
    """The stored vector, refused at a layer other than the one whose stream it was fitted on."""
    direction = load_direction(uri, lookup, model)
    if layer != direction.layer:
        raise InputError(
            f"{uri} was fitted on layer {direction.layer}'s resid_post, but the target names layer {layer}. Pass "
            f"layer {direction.layer}, or pass the vector itself (from the direction:// resource) to use it elsewhere."
        )
    return direction.vector
