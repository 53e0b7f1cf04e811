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
  points), keeping it on-distribution while removing prompt-specific information; with reference prompts, the part
  of one of those, drawn per prompt (seeded), so the source distribution is the caller's (e.g. corrupted inputs).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.edits import Edit, Rewrite
from mcp_interp.core.engine.backend.points import hook_attn_out, hook_mlp_out, hook_mlp_post, hook_out, hook_z
from mcp_interp.core.engine.dictionaries.sae import SparseAutoencoder
from mcp_interp.core.engine.dictionaries.transcoders import Transcoders
from mcp_interp.core.engine.numbers.metrics import at_answer_positions
from mcp_interp.core.engine.text.components import (
    Head,
    parse_block_part,
    parse_head,
    parse_neurons,
    position_mask,
)
from mcp_interp.core.engine.text.tokens import Batch, encode, token_ids
from mcp_interp.errors import InputError, require_choice
from mcp_interp.schemas.ablation import MeanOver
from mcp_interp.schemas.common import (
    AblationMethod,
    DirectionRef,
    HeadRef,
    Intervention,
    NeuronsRef,
    PositionsSpec,
)


class Target(ABC):
    """One ablated component: which hook holds it (``hook``), how to read its part of that hook's value
    ``[batch, seq, ...]`` as ``[batch, seq, width]`` (``read``) and how to write a new part (``write``).
    Each kind is a subclass; equal targets (``key``) are ablated once."""

    if TYPE_CHECKING:
        # Read-only: a field of most targets, a property of dictionary features (their dictionary's layer). Declared
        # for the type checker only, so that it is no inherited default of the dataclass fields that define it.
        @property
        def layer(self) -> int: ...

    @abstractmethod
    def hook(self) -> str: ...

    @abstractmethod
    def read(self, values: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def write(self, values: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        """``values`` with this target's part replaced by ``part`` (a new tensor)."""

    def read_hook(self) -> str:
        """The hook whose value ``read`` takes: ``hook()``, except for targets read at one hook and written at
        another (transcoder features: read from the MLP's input, written into its output)."""
        return self.hook()

    def shift(self, values: torch.Tensor, part: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        """``values`` with this target's part moved from ``current`` (as ``read`` found it) to ``part``."""
        return self.write(values, part)

    def key(self) -> tuple[Any, ...]:
        return (type(self).__name__, str(self))


@dataclass(frozen=True)
class HeadTarget(Target):
    """A query head's slice of ``hook_z`` (works unchanged under grouped-query attention: each query head has its
    own slice of z even when it shares keys and values)."""

    layer: int
    head: int

    def __str__(self) -> str:
        return str(Head(self.layer, self.head))

    def hook(self) -> str:
        return hook_z(self.layer)

    def read(self, values: torch.Tensor) -> torch.Tensor:
        return values[:, :, [self.head]].flatten(2)

    def write(self, values: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        new = values.clone()
        new[:, :, [self.head]] = part.reshape(new[:, :, [self.head]].shape).to(values.dtype)
        return new


@dataclass(frozen=True)
class NeuronsTarget(Target):
    """MLP neurons: their slice of ``mlp.hook_post`` (the down projection's input)."""

    layer: int
    neurons: tuple[int, ...]

    def __str__(self) -> str:
        return f"L{self.layer} neurons {list(self.neurons)}"

    def hook(self) -> str:
        return hook_mlp_post(self.layer)

    def read(self, values: torch.Tensor) -> torch.Tensor:
        return values[:, :, list(self.neurons)]

    def write(self, values: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        new = values.clone()
        new[:, :, list(self.neurons)] = part.to(values.dtype)
        return new


@dataclass(frozen=True)
class BlockOutputTarget(Target):
    """What a block's MLP (``hook_mlp_out``) or attention (``hook_attn_out``) adds to the residual stream."""

    layer: int
    part: Literal["MLP", "ATTN"]

    def __str__(self) -> str:
        return f"L{self.layer}{self.part}"

    def hook(self) -> str:
        return hook_mlp_out(self.layer) if self.part == "MLP" else hook_attn_out(self.layer)

    def read(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def write(self, values: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        return part.to(values.dtype).clone()


@dataclass(frozen=True)
class DirectionTarget(Target):
    """The component x·u of the residual stream leaving a block (``hook_resid_post``, the stream probes read)
    along a unit vector u ``[d_model]``, the rest of x untouched."""

    layer: int
    direction: torch.Tensor = field(compare=False)

    def __str__(self) -> str:
        return f"L{self.layer} direction (resid_post)"

    def key(self) -> tuple[Any, ...]:
        return ("direction", self.layer, tuple(self.direction.tolist()))

    def hook(self) -> str:
        return hook_out(self.layer)

    def read(self, values: torch.Tensor) -> torch.Tensor:
        return (values @ self.direction.to(device=values.device, dtype=values.dtype)).unsqueeze(-1)

    def write(self, values: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        unit = self.direction.to(device=values.device, dtype=values.dtype)
        return values + (part.to(values.dtype) - self.read(values)) * unit


@dataclass(frozen=True)
class FeaturesTarget(Target):
    """Features of a sparse dictionary at its hook: their activations are the part, and writing a new part
    moves each feature's decoder contribution from its activation to the new value, Σ_f Δa_f · W_dec[f]
    (the activations are read from the unablated value together, so removing one feature does not change what
    the others are measured at)."""

    sae: SparseAutoencoder = field(compare=False)
    features: tuple[int, ...]
    source: str  # the dictionary's folder: equal feature ids of two dictionaries differ

    @property
    def layer(self) -> int:
        return self.sae.layer

    def __str__(self) -> str:
        return f"SAE features {list(self.features)} at {self.sae.saelens_hook}"

    def key(self) -> tuple[Any, ...]:
        return ("features", self.source, self.features)

    def hook(self) -> str:
        return str(self.sae.hook_name)

    def read(self, values: torch.Tensor) -> torch.Tensor:
        return self.sae.encode(self.sae.to_input(values))[..., list(self.features)].to(values.dtype)

    def write(self, values: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        decoder = self.sae.W_dec[list(self.features)]
        delta = (part - self.read(values)).to(decoder.dtype) @ decoder
        return values + self.sae.from_input(delta, values)


@dataclass(frozen=True)
class TranscoderFeaturesTarget(Target):
    """Features of one layer's transcoder, as their write into one output layer's MLP output (a cross-layer
    transcoder's features are one target per layer they write to). The part is their activations, read from the
    transcoder's input (``read_hook``) of the same forward; a new part adds (new − current) · W_dec rows to the MLP's
    write at ``hook`` — the rest of the real MLP output is left as it is (circuit-tracer's ``feature_intervention``)."""

    transcoders: Transcoders = field(compare=False)
    source_layer: int
    out_layer: int
    features: tuple[int, ...]
    source: str  # the transcoder set's folder

    @property
    def layer(self) -> int:
        return self.source_layer

    def __str__(self) -> str:
        where = "" if self.out_layer == self.source_layer else f" (their write to layer {self.out_layer})"
        return f"transcoder features {list(self.features)} of layer {self.source_layer}{where}"

    def key(self) -> tuple[Any, ...]:
        return ("transcoder", self.source, self.source_layer, self.out_layer, self.features)

    def hook(self) -> str:
        return self.transcoders.output_hooks[self.out_layer]

    def read_hook(self) -> str:
        return self.transcoders.input_hooks[self.source_layer]

    def read(self, values: torch.Tensor) -> torch.Tensor:
        return self.transcoders.encode(self.source_layer, values)[..., list(self.features)].to(values.dtype)

    def write(self, values: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        raise TypeError("a transcoder target is written with shift(): its activations are read at another hook")

    def shift(self, values: torch.Tensor, part: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        rows = self.transcoders.decoder_rows(self.source_layer, list(self.features), self.out_layer)
        return values + ((part - current).to(rows.dtype) @ rows).to(values.dtype)


@dataclass(frozen=True)
class Ablation:
    """What is removed (``targets``), how (``method``), where (``positions``, of each prompt's own tokens), the seed
    of every random choice it makes (the resample permutation and the random stand-ins of its baselines), and for
    ``mean`` the prompts whose mean replaces the part, for ``resample`` those it is drawn from (``reference_prompts``;
    empty = the prompts themselves)."""

    targets: list[Target]
    method: AblationMethod = "zero"
    positions: PositionsSpec = "all"
    seed: int = 0
    reference_prompts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Heads are accepted as they are written elsewhere (``Head(9, 3)``).
        targets = [HeadTarget(t.layer, t.head) if isinstance(t, Head) else t for t in self.targets]
        object.__setattr__(self, "targets", targets)
        object.__setattr__(self, "reference_prompts", tuple(self.reference_prompts))

    @property
    def heads(self) -> list[Head]:
        return [Head(t.layer, t.head) for t in self.targets if isinstance(t, HeadTarget)]

    @property
    def directions(self) -> list[DirectionTarget]:
        return [t for t in self.targets if isinstance(t, DirectionTarget)]

    def describe(self) -> str:
        names = ", ".join(str(t) for t in self.targets)
        return f"{self.method}-ablate {names} at positions {self.positions or 'all'}"


@dataclass(frozen=True)
class PreparedAblation:
    """An ablation made concrete for one prompt batch: where it applies (``mask`` [batch, seq], the prompts' own
    positions) and, for mean/resample, each target's replacement part there (``replacements[i]`` [batch, seq, width],
    None = zero), computed once from the prompts' clean run.

    ``edits_for`` applies it to a batch whose rows begin with a prompt's tokens followed by a teacher-forced answer.
    The prompt's positions are ablated exactly as in the prompt batch. With ``positions='all'`` the answer's tokens
    are ablated too (a component removed from the model is removed while it writes the answer), each with the part
    the prompt's answer position gets — zero, the mean answer-position part, or the resampled prompt's — since every
    answer token is, like the prompt's last, a position predicting the answer. So one prompt's number depends on the
    prompts and its own answer, never on another prompt's answer or length."""

    ablation: Ablation
    mask: torch.Tensor
    replacements: list[torch.Tensor | None]
    lengths: list[int]
    mean_over: MeanOver | None = None
    permutation: list[int] | None = None

    def describe(self) -> str:
        return self.ablation.describe()

    @property
    def edits(self) -> list[Edit]:
        """The edits for the prompt batch itself."""
        return self.edits_for(None)

    def edits_for(self, owners: list[int] | None) -> list[Edit]:
        """The edits for a batch whose row r starts with prompt ``owners[r]``'s tokens (None = the prompt batch)."""
        rows = list(range(self.mask.shape[0])) if owners is None else list(owners)
        index = torch.tensor(rows, dtype=torch.long)
        mask = self.mask[index.to(self.mask.device)]
        replacements = [None if r is None else r[index.to(r.device)] for r in self.replacements]
        lengths = [self.lengths[r] for r in rows]
        answers_too = owners is not None and self.ablation.positions in (None, "all")
        targets = self.ablation.targets

        def extend(values: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
            """The mask and replacements over ``values``' positions (the prompt batch's, then the answers')."""
            seq = values.shape[1]
            width = min(seq, mask.shape[1])
            where = torch.zeros(values.shape[:2], dtype=torch.bool, device=values.device)
            where[:, :width] = mask[:, :width].to(values.device)
            if answers_too:
                for r, length in enumerate(lengths):
                    where[r, length:] = True
            parts: list[torch.Tensor | None] = []
            for replacement in replacements:
                if replacement is None:
                    parts.append(None)
                    continue
                part = torch.zeros((values.shape[0], seq, replacement.shape[-1]), dtype=replacement.dtype)
                part = part.to(replacement.device)
                part[:, :width] = replacement[:, :width]
                if answers_too:
                    for r, length in enumerate(lengths):
                        part[r, length:] = replacement[r, length - 1]
                parts.append(part)
            return where, parts

        held: dict[str, torch.Tensor] = {}  # values of read points that are not their target's write point

        def make_edit(name: str, members: list[int]) -> Edit:
            def ablate(values: torch.Tensor) -> torch.Tensor:
                where, parts = extend(values)
                for i in members:
                    target = targets[i]
                    part = target.read(values if target.read_hook() == target.hook() else held[target.read_hook()])
                    replacement = parts[i]
                    new_part = (
                        torch.zeros_like(part)
                        if replacement is None
                        else replacement.to(device=part.device, dtype=part.dtype)
                    )
                    values = target.shift(values, torch.where(where.unsqueeze(-1), new_part, part), part)
                return values

            # A target read at another point (a transcoder's input) makes the edit depend on more than its value.
            pure = all(targets[i].read_hook() == targets[i].hook() for i in members)
            return Rewrite(name, ablate, is_pure=pure)

        def keep(name: str) -> Edit:
            def hold(values: torch.Tensor) -> None:
                held[name] = values

            return Rewrite(name, hold, is_pure=False)

        by_point: dict[str, list[int]] = {}
        for i, target in enumerate(targets):
            by_point.setdefault(target.hook(), []).append(i)
        read_only = sorted({t.read_hook() for t in targets if t.read_hook() != t.hook()})
        edits: list[Edit] = [keep(name) for name in read_only]
        return edits + [make_edit(name, members) for name, members in by_point.items()]


def stacked_edits(edit_lists: list[list[Edit]], rows: int) -> list[Edit]:
    """Edits for a batch of ``len(edit_lists)`` stacked copies of a ``rows``-row batch: copy j gets ``edit_lists[j]``.
    Runs k variants of an ablation (random stand-ins) in one forward instead of k."""
    names = list(dict.fromkeys(edit.point for edits in edit_lists for edit in edits))

    def make(name: str) -> Edit:
        chosen = [[edit for edit in edits if edit.point == name] for edits in edit_lists]

        def apply(values: torch.Tensor) -> torch.Tensor:
            chunks: list[torch.Tensor] = []
            for j, edits in enumerate(chosen):
                chunk = values[j * rows : (j + 1) * rows]
                for edit in edits:
                    out = edit.apply(chunk)
                    chunk = chunk if out is None else out
                chunks.append(chunk)
            return torch.cat(chunks, dim=0)

        return Rewrite(name, apply, is_pure=all(edit.pure for edits in chosen for edit in edits))

    return [make(name) for name in names]


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


def resample_sources(n: int, seed: int, n_reference: int = 0) -> list[int]:
    """Which prompt each of ``n`` prompts takes its activation from under resample ablation: another of the prompts
    (``derangement``), or, with ``n_reference`` reference prompts, one of those — a seeded draw without replacement
    when there are at least ``n`` of them, with replacement otherwise (the same seed, the same draw on every device)."""
    if not n_reference:
        return derangement(n, seed)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    if n_reference >= n:
        return [int(i) for i in torch.randperm(n_reference, generator=generator)[:n]]
    return [int(i) for i in torch.randint(n_reference, (n,), generator=generator)]


def mean_replacement(
    part: torch.Tensor,
    attention_mask: torch.Tensor,
    reference: torch.Tensor | None = None,
    reference_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, MeanOver]:
    """The mean of a part at each real position's own kind of position: over the reference prompts (``reference``
    [refs, seq', ...] with ``reference_mask``; default the prompts themselves), shape of ``part`` [batch, seq, ...].

    A position k tokens before its prompt's last token gets the mean over reference prompts of the token k before
    *their* last (reference prompts shorter than k + 1 tokens are left out of that mean). When every prompt and every
    reference has the same length this is the plain per-position mean (``per_position``), else
    ``per_position_from_end`` — so the answer position always gets the mean answer-position part, never a mean
    dominated by other positions such as the first token. Positions no reference reaches, and padding, stay 0.
    """
    if reference is None or reference_mask is None:
        reference, reference_mask = part, attention_mask
    real, ref_real = attention_mask.bool(), reference_mask.bool()
    from_end = real.flip(1).cumsum(1).flip(1) - 1  # real tokens after this one, in its own prompt
    ref_from_end = ref_real.flip(1).cumsum(1).flip(1) - 1
    replacement = torch.zeros_like(part)
    for distance in range(int(real.sum(dim=1).max())):
        donors = ref_real & (ref_from_end == distance)
        if bool(donors.any()):
            replacement[real & (from_end == distance)] = reference[donors].mean(dim=0).to(part.dtype)
    lengths = set(real.sum(dim=1).tolist()) | set(ref_real.sum(dim=1).tolist())
    return replacement, "per_position" if len(lengths) == 1 else "per_position_from_end"


def prepare_ablation(
    model: Any, batch: Batch, ablation: Ablation, clean: Mapping[str, torch.Tensor] | None = None
) -> PreparedAblation:
    """Make ``ablation`` concrete for ``batch`` (``model`` a ``LoadedModel``: its backend runs, its tokenizer encodes
    the reference prompts by the shared rule): mean/resample read the targets' clean parts from one forward of the
    prompts (or ``clean``, those activations already captured), and mean's reference prompts from one more.

    Refused: mean ablation of a single prompt with no ``reference_prompts`` (the mean of one prompt is the prompt
    itself: a silent no-op), reference prompts with another method, resample of unequal-length prompts."""
    require_choice("method", ablation.method, AblationMethod)
    mask = position_mask(ablation.positions, batch.attention_mask, batch.answer_positions)
    n = batch.input_ids.shape[0]
    if ablation.reference_prompts and ablation.method not in ("mean", "resample"):
        raise InputError(
            "`reference_prompts` are the prompts whose activations replace the ablated part (their mean, or one "
            f"drawn per prompt): they apply to methods 'mean' and 'resample', not {ablation.method!r}."
        )
    if ablation.method == "mean" and n == 1 and not ablation.reference_prompts:
        raise InputError(
            "Mean ablation of a single prompt replaces its activation with itself (the mean of one prompt): nothing "
            "would be removed. Pass more prompts, or `reference_prompts` (prompts whose mean is used), or use method "
            "'zero'."
        )
    permutation = None
    if ablation.method == "resample":
        lengths = batch.lengths
        reference_lengths = [len(token_ids(model.tokenizer, p)) for p in ablation.reference_prompts]
        if len(set(lengths) | set(reference_lengths)) > 1:
            raise InputError(
                f"Resample ablation needs prompts of equal token length (got lengths {lengths}"
                + (f", reference prompts {reference_lengths}" if reference_lengths else "")
                + "): a prompt's activation is swapped in position by position. Use method 'mean', or equal-length "
                "prompts."
            )
        permutation = resample_sources(len(lengths), ablation.seed, len(ablation.reference_prompts))
    replacements: list[torch.Tensor | None] = [None] * len(ablation.targets)
    mean_over: MeanOver | None = None
    if ablation.method in ("mean", "resample"):
        names = sorted({t.read_hook() for t in ablation.targets})
        acts = clean if clean is not None and all(name in clean for name in names) else None
        if acts is None:
            acts = model.backend.capture(batch.input_ids, names).acts
        reference_acts: Mapping[str, torch.Tensor] | None = None
        reference_mask = None
        if ablation.reference_prompts:
            reference = encode(model.tokenizer, list(ablation.reference_prompts), str(batch.input_ids.device))
            reference_acts = model.backend.capture(reference.input_ids, names).acts
            reference_mask = reference.attention_mask
            if ablation.method == "mean":
                check_reference_lengths(batch, reference, mask)
        for i, target in enumerate(ablation.targets):
            part = target.read(acts[target.read_hook()])
            donors = None if reference_acts is None else target.read(reference_acts[target.read_hook()])
            if ablation.method == "mean":
                replacements[i], mean_over = mean_replacement(part, batch.attention_mask, donors, reference_mask)
            else:
                replacements[i] = (part if donors is None else donors)[torch.tensor(permutation)]
    return PreparedAblation(ablation, mask, replacements, batch.lengths, mean_over=mean_over, permutation=permutation)


def check_reference_lengths(batch: Batch, reference: Batch, mask: torch.Tensor) -> None:
    """Every ablated position needs a reference token at its distance from the end of its prompt."""
    longest = max(reference.lengths)
    for row, length in enumerate(batch.lengths):
        ablated = torch.nonzero(mask[row, :length]).flatten().tolist()
        if ablated and length - 1 - ablated[0] >= longest:
            raise InputError(
                f"Prompt {row} is ablated {length - ablated[0]} tokens from its end, but the longest reference prompt "
                f"has {longest} tokens: the mean is taken position by position from each prompt's end, so give "
                "reference prompts at least as long as the ablated span."
            )


def parse_target(spec: str | HeadRef | NeuronsRef | DirectionRef, model: Any) -> Target:
    """One target from the typed spelling pydantic produced (``schemas.common.TargetSpec``, a direction already a
    vector), checked against the model (``LoadedModel``: its layers, heads, MLP width, d_model, and whether the
    architecture has heads and neurons to remove). Dictionary features are built by ``sae_target`` and
    ``transcoder_targets`` from their loaded dictionaries; references are resolved before (``references``)."""
    cfg = model.cfg
    if isinstance(spec, str):
        block_part = parse_block_part(spec, cfg.n_layers)
        if block_part is not None:
            return BlockOutputTarget(*block_part)
        neurons = parse_neurons(spec, cfg.n_layers, int(cfg.d_mlp or 0))
        if neurons is not None:
            require(model.backend, "neuron_targets")  # mixture-of-experts blocks have no layer of neurons
            return NeuronsTarget(*neurons)
        head = parse_head(spec, cfg.n_layers, cfg.n_heads)
        require(model.backend, "head_targets")
        return HeadTarget(head.layer, head.head)
    if isinstance(spec, HeadRef):
        head = parse_head({"layer": spec.layer, "head": spec.head}, cfg.n_layers, cfg.n_heads)
        require(model.backend, "head_targets")
        return HeadTarget(head.layer, head.head)
    if isinstance(spec, NeuronsRef):
        require(model.backend, "neuron_targets")
        layer, d_mlp = _layer(spec.layer, cfg, spec), int(cfg.d_mlp)
        if not spec.neurons:
            raise InputError(f"Target {spec.model_dump()!r}: `neurons` must be a non-empty list of neuron indices.")
        bad = [n for n in spec.neurons if not 0 <= n < d_mlp]
        if bad:
            raise InputError(
                f"Target {spec.model_dump()!r}: neuron {bad[0]} is out of range; layer {layer}'s MLP has neurons "
                f"0..{d_mlp - 1}."
            )
        return NeuronsTarget(layer, tuple(sorted(set(spec.neurons))))
    if not isinstance(spec, DirectionRef):
        raise TypeError(f"{type(spec).__name__} names a dictionary, which is loaded by references.resolve_target")
    layer = _layer(spec.layer, cfg, spec)
    if isinstance(spec.direction, str):
        raise InputError(
            f"Target at layer {layer}: {spec.direction[:100]!r} is not a vector. A stored direction is named "
            "'direction://<32 hex>' (from `probe`); anything else must be a list of d_model floats."
        )
    vector = torch.tensor(spec.direction, dtype=torch.float32)
    if vector.ndim != 1 or vector.numel() != cfg.d_model:
        raise InputError(
            f"Target at layer {layer}: the direction has {vector.numel()} numbers but this model's residual "
            f"stream has d_model = {cfg.d_model}; pass a vector of exactly {cfg.d_model} floats."
        )
    norm = float(vector.norm())
    if not norm > 0 or norm != norm or norm == float("inf"):
        raise InputError(f"Target at layer {layer}: the direction must be a finite non-zero vector.")
    return DirectionTarget(layer, vector / norm)


def transcoder_targets(transcoders: Transcoders, layer: int, features: list[int]) -> list[Target]:
    """A transcoder set's features of one layer, as one target per output layer (a per-layer transcoder's: one)."""
    if not 0 <= layer < transcoders.n_layers:
        raise InputError(
            f"Transcoder target (layer {layer!r}, features {features!r}): layer {layer!r} does not exist; the "
            f"transcoders have layers 0..{transcoders.n_layers - 1}."
        )
    if not features or any(not 0 <= f < transcoders.d_transcoder for f in features):
        raise InputError(
            f"Transcoder features {features!r}: give a non-empty list of feature ids 0..{transcoders.d_transcoder - 1}."
        )
    chosen = tuple(sorted(set(features)))
    return [
        TranscoderFeaturesTarget(
            transcoders=transcoders, source_layer=layer, out_layer=j, features=chosen, source=transcoders.folder
        )
        for j in transcoders.output_layers(layer)
    ]


def sae_target(sae: SparseAutoencoder, features: list[int]) -> FeaturesTarget:
    """SAE features as one target."""
    if sae.site == "resid_mid":
        raise InputError(
            f"SAE at {sae.saelens_hook}: feature interventions at resid_mid are not supported (the bridge's "
            "hook_resid_mid only feeds the MLP). Use an SAE at resid_pre/resid_post, attn_out, mlp_out or z."
        )
    if not features or any(not 0 <= f < sae.d_sae for f in features):
        raise InputError(
            f"SAE features {features!r}: give a non-empty list of feature ids 0..{sae.d_sae - 1} for this SAE."
        )
    return FeaturesTarget(sae=sae, features=tuple(sorted(set(features))), source=sae.folder)


def _layer(layer: int, cfg: Any, spec: Any) -> int:
    if not 0 <= layer < cfg.n_layers:
        shown = spec.model_dump() if hasattr(spec, "model_dump") else spec
        raise InputError(
            f"Target {shown!r}: layer {layer!r} does not exist; this model has layers 0..{cfg.n_layers - 1}."
        )
    return layer


def ablation_of(targets: list[Target], spec: Intervention) -> Ablation:
    """The core ``Ablation`` of an intervention whose targets are parsed (and their references resolved): equal
    targets (a direction's vector counts) removed once, directions sharing a layer made orthonormal."""
    unique: dict[tuple[Any, ...], Target] = {}
    for target in targets:
        unique.setdefault(target.key(), target)
    return Ablation(
        orthonormal_directions(list(unique.values())),
        spec.method,
        spec.positions,
        spec.seed,
        tuple(spec.reference_prompts or ()),
    )


def orthonormal_directions(targets: list[Target]) -> list[Target]:
    """Directions that share a layer, made orthonormal (Gram–Schmidt, in the order given): projecting out
    non-orthogonal directions one after the other would not remove their span. The first keeps its vector."""
    basis: dict[int, list[torch.Tensor]] = {}
    out: list[Target] = []
    for target in targets:
        if not isinstance(target, DirectionTarget):
            out.append(target)
            continue
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
        out.append(DirectionTarget(target.layer, unit.to(torch.float32)))
    return out


def logits_at_answers(model: Any, batch: Batch, ablation: Ablation | PreparedAblation | None = None) -> torch.Tensor:
    """One forward pass (under ``ablation`` if given); ``[batch, vocab]`` logits at the answer positions."""
    if isinstance(ablation, Ablation):
        ablation = prepare_ablation(model, batch, ablation)
    logits = model.backend.logits(batch.input_ids, ablation.edits if ablation is not None else [])
    return at_answer_positions(logits, batch.answer_positions)
