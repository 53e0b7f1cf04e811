"""The causal-swap benchmark: every (function, source, target) of a corpus at every chosen layer.

Each prompt is run once, unedited, and that run (its answer scores and the residuals at every
layer) is shared by all its trials. A prompt the model cannot answer (strict top-1) and a trial
that cannot run (a word that is not one token, the same answer token for source and target, an
incapable source, an unknown target) go to the exclusion ledger once, with the reason, and are
never counted. Before any edit, one pass over the layers decomposes every prompt and narrows each
swap's control pool to the tokens matched at every layer it is edited at (a swap's controls are
one token per seed at all its layers: ``swap.controls``), within the first step. The trials of
one prompt at one layer edit the same run, so their edits (real and controls, all targets) go
through one batched forward; steps then yield once per trial slot, and a cancelled job stops
between prompts.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.swap.controls import SharedPool
from mcp_interp.core.swap.corpus import (
    Resolved,
    TrialKey,
    corpus_of,
    load_corpus,
    prompt_text,
    resolve,
    token_reason,
    trial_keys,
)
from mcp_interp.core.swap.lenses import FitLensJob, default_fit, load_lens_file, resolve_lens
from mcp_interp.core.swap.summary import benchmark_notes, summarize
from mcp_interp.core.swap.trial import (
    EditPlan,
    PromptRun,
    TrialTokens,
    answer_score,
    capability_reason,
    check_settings,
    chosen_controls,
    edit_position,
    match_controls,
    new_record,
    plan_edit_trial,
    prompt_run,
    run_edits,
    score_edit_trial,
    swap_name,
    teacher_forced_logits,
)
from mcp_interp.errors import InputError
from mcp_interp.schemas.swap import (
    AnswerScore,
    Exclusion,
    LensInfo,
    SwapBenchmarkMeasurement,
    SwapCorpus,
    SwapSettings,
    TrialBaseline,
    TrialRecord,
)


class SwapBenchmarkJob:
    """Every trial of a corpus at the given layers; ``steps()`` yields once per trial slot."""

    def __init__(
        self,
        *,
        model: LoadedModel,
        corpus: SwapCorpus,
        layers: Sequence[int],
        lens: Any,
        lens_info: LensInfo,
        settings: SwapSettings,
    ) -> None:
        check_settings(model, settings, layers, lens_info)
        self.model, self.corpus, self.lens, self.lens_info, self.settings = model, corpus, lens, lens_info, settings
        self.layers = sorted(set(layers))
        self.resolved: Resolved = resolve(corpus, model.tokenizer)
        self.keys = trial_keys(corpus)
        self.trials: list[TrialRecord] = []
        self.exclusions: list[Exclusion] = []
        self.notes: list[str] = []
        runnable = [k for k in self.keys if token_reason(self.resolved, corpus, k.function, k.source, k.target) is None]
        if not runnable:
            raise InputError(
                f"No trial of corpus {corpus.name!r} can run with this model's tokenizer: every (function, source, "
                f"target) needs a word it cannot use (a concept must be one token, an answer known tokens): "
                f"{self.resolved.unusable}."
            )
        self.result: SwapBenchmarkMeasurement | None = None

    def total_steps(self) -> int:
        return 1 + len(self.keys) * len(self.layers)

    def steps(self) -> Iterator[str]:
        try:
            yield from self._steps()
        finally:  # also when cancelled: a lens object may outlive the call (it is cached)
            self.lens.clear_device_cache()

    def _steps(self) -> Iterator[str]:
        runs, scores = self._baselines()
        blocked = self._blocked_trials(scores)
        pools = self._match_controls(runs, blocked)
        yield (
            f"baselines: {len(runs)} prompts run, {len(self.exclusions)} excluded; controls matched at "
            f"{len(self.layers)} layers"
        )
        words = [*self.resolved.concept_ids.values(), *(t for ids in self.resolved.answer_ids.values() for t in ids)]
        for pool in pools.values():
            pool.exclude(words)  # a concept is another target's real arm: no token is an arm of two targets' tests
        controls = self._draw_controls(pools)
        distances: dict[tuple[int, int], torch.Tensor] = {}
        for layer in self.layers:
            # The trials of one prompt at one layer edit the same run: their edits go through one batched forward.
            for (function, source), group in itertools.groupby(self.keys, key=lambda k: (k.function, k.source)):
                done: list[tuple[TrialKey, TrialRecord | None]] = []
                plans: list[EditPlan] = []
                for key in group:
                    if (key.function, key.source, key.target) in blocked:
                        done.append((key, None))
                        continue
                    record, plan = self._plan(key, layer, runs, scores, distances, pools[key], controls[key])
                    self.trials.append(record)
                    done.append((key, record))
                    plans += [plan] if plan is not None else []
                if plans:
                    run = runs[(function, source)]
                    for plan, logits in zip(plans, run_edits(self.model, run, layer, plans), strict=True):
                        score_edit_trial(self.model, plan, logits, self.settings)
                for key, done_record in done:
                    status = "excluded" if done_record is None else done_record.status
                    yield f"layer {layer}: {key.function} {key.source}→{key.target} {status}"
            self.lens.clear_device_cache()  # the dictionary is vocabulary-sized, one per layer
            distances.clear()
        n_slots = sum(1 for _ in blocked) * len(self.layers)
        self.result = SwapBenchmarkMeasurement(
            corpus=self.corpus.name,
            settings=self.settings,
            lens=self.lens_info,
            summary=summarize(self.trials, self.layers, self.settings.control_seeds, n_slots),
            exclusions=self.exclusions,
            notes=self.notes + benchmark_notes(self.trials, self.settings),
        )

    def _draw_controls(self, pools: dict[TrialKey, SharedPool]) -> dict[TrialKey, list[int] | None]:
        """Each swap's controls, drawn by (seed, swap), keeping clear of the tokens other targets' swaps already drew
        while the pool allows: a token shared by two targets' tested swaps ties their tests together (the summary
        clusters those targets)."""
        owner: dict[int, str] = {}
        out: dict[TrialKey, list[int] | None] = {}
        for key, pool in pools.items():
            avoid = {token for token, target in owner.items() if target != key.target}
            name = swap_name(key.function, key.source, key.target)
            out[key] = chosen = chosen_controls(pool, self.settings.control_seeds, name, avoid)
            for token in chosen or []:
                owner.setdefault(token, key.target)
        return out

    def _match_controls(
        self, runs: dict[tuple[str, str], PromptRun], blocked: dict[tuple[str, str, str], str]
    ) -> dict[TrialKey, SharedPool]:
        """Before any edit: each swap's control pool, narrowed layer by layer to the tokens matched at every layer
        its source atom is active at (``swap.controls``: a control is one token for the whole swap). Decomposes
        every prompt at every layer on the way (the edits reuse the decompositions)."""
        pools = {key: SharedPool() for key in self.keys if (key.function, key.source, key.target) not in blocked}
        for layer in self.layers:
            distances: dict[tuple[int, int], torch.Tensor] = {}
            for (function, source), group in itertools.groupby(pools, key=lambda k: (k.function, k.source)):
                swaps = [(self._tokens(key), pools[key]) for key in group]
                match_controls(self.model, self.lens, runs[(function, source)], layer, swaps, self.settings, distances)
            self.lens.clear_device_cache()
        return pools

    def _tokens(self, key: TrialKey) -> TrialTokens:
        return TrialTokens(
            source_id=self.resolved.concept_ids[key.source],
            target_id=self.resolved.concept_ids[key.target],
            source_answer=self.resolved.answer_ids[(key.function, key.source)],
            target_answer=self.resolved.answer_ids[(key.function, key.target)],
        )

    def _plan(
        self,
        key: TrialKey,
        layer: int,
        runs: dict[tuple[str, str], PromptRun],
        scores: dict[tuple[str, str], AnswerScore],
        distances: dict[tuple[int, int], torch.Tensor],
        pool: SharedPool,
        controls: list[int] | None,
    ) -> tuple[TrialRecord, EditPlan | None]:
        """One trial's record and, when it executes, its solved edits (run later in the prompt's batch)."""
        tokenizer = self.model.tokenizer
        run = runs[(key.function, key.source)]
        record = new_record(
            tokenizer, key.function, key.source, key.target, layer, self._prompt(key.function, key.source), run
        )
        record.baseline = TrialBaseline(
            source_answer=scores[(key.function, key.source)],
            target_answer=self._score(run, self.resolved.answer_ids[(key.function, key.target)]),
            target_prompt_answer=scores[(key.function, key.target)],
        )
        tokens = self._tokens(key)
        plan = plan_edit_trial(
            self.model, self.lens, run, layer, tokens, self.settings, record, distances, pool, controls
        )
        return record, plan

    def _score(self, run: PromptRun, answer: tuple[int, ...]) -> AnswerScore:
        """An answer scored in an unedited run (teacher-forced when it is several tokens)."""
        return answer_score(self.model.tokenizer, teacher_forced_logits(self.model, run, answer), answer)

    def _prompt(self, function: str, concept: str) -> str:
        return prompt_text(next(f for f in self.corpus.functions if f.name == function), concept)

    def _baselines(self) -> tuple[dict[tuple[str, str], PromptRun], dict[tuple[str, str], AnswerScore]]:
        """Run every usable prompt once; ledger the ones the model cannot answer (strict top-1)."""
        tokenizer = self.model.tokenizer
        runs: dict[tuple[str, str], PromptRun] = {}
        scores: dict[tuple[str, str], AnswerScore] = {}
        mismatched: set[str] = set()
        for function in self.corpus.functions:
            for concept in self.corpus.concepts:
                prompt = prompt_text(function, concept)
                reason = token_reason(self.resolved, self.corpus, function.name, concept)
                if reason is not None:
                    self.exclusions.append(
                        Exclusion(kind="prompt", function=function.name, concept=concept, prompt=prompt, reason=reason)
                    )
                    continue
                ids, position = edit_position(tokenizer, function.template, concept, self.settings.position)
                if self.settings.position == "concept" and ids[position] != self.resolved.concept_ids[concept]:
                    mismatched.add(function.name)
                run = prompt_run(self.model, ids, position, self.layers)
                score = self._score(run, self.resolved.answer_ids[(function.name, concept)])
                runs[(function.name, concept)] = run
                scores[(function.name, concept)] = score
                if not score.top1:
                    self.exclusions.append(
                        Exclusion(
                            kind="prompt",
                            function=function.name,
                            concept=concept,
                            prompt=prompt,
                            reason="not capable: " + capability_reason(score),
                            rank=score.rank,
                            margin=score.margin,
                            top_token=score.top_token,
                        )
                    )
        if mismatched:
            self.notes.append(
                f"position='concept': in {sorted(mismatched)} the concept's token in the prompt is not the concept "
                "atom (a sentence-initial word has no leading space, so it is a different token, and the first "
                "position is where attention sinks): those edits act where the atom's own token never was."
            )
        return runs, scores

    def _blocked_trials(self, scores: dict[tuple[str, str], AnswerScore]) -> dict[tuple[str, str, str], str]:
        """(function, source, target) → why its trials cannot run; each goes to the ledger once."""
        blocked: dict[tuple[str, str, str], str] = {}
        for key in self.keys:
            reason = token_reason(self.resolved, self.corpus, key.function, key.source, key.target)
            if reason is None and (
                self.resolved.answer_ids[(key.function, key.source)]
                == self.resolved.answer_ids[(key.function, key.target)]
            ):
                reason = "source and target have the same answer tokens, so a success could not be told apart"
            if reason is None and not scores[(key.function, key.source)].top1:
                reason = "the source prompt is not capable (see its prompt exclusion)"
            if reason is None and self.settings.require_target_known and not scores[(key.function, key.target)].top1:
                reason = "the model does not know the target's answer (see the target prompt's exclusion)"
            if reason is not None:
                blocked[(key.function, key.source, key.target)] = reason
                self.exclusions.append(
                    Exclusion(
                        kind="trial",
                        function=key.function,
                        source=key.source,
                        target=key.target,
                        reason=f"{reason}; excluded at all {len(self.layers)} layers",
                    )
                )
        return blocked


class BenchmarkRun:
    """A benchmark job, preceded by fitting the default Jacobian lens when the run needs one and none is cached.

    One job for the server (one progress bar, cancellable between texts of the fit and between trials); the fit is
    cached on disk, so only the first benchmark of a model pays for it. ``benchmark`` exists once the lens does.
    """

    def __init__(
        self,
        *,
        model: LoadedModel,
        corpus: SwapCorpus,
        layers: Sequence[int] | None,
        lens_kind: str,
        lens_path: str | None,
        settings: SwapSettings,
    ) -> None:
        self.model, self.corpus, self.layers, self.settings = model, corpus, layers, settings
        self.fit: FitLensJob | None = None
        self.benchmark: SwapBenchmarkJob | None = None
        self.fit = default_fit(model, lens_kind, lens_path)
        if self.fit is not None:
            # Check now what would otherwise fail only after minutes of fitting.
            check_settings(model, settings, self._layers(self.fit.layers), _fitted_info(self.fit.layers))
            self._n_keys = len(trial_keys(corpus))
        else:
            lens, info = resolve_lens(model, lens_kind, lens_path)
            self.benchmark = SwapBenchmarkJob(
                model=model,
                corpus=corpus,
                layers=self._layers(info.source_layers),
                lens=lens,
                lens_info=info,
                settings=settings,
            )

    def _layers(self, source_layers: Sequence[int]) -> list[int]:
        return list(self.layers) if self.layers is not None else list(source_layers)

    def total_steps(self) -> int:
        if self.benchmark is not None:
            return self.benchmark.total_steps()
        assert self.fit is not None
        return self.fit.total_steps() + 1 + self._n_keys * len(set(self._layers(self.fit.layers)))

    def steps(self) -> Iterator[str]:
        if self.fit is not None and self.benchmark is None:
            for message in self.fit.steps():
                yield f"no Jacobian lens cached for this model: fitting one first — {message}"
            lens, info = load_lens_file(self.fit.path, self.model)
            self.benchmark = SwapBenchmarkJob(
                model=self.model,
                corpus=self.corpus,
                layers=self._layers(info.source_layers),
                lens=lens,
                lens_info=info,
                settings=self.settings,
            )
        assert self.benchmark is not None
        yield from self.benchmark.steps()
        if self.fit is not None and self.benchmark.result is not None:
            self.benchmark.result.notes.append(
                f"A Jacobian lens was fitted for this run ({len(self.fit.texts)} texts, {self.fit.fit_seconds:.0f} s) "
                f"and cached at {self.fit.path}; later runs reuse it. fit_lens fits a larger one."
            )

    @property
    def result(self) -> SwapBenchmarkMeasurement | None:
        return self.benchmark.result if self.benchmark is not None else None


def _fitted_info(source_layers: Sequence[int]) -> LensInfo:
    """Enough of a future lens's identity to check layers against before fitting it."""
    return LensInfo(kind="jacobian", sha256=None, path=None, source_layers=list(source_layers))


def prepare_benchmark(
    model: LoadedModel,
    corpus: str | SwapCorpus | dict[str, Any],
    layers: Sequence[int] | None,
    lens_kind: str,
    lens_path: str | None,
    settings: SwapSettings,
) -> BenchmarkRun:
    """A benchmark from a tool's arguments: a shipped corpus by name or a corpus object, the lens by kind (and
    file), by default every layer the lens can edit. Runs no forward pass (a lens it must fit is fitted in steps)."""
    corpus_object = load_corpus(corpus) if isinstance(corpus, str) else corpus_of(corpus)
    return BenchmarkRun(
        model=model, corpus=corpus_object, layers=layers, lens_kind=lens_kind, lens_path=lens_path, settings=settings
    )
