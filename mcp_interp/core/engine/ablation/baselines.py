"""Random baselines an ablation is judged against: random stand-ins that remove the same energy as the real thing.

A residual direction's (or a set of SAE features') effect means something only next to the effect of stand-ins that
are *not* special but otherwise comparable. ``random_baseline`` re-runs the ablation with every direction replaced by
a random direction at its layer, and every SAE feature by a random feature of its dictionary, each matched on the
energy it removes at the ablated positions, and ranks the real effect among theirs: drawn sequentially (Besag &
Clifford: stop once 10 draws are at least as extreme, else at n_max, so a strong effect reaches p ≈ 0.005 instead of
the fixed 20 draws' floor 1/21), two-sided about the null's centre (``stats.sequential_two_sided_test``: an effect on
the far side of the draws' shared shift counts).

What "energy" is: what the method takes away, Δ (``removed_part``: the value itself for zero, minus its mean for mean,
minus the resampled prompt's for resample); for a direction u the mean over the ablated positions of (Δx·u)², for
features the mean of ‖Σ_f Δa_f W_dec[f]‖². Every ablated position is matched, token 0 included: what is ablated is
matched (token 0's share of the energy is reported in a note, since in most models it is an attention sink). The
draws run stacked, several copies of the batch in one forward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from mcp_interp.core.engine.ablation.targets import (
    Ablation,
    BlockOutputTarget,
    DirectionTarget,
    FeaturesTarget,
    HeadTarget,
    NeuronsTarget,
    PreparedAblation,
    Target,
    mean_replacement,
    prepare_ablation,
    resample_sources,
    stacked_edits,
)
from mcp_interp.core.engine.backend.forward import Capture
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.numbers import metrics, stats
from mcp_interp.core.engine.text.answers import Answer, read_log_probs, resolve_answer_specs
from mcp_interp.core.engine.text.components import position_mask
from mcp_interp.core.engine.text.tokens import Batch, encode
from mcp_interp.schemas.ablation import RandomBaseline

TOKENS_PER_FORWARD = 4096  # stacked copies of the batch per forward, in tokens: bounded memory
FEATURE_ENERGY_RATIO = 1.25  # a random feature matches when its energy is within this factor of the real one's


def random_unit_vectors(n: int, d_model: int, seed: int) -> torch.Tensor:
    """``n`` directions uniform on the unit sphere of R^d_model (normalised Gaussians), from a seeded CPU
    generator so the same seed draws the same directions on every machine."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    draws = torch.randn(n, d_model, generator=generator, dtype=torch.float64)
    return (draws / draws.norm(dim=1, keepdim=True)).to(torch.float32)


def energy_matched_directions(rows: torch.Tensor, target: float, gaussians: torch.Tensor) -> torch.Tensor:
    """Random unit directions that remove the same energy as the real one: u ∝ Σ_i g_i λ_i^(γ/2) v_i, with
    (λ_i, v_i) the eigenpairs of the residual's second moment S = E[x xᵀ] over ``rows`` (the matched positions) and
    g a Gaussian draw. γ = 0 is a uniform direction; γ > 0 leans toward the stream's energetic directions, γ < 0
    away from them. uᵀSu = Σ λ^(1+γ) g² / Σ λ^γ g² rises monotonically with γ (its derivative is a variance),
    so for each draw γ ∈ [−4, 4] is found by bisection to give uᵀSu = ``target`` (clamped at the ends).
    ``rows`` [tokens, d_model] float64, ``gaussians`` [n, d_model] → [n, d_model] unit vectors."""
    second = rows.T @ rows / rows.shape[0]
    eigenvalues, eigenvectors = torch.linalg.eigh(second)
    eigenvalues = eigenvalues.clamp_min(float(eigenvalues.max()) * 1e-12)
    out = []
    for g in gaussians:
        weight = g**2

        def energy(gamma: float, weight: torch.Tensor = weight) -> float:
            scaled = weight * eigenvalues**gamma
            return float((scaled * eigenvalues).sum() / scaled.sum())

        low, high = -4.0, 4.0
        if target <= energy(low):
            gamma = low
        elif target >= energy(high):
            gamma = high
        else:
            for _ in range(60):
                gamma = (low + high) / 2
                low, high = (gamma, high) if energy(gamma) < target else (low, gamma)
            gamma = (low + high) / 2
        vector = eigenvectors @ (g * eigenvalues ** (gamma / 2))
        out.append(vector / vector.norm())
    return torch.stack(out)


def removed_part(
    ablation: Ablation, attention_mask: torch.Tensor, reference_mask: torch.Tensor | None, permutation: list[int] | None
) -> Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]:
    """What the ablation's method takes away from any per-position quantity ``values`` [batch, seq, ...] (the residual
    vectors, or a dictionary's activations): ``values`` itself for zero, ``values`` − its mean at that kind of position
    for mean (over the reference prompts' ``reference`` when given), ``values`` − the resampled prompt's for resample
    (a reference prompt's when given).
    Linear in ``values``: the part a direction u loses is (Δx)·u, so the energy a mean or resample ablation removes is
    a quadratic form on Δx like zero-ablation's on x, and draws can be matched on it exactly."""

    def removed(values: torch.Tensor, reference: torch.Tensor | None) -> torch.Tensor:
        if ablation.method == "zero":
            return values
        if ablation.method == "mean":
            mask = None if reference is None else reference_mask
            replacement, _ = mean_replacement(values, attention_mask, reference, mask)
            return values - replacement
        assert permutation is not None
        return values - (values if reference is None else reference)[torch.tensor(permutation)]

    return removed


@dataclass(frozen=True)
class Effect:
    """What an ablation does to the prompts, as the baseline ranks it: the mean change of ``statistic``."""

    statistic: str
    tracked: list[Answer]
    bad: list[Answer] | None
    sequences: bool

    def value(self, model: LoadedModel, batch: Batch, logits: torch.Tensor, prepared: PreparedAblation | None) -> float:
        """The statistic's mean over prompts (logit difference or log-prob of the tracked answer)."""
        if all(a.kind == "token" for a in self.tracked + (self.bad or [])):
            first = [a.first_token for a in self.tracked]
            if self.bad is not None:
                return metrics.logit_difference(logits, first, [a.first_token for a in self.bad]).value
            return metrics.answer_logprob(logits, first).value
        lists = [self.tracked] if self.bad is None else [self.tracked, self.bad]
        log_probs = read_log_probs(model.backend, batch, logits, lists, prepared)  # a set of single tokens: no forward
        return float((log_probs[0] - log_probs[1] if self.bad is not None else log_probs[0]).mean())


def effect_of(model: LoadedModel, batch: Batch, clean: torch.Tensor, correct: Any, incorrect: Any) -> Effect:
    """The statistic: the logit difference when both answers are given, else the log-prob of the correct answer (or
    of each prompt's clean top-1), as ``ablation_outcome`` tracks them."""
    n = len(batch.texts)
    good = resolve_answer_specs(model.tokenizer, correct, n, "correct") if correct is not None else None
    bad = resolve_answer_specs(model.tokenizer, incorrect, n, "incorrect") if incorrect is not None else None
    if good is None:
        good = [Answer(model.tokenizer.decode([int(i)]), ((int(i),),), "token") for i in clean.argmax(dim=-1)]
    with_bad = bad if correct is not None and bad is not None else None
    # Teacher-forced rows only when some alternative is several tokens: a set of single tokens is read from the
    # stacked answer logits like a single token (``read_log_probs``).
    sequences = any(len(alt) > 1 for a in good + (with_bad or []) for alt in a.alternatives)
    return Effect("logit_diff" if with_bad is not None else "log_prob", good, with_bad, sequences)


@dataclass(frozen=True)
class UnablatedRun:
    """The unablated run both baselines rank against: the prompts, the ablated positions, the values at the points
    the ablations touch, and the statistic before ablating."""

    model: LoadedModel
    batch: Batch
    mask: torch.Tensor
    capture: Capture
    effect: Effect
    before: float

    def changes(self, ablations: Sequence[Ablation]) -> list[float]:
        """Each ablation's change of the statistic (after − before), the draws stacked in few forwards."""
        prepared = [prepare_ablation(self.model, self.batch, a, clean=self.capture.acts) for a in ablations]
        return [value - self.before for value in effect_values(self.model, self.batch, self.effect, prepared)]


def unablated_run(
    model: LoadedModel, prompts: Sequence[str], ablation: Ablation, names: Sequence[str], correct: Any, incorrect: Any
) -> UnablatedRun:
    batch = encode(model.tokenizer, prompts, model.device)
    mask = position_mask(ablation.positions, batch.attention_mask, batch.answer_positions)
    capture = model.backend.capture(batch.input_ids, sorted(names))
    clean = answer_logits(model, batch, capture)
    effect = effect_of(model, batch, clean, correct, incorrect)
    return UnablatedRun(model, batch, mask, capture, effect, effect.value(model, batch, clean, None))


def random_baseline(
    model: LoadedModel,
    prompts: Sequence[str],
    ablation: Ablation,
    correct: Any = None,
    incorrect: Any = None,
    draws: int = stats.MOST_DRAWS,
) -> RandomBaseline | None:
    """The ablation re-run with its directions and SAE features replaced by random ones removing the same energy (the
    other targets unchanged), drawn sequentially — batches of ``stats.BATCH`` until 10 draws are at least as far from
    the null's centre as the real effect, or ``draws`` (n_max) are made — and the real effect ranked two-sided about
    that centre (``stats.sequential_two_sided_test``); None when it has neither directions nor features."""
    special = [i for i, t in enumerate(ablation.targets) if isinstance(t, DirectionTarget | FeaturesTarget)]
    if not special:
        return component_baseline(model, prompts, ablation, correct, incorrect, draws)
    stats.check_most_draws(draws)
    names = sorted({t.hook() for t in ablation.targets})
    run = unablated_run(model, prompts, ablation, names, correct, incorrect)
    batch, mask, capture, effect = run.batch, run.mask, run.capture, run.effect
    reference, reference_mask = None, None
    if ablation.reference_prompts:
        ref_batch = encode(model.tokenizer, list(ablation.reference_prompts), model.device)
        reference, reference_mask = model.backend.capture(ref_batch.input_ids, names).acts, ref_batch.attention_mask
    permutation = (
        resample_sources(len(prompts), ablation.seed, len(ablation.reference_prompts))
        if ablation.method == "resample"
        else None
    )  # as prepared
    removed = removed_part(ablation, batch.attention_mask, reference_mask, permutation)
    parts = {i: removed_rows(ablation.targets[i], capture.acts, reference, removed, mask) for i in special}

    generator = torch.Generator(device="cpu").manual_seed(ablation.seed)
    variants: list[Ablation] = []

    def draw(k: int) -> list[float]:
        stand_ins: dict[int, list[Target]] = {}
        for i in special:
            target = ablation.targets[i]
            if isinstance(target, DirectionTarget):
                stand_ins[i] = random_directions(target, parts[i], k, generator)
            else:
                assert isinstance(target, FeaturesTarget)
                stand_ins[i] = random_features(target, parts[i], k, generator)
        targets = ablation.targets
        new = [
            replace(ablation, targets=[stand_ins[i][j] if i in stand_ins else t for i, t in enumerate(targets)])
            for j in range(k)
        ]
        variants.extend(new)
        return run.changes(new)

    test = stats.sequential_two_sided_test(run.changes([ablation])[0], draw, n_max=draws)

    def energy(variant: Ablation) -> float:
        return sum(removed_energy(variant.targets[i], parts[i]) for i in special)

    notes = [
        f"Drawn sequentially: {test.n} draws (stop at 10 at least as far from the null's centre {test.centre:.3g} as "
        f"the real change, or {draws}); two-sided, so an effect on either side of where the random ones sit counts."
    ]
    if ablation.method != "zero":
        notes.append(
            f"Energy is what {ablation.method}-ablation removes (the part minus its replacement), for the real targets "
            "and the random ones alike; the random ones are matched on it."
        )
    first = mask.clone()
    first[:, 1:] = False
    if bool(first.any()) and bool(mask[:, 1:].any()):
        share = sum(removed_energy_at(ablation.targets[i], parts[i], first[mask]) for i in special) / max(
            energy(ablation) * int(mask.sum()), 1e-30
        )
        notes.append(
            f"Token 0 is ablated and matched like every other ablated position; it carries {share:.0%} of the real "
            f"targets' removed energy (an attention sink in most models: pass positions='last' to leave it out)."
        )
    return RandomBaseline(
        replaced=kind_of(ablation, special),
        statistic=f"{effect.statistic} change",
        real=test.real,
        draws=list(test.draws),
        p_value=test.p_value,
        p_floor=test.p_floor,
        pool_size=None,
        verdict=stats.versus_random("direction_ablation", test, f"energy-matched random {kind_of(ablation, special)}"),
        seed=ablation.seed,
        energy=energy(ablation),
        draw_energy=[energy(v) for v in variants[: test.n]],
        matched_positions=int(mask.sum()),
        centre=test.centre,
        notes=notes,
    )


COMPONENT_TARGETS = (HeadTarget, NeuronsTarget, BlockOutputTarget)


def component_baseline(
    model: LoadedModel,
    prompts: Sequence[str],
    ablation: Ablation,
    correct: Any = None,
    incorrect: Any = None,
    draws: int = stats.MOST_DRAWS,
) -> RandomBaseline | None:
    """Heads, neurons, MLPs and attention layers ranked among random sets of the same kind and count, ablated the same
    way, never the real set (``ComponentPool``): heads from a band of layers around the real ones, neurons of their
    layer, MLPs (attention layers) of other layers. Under H0 "the real set is one more random one" the test is exact;
    its floor is 1/(min(draws, pool_size) + 1), and a pool too small to reach α says so. Drawn sequentially and ranked
    two-sided, as ``random_baseline``. None when the ablation has none of these, or other targets (transcoder
    features)."""
    if not ablation.targets or not all(isinstance(t, COMPONENT_TARGETS) for t in ablation.targets):
        return None
    stats.check_most_draws(draws)
    pool = ComponentPool.of(model, ablation.targets, draws, ablation.seed)
    if pool.sets.size < 1:
        return None  # nothing to draw: no p at all (``no_random_sets`` says so), rather than a p of 1 against nothing
    names = {t.hook() for t in ablation.targets} | {t.hook() for t in pool.stand_ins()}
    run = unablated_run(model, prompts, ablation, sorted(names), correct, incorrect)
    cap = min(draws, pool.sets.size)
    floor = stats.rank_floor(draws, pool.sets.size)
    effect, mask = run.effect, run.mask
    kinds = component_kinds(ablation.targets)
    real = run.changes([ablation])[0]

    def draw(k: int) -> list[float]:
        return run.changes([replace(ablation, targets=targets) for targets in pool.draw(k)])

    h, batch = min(stats.STOP_AFTER, cap), min(stats.BATCH, cap)
    test = stats.sequential_two_sided_test(real, draw, h=h, n_max=cap, batch=batch)
    what = f"random {kinds} of the same kind and count"
    return RandomBaseline(
        replaced=kinds,
        statistic=f"{effect.statistic} change",
        real=test.real,
        draws=list(test.draws),
        p_value=test.p_value,
        p_floor=floor,
        pool_size=pool.sets.size,
        verdict=stats.versus_random("component_ablation", test, what, floor),
        seed=ablation.seed,
        energy=None,
        draw_energy=None,
        matched_positions=int(mask.sum()),
        centre=test.centre,
        notes=[
            f"Random {kinds}: {pool.describe()}; never the real set, each set drawn once ({pool.sets.size} distinct "
            f"other sets{', all listed' if pool.sets.listed is not None else ''}). Drawn sequentially: {test.n} "
            f"draws, two-sided about the null's centre {test.centre if test.centre is not None else real:.3g}."
        ],
    )


def no_random_sets(model: LoadedModel, ablation: Ablation, draws: int = stats.MOST_DRAWS) -> str | None:
    """The note for a component ablation whose pool holds no other set to draw (one head in the whole model, one MLP,
    every neuron of a layer): no baseline, so no p and no verdict. None when there is a set to draw, or the ablation
    is not of components."""
    if not ablation.targets or not all(isinstance(t, COMPONENT_TARGETS) for t in ablation.targets):
        return None
    if ComponentPool.of(model, ablation.targets, draws, ablation.seed).sets.size >= 1:
        return None
    kinds = component_kinds(ablation.targets)
    return (
        f"No random baseline: this model holds no other set of {kinds} of the same kind and count to draw, so the "
        "effect cannot be ranked against chance. There is no p-value and no verdict (it cannot resolve at any α); "
        "judge the effect by its size alone, or ablate on a model with more components."
    )


HEAD_BAND_WHY = (
    "a band of layers, not the whole model: heads at other depths differ in how much they can move the output at all, "
    "so the band is the nearest layers that hold enough other sets to reach the floor of the draws"
)


@dataclass
class ComponentPool:
    """The random sets a component ablation is ranked among, as ``stats.DistinctSets`` over one slot per kind: every
    head of the set drawn from the heads of the band of layers ``band`` (grown one layer each side of the real heads'
    layers until it holds at least ``draws`` other sets, or is the whole model: see ``HEAD_BAND_WHY``), each neuron
    set from its layer's neurons, the MLPs (attention layers) from every layer's."""

    slots: list[tuple[str, Any, stats.Slot]]  # (kind, what an item means, the slot)
    sets: stats.DistinctSets
    band: tuple[int, int] | None

    @staticmethod
    def of(model: LoadedModel, targets: Sequence[Target], draws: int, seed: int) -> ComponentPool:
        n_heads, n_layers = int(model.cfg.n_heads), int(model.cfg.n_layers)
        slots: list[tuple[str, Any, stats.Slot]] = []
        band = None
        heads = [t for t in targets if isinstance(t, HeadTarget)]
        if heads:
            low, high = min(t.layer for t in heads), max(t.layer for t in heads)
            while True:
                count = (high - low + 1) * n_heads
                if math.comb(count, len(heads)) - 1 >= draws or (low == 0 and high == n_layers - 1):
                    break
                low, high = max(0, low - 1), min(n_layers - 1, high + 1)
            band = (low, high)
            items = [HeadTarget(layer, head) for layer in range(low, high + 1) for head in range(n_heads)]
            index = {(t.layer, t.head): i for i, t in enumerate(items)}
            real = tuple(index[(t.layer, t.head)] for t in heads)
            slots.append(("heads", items, stats.Slot(tuple(range(len(items))), real)))
        for target in targets:
            if isinstance(target, NeuronsTarget):
                pool = tuple(range(int(model.cfg.d_mlp)))
                slots.append(("neurons", target.layer, stats.Slot(pool, tuple(target.neurons))))
        for part in ("MLP", "ATTN"):
            blocks = [t for t in targets if isinstance(t, BlockOutputTarget) and t.part == part]
            if blocks:
                slots.append((part, part, stats.Slot(tuple(range(n_layers)), tuple(t.layer for t in blocks))))
        return ComponentPool(slots, stats.DistinctSets([slot for _, _, slot in slots], seed), band)

    def targets_of(self, chosen: tuple[tuple[int, ...], ...]) -> list[Target]:
        out: list[Target] = []
        for (kind, meaning, _), items in zip(self.slots, chosen, strict=True):
            if kind == "heads":
                out.extend(meaning[i] for i in items)
            elif kind == "neurons":
                out.append(NeuronsTarget(meaning, items))
            else:
                out.extend(BlockOutputTarget(layer, meaning) for layer in items)
        return out

    def draw(self, k: int) -> list[list[Target]]:
        return [self.targets_of(chosen) for chosen in self.sets.take(k)]

    def stand_ins(self) -> list[Target]:
        """Every component a random set may hold whose values must be read (heads and blocks; neurons share their
        layer's hook with the real ones)."""
        out: list[Target] = []
        for kind, meaning, slot in self.slots:
            if kind == "heads":
                out.extend(meaning)
            elif kind != "neurons":
                out.extend(BlockOutputTarget(layer, meaning) for layer in slot.pool)
        return out

    def describe(self) -> str:
        parts = []
        for kind, meaning, slot in self.slots:
            if kind == "heads":
                assert self.band is not None
                low, high = self.band
                parts.append(f"{slot.k} of the {len(slot.pool)} heads of layers {low}–{high} ({HEAD_BAND_WHY})")
            elif kind == "neurons":
                parts.append(f"{slot.k} of layer {meaning}'s {len(slot.pool)} neurons")
            else:
                parts.append(f"{slot.k} of the {len(slot.pool)} layers' {kind}s")
        return "; ".join(parts)


def component_kinds(targets: Sequence[Target]) -> str:
    words = {
        "heads" if isinstance(t, HeadTarget) else "neurons" if isinstance(t, NeuronsTarget) else
        ("MLPs" if isinstance(t, BlockOutputTarget) and t.part == "MLP" else "attention layers")
        for t in targets
    }  # fmt: skip
    return " and ".join(sorted(words))


def removed_rows(
    target: Target,
    acts: Any,
    reference: Any,
    removed: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
    mask: torch.Tensor,
) -> torch.Tensor:
    """At the ablated positions, what the method removes: the residual vectors Δx [tokens, d_model] for a direction,
    every feature's activation change Δa [tokens, features] for a dictionary (its activations are not linear in x)."""
    values = acts[target.hook()]
    ref_values = None if reference is None else reference[target.hook()]
    if isinstance(target, DirectionTarget):
        return removed(values.to(torch.float64), None if ref_values is None else ref_values.to(torch.float64))[mask]
    assert isinstance(target, FeaturesTarget)
    sae = target.sae
    with torch.inference_mode():
        activations = sae.encode(sae.to_input(values)).to(torch.float64)
        ref_activations = None if ref_values is None else sae.encode(sae.to_input(ref_values)).to(torch.float64)
    return removed(activations, ref_activations)[mask]


def kind_of(ablation: Ablation, special: Sequence[int]) -> str:
    kinds = {"directions" if isinstance(ablation.targets[i], DirectionTarget) else "features" for i in special}
    return " and ".join(sorted(kinds))


def answer_logits(model: LoadedModel, batch: Batch, run: Capture) -> torch.Tensor:
    """[rows, vocab] logits at each row's answer position (rows may be stacked copies of the batch), float64."""
    copies = run.final.shape[0] // batch.input_ids.shape[0]
    return model.backend.logits_at(run, batch.answer_positions.repeat(copies)).to(torch.float64)


def effect_values(
    model: LoadedModel, batch: Batch, effect: Effect, prepared: Sequence[PreparedAblation]
) -> list[float]:
    """The statistic under each prepared ablation, the single-token case run as stacked copies of the batch."""
    if effect.sequences:  # teacher-forced rows differ per answer: one run per variant
        return [effect.value(model, batch, torch.empty(0), p) for p in prepared]
    rows = batch.input_ids.shape[0]
    per_forward = max(1, TOKENS_PER_FORWARD // batch.input_ids.numel())
    values: list[float] = []
    for start in range(0, len(prepared), per_forward):
        chunk = prepared[start : start + per_forward]
        edits = stacked_edits([p.edits for p in chunk], rows)
        logits = answer_logits(model, batch, model.backend.capture(batch.input_ids.repeat(len(chunk), 1), edits=edits))
        values.extend(effect.value(model, batch, logits[j * rows : (j + 1) * rows], None) for j in range(len(chunk)))
    return values


def random_directions(
    target: DirectionTarget, rows: torch.Tensor, draws: int, generator: torch.Generator
) -> list[Target]:
    """``draws`` random directions at the target's layer removing its energy at ``rows`` [tokens, d_model]."""
    rows = rows.detach().to("cpu", torch.float64)
    gaussians = torch.randn(draws, rows.shape[1], generator=generator, dtype=torch.float64)
    target_energy = float(((rows @ target.direction.to(torch.float64).cpu()) ** 2).mean())
    units = energy_matched_directions(rows, target_energy, gaussians)
    return [DirectionTarget(target.layer, unit.to(torch.float32)) for unit in units]


def random_features(
    target: FeaturesTarget, activations: torch.Tensor, draws: int, generator: torch.Generator
) -> list[Target]:
    """``draws`` random feature sets of the target's dictionary, each real feature replaced by one whose energy
    Δa²‖W_dec‖² at the ablated positions (``activations`` [tokens, features]: what the method removes of every
    feature's activation, ``removed_rows``) is within a factor ``FEATURE_ENERGY_RATIO`` of it — or, when fewer than
    ``draws`` features are that close, one of the ``draws`` nearest in log energy. Never one of the real features;
    distinct within a set."""
    sae = target.sae
    with torch.inference_mode():
        norms = sae.W_dec.detach().to(torch.float64).norm(dim=1)
    energies = (activations.to(torch.float64) ** 2).mean(dim=0).cpu() * norms.cpu() ** 2
    log_energy = torch.log(energies.clamp_min(1e-30))
    excluded = torch.zeros_like(energies, dtype=torch.bool)
    excluded[list(target.features)] = True
    pools = []
    for feature in target.features:
        distance = (log_energy - log_energy[feature]).abs().masked_fill(excluded, float("inf"))
        close = torch.nonzero(distance <= torch.log(torch.tensor(FEATURE_ENERGY_RATIO, dtype=torch.float64)))
        pool = close.flatten() if close.numel() >= draws else torch.argsort(distance)[:draws]
        pools.append(pool)
    sets = []
    for _ in range(draws):
        chosen: list[int] = []
        for pool in pools:
            free = [int(f) for f in pool if int(f) not in chosen]
            chosen.append(free[int(torch.randint(len(free), (1,), generator=generator))])
        sets.append(FeaturesTarget(sae=sae, features=tuple(sorted(chosen)), source=target.source))
    return list(sets)


def removed_energy(target: Target, rows: torch.Tensor) -> float:
    """The mean squared norm of what ablating ``target`` removes, from ``removed_rows`` [tokens, ...]: (Δx·u)² for a
    direction, ‖Σ_f Δa_f W_dec[f]‖² for features."""
    return removed_energy_at(target, rows, torch.ones(rows.shape[0], dtype=torch.bool)) / max(rows.shape[0], 1)


def removed_energy_at(target: Target, rows: torch.Tensor, where: torch.Tensor) -> float:
    """The *sum* over the rows ``where`` selects of the squared norm ``removed_energy`` averages."""
    rows = rows[where.to(rows.device)]
    with torch.inference_mode():
        if isinstance(target, DirectionTarget):
            return float(((rows.to(torch.float64) @ target.direction.to(rows.device, torch.float64)) ** 2).sum())
        assert isinstance(target, FeaturesTarget)
        decoder = target.sae.W_dec[list(target.features)].to(rows.device, torch.float64)
        decoded = rows[:, list(target.features)].to(torch.float64) @ decoder
        return float((decoded**2).sum())
