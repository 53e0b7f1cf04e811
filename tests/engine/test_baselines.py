"""Random baselines of `ablate` (directions, SAE features) and `steer`, rebuilt by hand on `tiny`: directions matched
on energy at the ablated positions with an independent root-finder, features matched on decoded energy, every
random effect recomputed with a hand hook one draw at a time, and the p-value from the rank formula."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy.optimize import brentq

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.localize.ablate import ablate
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import Intervention
from tests.features.test_sae import random_weights, write_sae

PROMPTS = [
    "when mary and john went to the store , john gave a drink to",
    "when tom and mary went to the park , tom gave a ball to",
]
HOOK = "blocks.1.hook_resid_post"


def logit_diff(model: LoadedModel, hooks: list[Any]) -> float:
    ids = encode(model.tokenizer, PROMPTS).input_ids
    good, bad = (model.tokenizer.convert_tokens_to_ids(w) for w in ("mary", "john"))
    with torch.no_grad(), model.bridge.hooks(fwd_hooks=hooks):
        logits = model.bridge(ids)[:, -1].double()
    return float((logits[:, good] - logits[:, bad]).mean())


def hand_sequential(real: float, draws: list[float], h: int = 10, n_max: int = 200) -> tuple[int, float]:
    """Besag–Clifford two-sided about c = median(real, first 20 draws), written out: walk the draws, count those with
    |d − c| ≥ |real − c| (within 1e-6: a tie); stop at the h-th (p = h/n) or at n_max (p = (1 + count)/(n_max + 1)).
    Returns (n, p)."""
    first = draws[: min(20, n_max)]  # the first batch: 20 draws, or all of them when fewer may be drawn
    centre = float(np.median([real, *first]))
    count, tie = 0, 1e-6 * max(1.0, abs(real), abs(centre))  # float noise between batched forwards is a tie
    for n, d in enumerate(draws[:n_max], start=1):
        count += abs(d - centre) >= abs(real - centre) - tie
        if count == h:
            return n, h / n
    assert len(draws) >= n_max, f"the {len(draws)} draws given end before the test could stop"
    return n_max, (1 + count) / (n_max + 1)


@pytest.mark.parametrize("positions", ["last", "all"])
def test_direction_baseline_is_matched_at_the_ablated_positions(tiny: LoadedModel, positions: str) -> None:
    vector = torch.randn(64, generator=torch.Generator().manual_seed(5))
    unit = vector / vector.norm()
    spec = Intervention(ablate=[{"layer": 1, "direction": vector.tolist()}], positions=positions)  # type: ignore[list-item]
    result = ablate(tiny, PROMPTS, spec, "mary", "john")
    baseline = result.random_baseline
    assert baseline is not None and baseline.replaced == "directions"
    n = len(baseline.draws)

    ids = encode(tiny.tokenizer, PROMPTS).input_ids
    _, cache = tiny.bridge.run_with_cache(ids)
    resid = cache[HOOK].double()  # equal-length prompts: every position is real
    seq = resid.shape[1]
    where = torch.zeros(2, seq, dtype=torch.bool)
    if positions == "last":
        where[:, -1] = True
    else:
        where[:, :] = True  # every ablated position is matched, token 0 too
    rows = resid[where]
    target = float(((rows @ unit.double()) ** 2).mean())
    assert baseline.energy == pytest.approx(target, rel=1e-5)
    assert baseline.matched_positions == int(where.sum())
    assert baseline.draw_energy == pytest.approx([target] * n, rel=1e-3)
    token_0 = float(((resid[:, 0] @ unit.double()) ** 2).sum()) / float(((rows @ unit.double()) ** 2).sum())
    shares = [note for note in baseline.notes if "Token 0" in note]
    assert (f"{token_0:.0%} of the real" in shares[0]) if positions == "all" else not shares

    # Independent reconstruction: scipy's brentq on γ of u ∝ Σ g_i λ_i^(γ/2) v_i (eigenpairs of the matched rows'
    # second moment), the Gaussians from the ablation's seed; each draw's effect by a hand projection hook.
    lam, vecs = torch.linalg.eigh(rows.T @ rows / rows.shape[0])
    lam = lam.clamp_min(float(lam.max()) * 1e-12)
    generator = torch.Generator().manual_seed(0)  # the ablation's seed; 20 Gaussians drawn per batch of draws
    gaussians = torch.cat([torch.randn(20, 64, generator=generator, dtype=torch.float64) for _ in range(-(-n // 20))])
    # (the centre uses the whole first batch of 20, even when the test stops inside it)
    before = logit_diff(tiny, [])
    mask = torch.ones(2, seq, 1, dtype=torch.bool) if positions == "all" else where.unsqueeze(-1)  # what is ablated

    def project(u: torch.Tensor) -> Any:
        def hook(x: torch.Tensor, hook: Any) -> torch.Tensor:
            return torch.where(mask, x - (x @ u).unsqueeze(-1) * u, x)

        return hook

    real = logit_diff(tiny, [(HOOK, project(unit))]) - before
    assert baseline.real == pytest.approx(real, abs=1e-5)
    assert result.after.logit_diff is not None and result.before.logit_diff is not None
    assert baseline.real == pytest.approx(result.after.logit_diff.value - result.before.logit_diff.value, abs=1e-5)
    expected = []
    for g in gaussians[: max(n, 20)]:
        gamma = brentq(lambda t, g=g: float((g**2 * lam ** (1 + t)).sum() / (g**2 * lam**t).sum()) - target, -4, 4)
        u = vecs @ (g * lam ** (gamma / 2))
        expected.append(logit_diff(tiny, [(HOOK, project((u / u.norm()).float()))]) - before)
    assert baseline.draws == pytest.approx(expected[:n], abs=1e-3)
    stop, p = hand_sequential(real, expected)
    assert stop == n and baseline.p_value == pytest.approx(p)
    assert ("beats" in baseline.verdict) == (baseline.p_value <= 0.05)
    assert any(baseline.verdict in note for note in result.notes)


def test_direction_baseline_seed_and_draws(tiny: LoadedModel) -> None:
    vector = torch.randn(64, generator=torch.Generator().manual_seed(5)).tolist()
    spec = Intervention(ablate=[{"layer": 1, "direction": vector}], positions="last")  # type: ignore[list-item]
    first = ablate(tiny, PROMPTS, spec, "mary", "john", random_draws=19).random_baseline
    again = ablate(tiny, PROMPTS, spec, "mary", "john", random_draws=19).random_baseline
    other = ablate(tiny, PROMPTS, spec.model_copy(update={"seed": 1}), "mary", "john", random_draws=19)
    assert first is not None and again is not None and other.random_baseline is not None
    assert len(first.draws) <= 19 and first.draws == again.draws != other.random_baseline.draws
    with pytest.raises(InputError, match="19 to 1000"):
        ablate(tiny, PROMPTS, spec, "mary", "john", random_draws=5)


def test_zero_ablating_a_direction_the_prompts_sit_far_along_says_so(tiny: LoadedModel) -> None:
    """The prompts' mean projection on the ablated direction, at the ablated positions, by hand; zero-ablation of a
    direction whose mean is far from 0 gets a note, the mean method's wording is not 'projecting out'."""
    ids = encode(tiny.tokenizer, PROMPTS).input_ids
    _, cache = tiny.bridge.run_with_cache(ids)
    last = cache[HOOK][:, -1].double()
    direction = last.mean(dim=0)  # the prompts' own mean: they sit far along it
    unit = direction / direction.norm()
    spec = Intervention(ablate=[{"layer": 1, "direction": direction.tolist()}], positions="last")  # type: ignore[list-item]
    zeroed = ablate(tiny, PROMPTS, spec, "mary", "john")
    projection = last @ unit
    assert zeroed.projections[0].mean == pytest.approx(float(projection.mean()), rel=1e-5)
    assert zeroed.projections[0].sd == pytest.approx(float(projection.std()), rel=1e-4)
    assert any("zero-ablation sets it to 0" in note for note in zeroed.notes)
    meaned = ablate(tiny, PROMPTS, spec.model_copy(update={"method": "mean"}), "mary", "john")
    assert not any("zero-ablation sets it to 0" in note for note in meaned.notes)
    assert not any("Projecting out" in note for note in meaned.notes)
    assert any(note.startswith("Replacing the projection") for note in meaned.notes)


def test_sae_feature_baseline_draws_energy_matched_features(tiny: LoadedModel, tmp_path: Path) -> None:
    weights = random_weights(64, seed=4)
    folder = write_sae(tmp_path / "sae", weights, hook=HOOK)
    features = [3]
    spec = Intervention(ablate=[{"sae": folder, "features": features}], positions="last")  # type: ignore[list-item]
    result = ablate(tiny, PROMPTS, spec, "mary", "john")
    baseline = result.random_baseline
    assert baseline is not None and baseline.replaced == "features"

    ids = encode(tiny.tokenizer, PROMPTS).input_ids
    _, cache = tiny.bridge.run_with_cache(ids)
    x = cache[HOOK][:, -1].double()  # the ablated (last) positions
    w = {k: v.double() for k, v in weights.items()}
    acts = torch.relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"])  # [2, 64]

    def decoded_energy(chosen: list[int]) -> float:
        return float(((acts[:, chosen] @ w["W_dec"][chosen]) ** 2).sum(dim=-1).mean())

    assert baseline.energy == pytest.approx(decoded_energy(features), rel=1e-5)
    per_feature = (acts**2).mean(dim=0) * w["W_dec"].norm(dim=1) ** 2
    before = logit_diff(tiny, [])

    def remove(chosen: list[int]) -> Any:
        def hook(v: torch.Tensor, hook: Any) -> torch.Tensor:
            a = torch.relu((v.double() - w["b_dec"]) @ w["W_enc"] + w["b_enc"])[..., chosen]
            new = v.double().clone()
            new[:, -1] -= (a @ w["W_dec"][chosen])[:, -1]
            return new.float()

        return hook

    real = logit_diff(tiny, [(HOOK, remove(features))]) - before
    assert baseline.real == pytest.approx(real, abs=1e-5)
    # Each draw's effect must be that of a non-real feature whose energy is close to the real one's (within the
    # matching ratio, or among the 20 nearest): the candidates' effects recomputed by hand.
    log_e = torch.log(per_feature.clamp_min(1e-30))
    distance = (log_e - log_e[features[0]]).abs()
    distance[features] = float("inf")
    close = torch.nonzero(distance <= torch.log(torch.tensor(1.25, dtype=torch.float64))).flatten()
    candidates = close.tolist() if len(close) >= 20 else torch.argsort(distance)[:20].tolist()
    assert features[0] not in candidates
    effects = [logit_diff(tiny, [(HOOK, remove([c]))]) - before for c in candidates]
    for draw in baseline.draws:
        assert min(abs(draw - e) for e in effects) < 1e-4
    assert len({round(d, 6) for d in baseline.draws}) > 1  # several different features were drawn
    stop, p = hand_sequential(real, baseline.draws)
    assert stop == len(baseline.draws) and baseline.p_value == pytest.approx(p)


def test_steer_ranks_its_kl_among_reference_differences_of_its_norm(tiny: LoadedModel) -> None:
    """Rebuilt without the package's own pieces: the ActAdd vector from the bridge's caches, the steered and stand-in
    runs through hand hooks, every KL by scipy (``scipy.stats.entropy``), the stand-ins from their documented draw
    written out here (``hand_reference_units``), and the p-value from the rank formula on those numbers — none of them
    read from the result."""
    from scipy.stats import entropy

    from mcp_interp.core.lens.steer import steer

    prompt = "when mary and john went to the store"
    result = steer(tiny, prompt, " happy", " sad", 1, 4.0, 3, seed=2)
    ids = torch.tensor([tiny.tokenizer(prompt)["input_ids"]])
    with torch.no_grad():
        pos = tiny.bridge.run_with_cache(torch.tensor([tiny.tokenizer(" happy")["input_ids"]]))[1]
        neg = tiny.bridge.run_with_cache(torch.tensor([tiny.tokenizer(" sad")["input_ids"]]))[1]
    added = 4.0 * (pos["blocks.1.hook_in"][0, -1] - neg["blocks.1.hook_in"][0, -1])

    def next_token(vector: torch.Tensor | None) -> Any:
        hooks = [] if vector is None else [("blocks.1.hook_in", lambda r, hook: r + vector)]
        with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=hooks):
            return torch.softmax(tiny.bridge(ids)[0, -1].double(), dim=-1).numpy()

    base = next_token(None)
    real = float(entropy(base, next_token(added)))
    n = len(result.random_next_token_kl)
    units = hand_reference_units(
        tiny, 2, (len(tiny.tokenizer(" happy")["input_ids"]), len(tiny.tokenizer(" sad")["input_ids"])), n
    )
    norm = float(added.norm())
    kls = [float(entropy(base, next_token(norm * unit))) for unit in units]
    assert result.next_token_kl == pytest.approx(real, rel=1e-4, abs=1e-7)
    assert result.random_next_token_kl == pytest.approx(kls[:n], rel=1e-4, abs=1e-7)
    stop, p = hand_sequential_greater(real, kls)
    assert stop == n and result.random_p_value == pytest.approx(p)


def hand_reference_units(
    model: LoadedModel, seed: int, lengths: tuple[int, int], n: int, hook: str = "blocks.1.hook_in"
) -> torch.Tensor:
    """The documented stand-ins of ``steer``, written out: the shipped WordNet example sentences (the search pool) in
    the order of ``torch.randperm`` seeded by ``seed``; draw j reads sentences order[2j] and order[2j + 1], each
    tokenized with the tokenizer's special tokens and cut to the positive's and the negative's token counts (running
    on into the next sentence, after a space, while short), a pair cut to the same tokens skipped; the residual at
    ``hook`` at the last token of each, one text per forward; their difference normalised in float64, cast to
    float32."""
    from mcp_interp.corpora import text_corpus

    texts = list(text_corpus("wordnet_examples").search)
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed)).tolist()

    def cut(index: int, count: int) -> list[int]:
        text, following = texts[index], index
        ids = model.tokenizer(text)["input_ids"]
        while len(ids) < count:
            following = (following + 1) % len(texts)
            text = f"{text} {texts[following]}"
            ids = model.tokenizer(text)["input_ids"]
        return list(ids[:count])

    def last(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model.bridge.run_with_cache(torch.tensor([ids]))[1][hook][0, -1].double()

    units, j = [], 0
    while len(units) < n:
        first, second = cut(order[(2 * j) % len(order)], lengths[0]), cut(order[(2 * j + 1) % len(order)], lengths[1])
        j += 1
        if first == second:  # two texts cut to the same tokens: a zero difference, skipped
            continue
        difference = last(first) - last(second)
        units.append((difference / difference.norm()).float())
    assert j > n, "no pair was skipped: the test would not see the skip"
    return torch.stack(units)


def hand_sequential_greater(real: float, draws: list[float], h: int = 10, n_max: int = 200) -> tuple[int, float]:
    """Besag–Clifford, "greater", written out: stop at the h-th draw ≥ real (p = h/n), else p = (1 + #)/(n_max + 1)."""
    count = 0
    for n, d in enumerate(draws[:n_max], start=1):
        count += d >= real
        if count == h:
            return n, h / n
    assert len(draws) >= n_max, f"the {len(draws)} draws given end before the test could stop"
    return n_max, (1 + count) / (n_max + 1)


def test_steer_scores_its_continuation_for_a_concept_against_reference_differences(tiny: LoadedModel) -> None:
    """The concept test rebuilt by hand: the steered, unsteered and stand-in continuations by greedy decoding through
    hand hooks (each stand-in, ``hand_reference_units``, of the same norm added at every position), each scored by the
    unsteered model's log P(next ∈ concept tokens) averaged over the continuation (torch log-softmax, by hand), and the
    sequential p 'greater' by hand; the raw-vector direction and the per-position residual norms checked too."""
    from mcp_interp.core.lens.concept import concept_from_words
    from mcp_interp.core.lens.steer import steer

    prompt, words, steps = "when mary and john went to the store", ["mary", "ball"], 3
    concept = concept_from_words(tiny, words)
    result = steer(tiny, prompt, " happy", " sad", 1, 4.0, steps, seed=2, random_draws=39, concept=concept)
    ids = tiny.tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        pos = tiny.bridge.run_with_cache(torch.tensor([tiny.tokenizer(" happy")["input_ids"]]))[1]
        neg = tiny.bridge.run_with_cache(torch.tensor([tiny.tokenizer(" sad")["input_ids"]]))[1]
        resid = tiny.bridge.run_with_cache(torch.tensor([ids]))[1]["blocks.1.hook_in"][0]
    added = 4.0 * (pos["blocks.1.hook_in"][0, -1] - neg["blocks.1.hook_in"][0, -1])
    targets = [tiny.tokenizer.convert_tokens_to_ids(w) for w in words]

    def logits(tokens: list[int], vector: torch.Tensor | None) -> torch.Tensor:
        hooks = [] if vector is None else [("blocks.1.hook_in", lambda r, hook: r + vector)]
        with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=hooks):
            return tiny.bridge(torch.tensor([tokens]))[0].double()

    def continue_(vector: torch.Tensor | None) -> list[int]:
        out: list[int] = []
        for _ in range(steps):
            out.append(int(logits(ids + out, vector)[-1].argmax()))
        return out

    def score(continuation: list[int]) -> float:
        lp = torch.log_softmax(logits(ids + continuation[:-1], None)[len(ids) - 1 :], dim=-1)[:, targets]
        return float(torch.logsumexp(lp, dim=-1).mean())

    assert result.residual_norms == pytest.approx(resid.double().norm(dim=1).tolist(), rel=1e-5)
    baseline = result.concept_baseline
    assert baseline is not None
    assert baseline.real == pytest.approx(score(continue_(added)), abs=1e-5)
    assert baseline.unsteered == pytest.approx(score(continue_(None)), abs=1e-5)
    n = len(baseline.draws)
    norm = float(added.norm())
    lengths = (len(tiny.tokenizer(" happy")["input_ids"]), len(tiny.tokenizer(" sad")["input_ids"]))
    randoms = [continue_(norm * unit) for unit in hand_reference_units(tiny, 2, lengths, n)]
    scores = [score(c) for c in randoms]
    assert baseline.draws == pytest.approx(scores, abs=1e-5)
    stop, p = hand_sequential_greater(baseline.real, scores, n_max=39)
    assert stop == n and baseline.p_value == pytest.approx(p)
    assert result.random_continuations == [tiny.tokenizer.decode(c) for c in randoms[:3]]
    # a raw vector at layer 1's resid_post is added as coefficient × vector
    raw = steer(tiny, prompt, None, None, 1, 2.0, steps, vector=added.tolist(), random_draws=19)
    assert raw.site == "resid_post" and raw.added_norm == pytest.approx(2.0 * norm, rel=1e-5)


def test_steer_without_a_layer_uses_the_default(tiny: LoadedModel) -> None:
    from mcp_interp.core.lens.steer import default_actadd_layer, steer

    result = steer(tiny, "when mary went", " happy", " sad", None, 2.0, 2)
    assert result.layer == default_actadd_layer(tiny.bridge.cfg.n_layers) == 1  # tiny has 4 layers: ⌊4/3⌋ = 1
    assert any("No `layer` given" in note for note in result.notes)
    assert default_actadd_layer(30) == 10 and default_actadd_layer(2) == 1


def test_mean_ablation_reports_and_matches_the_energy_it_removes(tiny: LoadedModel) -> None:
    """Mean-ablating a direction removes (x·u − mean_prompts(x·u))², not (x·u)²: the energy by hand at the last
    position of the two equal-length prompts (their per-position mean), below zero-ablation's, and the random
    directions matched on it."""
    vector = torch.randn(64, generator=torch.Generator().manual_seed(5))
    unit = (vector / vector.norm()).double()
    spec = Intervention(ablate=[{"layer": 1, "direction": vector.tolist()}], positions="last", method="mean")  # type: ignore[list-item]
    baseline = ablate(tiny, PROMPTS, spec, "mary", "john", random_draws=19).random_baseline
    _, cache = tiny.bridge.run_with_cache(encode(tiny.tokenizer, PROMPTS).input_ids)
    projection = cache[HOOK][:, -1].double() @ unit
    removed = float(((projection - projection.mean()) ** 2).mean())
    assert baseline is not None
    assert baseline.energy == pytest.approx(removed, rel=1e-5)
    assert baseline.energy < float((projection**2).mean())
    assert baseline.draw_energy == pytest.approx([removed] * len(baseline.draws), rel=1e-3)
    assert any("mean-ablation removes" in note for note in baseline.notes)


@pytest.mark.parametrize("targets", [["L1H2", "L2H0", "L2H3"], ["L2N5,9"], ["L1H2"]])
def test_components_are_ranked_among_random_ones_of_the_same_kind_and_count(
    tiny: LoadedModel, targets: list[str]
) -> None:
    """Heads and neurons, zero-ablated: the random sets written out from their documented draw (numpy's
    ``default_rng(seed)``; heads from the band of layers around the real ones grown until it holds ≥ 60 other sets —
    here the whole model —, ``choice(pool, k, replace=False)`` per set, sorted, a repeat or the real set drawn
    again), every set's effect by hand hooks, the sequential two-sided p by hand (``hand_sequential``) — none read
    from the result; no draw is the real set."""
    spec = Intervention(ablate=targets, positions="all")  # type: ignore[arg-type]
    result = ablate(tiny, PROMPTS, spec, "mary", "john", random_draws=60)
    baseline = result.random_baseline
    assert baseline is not None and baseline.energy is None
    n_heads, n_layers, d_mlp = tiny.cfg.n_heads, tiny.cfg.n_layers, tiny.cfg.d_mlp
    generator = np.random.default_rng(0)
    heads = [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    real_heads = tuple(sorted(heads.index((int(t[1]), int(t.split("H")[1]))) for t in targets if "H" in t))
    real_neurons = tuple(int(i) for t in targets if "N" in t for i in t.split("N")[1].split(","))
    seen = {(real_heads, real_neurons)}
    listed = None
    if not real_neurons and math.comb(len(heads), len(real_heads)) - 1 < 200:  # few: all of them, shuffled
        every = [c for c in itertools.combinations(range(len(heads)), len(real_heads)) if c != real_heads]
        listed = iter([every[i] for i in generator.permutation(len(every))])

    def random_set() -> list[tuple[str, int, Any]]:
        while listed is None:
            chosen_heads = tuple(sorted(int(i) for i in generator.choice(len(heads), len(real_heads), replace=False)))
            chosen_neurons = (
                tuple(sorted(int(i) for i in generator.choice(d_mlp, len(real_neurons), replace=False)))
                if real_neurons
                else ()
            )
            if real_heads == ():
                chosen_heads = ()
            if (chosen_heads, chosen_neurons) not in seen:
                seen.add((chosen_heads, chosen_neurons))
                break
        if listed is not None:
            chosen_heads, chosen_neurons = next(listed), ()
        out: list[tuple[str, int, Any]] = [("head", *heads[i]) for i in chosen_heads]
        if real_neurons:
            out.append(("neurons", 2, list(chosen_neurons)))
        return out

    def hooks(chosen: list[tuple[str, int, Any]]) -> list[Any]:
        out = []
        for kind, layer, what in chosen:
            if kind == "head":

                def zero_head(z: torch.Tensor, hook: Any, head: int = what) -> torch.Tensor:
                    z = z.clone()
                    z[:, :, head] = 0.0
                    return z

                out.append((f"blocks.{layer}.attn.hook_z", zero_head))
            elif kind == "mlp":
                out.append((f"blocks.{layer}.hook_mlp_out", lambda x, hook: torch.zeros_like(x)))
            else:

                def zero_neurons(x: torch.Tensor, hook: Any, neurons: list[int] = what) -> torch.Tensor:
                    x = x.clone()
                    x[:, :, neurons] = 0.0
                    return x

                out.append((f"blocks.{layer}.mlp.hook_post", zero_neurons))
        return out

    real_set = [
        ("head", int(t[1]), int(t.split("H")[1])) if "H" in t
        else ("mlp", int(t[1]), None) if t.endswith("MLP")
        else ("neurons", int(t[1]), [int(i) for i in t.split("N")[1].split(",")])
        for t in targets
    ]  # fmt: skip
    before = logit_diff(tiny, [])
    real = logit_diff(tiny, hooks(real_set)) - before
    assert baseline.real == pytest.approx(real, abs=1e-5)
    # the centre uses the whole first batch of 20, even when the test stops inside it
    total = math.comb(len(heads), len(real_heads)) * math.comb(d_mlp, len(real_neurons)) - 1
    cap = min(60, total)
    expected = [logit_diff(tiny, hooks(random_set())) - before for _ in range(max(min(20, cap), len(baseline.draws)))]
    assert baseline.draws == pytest.approx(expected[: len(baseline.draws)], abs=1e-5)
    stop, p = hand_sequential(real, expected, h=min(10, cap), n_max=cap)
    assert stop == len(baseline.draws) and baseline.p_value == pytest.approx(p)
    assert ("beats" in baseline.verdict) == (p <= 0.05)
    assert ("cannot resolve" in baseline.verdict) == (p > 0.05 and 1 / (cap + 1) > 0.05)
    assert baseline.pool_size == total and baseline.p_floor == pytest.approx(1 / (min(60, total) + 1))


def test_a_pool_too_small_to_reach_alpha_says_it_cannot_resolve(tiny: LoadedModel) -> None:
    """An MLP of tiny's 3 layers has 2 other layers: both are drawn (never the real one), the floor is 1/3 and the
    verdict says it cannot resolve at α — whatever the effect."""
    result = ablate(tiny, PROMPTS, Intervention(ablate=["L1MLP"], positions="all"), "mary", "john", random_draws=60)  # type: ignore[list-item]
    baseline = result.random_baseline
    assert baseline is not None and baseline.pool_size == tiny.cfg.n_layers - 1 == 2
    assert baseline.p_floor == pytest.approx(1 / 3)
    assert "cannot resolve at α = 0.05" in baseline.verdict and "indistinguishable" not in baseline.verdict
    zero_mlp = [(f"blocks.{layer}.hook_mlp_out", lambda x, hook: torch.zeros_like(x)) for layer in range(3)]
    before = logit_diff(tiny, [])
    others = sorted(logit_diff(tiny, [zero_mlp[layer]]) - before for layer in (0, 2))
    assert sorted(baseline.draws) == pytest.approx(others, abs=1e-5)
