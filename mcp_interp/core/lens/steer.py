"""Activation addition ("ActAdd"): steer generation with a difference of residual streams.

The steering vector is resid(positive) − resid(negative) entering block ``layer``, each read at
its prompt's last token (where the prompt's meaning is summarised); ``coefficient`` times it is
added to the residual entering that block at every position of the prompt and of the generated
tokens. A stored direction (``direction://`` from ``probe``) is added instead to the stream its
probe read (resid_post of its layer), ``coefficient`` × the spread of its probe texts' projections
× the unit vector, so coefficient 1 moves the stream by one typical spread along the direction.

A continuation is one sample of text; the number beside it is the change of the next-token
distribution (KL from the unsteered run), compared with the same for stand-in vectors of the same
norm at the same site — a vector that moves the prediction no more than arbitrary ones do is not a
meaningful direction, however the text reads. The stand-ins are differences of two reference texts'
activations at the site (``ReferenceDifferences``: the shipped WordNet sentences, cut to the token
counts of the positive and negative texts, or of the prompt), not isotropic random directions: a
trained model's stream is anisotropic, and on SmolLM2 isotropic directions of a norm moved the next
token further than single-token differences and less than multi-token ones (docs/calibration.md).
Continuations are greedy, so the only randomness is none: ``seed`` is recorded, draws the
reference texts, and fixes torch's generator in case a model samples internally (e.g. dropout left
on).

A steered text that merely repeats itself is a broken model, not a steered one; the result
measures repetition (repeated 3-grams) in both continuations and says so in ``notes``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

import mcp_interp.state.limits as limits
from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.edits import Add, Edit
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.points import hook_in, hook_out
from mcp_interp.core.engine.dictionaries.sae import SparseAutoencoder, splice_edits
from mcp_interp.core.engine.dictionaries.transcoders import TranscoderFeature
from mcp_interp.core.engine.jobs import Job
from mcp_interp.core.engine.numbers import stats
from mcp_interp.core.engine.numbers.metrics import kl_divergence
from mcp_interp.core.engine.references import Lookup, is_direction_uri, load_direction, steered_feature
from mcp_interp.core.engine.text.tokens import encode, token_ids
from mcp_interp.core.lens.concept import Concept, concept_from_direction, concept_from_words, greedy_rows
from mcp_interp.corpora import DEFAULT_TEXT_CORPUS, text_corpus
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import StoredDirection
from mcp_interp.schemas.lens import ConceptBaseline, SteerMeasurement

DEGENERATE = 0.5  # fraction of repeated 3-grams above which a continuation is called degenerate


def repetition(ids: list[int]) -> float:
    """Fraction of 3-grams that already occurred earlier in ``ids`` (0 = none repeated)."""
    grams = [tuple(ids[i : i + 3]) for i in range(len(ids) - 2)]
    if not grams:
        return 0.0
    seen: set[tuple[int, ...]] = set()
    repeated = 0
    for gram in grams:
        repeated += gram in seen
        seen.add(gram)
    return repeated / len(grams)


def _resid_at(model: LoadedModel, text: str, name: str) -> torch.Tensor:
    """The residual at point ``name`` at ``text``'s last token."""
    return _resid_all(model, text, name)[-1].clone()


def _resid_all(model: LoadedModel, text: str, name: str) -> torch.Tensor:
    """The values at point ``name`` at every position of ``text`` [seq, ...]."""
    batch = encode(model.tokenizer, [text], model.device)
    acts = model.backend.run(batch.input_ids, capture=[name], stop_at=name).acts
    return acts[name][0, : int(batch.answer_positions[0]) + 1].detach()


def greedy_steps(
    model: LoadedModel, ids: list[int], max_new_tokens: int, edits: list[Edit], out: list[int], what: str
) -> Iterator[str]:
    """Greedy continuation into ``out`` under ``edits`` (``backend.generate``: one full forward per token), yielding
    after each token so a cancelled job stops within one forward."""
    for step, token in enumerate(model.backend.generate(ids, max_new_tokens, edits, model.tokenizer.eos_token_id)):
        out.append(token)
        yield f"{what}: token {step + 1} of {max_new_tokens}"


def greedy(model: LoadedModel, ids: list[int], max_new_tokens: int, edits: list[Edit]) -> list[int]:
    """The greedy continuation's token ids (``greedy_steps`` run to the end)."""
    out: list[int] = []
    for _ in greedy_steps(model, ids, max_new_tokens, edits, out, "greedy"):
        pass
    return out


def steer_job(
    model: LoadedModel,
    lookup: Lookup | None,
    direction: str | list[float] | None,
    concept: list[str] | str | None,
    **arguments: Any,
) -> SteerJob:
    """The job for the ``steer`` tool's arguments, its references resolved (on the model thread, where the toolkit
    builds jobs): a ``direction://`` to steer along, and a concept that is a ``direction://`` or words."""
    uri = direction if isinstance(direction, str) else None
    stored = load_direction(uri, lookup, model) if uri is not None and lookup is not None else None
    if uri is not None and stored is None:
        raise InputError(f"{uri} is a stored direction, which only the server's store holds; pass its vector instead.")
    judged = None
    if isinstance(concept, str) and is_direction_uri(concept):
        if lookup is None:
            raise InputError(f"{concept} is a stored direction, which only the server's store holds.")
        judged = concept_from_direction(model, load_direction(concept, lookup, model), concept)
    elif concept is not None:
        judged = concept_from_words(model, [concept] if isinstance(concept, str) else list(concept))
    vector = None if isinstance(direction, str) else direction
    return SteerJob(model=model, direction=stored, direction_uri=uri, vector=vector, concept=judged, **arguments)


@dataclass(kw_only=True)
class SteerJob(Job[SteerMeasurement]):
    """``steer`` as a job: a step per generated token (baseline, then steered), so a cancel frees the model within
    one forward pass. An SAE or transcoder feature is named by its folder (``sae`` / ``transcoders``, ``feature``)
    and loaded in the job's first step, on the model thread (``references.steered_feature``); with ``transcoders``,
    ``layer`` is the transcoder layer the feature belongs to."""

    model: LoadedModel
    prompt: str
    positive: str | None
    negative: str | None
    layer: int | None
    coefficient: float
    max_new_tokens: int = 20
    seed: int = 0
    direction: StoredDirection | None = None
    direction_uri: str | None = None
    sae: str | None = None
    transcoders: str | None = None
    feature: int | None = None
    vector: list[float] | None = None
    concept: Concept | None = None
    random_draws: int = stats.MOST_DRAWS
    result: SteerMeasurement | None = field(default=None, init=False)

    def total_steps(self) -> int:
        batches = -(-self.random_draws // stats.BATCH)
        return 2 * self.max_new_tokens + 2 + batches * (2 if self.concept is not None else 1)

    def steps(self) -> Iterator[str]:
        require(self.model.backend, "steer")
        chosen = steered_feature(self.model, self.sae, self.transcoders, self.layer, self.feature)
        layer = None if self.transcoders is not None else self.layer
        holder: list[SteerMeasurement] = []
        yield from steer_steps(
            self.model, self.prompt, self.positive, self.negative, layer, self.coefficient, self.max_new_tokens,
            self.seed, self.direction, self.direction_uri, chosen, self.random_draws, holder, self.vector,
            self.concept,
        )  # fmt: skip
        self.result = holder[0]


def steer(*args: Any, **kwargs: Any) -> SteerMeasurement:
    """``steer_steps`` run to the end here (the arguments of ``steer_steps`` but ``into``)."""
    holder: list[SteerMeasurement] = []
    for _ in steer_steps(*args, **{**kwargs, "into": holder}):
        pass
    return holder[0]


def steer_steps(
    model: LoadedModel,
    prompt: str,
    positive: str | None,
    negative: str | None,
    layer: int | None,
    coefficient: float,
    max_new_tokens: int = 20,
    seed: int = 0,
    direction: StoredDirection | None = None,
    direction_uri: str | None = None,
    feature: tuple[SparseAutoencoder, int] | TranscoderFeature | None = None,
    random_draws: int = stats.MOST_DRAWS,
    into: list[SteerMeasurement] | None = None,
    vector: list[float] | None = None,
    concept: Concept | None = None,
) -> Iterator[str]:
    """ActAdd (``positive``/``negative`` at resid_pre of ``layer``), a stored direction (at resid_post of its
    layer, ``coefficient`` in units of its probe texts' projection spread), an SAE feature (its decoder row
    at the SAE's hook, ``coefficient`` = the activation added) or a transcoder feature (its decoder row(s) added to
    the MLP write(s) it feeds); greedy continuations with and without. Yields a progress message per step; the
    measurement is appended to ``into``."""
    n_layers = model.cfg.n_layers
    chosen = sum(x is not None for x in (direction, feature, vector)) + (positive is not None or negative is not None)
    if chosen > 1:
        raise InputError(
            "Give one of: `positive` and `negative`, a `direction` (stored or a vector), or an SAE `feature` — not "
            "several."
        )
    if vector is not None:
        if layer is None:
            raise InputError("A `direction` given as a vector needs `layer`: it is added to that layer's resid_post.")
        if len(vector) != model.cfg.d_model or not all(v == v and abs(v) < 1e30 for v in vector):
            raise InputError(
                f"A `direction` vector needs {model.cfg.d_model} finite numbers (d_model), got {len(vector)}."
            )
    elif direction is not None:
        layer = direction.layer if layer is None else layer
    elif feature is not None:
        layer = feature.layer if isinstance(feature, TranscoderFeature) else feature[0].layer
    elif positive is None or negative is None:
        raise InputError(
            "Give `positive` and `negative` texts (activation addition), a stored `direction`, or an SAE `feature`."
        )
    defaulted = layer is None and direction is None and feature is None and vector is None
    if defaulted:
        layer = default_actadd_layer(n_layers)
    if layer is None or not 0 <= layer < n_layers:
        raise InputError(f"layer {layer} does not exist; this model has layers 0..{n_layers - 1}.")
    stats.check_most_draws(random_draws)
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be at least 1, got {max_new_tokens}.")
    limits.check("max_new_tokens", max_new_tokens, "max_new_tokens")
    if not (coefficient == coefficient) or abs(coefficient) > 1e4:
        raise InputError(f"coefficient must be a finite number with |c| ≤ 10000, got {coefficient}.")
    for name, text in (("prompt", prompt), ("positive", positive), ("negative", negative)):
        if text is not None and (not isinstance(text, str) or not text):
            raise InputError(f"`{name}` must be a non-empty string.")
    torch.manual_seed(seed)
    notes: list[str] = []
    if defaulted:
        notes.append(
            f"No `layer` given: ActAdd steered at layer {layer}'s input (about a third of the way up, where Turner et "
            "al. found activation addition works best); try others with `layer`."
        )
    steering = steering_at(model, prompt, positive, negative, layer, direction, feature, vector)
    if direction is not None and layer != direction.layer:
        notes.append(
            f"The direction was fitted on layer {direction.layer}'s output but is added at layer {layer}'s: "
            "residual bases drift between layers, so expect a weaker or different effect."
        )
    prompt_ids = encode(model.tokenizer, [prompt]).ids(0)
    added = coefficient * steering.vector
    yield "steering vector"
    baseline_ids: list[int] = []
    yield from greedy_steps(model, prompt_ids, max_new_tokens, [], baseline_ids, "unsteered")
    steered_ids: list[int] = []
    yield from greedy_steps(model, prompt_ids, max_new_tokens, steering.edits(added), steered_ids, "steered")
    base_logits = next_logits(model, prompt_ids, [])
    norm = float(added.norm())
    stand_ins = ReferenceDifferences(model, steering, seed)
    test = next_token_kl_test(model, prompt_ids, steering, added, base_logits, stand_ins, random_draws)
    next_kl, random_kl = test.real, list(test.draws)
    yield f"stand-in vectors' next-token KL: {test.n} draws"
    concept_baseline: ConceptBaseline | None = None
    random_texts: list[str] = []
    if concept is not None:
        steered_score, baseline_score = concept.score(prompt_ids, steered_ids), concept.score(prompt_ids, baseline_ids)
        concept_test, continuations = concept_rank_test(
            model, prompt_ids, steering, norm, concept, steered_score, stand_ins, max_new_tokens, random_draws
        )
        random_texts = [model.tokenizer.decode(row) for row in continuations[:RANDOM_TEXTS]]
        concept_baseline = ConceptBaseline(
            concept=concept.describe,
            real=steered_score,
            unsteered=baseline_score,
            draws=list(concept_test.draws),
            p_value=concept_test.p_value,
            p_floor=concept_test.p_floor,
            verdict=concept_without_verdict(concept_test),
        )
        notes.append(
            f"Concept score ({concept.describe}): steered {steered_score:.3f}, unsteered {baseline_score:.3f}; "
            f"{concept_test.n} {STAND_INS} of the same norm give {min(concept_test.draws):.3f} to "
            f"{max(concept_test.draws):.3f}: the steered text {concept_baseline.verdict}."
        )
        yield f"stand-in vectors' continuations: {concept_test.n} draws"
    residual_norm = steering.residual_norm
    position_norms = steering.position_norms
    exceeded = sum(norm > n for n in position_norms)
    rep_base, rep_steer = repetition(baseline_ids), repetition(steered_ids)
    if rep_steer >= DEGENERATE:
        notes.append(
            f"The steered continuation degenerates ({rep_steer:.0%} of its 3-grams repeat, baseline "
            f"{rep_base:.0%}): this is the model breaking, not evidence of steering. Try a smaller coefficient "
            "or another layer."
        )
    if steered_ids == baseline_ids:
        notes.append("The steered continuation is identical to the baseline: no visible effect at this strength.")
    if exceeded:
        notes.append(
            f"The added vector (norm {norm:.3g}) is larger than the residual itself at {exceeded} of the prompt's "
            f"{len(position_norms)} positions (residual norms {min(position_norms):.3g}–{max(position_norms):.3g}, "
            f"median {sorted(position_norms)[len(position_norms) // 2]:.3g}; `residual_norms`): it replaces more "
            "than it nudges. A coefficient that keeps added_norm below the median is a gentler start."
        )
    if residual_norm > 0 and norm > 4 * residual_norm:
        notes.append(
            f"The added vector (norm {norm:.1f}) is {norm / residual_norm:.1f}× the residual's norm "
            f"({residual_norm:.1f}) at layer {layer}: it dominates the stream rather than nudging it."
        )
    notes.append(
        f"The next-token distribution moves by KL {next_kl:.4f} nats; {len(random_kl)} {STAND_INS} of the same norm "
        f"move it by {min(random_kl):.4f}–{max(random_kl):.4f}: the vector "
        f"{stats.versus_random('steer_kl', test, f'{STAND_INS} of its norm')}. This says the prediction moved, "
        "not where"
        + ("; the concept score above says where." if concept is not None else ": pass `concept` to test where.")
    )
    measurement = SteerMeasurement(
        prompt=prompt,
        positive=positive,
        negative=negative,
        direction_uri=direction_uri,
        sae_feature=None if feature is None else _describe(feature),
        layer=layer,
        site=steering.site,
        coefficient=coefficient,
        vector_norm=float(steering.vector.norm()),
        added_norm=norm,
        residual_norm=residual_norm,
        residual_norms=position_norms,
        next_token_kl=next_kl,
        random_next_token_kl=random_kl,
        random_norm=norm,
        random_p_value=test.p_value,
        random_p_floor=test.p_floor,
        baseline_text=model.tokenizer.decode(baseline_ids),
        steered_text=model.tokenizer.decode(steered_ids),
        repetition_baseline=rep_base,
        repetition_steered=rep_steer,
        concept_baseline=concept_baseline,
        random_continuations=random_texts,
        notes=notes,
    )
    if into is not None:
        into.append(measurement)
    yield "done"


def concept_without_verdict(test: stats.RankTest) -> str:
    """The concept test's p, worded without a verdict: simulated on SmolLM2 under unrelated ActAdds its size came out
    above 0.06 (16 of 180 at 4 new tokens, power 0 on an ocean ActAdd: docs/calibration.md, ``steer_concept``), so a
    small p here does not support "the vector wrote the concept" until the test is fixed."""
    return (
        f"is reported without a verdict (p = {test.p_value:.3g}, p_floor = {test.p_floor:.3g}, {test.n} stand-ins): "
        "this test's simulated size on SmolLM2 is above 0.06 (docs/calibration.md)"
    )


RANDOM_TEXTS = 3  # random directions' continuations shown, so the reader sees what "random" wrote


STAND_INS = "differences of two reference texts' activations"


class StandIns(Protocol):
    """Unit vectors a steering vector is ranked among, drawn as needed and kept: ``take(start, k)`` → ``[k, width]``."""

    def take(self, start: int, k: int) -> torch.Tensor: ...


class ReferenceDifferences:
    """The vectors a steering vector is ranked among: differences of two reference texts' values at the steering
    site, each read at the last token of a text cut to the token counts the steering vector's own two ends had
    (``Steering.lengths``: ActAdd's positive and negative texts; the prompt's, for a stored direction, a vector or a
    feature), as unit vectors (float32), drawn as needed and kept so the KL test and the concept test use the same.

    Why not isotropic random directions: a trained model's residual stream is anisotropic, and how far a vector of a
    given norm moves the next token depends on where it points — on SmolLM2 isotropic directions moved it further
    than differences of single tokens' residuals and less than differences of longer texts' (docs/calibration.md).
    Under H0 "the vector is the difference of two arbitrary texts' activations" the real vector and these are
    exchangeable, so the rank test is exact. The texts: the shipped WordNet example sentences (the search pool of
    ``wordnet_examples``), in an order seeded by ``seed``, each pair two texts never used by another draw; a text
    shorter than the count needed runs on into the next sentences."""

    def __init__(self, model: LoadedModel, steering: Steering, seed: int, texts: Sequence[str] | None = None) -> None:
        self.model, self.steering = model, steering
        self.texts = list(text_corpus(DEFAULT_TEXT_CORPUS).search if texts is None else texts)
        self.order = torch.randperm(len(self.texts), generator=torch.Generator().manual_seed(seed)).tolist()
        self.units: list[torch.Tensor] = []
        self.pair = 0  # the next pair of the order to read: (order[2j], order[2j + 1])

    def cut(self, index: int, count: int) -> list[int]:
        """Text ``index`` (running on into the next ones while it is short) cut to its first ``count`` tokens."""
        text, following = self.texts[index], index
        ids = token_ids(self.model.tokenizer, text)
        while len(ids) < count:
            following = (following + 1) % len(self.texts)
            text = f"{text} {self.texts[following]}"
            ids = token_ids(self.model.tokenizer, text)
        return ids[:count]

    def take(self, start: int, k: int) -> torch.Tensor:
        """Stand-ins ``start`` … ``start + k − 1`` as unit vectors ``[k, width]``. A pair whose two cut texts are the
        same tokens (two sentences opening alike, cut to one token) is skipped: its difference is zero, a stand-in that
        moves nothing and would make any real vector look strong (on SmolLM2 this lifted the KL test's size)."""
        first, second = self.steering.lengths
        while len(self.units) < start + k:
            wanted = max(stats.BATCH, start + k - len(self.units))
            pairs: list[tuple[list[int], list[int]]] = []
            for _ in range(MOST_PAIRS_TRIED):
                j, self.pair = self.pair, self.pair + 1
                a, b = self.order[(2 * j) % len(self.order)], self.order[(2 * j + 1) % len(self.order)]
                cut_a, cut_b = self.cut(a, first), self.cut(b, second)
                if cut_a != cut_b:
                    pairs.append((cut_a, cut_b))
                if len(pairs) == wanted:
                    break
            if not pairs:
                raise InputError(
                    f"The reference texts cut to {first} and {second} tokens are all alike, so no stand-in vector "
                    "differs from zero: steer with longer positive and negative texts, or along a `direction`."
                )
            positive = self.steering.read(torch.tensor([a for a, _ in pairs]))
            negative = self.steering.read(torch.tensor([b for _, b in pairs]))
            difference = (positive - negative).to("cpu", torch.float64)
            self.units.extend((difference / difference.norm(dim=1, keepdim=True)).to(torch.float32))
        return torch.stack(self.units[start : start + k])


MOST_PAIRS_TRIED = 20_000  # pairs of reference texts looked at for one batch of stand-ins before giving up


def next_token_kl_test(
    model: LoadedModel,
    ids: list[int],
    steering: Steering,
    added: torch.Tensor,
    base_logits: torch.Tensor,
    stand_ins: StandIns,
    random_draws: int,
) -> stats.RankTest:
    """The steered next-token KL ranked among the KLs of ``stand_ins`` scaled to ``added``'s norm, drawn sequentially
    (``stats.sequential_rank_test``, "greater", at most ``random_draws``): the ``steer_kl`` verdict's test, which
    its calibration runs too (``lens.nulls``)."""
    real = float(kl_divergence(base_logits, next_logits(model, ids, steering.edits(added))).value)
    norm = float(added.norm())
    made: list[float] = []

    def draw(k: int) -> list[float]:
        new = random_next_token_kl(model, ids, steering, norm * stand_ins.take(len(made), k), base_logits)
        made.extend(new)
        return new

    return stats.sequential_rank_test(real, draw, "greater", n_max=random_draws)


def concept_rank_test(
    model: LoadedModel,
    ids: list[int],
    steering: Steering,
    norm: float,
    concept: Concept,
    steered_score: float,
    stand_ins: StandIns,
    max_new_tokens: int,
    random_draws: int,
) -> tuple[stats.RankTest, list[list[int]]]:
    """The steered continuation's concept score ranked among the scores of ``stand_ins``' greedy continuations (same
    norm, same site), drawn sequentially: the ``steer_concept`` verdict's test (and its calibration's, ``lens.nulls``);
    with the continuations made."""
    continuations: list[list[int]] = []

    def draw(k: int) -> list[float]:
        units = stand_ins.take(len(continuations), k)
        rows = greedy_rows(model, ids, max_new_tokens, steering.edits((norm * units).unsqueeze(1)), k)
        continuations.extend(rows)
        return [concept.score(ids, row) for row in rows]

    return stats.sequential_rank_test(steered_score, draw, "greater", n_max=random_draws), continuations


@dataclass
class Steering:
    """Where a steering vector goes: ``site`` in words, ``vector`` the coefficient's unit (in the point's own
    space, flattened for ``z``), ``edits(added)`` the edits adding ``added`` at every position, the prompt's norm
    there (last token) for scale, ``read(ids)`` the values at the site at the last token of each row of ``ids``
    ``[rows, tokens]`` (in ``vector``'s space: ``[rows, width]``), and ``lengths`` the token counts of the texts the
    vector's two ends come from (ActAdd's positive and negative; else the prompt's, twice) — what the stand-in
    vectors are read from (``ReferenceDifferences``)."""

    site: str
    vector: torch.Tensor
    edits: Callable[[torch.Tensor], list[Edit]]
    residual_norm: float
    position_norms: list[float]  # the prompt's norm at that point, per position
    read: Callable[[torch.Tensor], torch.Tensor]
    lengths: tuple[int, int]


def steering_at(
    model: LoadedModel,
    prompt: str,
    positive: str | None,
    negative: str | None,
    layer: int,
    direction: StoredDirection | None,
    feature: tuple[SparseAutoencoder, int] | TranscoderFeature | None,
    raw: list[float] | None = None,
) -> Steering:
    prompt_tokens = len(token_ids(model.tokenizer, prompt))
    if isinstance(feature, TranscoderFeature):
        tc = feature.transcoders
        if not 0 <= feature.feature < tc.d_transcoder:
            raise InputError(f"Transcoder feature {feature.feature} does not exist; ids are 0..{tc.d_transcoder - 1}.")
        layers = list(feature.out_layers)
        site = f"{tc.feature_output_hook} of layer {layers[0]}" + (f" to {layers[-1]}" if len(layers) > 1 else "")
        norms = _norms(_resid_all(model, prompt, tc.output_hooks[feature.layer]))
        read = _last_values(model, [tc.output_hooks[j] for j in layers])
        return Steering(site, feature.vector, feature.edits, norms[-1], norms, read, (prompt_tokens, prompt_tokens))
    if feature is not None:
        sae, index = feature
        if not 0 <= index < sae.d_sae:
            raise InputError(f"SAE feature {index} does not exist; this SAE has features 0..{sae.d_sae - 1}.")

        def sae_edits(added: torch.Tensor) -> list[Edit]:
            def shift(values: torch.Tensor) -> torch.Tensor:
                flat = sae.to_input(values)
                return sae.from_input(flat + added.to(device=flat.device, dtype=flat.dtype), values)

            return splice_edits(sae, shift)

        def sae_read(ids: torch.Tensor) -> torch.Tensor:
            values = model.backend.run(ids.to(model.device), capture=[sae.hook_name], stop_at=sae.hook_name).acts
            return sae.to_input(values[sae.hook_name][:, -1]).float()

        norms = _norms(sae.to_input(_resid_all(model, prompt, sae.hook_name)))
        vector = sae.W_dec[index].detach().float().cpu()
        return Steering(sae.site, vector, sae_edits, norms[-1], norms, sae_read, (prompt_tokens, prompt_tokens))
    lengths = (prompt_tokens, prompt_tokens)
    if raw is not None:
        site, hook = "resid_post", hook_out(layer)
        vector = torch.tensor(raw, dtype=torch.float32)
    elif direction is not None:
        site, hook = "resid_post", hook_out(layer)
        vector = direction.projection_std * torch.tensor(direction.vector, dtype=torch.float32)
    else:
        assert positive is not None and negative is not None
        site, hook = "resid_pre", hook_in(layer)
        vector = _resid_at(model, positive, hook) - _resid_at(model, negative, hook)
        lengths = (len(token_ids(model.tokenizer, positive)), len(token_ids(model.tokenizer, negative)))

    def add_at(added: torch.Tensor) -> list[Edit]:
        return [Add(hook, added)]

    norms = _norms(_resid_all(model, prompt, hook))
    return Steering(site, vector, add_at, norms[-1], norms, _last_values(model, [hook]), lengths)


def _last_values(model: LoadedModel, names: list[str]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A reader of the values at ``names`` (in forward order) at the last token of each row of ``ids``, concatenated
    ``[rows, Σ widths]`` (float32), the forward stopped after the last of them."""

    def read(ids: torch.Tensor) -> torch.Tensor:
        acts = model.backend.run(ids.to(model.device), capture=names, stop_at=names[-1]).acts
        return torch.cat([acts[name][:, -1].reshape(ids.shape[0], -1).float() for name in names], dim=1)

    return read


def _norms(values: torch.Tensor) -> list[float]:
    """Per-position L2 norms of values [seq, ...]."""
    return [float(v) for v in values.reshape(values.shape[0], -1).to(torch.float64).norm(dim=1)]


def default_actadd_layer(n_layers: int) -> int:
    """ActAdd's default layer: a third of the way up (Turner et al. 2023 steered GPT-2-XL best in its early-middle
    layers); at least 1, so the added difference is between contextual residuals, not embeddings."""
    return max(1, min(n_layers - 1, n_layers // 3))


def random_next_token_kl(
    model: LoadedModel, ids: list[int], steering: Steering, added: torch.Tensor, base_logits: torch.Tensor
) -> list[float]:
    """KL(baseline‖steered) of the next token for each row of ``added`` [n, width], as one stacked forward: row j
    of the batch is the prompt with ``added[j]`` at every position."""
    rows = added.shape[0]
    edits = steering.edits(added.unsqueeze(1))  # [n, 1, width]: broadcast over positions, one vector per row
    logits = model.backend.logits(torch.tensor([ids] * rows, device=model.device), edits)[:, -1]
    return [float(kl_divergence(base_logits, logits[j : j + 1]).value) for j in range(rows)]


def _describe(feature: tuple[SparseAutoencoder, int] | TranscoderFeature) -> str:
    return feature.describe() if isinstance(feature, TranscoderFeature) else f"{feature[1]} of {feature[0].describe()}"


def next_logits(model: LoadedModel, ids: list[int], edits: list[Edit]) -> torch.Tensor:
    return model.backend.logits(torch.tensor([ids], device=model.device), edits)[:, -1]
