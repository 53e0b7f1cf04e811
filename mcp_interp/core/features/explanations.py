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
from mcp_interp.core.engine.numbers.stats import stratified_auroc_test, stratified_detection_test, worded
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
QUIET = 0.5  # non-firing quiz texts: at most this quantile of the texts under the threshold (well below it)
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
                list(self.activating_texts), list(self.non_activating_texts), result.notes
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

    def _generation(
        self, activating: list[str], non_activating: list[str], notes: list[str]
    ) -> Generator[str, None, GenerationScore]:
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
        counts = np.array([len(v) for v in read[0].values], dtype=np.int64)  # tokens per text: the strata
        first, second = counts[: len(activating)], counts[len(activating) :]
        test = stratified_auroc_test(x, y, first, second)
        verdict = worded(
            "naming_generation",
            test.p_value,
            test.p_floor,
            f"the activating texts rank above the non-activating ones of the same token count (AUROC {test.auroc:.3f} "
            f"over {test.pairs} same-length pairs)",
            f"not shown to separate the two sets within equal token counts (AUROC {test.auroc:.3f} over "
            f"{test.pairs} same-length pairs)",
        )
        unmatched = len(activating) + len(non_activating) - test.n_x - test.n_y
        if unmatched:
            notes.append(
                f"{unmatched} of the {len(activating) + len(non_activating)} written texts have no text of their token "
                "count in the other set and do not count: a longer text has more positions and so a larger maximum, "
                "so texts are compared only with texts of their length — write both sets with matching token counts "
                "(activating_tokens, non_activating_tokens)."
            )
        texts = [*activating, *non_activating]
        return GenerationScore(
            auroc=test.auroc,
            auroc_ci=[test.low, test.high],
            p_value=test.p_value,
            p_floor=test.p_floor,
            p_method=test.method,
            pairs=test.pairs,
            activating_tokens=first.tolist(),
            non_activating_tokens=second.tolist(),
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
        """A quiz as Delphi's detection scorer builds one, relative to the unit's own distribution of per-text maxima
        (the reference pool's: the search pool for a shipped corpus): firing texts from its top (maximum above the
        threshold, by default the 90th percentile), non-firing ones from well below it (at most the ``QUIET``
        quantile of the texts under the threshold: below the 45th percentile by default), so a dense unit's texts
        just under the threshold are never called non-firing. Each firing text is paired with a non-firing text of
        the same token count (a longer text has a larger maximum), and the quiz is shuffled; nothing about the
        answers (not even how many fire) is shown before they are given."""
        pool, reference = self._quiz_pools()
        threshold = self.threshold
        distribution: np.ndarray | None = None
        if threshold is None:
            source = pool if reference is None else reference
            read: list[TextActivations] = []
            yield from activation_steps(self.model, self.named, source.texts, read)
            scored, maxima, _ = read[0].maxima()
            distribution = maxima[scored]
            threshold = default_threshold(distribution)
            notes.append(
                f"threshold = {threshold:.4g}: {THRESHOLD_RULE.replace('search pool', source.kind + ' pool')}."
            )
        read = []
        yield from activation_steps(self.model, self.named, pool.texts, read)
        scored, maxima, _ = read[0].maxima()
        counts = np.array([len(v) for v in read[0].values], dtype=np.int64)
        if distribution is None:
            distribution = maxima[scored]
        quiet = float(np.quantile(distribution, QUIET * float(np.mean(distribution <= threshold))))
        excluded = self._excluded(pool)
        eligible = np.array([scored[i] and pool.texts[i] not in excluded for i in range(len(pool.texts))], dtype=bool)
        if (~eligible & scored).any():
            notes.append(
                f"{int((~eligible & scored).sum())} texts already shown or revealed for this feature were "
                "left out of the draw."
            )
        seed = secrets.randbelow(2**31) if self.seed is None else self.seed
        rng = np.random.default_rng(seed)
        above = rng.permutation(np.flatnonzero(eligible & (maxima > threshold)))
        below: dict[int, list[int]] = {}
        for i in rng.permutation(np.flatnonzero(eligible & (maxima <= quiet))):
            below.setdefault(int(counts[i]), []).append(int(i))
        pairs: list[tuple[int, int]] = []
        for i in above.tolist():
            if len(pairs) == n // 2:
                break
            if below.get(int(counts[i])):
                pairs.append((i, below[int(counts[i])].pop()))
        if not pairs:
            raise InputError(
                f"No eligible quiz text above the threshold {threshold:.4g} has a text of its token count at or below "
                f"{quiet:.4g} (well below it): choose another `threshold` or more `texts`."
            )
        chosen = np.array([i for pair in pairs for i in pair])[rng.permutation(2 * len(pairs))]
        if chosen.size < n:
            notes.append(
                f"The quiz has {chosen.size} texts, not {n}: the pool had too few length-matched texts above the "
                "threshold and well below it."
            )
        notes.append(
            f"Fires: maximum > {threshold:.4g}; the quiz's other texts are well below it (maximum ≤ {quiet:.4g}, "
            "the lower half of the texts under the threshold), each of the same token count as a firing one."
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
            "quiet": quiet,
            "texts": texts,
            "fires": [bool(maxima[i] > threshold) for i in chosen],
            "max_activations": [float(maxima[i]) for i in chosen],
            "tokens": [int(counts[i]) for i in chosen],
            "scored_by": None,
        }
        handle = QuizHandle(quiz_id=QUIZ_PENDING, texts=texts, seed=seed, pool=f"{pool.name}:{pool.kind}")
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
        if not any(fires) or all(fires):
            raise InputError(f"{quiz_id} holds texts of one class only: draw a new quiz.")
        tokens = record.get("tokens")
        if tokens is None:  # a quiz drawn before quizzes were matched on length: one stratum
            notes.append("This quiz was drawn before texts were matched on token count: its p ignores length.")
            tokens = [0] * len(texts)
        stratified = stratified_detection_test(fires, said, [int(t) for t in tokens])
        test = stratified.test
        verdict = worded(
            "naming_detection",
            stratified.p_value,
            stratified.p_floor,
            f"the predictions beat chance within equal token counts (balanced accuracy {test.balanced_accuracy:.3f})",
            f"not shown better than chance (balanced accuracy {test.balanced_accuracy:.3f})",
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
            p_value=stratified.p_value,
            p_floor=stratified.p_floor,
            true_positive_rate=test.true_positive_rate,
            true_negative_rate=test.true_negative_rate,
            verdict=verdict,
            truth=truth,
        )
        return score, float(record["threshold"])
