"""References to what lives outside the request — stored directions, SAE and transcoder folders — resolved here, the
one place that reads them, and nowhere else.

Why one module of its own: reading a dictionary's weights is I/O (a large one can take seconds). Resolved here, on the
model thread inside the measurement or job (the toolkit builds jobs there too), a reference never blocks the server's
event loop and is read once per request; parsing a target (``ablation.targets``) and scoring an answer do no I/O.
Everything that names a reference — an ``intervention``'s targets, a feature to name (``features.units``), a
direction or dictionary to steer along, a transcoder set to trace — is resolved through this module.

* ``direction://{id}`` — a direction a probe found, stored as JSON (``schemas.common.StoredDirection``): the unit
  vector in one layer's output residual stream, the statistics of the texts' projections onto it, and the fingerprint
  of the weights it was fitted on. Wherever a raw vector is accepted — ``{"layer": 12, "direction": "direction://…"}``
  — the URI is replaced by its vector; a direction fitted on other weights (same shape is not same model) or an
  unknown id is refused. Resolving one needs ``lookup`` (the server's store).
* ``{"sae": folder, "features": [...]}`` — the SAE is loaded (``dictionaries.saelens``).
* ``{"transcoders": folder or hub id, "layer": l, "features": [...]}`` — the set is loaded
  (``dictionaries.transcoder_format``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from pydantic import ValidationError

import mcp_interp.state.limits as limits
from mcp_interp.core.engine.ablation.targets import (
    Ablation,
    Target,
    ablation_of,
    parse_target,
    sae_target,
    transcoder_targets,
)
from mcp_interp.core.engine.backend.capabilities import require
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
    TargetSpec,
    TranscoderFeaturesRef,
)

DIRECTION_SCHEME = "direction://"
Lookup = Callable[[str], bytes]  # id → the stored JSON; raises LookupError for an unknown id


def is_direction_uri(value: object) -> bool:
    return isinstance(value, str) and value.startswith(DIRECTION_SCHEME)


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


def sae_dictionary(folder: str, model: LoadedModel) -> SparseAutoencoder:
    """The SAELens-format dictionary in ``folder`` (or a cached hub id), loaded for ``model`` (cached with it)."""
    return load_sae(folder, model)


def transcoder_set(source: str, model: LoadedModel) -> Transcoders:
    """The circuit-tracer transcoders in ``source`` (a folder or a cached hub id), loaded for ``model``."""
    return load_transcoders(source, model)


def resolve_intervention(
    spec: Intervention | None, model: LoadedModel, lookup: Lookup | None = None
) -> Ablation | None:
    """The core ``Ablation`` of a tool's ``intervention``, every reference resolved and every target parsed in one
    pass over the typed targets pydantic produced; None passes through. ``lookup`` (the server's store) resolves
    ``direction://`` URIs; without it they are refused with the fix."""
    if spec is None:
        return None
    if not spec.ablate:
        raise InputError("An ablation needs components in `ablate`, e.g. {'ablate': ['L9H3', 'L28MLP']}.")
    limits.check("max_heads", len(spec.ablate), "Number of ablation targets")
    return ablation_of([target for item in spec.ablate for target in resolve_target(item, model, lookup)], spec)


def resolve_target(spec: TargetSpec, model: LoadedModel, lookup: Lookup | None = None) -> list[Target]:
    """The target(s) one component names: one, except a transcoder set's features, which are one per layer they write
    to. References are loaded here; everything else is parsed by ``targets.parse_target``."""
    if isinstance(spec, SaeFeaturesRef):
        return [sae_target(sae_dictionary(spec.sae, model), spec.features)]
    if isinstance(spec, TranscoderFeaturesRef):
        require(model.backend, "transcoder_targets")  # read at one point, written at another: a local model
        return transcoder_targets(transcoder_set(spec.transcoders, model), spec.layer, spec.features)
    if isinstance(spec, DirectionRef) and isinstance(spec.direction, str) and is_direction_uri(spec.direction):
        if lookup is None:
            raise InputError(
                f"{spec.direction} is a stored direction, which only the server's store holds; pass its vector "
                "(the direction:// resource's `vector`) when calling mcp_interp without the server."
            )
        spec = DirectionRef(layer=spec.layer, direction=_vector_at(spec.layer, spec.direction, lookup, model))
    return [parse_target(spec, model)]


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
