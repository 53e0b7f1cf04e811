"""Null simulations of the steering verdicts (``steer_kl``, ``steer_concept``) on a real model — by default the
embedded SmolLM2, whose residual stream is strongly anisotropic, the confound the issue asked about.

Each dataset is one ``steer`` call's test, run by the tool's own functions: the steering vector (``steering_at``), the
stand-ins (``ReferenceDifferences``) and the sequential rank test of the next-token KL (``next_token_kl_test``) or of
the concept score of greedy continuations (``concept_rank_test``); only the continuations the tool shows beside the
KL test are not generated for the KL rows.

**H0: an unrelated ActAdd.** The prompt is the start (4–7 words) of a held-out WordNet sentence; the positive and
negative texts are unrelated to it and to each other, and come from elsewhere than the stand-ins' reference texts
(WordNet's search pool): half the datasets two random nouns (" table" − " river"), half the starts (1–8 words) of two
sentences of the lens corpus (encyclopaedic prose); the layer one of five spread over the depth, the coefficient 1, 2
or 4. Such a vector means nothing for the prompt, yet its direction is a real activation difference — of one token's
residual (position 0, SmolLM2's attention sink) or of a longer text's — which is what made isotropic random
directions an unfair null (``isotropic=True`` keeps that contrast measurable).

**Alternatives.** KL: a counterfactual ActAdd — the prompt with its last word replaced by a random noun, minus the
prompt (coefficient 1), which rewrites what the prediction reads. Concept: ActAdd " The ocean waves crash on the
beach" − " The desert sand blows in the wind" (coefficient 4) on the same prompts, scored for ocean words over 4 new
tokens (the null's concept is the same words).
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import torch

from mcp_interp.core.engine.backend.loader import load_model
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.numbers import stats
from mcp_interp.core.engine.numbers.calibration import Calibration, rejected
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.lens.concept import concept_from_words
from mcp_interp.core.lens.steer import (
    ReferenceDifferences,
    StandIns,
    concept_rank_test,
    default_actadd_layer,
    greedy,
    next_logits,
    next_token_kl_test,
    steering_at,
)
from mcp_interp.corpora import DEFAULT_TEXT_CORPUS, text_corpus

NOUNS = (
    "table", "river", "window", "pencil", "garden", "engine", "bottle", "mountain", "paper", "chair", "cloud", "bridge",
    "candle", "ladder", "basket", "mirror", "hammer", "blanket", "carpet", "button", "wallet", "kettle", "pillow",
    "ticket", "helmet", "anchor", "saddle", "barrel", "needle", "shovel",
)  # fmt: skip
OCEAN_WORDS = [" ocean", " sea", " waves", " beach", " water", " fish", " ship", " sailing"]
COEFFICIENTS = (1.0, 2.0, 4.0)
CONCEPT_COEFFICIENT = 4.0
OCEAN_ACTADD = (" The ocean waves crash on the beach", " The desert sand blows in the wind")
CONCEPT_TOKENS = 4  # new tokens per continuation scored for the concept
CONCEPT_WITHOUT_VERDICT = "above 0.06: `steer` reports this p without a verdict"
UNRELATED = (
    "an unrelated ActAdd on the start (4–7 words) of a held-out WordNet sentence: two random nouns, or the starts "
    "(1–8 words) of two encyclopaedic sentences (the lens corpus), never the stand-ins' reference texts"
)


class IsotropicDirections:
    """The stand-ins before issue 41: unit directions uniform on the sphere, blind to the stream's shape."""

    def __init__(self, width: int, seed: int) -> None:
        self.width, self.generator = width, torch.Generator().manual_seed(seed)
        self.units: list[torch.Tensor] = []

    def take(self, start: int, k: int) -> torch.Tensor:
        while len(self.units) < start + k:
            draws = torch.randn(stats.BATCH, self.width, generator=self.generator, dtype=torch.float64)
            self.units.extend((draws / draws.norm(dim=1, keepdim=True)).to(torch.float32))
        return torch.stack(self.units[start : start + k])


def embedded(model: LoadedModel | None) -> LoadedModel:
    return load_model("smollm2-135m") if model is None else model


def steering_layers(n_layers: int) -> list[int]:
    """Five layers spread over the model's depth (fewer when it has fewer), never the embedding's."""
    return sorted({min(n_layers - 1, max(1, round(n_layers * f))) for f in (1 / 6, 1 / 3, 1 / 2, 2 / 3, 5 / 6)})


def lens_sentences() -> list[str]:
    """The sentences of the lens corpus (its paragraphs split at full stops), for unrelated ActAdd texts."""
    return [s.strip() for text in text_corpus("lens_corpus").search for s in text.split(". ") if len(s.split()) > 8]


def unrelated_pair(rng: random.Random) -> tuple[str, str]:
    """Two texts unrelated to each other and to any prompt: two nouns, or the starts of two encyclopaedic sentences."""
    if rng.random() < 0.5:
        first, second = rng.sample(NOUNS, 2)
        return f" {first}", f" {second}"
    first, second = rng.sample(lens_sentences(), 2)
    return " ".join(first.split()[: rng.randint(1, 8)]), " ".join(second.split()[: rng.randint(1, 8)])


def steering_prompt(rng: random.Random) -> str:
    """The start (4–7 words) of a held-out WordNet sentence."""
    sentence = rng.choice(text_corpus(DEFAULT_TEXT_CORPUS).held_out)
    return " ".join(sentence.split()[: rng.randint(4, 7)])


def _stand_ins(model: LoadedModel, steering: Any, seed: int, isotropic: bool) -> StandIns:
    return (
        IsotropicDirections(int(steering.vector.numel()), seed)
        if isotropic
        else ReferenceDifferences(model, steering, seed)
    )


def kl_p(model: LoadedModel, seed: int, counterfactual: bool, isotropic: bool = False) -> float:
    """One ``steer`` KL test's p: an unrelated ActAdd (H0) or a counterfactual one (the alternative)."""
    rng = random.Random(seed)
    prompt = steering_prompt(rng)
    if counterfactual:
        words = prompt.split()
        positive, negative, coefficient = " ".join([*words[:-1], rng.choice(NOUNS)]), prompt, 1.0
    else:
        (positive, negative), coefficient = unrelated_pair(rng), rng.choice(COEFFICIENTS)
    layer = rng.choice(steering_layers(model.cfg.n_layers))
    steering = steering_at(model, prompt, positive, negative, layer, None, None)
    ids = encode(model.tokenizer, [prompt]).ids(0)
    stand_ins = _stand_ins(model, steering, seed, isotropic)
    added = coefficient * steering.vector
    return next_token_kl_test(
        model, ids, steering, added, next_logits(model, ids, []), stand_ins, stats.MOST_DRAWS
    ).p_value


def concept_p(model: LoadedModel, seed: int, ocean: bool, isotropic: bool = False) -> float:
    """One ``steer(concept=ocean words)`` concept test's p at the default layer: an unrelated ActAdd (H0) or
    " ocean" − " desert" (the alternative)."""
    rng = random.Random(seed)
    prompt = steering_prompt(rng)
    positive, negative = OCEAN_ACTADD if ocean else unrelated_pair(rng)
    steering = steering_at(model, prompt, positive, negative, default_actadd_layer(model.cfg.n_layers), None, None)
    ids = encode(model.tokenizer, [prompt]).ids(0)
    added = CONCEPT_COEFFICIENT * steering.vector
    concept = concept_from_words(model, OCEAN_WORDS)
    score = concept.score(ids, greedy(model, ids, CONCEPT_TOKENS, steering.edits(added)))
    stand_ins = _stand_ins(model, steering, seed, isotropic)
    test, _ = concept_rank_test(
        model, ids, steering, float(added.norm()), concept, score, stand_ins, CONCEPT_TOKENS, stats.MOST_DRAWS
    )
    return test.p_value


def steer_kl(
    sims: int, power_sims: int, seed: int, model: LoadedModel | None = None, isotropic: bool = False
) -> list[Calibration]:
    model = embedded(model)
    null = [kl_p(model, seed * 100_003 + i, False, isotropic) for i in range(sims)]
    alternative = [kl_p(model, seed * 100_003 + sims + i, True, isotropic) for i in range(power_sims)]
    against = "isotropic random directions (before issue 41)" if isotropic else "differences of reference texts"
    return [
        Calibration(
            "steer_kl",
            f"{model.name}; stand-ins: {against}",
            f"{UNRELATED}; at one of five layers over the depth, coefficient 1, 2 or 4; the next-token KL ranked among "
            "the stand-ins scaled to its norm",
            "a counterfactual ActAdd: the prompt with its last word replaced by a random noun, minus the prompt",
            sims,
            rejected(null),
            power_sims,
            rejected(alternative),
            stats.rank_floor(stats.MOST_DRAWS),
        )
    ]


def steer_kl_isotropic(sims: int, power_sims: int, seed: int, model: LoadedModel | None = None) -> list[Calibration]:
    """The contrast: the same datasets ranked among isotropic random directions, the stand-ins ``steer`` used before
    issue 41 — no verdict rests on it now."""
    (row,) = steer_kl(sims, power_sims, seed, model, isotropic=True)
    return [replace(row, gives_verdict=False, without_verdict="the null replaced in issue 41, shown for contrast")]


def steer_concept(
    sims: int, power_sims: int, seed: int, model: LoadedModel | None = None, isotropic: bool = False
) -> list[Calibration]:
    model = embedded(model)
    null = [concept_p(model, seed * 100_003 + i, False, isotropic) for i in range(sims)]
    alternative = [concept_p(model, seed * 100_003 + sims + i, True, isotropic) for i in range(power_sims)]
    return [
        Calibration(
            "steer_concept",
            f"{model.name}, ocean words, {CONCEPT_TOKENS} new tokens",
            f"{UNRELATED}; at the default layer, coefficient {CONCEPT_COEFFICIENT:g}; the concept score of its greedy "
            "continuation ranked among the stand-ins' continuations",
            f"ActAdd '{OCEAN_ACTADD[0]}' − '{OCEAN_ACTADD[1]}' (coefficient {CONCEPT_COEFFICIENT:g}), scored for the "
            "same ocean words",
            sims,
            rejected(null),
            power_sims,
            rejected(alternative),
            stats.rank_floor(stats.MOST_DRAWS),
            gives_verdict=False,
            without_verdict=CONCEPT_WITHOUT_VERDICT,
        )
    ]
