"""Stored directions (``direction://{id}``) and their use by interventions and steering.

A direction a probe found is stored as JSON (``schemas.common.StoredDirection``): the unit vector
in one layer's output residual stream, the statistics of the texts' projections onto it, and the
fingerprint of the weights it was fitted on. Every family's interventions name it by URI wherever a
raw vector is accepted — ``{"layer": 12, "direction": "direction://…"}`` — and ``resolve_direction_refs``
replaces each URI by its vector before the intervention is parsed, refusing a direction fitted on
other weights (same shape is not same model) or an unknown id; ``steer`` loads one with ``load_direction``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.common import DirectionRef, Intervention, StoredDirection

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


def resolve_direction_refs(spec: Any, lookup: Lookup, model: LoadedModel) -> Any:
    """``spec`` (an ``Intervention`` or anything else) with every ``direction://`` URI in its targets replaced by
    the stored vector; anything else is returned unchanged."""
    if not isinstance(spec, Intervention):
        return spec
    targets = [
        DirectionRef(layer=t.layer, direction=_vector_at(t.layer, t.direction, lookup, model))
        if isinstance(t, DirectionRef) and isinstance(t.direction, str)
        else t
        for t in spec.ablate
    ]
    return spec.model_copy(update={"ablate": targets})


def _vector_at(layer: int, uri: str, lookup: Lookup, model: LoadedModel) -> list[float]:
    """The stored vector, refused at a layer other than the one whose stream it was fitted on."""
    direction = load_direction(uri, lookup, model)
    if layer != direction.layer:
        raise InputError(
            f"{uri} was fitted on layer {direction.layer}'s resid_post, but the target names layer {layer}. Pass "
            f"layer {direction.layer}, or pass the vector itself (from the direction:// resource) to use it elsewhere."
        )
    return direction.vector
