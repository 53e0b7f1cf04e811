"""``score_explanation``: an assistant's explanation of a feature, scored by statistics that can fail.

The assistant is the explainer and the simulator; the server finds texts, hides answers, measures and scores:

* **generation** — the assistant writes ``activating_texts`` and ``non_activating_texts`` from its explanation; each
  text's activation is its maximum (positions ≥ 1) and the score is the AUROC of the two sets with Newcombe's
  interval and an exact one-sided test (``stats.auroc_test``). Swapping the sets gives 1 − AUROC.
* **detection quiz** — ``quiz: n`` draws n texts the examples never showed (a shipped corpus's held-out pool, or the
  caller's ``texts`` minus every text shown as an example of this feature), about half firing (maximum >
  ``threshold``) and half not, shuffled, activations hidden; the truth is stored on the server under the quiz id.
  ``quiz_id`` + ``predictions`` scores it: balanced accuracy with an exact interval and the exact permutation
  p-value of the predictions against chance (``stats.detection_test``), and the truth revealed. A quiz is scored
  once; its texts are never drawn again for the same feature.

Every score is stored with its explanation (``explanation_document``, served as ``explanation://``), and
``feature_examples`` lists them per feature.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.numbers.stats import ALPHA, auroc_test, detection_test
from mcp_interp.core.engine.references import Lookup
from mcp_interp.core.engine.text.tokens import token_strings
from mcp_interp.core.features.activations import TextActivations, activation_steps, count_steps
from mcp_interp.core.features.examples import (
    THRESHOLD_RULE,
    Pool,
    check_texts,
    default_threshold,
    search_pool,
    shipped,
    shown_texts,
)
from mcp_interp.core.features.units import NamedFeature, parse_feature
from mcp_interp.corpora import DEFAULT_TEXT_CORPUS
from mcp_interp.errors import InputError
from mcp_interp.schemas.naming import (
    DetectionScore,
    FeatureSpec,
    GenerationScore,
    QuizAnswer,
    QuizHandle,
    ScoreExplanationMeasurement,
    TextScore,
)

QUIZ_MIN, QUIZ_MAX = 4, 100
MAX_WRITTEN = 200  # texts per generation set: more cannot sharpen a verdict an assistant's writing supports
MAX_EXPLANATION = 2000  # characters
QUIZ_PENDING = "quiz://pending"  # the adapter replaces it with the stored quiz's URI
SCHEMA = "mcp-interp/explanation"
History = Callable[[str], list[dict[str, Any]]]  # feature key → the stored explanation documents of that feature


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(kw_only=True)
class ScoreExplanationJob:
    """``score_explanation`` as a job. ``quiz_record`` is the stored quiz behind ``quiz_id`` (read by the adapter);
    ``history`` the stored explanations of a feature (their revealed quiz texts are never drawn again). Afterwards
    ``quiz_document`` (a new quiz to store) and ``explanation_document`` (the scores to store) are set when due."""

    model: LoadedModel
    feature: FeatureSpec | dict[str, Any]
    explanation: str
    activating_texts: Sequence[str] | None = None
    non_activating_texts: Sequence[str] | None = None
    quiz: int | None = None
    texts: Sequence[str] | None = None
    corpus: str | None = None
    threshold: float | None = None
    seed: int | None = None
    quiz_id: str | None = None
    predictions: Sequence[bool] | None = None
    lookup: Lookup | None = None
    quiz_record: dict[str, Any] | None = None
    history: History | None = None
    result: ScoreExplanationMeasurement | None = field(default=None, init=False)
    quiz_document: dict[str, Any] | None = field(default=None, init=False)
    explanation_document: dict[str, Any] | None = field(default=None, init=False)
    named: NamedFeature = field(init=False)

    def __post_init__(self) -> None:
        require(self.model.backend, "score_explanation")
        if not isinstance(self.explanation, str) or not self.explanation.strip():
            raise InputError("`explanation` must be your explanation of the feature, a non-empty string.")
        if len(self.explanation) > MAX_EXPLANATION:
            raise InputError(f"`explanation` has {len(self.explanation)} characters; keep it under {MAX_EXPLANATION}.")
        generation = self.activating_texts is not None or self.non_activating_texts is not None
        if generation:
            self.activating_texts = check_texts(self.activating_texts, "activating_texts")
            self.non_activating_texts = check_texts(self.non_activating_texts, "non_activating_texts")
            if max(len(self.activating_texts), len(self.non_activating_texts)) > MAX_WRITTEN:
                raise InputError(f"Write at most {MAX_WRITTEN} texts per set.")
        scoring = self.quiz_id is not None or self.predictions is not None
        if self.quiz is not None and scoring:
            raise InputError("Give `quiz` (draw a new quiz) or `quiz_id` with `predictions` (score one), not both.")
        if scoring and (self.quiz_id is None or self.predictions is None or self.quiz_record is None):
            raise InputError("Scoring a quiz needs both `quiz_id` (from the call that drew it) and `predictions`.")
        if self.quiz is not None:
            q = self.quiz
            if isinstance(q, bool) or not isinstance(q, int) or not QUIZ_MIN <= q <= QUIZ_MAX:
                raise InputError(f"`quiz` is the number of texts to draw, an integer from {QUIZ_MIN} to {QUIZ_MAX}.")
        elif self.texts is not None or self.corpus is not None or self.threshold is not None:
            raise InputError("`texts`, `corpus` and `threshold` choose a new quiz's texts: give them with `quiz`.")
        if not (generation or scoring or self.quiz is not None):
            raise InputError(
                "Nothing to score: pass `activating_texts` and `non_activating_texts` (texts you wrote from the "
                "explanation), `quiz` (the number of held-out texts to predict), or `quiz_id` with `predictions`."
            )
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32
        ):
            raise InputError("`seed` must be an integer from 0 to 2**32 − 1 (or omitted for a fresh draw).")
        if self.threshold is not None and not (isinstance(self.threshold, int | float) and np.isfinite(self.threshold)):
            raise InputError("`threshold` must be a finite number.")
        self.named = parse_feature(self.feature, self.model, self.lookup)

    def _quiz_pools(self) -> tuple[Pool, Pool | None]:
        """(where the quiz is drawn, where the default threshold comes from: None when it is the same pool)."""
        if self.texts is not None and self.corpus is not None:
            raise InputError("Give `texts` or `corpus`, not both.")
        if self.texts is not None:
            return search_pool(self.texts, None), None
        found = shipped(DEFAULT_TEXT_CORPUS if self.corpus is None else self.corpus)
        if not found.held_out:
            raise InputError(f"`corpus` {found.name!r} has no held-out texts; pass your own `texts` for the quiz.")
        return Pool(found.name, "held_out", found.held_out, found), Pool(found.name, "search", found.search, found)

    def total_steps(self) -> int:
        total = 1
        if self.activating_texts is not None and self.non_activating_texts is not None:
            total += count_steps(self.model, [*self.activating_texts, *self.non_activating_texts])
        if self.quiz is not None:
            pool, reference = self._quiz_pools()
            total += count_steps(self.model, pool.texts)
            if reference is not None and self.threshold is None:
                total += count_steps(self.model, reference.texts)
        return total

    def steps(self) -> Iterator[str]:
        result = ScoreExplanationMeasurement(feature=self.named.info(), explanation=self.explanation)
        if self.activating_texts is not None and self.non_activating_texts is not None:
            result.generation = yield from self._generation(
                list(self.activating_texts), list(self.non_activating_texts)
            )
        if self.quiz is not None:
            result.quiz, result.threshold = yield from self._draw(self.quiz, result.notes)
        if self.quiz_record is not None and self.predictions is not None:
            result.detection, result.threshold = self._score(self.quiz_record, self.predictions, result.notes)
        if result.generation is not None or result.detection is not None:
            self.explanation_document = {
                "schema": SCHEMA,
                "feature": self.named.info().model_dump(),
                "model_name": self.model.name,
                "model_fingerprint": self.model.fingerprint,
                "explanation": self.explanation,
                "created": now(),
                "threshold": result.threshold,
                "generation": None if result.generation is None else result.generation.model_dump(),
                "detection": None if result.detection is None else result.detection.model_dump(),
            }
        self.result = result
        yield "scored"

    def _generation(self, activating: list[str], non_activating: list[str]) -> Generator[str, None, GenerationScore]:
        read: list[TextActivations] = []
        yield from activation_steps(self.model, self.named, [*activating, *non_activating], read)
        scored, maxima, where = read[0].maxima()
        short = [i for i in np.flatnonzero(~scored)]
        if short:
            i = int(short[0])
            which = "activating_texts" if i < len(activating) else "non_activating_texts"
            index = i if i < len(activating) else i - len(activating)
            raise InputError(f"`{which}[{index}]` is one token; position 0 is never scored: write 2 or more tokens.")
        x, y = maxima[: len(activating)], maxima[len(activating) :]
        test = auroc_test(x, y)
        verdict = (
            f"the activating texts rank above the non-activating ones (AUROC {test.auroc:.3f}, p = {test.p_value:.3g})"
            if test.p_value <= ALPHA
            else f"not shown to separate the two sets (AUROC {test.auroc:.3f}, p = {test.p_value:.3g})"
        )
        texts = [*activating, *non_activating]
        return GenerationScore(
            auroc=test.auroc,
            auroc_ci=[test.low, test.high],
            p_value=test.p_value,
            p_method=test.method,
            verdict=verdict,
            per_text=[
                TextScore(
                    text=t,
                    written_as="activating" if i < len(activating) else "non_activating",
                    max_activation=float(maxima[i]),
                    max_token=token_strings(self.model.tokenizer, [read[0].ids[i][int(where[i])]])[0],
                )
                for i, t in enumerate(texts)
            ],
        )

    def _draw(self, n: int, notes: list[str]) -> Generator[str, None, tuple[QuizHandle, float]]:
        pool, reference = self._quiz_pools()
        threshold = self.threshold
        if threshold is None:
            source = pool if reference is None else reference
            read: list[TextActivations] = []
            yield from activation_steps(self.model, self.named, source.texts, read)
            scored, maxima, _ = read[0].maxima()
            threshold = default_threshold(maxima[scored])
            notes.append(
                f"threshold = {threshold:.4g}: {THRESHOLD_RULE.replace('search pool', source.kind + ' pool')}."
            )
        read = []
        yield from activation_steps(self.model, self.named, pool.texts, read)
        scored, maxima, _ = read[0].maxima()
        excluded = self._excluded(pool)
        eligible = np.array([scored[i] and pool.texts[i] not in excluded for i in range(len(pool.texts))], dtype=bool)
        if (~eligible & scored).any():
            notes.append(
                f"{int((~eligible & scored).sum())} texts already shown or revealed for this feature were "
                "left out of the draw."
            )
        above = np.flatnonzero(eligible & (maxima > threshold))
        below = np.flatnonzero(eligible & ~(maxima > threshold))
        if above.size == 0 or below.size == 0:
            side = "above" if above.size == 0 else "at or below"
            raise InputError(
                f"No eligible quiz text has its maximum {side} the threshold {threshold:.4g}; choose "
                "another `threshold` or other `texts`."
            )
        seed = secrets.randbelow(2**31) if self.seed is None else self.seed
        rng = np.random.default_rng(seed)
        n_firing = min(n // 2, above.size)
        n_quiet = min(n - n_firing, below.size)
        chosen = np.concatenate([rng.choice(above, n_firing, replace=False), rng.choice(below, n_quiet, replace=False)])
        chosen = chosen[rng.permutation(chosen.size)]
        if chosen.size < n or n_firing < n // 2:
            notes.append(
                f"The quiz has {chosen.size} texts, {n_firing} firing: the pool had only {above.size} "
                f"eligible texts above the threshold and {below.size} at or below it."
            )
        texts = [pool.texts[int(i)] for i in chosen]
        self.quiz_document = {
            "schema": "mcp-interp/quiz",
            "feature": self.named.info().model_dump(),
            "model_fingerprint": self.model.fingerprint,
            "explanation": self.explanation,
            "created": now(),
            "pool": f"{pool.name}:{pool.kind}",
            "seed": seed,
            "threshold": threshold,
            "texts": texts,
            "fires": [bool(maxima[i] > threshold) for i in chosen],
            "max_activations": [float(maxima[i]) for i in chosen],
            "scored_by": None,
        }
        handle = QuizHandle(
            quiz_id=QUIZ_PENDING, texts=texts, seed=seed, pool=f"{pool.name}:{pool.kind}", n_firing=n_firing
        )
        return handle, threshold

    def _excluded(self, pool: Pool) -> set[str]:
        """Texts a quiz on ``pool`` may not show: those revealed by this feature's scored quizzes, and for the
        caller's texts those shown as examples of it."""
        out: set[str] = set()
        for document in self.history(self.named.key) if self.history is not None else []:
            out.update(answer["text"] for answer in (document.get("detection") or {}).get("truth", []))
        if pool.kind == "all":
            out |= shown_texts(self.model, self.named.key)
        return out

    def _score(
        self, record: dict[str, Any], predictions: Sequence[bool], notes: list[str]
    ) -> tuple[DetectionScore, float]:
        quiz_id = str(self.quiz_id)
        if record.get("model_fingerprint") != self.model.fingerprint:
            raise InputError(f"{quiz_id} was drawn on other weights than the loaded model's; draw a new quiz.")
        key = record.get("feature", {}).get("key")
        if key != self.named.key:
            raise InputError(
                f"{quiz_id} was drawn for feature {key!r}, not {self.named.key!r}: pass that feature, or "
                "draw a quiz for this one with `quiz`."
            )
        if record.get("scored_by"):
            raise InputError(
                f"{quiz_id} was already scored and its truth revealed ({record['scored_by']}): draw a new "
                "quiz with `quiz`."
            )
        texts, fires = list(record["texts"]), [bool(f) for f in record["fires"]]
        values = list(predictions) if isinstance(predictions, list | tuple) else None
        if values is None or len(values) != len(texts):
            got = "not a list" if values is None else f"{len(values)}"
            raise InputError(
                f"`predictions` must hold one true/false per quiz text, {len(texts)} in the quiz's order; got {got}."
            )
        if not all(isinstance(v, bool) or v in (0, 1) for v in values):
            raise InputError("`predictions` must be true (the feature fires) or false, one per quiz text.")
        if record.get("explanation") != self.explanation:
            notes.append(
                "The explanation differs from the one the quiz was drawn with; the scores are filed under this one."
            )
        said = [bool(v) for v in values]
        test = detection_test(fires, said)
        verdict = (
            f"the predictions beat chance (balanced accuracy {test.balanced_accuracy:.3f}, p = {test.p_value:.3g})"
            if test.p_value <= ALPHA
            else f"not shown better than chance (balanced accuracy {test.balanced_accuracy:.3f}, "
            f"p = {test.p_value:.3g})"
        )
        truth = [
            QuizAnswer(text=t, fires=f, predicted=s, max_activation=float(a))
            for t, f, s, a in zip(texts, fires, said, record["max_activations"], strict=True)
        ]
        score = DetectionScore(
            quiz_id=quiz_id,
            balanced_accuracy=test.balanced_accuracy,
            balanced_accuracy_ci=[test.low, test.high],
            interval=test.interval,
            p_value=test.p_value,
            true_positive_rate=test.true_positive_rate,
            true_negative_rate=test.true_negative_rate,
            verdict=verdict,
            truth=truth,
        )
        return score, float(record["threshold"])
