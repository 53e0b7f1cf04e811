"""Ablation of model components: heads, MLPs, attention layers, MLP neurons, residual directions.

A *target* names what is removed and where it lives (``Target``): a head is its slice of
``hook_z`` (the per-head input to the attention output projection — which works unchanged for
grouped-query attention: each query head has its own slice of z even when it shares keys and
values), an MLP or an attention layer is what it adds to the residual stream (``hook_mlp_out``,
``hook_attn_out``), neurons are their slice of ``mlp.hook_post``, and a direction u is the
component x·u of the residual stream leaving a block (``hook_resid_post``, the stream probes read),
the rest of x untouched. Three ways to remove a target's part, from crudest to gentlest:

* ``zero``     — the part = 0 (for a direction: projected out). Simple, but pushes the model
  off-distribution (a head is rarely 0).
* ``mean``     — the part = its mean over this batch at the same kind of position: per position
  when every prompt has the same token length, else per distance from each prompt's last token
  (so the answer position is replaced by the mean answer-position z, never by a mean dominated by
  other positions such as the first token).
* ``resample`` — each prompt gets another prompt's part (a seeded permutation with no fixed
  points), keeping it on-distribution while removing prompt-specific information.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from mcp_interp import limits
from mcp_interp.core.bridge import hook_attn_out, hook_mlp_out, hook_mlp_post, hook_out, hook_z
from mcp_interp.core.heads import Head, PositionSpec, parse_head, position_mask
from mcp_interp.core.tokens import Batch
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import AblationSpec, DirectionRef, HeadRef, Intervention, NeuronsRef, SaeFeaturesRef

AblationMethod = Literal["zero", "mean", "resample"]
TargetKind = Literal["head", "mlp", "attn", "neurons", "direction", "sae_features"]
MeanOver = Literal["per_position", "per_position_from_end"]
Hook = tuple[str, Callable[[torch.Tensor, Any], torch.Tensor]]


@dataclass(frozen=True)
class Target:
    """One ablated component: ``kind`` at ``layer``; ``index`` = (head,), the neurons or the SAE features;
    ``direction`` a unit vector ``[d_model]`` for kind ``direction``; ``sae`` the dictionary (a
    ``SparseAutoencoder``) for kind ``sae_features``, ``source`` its folder (so equal ids of two SAEs differ)."""

    layer: int
    kind: TargetKind
    index: tuple[int, ...] = ()
    direction: torch.Tensor | None = field(default=None, compare=False)
    sae: Any = field(default=None, compare=False)
    source: str = ""

    def __str__(self) -> str:
        if self.kind == "head":
            return f"L{self.layer}H{self.index[0]}"
        if self.kind == "neurons":
            return f"L{self.layer} neurons {list(self.index)}"
        if self.kind == "direction":
            return f"L{self.layer} direction (resid_post)"
        if self.kind == "sae_features":
            return f"SAE features {list(self.index)} at {self.sae.saelens_hook}"
        return f"L{self.layer}{'MLP' if self.kind == 'mlp' else 'ATTN'}"

    def hook(self) -> str:
        if self.kind == "sae_features":
            return str(self.sae.hook_name)
        return {
            "head": hook_z,
            "mlp": hook_mlp_out,
            "attn": hook_attn_out,
            "neurons": hook_mlp_post,
            "direction": hook_out,
        }[self.kind](self.layer)

    def read(self, values: torch.Tensor) -> torch.Tensor:
        """This target's part of the hook's ``values`` [batch, seq, ...] → [batch, seq, width]."""
        if self.kind in ("head", "neurons"):
            part = values[:, :, list(self.index)]
            return part.flatten(2) if self.kind == "head" else part
        if self.kind == "direction":
            assert self.direction is not None
            return (values @ self.direction.to(device=values.device, dtype=values.dtype)).unsqueeze(-1)
        if self.kind == "sae_features":
            return self.sae.encode(self.sae.to_input(values))[..., list(self.index)].to(values.dtype)
        return values

    def write(self, values: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        """``values`` with this target's part replaced by ``part`` (a new tensor)."""
        if self.kind == "direction":
            assert self.direction is not None
            unit = self.direction.to(device=values.device, dtype=values.dtype)
            return values + (part.to(values.dtype) - self.read(values)) * unit
        if self.kind == "sae_features":
            # Each feature's decoder contribution moves from its activation to ``part``: Σ_f Δa_f · W_dec[f].
            decoder = self.sae.W_dec[list(self.index)]
            delta = (part - self.read(values)).to(decoder.dtype) @ decoder
            return values + self.sae.from_input(delta, values)
        if self.kind in ("mlp", "attn"):
            return part.to(values.dtype).clone()
        new = values.clone()
        index = list(self.index)
        new[:, :, index] = part.reshape(new[:, :, index].shape).to(values.dtype)
        return new


def head_target(head: Head) -> Target:
    return Target(head.layer, "head", (head.head,))


@dataclass(frozen=True)
class Ablation:
    targets: list[Target]
    method: AblationMethod = "zero"
    positions: PositionSpec = "all"
    seed: int = 0

    def __post_init__(self) -> None:
        # Heads are accepted as they are written elsewhere (``Head(9, 3)``).
        object.__setattr__(self, "targets", [head_target(t) if isinstance(t, Head) else t for t in self.targets])

    @property
    def heads(self) -> list[Head]:
        return [Head(t.layer, t.index[0]) for t in self.targets if t.kind == "head"]

    def describe(self) -> str:
        names = ", ".join(str(t) for t in self.targets)
        return f"{self.method}-ablate {names} at positions {self.positions or 'all'}"


@dataclass(frozen=True)
class PreparedAblation:
    """Forward hooks that apply an ablation to one batch, and how the replacement was formed."""

    hooks: list[Hook]
    mean_over: MeanOver | None = None
    permutation: list[int] | None = None


def derangement(n: int, seed: int) -> list[int]:
    """A uniformly random permutation of 0..n-1 with no fixed points, from a seeded CPU generator.

    Rejection sampling: about 1/e of permutations qualify, so a handful of draws suffice; the
    same seed gives the same permutation on every device.
    """
    if n < 2:
        raise InputError("Resample ablation needs at least 2 prompts: each prompt takes another prompt's activation.")
    generator = torch.Generator(device="cpu").manual_seed(seed)
    for _ in range(10_000):
        perm = torch.randperm(n, generator=generator)
        if bool((perm != torch.arange(n)).all()):
            return [int(i) for i in perm]
    raise RuntimeError("no derangement found")  # pragma: no cover - probability ~ (1 - 1/e)^10000


def mean_replacement(z: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, MeanOver]:
    """The batch mean of ``z`` ([batch, seq, heads, d_head]) at each real position's own kind of position.

    ``per_position``: no prompt is padded, so position i is replaced by the mean over prompts of
    position i. ``per_position_from_end``: prompts differ in length, so a position k tokens before
    its prompt's last token is replaced by the mean over prompts of the token k before *their* last
    (prompts shorter than k + 1 tokens are left out of that mean). Padding entries stay 0: they are
    never selected for replacement.
    """
    real = attention_mask.bool()
    if bool(real.all()):
        return z.mean(dim=0, keepdim=True).expand_as(z), "per_position"
    from_end = real.flip(1).cumsum(1).flip(1) - 1  # real tokens after this one, in its own prompt
    replacement = torch.zeros_like(z)
    for distance in range(int(real.sum(dim=1).max())):
        same_kind = real & (from_end == distance)  # at most one position per prompt
        replacement[same_kind] = z[same_kind].mean(dim=0)
    return replacement, "per_position_from_end"


def prepare_ablation(bridge: Any, batch: Batch, ablation: Ablation) -> PreparedAblation:
    """Build the hooks; mean/resample first read the targets' clean parts from one forward of the batch."""
    if ablation.method not in ("zero", "mean", "resample"):
        raise InputError(f"Unknown ablation method {ablation.method!r}; use 'zero', 'mean' or 'resample'.")
    mask = position_mask(ablation.positions, batch.attention_mask, batch.answer_positions)
    permutation = None
    if ablation.method == "resample":
        lengths = batch.lengths
        if len(set(lengths)) > 1:
            raise InputError(
                f"Resample ablation needs prompts of equal token length (got lengths {lengths}): a prompt's "
                "activation is swapped in position by position. Use method 'mean', or equal-length prompts."
            )
        permutation = derangement(len(lengths), ablation.seed)
    replacements: list[torch.Tensor | None] = [None] * len(ablation.targets)
    mean_over: MeanOver | None = None
    if ablation.method in ("mean", "resample"):
        from mcp_interp.core.patching import capture_forward

        names = sorted({t.hook() for t in ablation.targets})
        clean = capture_forward(bridge, batch.input_ids, names).acts
        for i, target in enumerate(ablation.targets):
            part = target.read(clean[target.hook()])
            if ablation.method == "mean":
                replacements[i], mean_over = mean_replacement(part, batch.attention_mask)
            else:
                replacements[i] = part[torch.tensor(permutation)]

    def make_hook(members: list[int]) -> Callable[[torch.Tensor, Any], torch.Tensor]:
        def hook(values: torch.Tensor, hook: Any) -> torch.Tensor:
            for i in members:
                target = ablation.targets[i]
                part = target.read(values)
                replacement = replacements[i]
                new_part = torch.zeros_like(part) if replacement is None else replacement.to(part.dtype)
                where = mask.unsqueeze(-1)
                values = target.write(values, torch.where(where, new_part, part))
            return values

        return hook

    by_hook: dict[str, list[int]] = {}
    for i, target in enumerate(ablation.targets):
        by_hook.setdefault(target.hook(), []).append(i)
    hooks: list[Hook] = [(name, make_hook(members)) for name, members in by_hook.items()]
    return PreparedAblation(hooks=hooks, mean_over=mean_over, permutation=permutation)


_COMPONENT_NAME = re.compile(r"^\s*L(\d+)\s*(MLP|ATTN)\s*$", re.IGNORECASE)


def parse_target(spec: Any, cfg: Any, model: Any = None) -> Target:
    """One target from its tool spelling (see ``schemas.common.TARGETS_DESCRIPTION``), checked against
    the model's config (layers, heads, MLP width, d_model); SAE features need the loaded ``model``."""
    if isinstance(spec, HeadRef | NeuronsRef | DirectionRef | SaeFeaturesRef):
        spec = spec.model_dump()
    if isinstance(spec, Mapping) and set(spec) == {"sae", "features"}:
        return sae_target(spec, model)
    if isinstance(spec, str):
        match = _COMPONENT_NAME.match(spec)
        if match is None:
            return head_target(parse_head(spec, cfg.n_layers, cfg.n_heads))
        layer = _layer(int(match.group(1)), cfg, spec)
        return Target(layer, "mlp" if match.group(2).upper() == "MLP" else "attn")
    if isinstance(spec, Mapping) and set(spec) == {"layer", "head"}:
        return head_target(parse_head(dict(spec), cfg.n_layers, cfg.n_heads))
    if isinstance(spec, Mapping) and set(spec) == {"layer", "neurons"}:
        layer, neurons, d_mlp = _layer(spec["layer"], cfg, spec), spec["neurons"], int(cfg.d_mlp)
        if not isinstance(neurons, list) or not neurons:
            raise InputError(f"Target {dict(spec)!r}: `neurons` must be a non-empty list of neuron indices.")
        bad = [n for n in neurons if not isinstance(n, int) or not 0 <= n < d_mlp]
        if bad:
            raise InputError(
                f"Target {dict(spec)!r}: neuron {bad[0]} is out of range; layer {layer}'s MLP has neurons "
                f"0..{d_mlp - 1}."
            )
        return Target(layer, "neurons", tuple(sorted(set(neurons))))
    if isinstance(spec, Mapping) and set(spec) == {"layer", "direction"}:
        layer = _layer(spec["layer"], cfg, spec)
        if isinstance(spec["direction"], str):
            raise InputError(
                f"Target at layer {layer}: {spec['direction'][:100]!r} is not a vector. A stored direction is named "
                "'direction://<32 hex>' (from `probe`); anything else must be a list of d_model floats."
            )
        vector = torch.tensor(spec["direction"], dtype=torch.float32)
        if vector.ndim != 1 or vector.numel() != cfg.d_model:
            raise InputError(
                f"Target at layer {layer}: the direction has {vector.numel()} numbers but this model's residual "
                f"stream has d_model = {cfg.d_model}; pass a vector of exactly {cfg.d_model} floats."
            )
        norm = float(vector.norm())
        if not norm > 0 or norm != norm or norm == float("inf"):
            raise InputError(f"Target at layer {layer}: the direction must be a finite non-zero vector.")
        return Target(layer, "direction", (), vector / norm)
    raise InputError(
        f"Target {spec!r} is not one of: 'L9H3' (a head), 'L28MLP', 'L12ATTN', {{'layer': 28, 'neurons': [17]}}, "
        "{'layer': 12, 'direction': [...]}, {'sae': '<folder>', 'features': [12]}."
    )


def sae_target(spec: Mapping[str, Any], model: Any) -> Target:
    """SAE features as one target (their activations are read from the unablated value together, so
    removing one feature does not change what the others are measured at)."""
    from mcp_interp.core.features.sae import load_sae

    if model is None:
        raise InputError("SAE feature targets need the loaded model; this tool does not take them.")
    sae = load_sae(spec["sae"], model)
    if sae.site == "resid_mid":
        raise InputError(
            f"SAE at {sae.saelens_hook}: feature interventions at resid_mid are not supported (the bridge's "
            "hook_resid_mid only feeds the MLP). Use an SAE at resid_pre/resid_post, attn_out, mlp_out or z."
        )
    features = spec["features"]
    bad = [f for f in features if isinstance(f, bool) or not isinstance(f, int) or not 0 <= f < sae.d_sae]
    if not features or bad:
        raise InputError(
            f"SAE features {features!r}: give a non-empty list of feature ids 0..{sae.d_sae - 1} for this SAE."
        )
    return Target(sae.layer, "sae_features", tuple(sorted(set(features))), sae=sae, source=sae.folder)


def _layer(layer: Any, cfg: Any, spec: Any) -> int:
    if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < cfg.n_layers:
        raise InputError(
            f"Target {spec!r}: layer {layer!r} does not exist; this model has layers 0..{cfg.n_layers - 1}."
        )
    return layer


def ablation_from_spec(spec: AblationSpec | Intervention | None, cfg: Any, model: Any = None) -> Ablation | None:
    """The core ``Ablation`` for a tool's ``intervention`` / ablation arguments (None passes through);
    ``model`` (the ``LoadedModel``) is needed only for SAE feature targets."""
    if spec is None:
        return None
    if isinstance(spec, Intervention):
        spec = spec.ablate
    heads = [] if spec.heads is None else spec.heads if isinstance(spec.heads, list) else [spec.heads]
    specs = [*heads, *(spec.targets or [])]
    if not specs:
        raise InputError("An ablation needs `heads` or `targets`, e.g. {'targets': ['L9H3', 'L28MLP']}.")
    limits.check("max_heads", len(specs), "Number of ablation targets")
    targets: list[Target] = []
    for item in specs:
        target = parse_target(item, cfg, model)
        if not any(same_target(target, seen) for seen in targets):
            targets.append(target)
    return Ablation(orthonormal_directions(targets), spec.method, spec.positions, spec.seed)


def same_target(a: Target, b: Target) -> bool:
    """Equal targets (a direction's vector counts: two directions at one layer are two targets)."""
    if a != b:
        return False
    return a.kind != "direction" or torch.equal(a.direction, b.direction)  # type: ignore[arg-type]


def orthonormal_directions(targets: list[Target]) -> list[Target]:
    """Directions that share a layer, made orthonormal (Gram–Schmidt, in the order given): projecting out
    non-orthogonal directions one after the other would not remove their span. The first keeps its vector."""
    basis: dict[int, list[torch.Tensor]] = {}
    out: list[Target] = []
    for target in targets:
        if target.kind != "direction":
            out.append(target)
            continue
        assert target.direction is not None
        vector = target.direction.to(torch.float64)
        for earlier in basis.get(target.layer, []):
            vector = vector - (vector @ earlier) * earlier
        norm = float(vector.norm())
        if norm < 1e-6:
            raise InputError(
                f"The directions at layer {target.layer} are linearly dependent: one lies in the span of the others. "
                "Drop it (projecting out the others already removes it)."
            )
        unit = vector / norm
        basis.setdefault(target.layer, []).append(unit)
        out.append(Target(target.layer, "direction", (), unit.to(torch.float32)))
    return out
