"""The controlled causal-swap protocol: one trial, and a benchmark over a corpus.

Claim under test: editing the model's representation of concept *source* toward *target* at
layer ℓ makes the model answer as if the prompt were about *target*. A trial:

1. **Baseline filter.** The unedited source prompt must give its own answer as the strict
   argmax; otherwise the prompt is excluded (with its rank), never counted. By default the model
   must also know the target's fact (the target's own prompt gives the target answer, strict
   top-1): a swap toward a fact the model does not know cannot be scored as the swap's failure.
2. **Real edit.** The activation at (ℓ, position) is decomposed into lens atoms
   (``get_sparse_decomposition`` via ``JacobianLens.decompose``). If the source atom is not in
   the active support the trial is ``skipped_source_inactive``. Otherwise the library's anchored
   coordinate patch (``solve_coordinate_patch``, mode ``substitute``: h += α·c_src·(v_tgt − v_src))
   is applied and the target's answer scored.
3. **Displacement-matched controls**, one per seed, edited and scored identically
   (``core.swap_controls``); no qualifying token → ``skipped_no_control_token``.

Implementation note: the real and control edits of one trial differ only in the target atom, so
their patched activations are computed with the library's ``solve_coordinate_patch`` (what
``coordinate_patch_hooks`` calls inside its hook) and run as one batch with a hook that writes
them at (ℓ, position). Upstream of that hook the batch equals the unedited run, so this is the
same computation as one ``coordinate_patch_hooks`` run per edit (a test checks it), six times
cheaper. Any other error propagates: a skip status is only ever one of the two named conditions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch
from pydantic import ValidationError

from mcp_interp.core import swap_stats
from mcp_interp.core.swap_controls import ControlPool, control_pool, distances_from, draw_control
from mcp_interp.core.swap_corpus import Resolved, prompt_text, resolve, single_token, token_reason, trial_keys
from mcp_interp.core.tokens import token_ids
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.swap import (
    SLOT,
    AnswerScore,
    Atom,
    ClusterTest,
    ControlDraw,
    Exclusion,
    LayerSummary,
    LensInfo,
    PairedTest,
    RateSummary,
    SeedMcNemar,
    SeedRate,
    SeedSpread,
    SwapBenchmarkMeasurement,
    SwapCorpus,
    SwapFunction,
    SwapSettings,
    SwapSummary,
    SwapTrialMeasurement,
    TrialBaseline,
    TrialRecord,
)

EXECUTED: Final = "executed"
INACTIVE: Final = "skipped_source_inactive"
NO_CONTROL: Final = "skipped_no_control_token"
TRIAL_STATUSES = (EXECUTED, INACTIVE, NO_CONTROL)
SUPPORT_SHOWN = 10


def hook_out(layer: int) -> str:
    return f"blocks.{layer}.hook_out"


def check_settings(model: LoadedModel, settings: SwapSettings, layers: Sequence[int], lens_info: LensInfo) -> None:
    if not settings.control_seeds:
        raise InputError("`control_seeds` must name at least one seed: the controls are the point of the protocol.")
    if len(set(settings.control_seeds)) != len(settings.control_seeds):
        raise InputError("`control_seeds` must be distinct.")
    if not 1 <= settings.k <= 25:
        raise InputError(f"`k` (atoms in the sparse decomposition) must be between 1 and 25, got {settings.k}.")
    if not settings.control_tolerance >= 0:
        raise InputError(f"`control_tolerance` must be >= 0, got {settings.control_tolerance}.")
    if not layers:
        raise InputError("Name at least one layer.")
    bad = [layer for layer in layers if layer not in lens_info.source_layers]
    if bad:
        first, last = lens_info.source_layers[0], lens_info.source_layers[-1]
        raise InputError(
            f"Layers {bad} cannot be edited with this lens: it covers the outputs of blocks {first}..{last} "
            f"(the last block, {model.bridge.cfg.n_layers - 1}, is the model's output itself)."
        )


def word_token(tokenizer: Any, word: str, what: str) -> int:
    """The single token of ``" " + word.strip()`` (how the corpus writes concepts and answers)."""
    token, why = single_token(tokenizer, word)
    if token is None:
        raise InputError(
            f"The {what} {word!r} must be one known token with a leading space, but {why}. "
            "Pick a word that is a single token (the `tokenize` tool shows how text splits)."
        )
    return token


def edit_position(tokenizer: Any, template: str, concept: str, position: str | int) -> tuple[list[int], int]:
    """The prompt's token ids and the index of the activation to edit.

    ``"last"``: the last token (where the answer is read). ``"concept"``: the last token of the
    concept word in the prompt (found from the tokenizer's character offsets), where the concept
    is complete. An int: that index (negative counts from the end).
    """
    prompt = template.replace(SLOT, concept)
    ids = token_ids(tokenizer, prompt)
    n = len(ids)
    if position == "last":
        return ids, n - 1
    if position == "concept":
        start = template.index(SLOT)
        end = start + len(concept)
        try:
            encoded = tokenizer(prompt, add_special_tokens=True, return_offsets_mapping=True)
        except (NotImplementedError, ValueError):  # slow (Python) tokenizers have no offsets
            encoded = {"input_ids": ids}
        offsets = encoded.get("offset_mapping")
        if offsets is None or list(encoded["input_ids"]) != ids:
            raise InputError("position='concept' needs a tokenizer with character offsets; pass an index instead.")
        covering = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
        if not covering:
            raise InputError(f"No token of {prompt!r} covers the concept {concept!r}; pass an index instead.")
        return ids, covering[-1]
    if isinstance(position, int) and not isinstance(position, bool):
        index = position + n if position < 0 else position
        if not 0 <= index < n:
            raise InputError(f"position {position} is outside the prompt {prompt!r}, which has {n} tokens.")
        return ids, index
    raise InputError(f"position must be 'last', 'concept' or a token index, got {position!r}.")


def answer_score(tokenizer: Any, logits: torch.Tensor, answer_id: int) -> AnswerScore:
    score = swap_stats.score_answer(logits, answer_id)
    return AnswerScore(
        token=tokenizer.decode([answer_id]),
        token_id=answer_id,
        logit=score.logit,
        rank=score.rank,
        margin=score.margin,
        top1=score.strict_top1,
        top_token=tokenizer.decode([score.top_token]),
    )


@dataclass
class PromptRun:
    """One unedited forward of a prompt and the residuals the trials at each layer will edit."""

    ids: list[int]
    position: int
    last_logits: torch.Tensor  # [vocab] float32 CPU
    activations: dict[int, torch.Tensor]  # layer → [d_model] at `position`
    decompositions: dict[int, Any] = field(default_factory=dict)


def prompt_run(model: LoadedModel, ids: list[int], position: int, layers: Sequence[int]) -> PromptRun:
    names = {hook_out(layer) for layer in layers}
    tokens = torch.tensor([ids], device=model.device)
    with torch.no_grad():
        logits, cache = model.bridge.run_with_cache(tokens, names_filter=lambda name: name in names)
    return PromptRun(
        ids=ids,
        position=position,
        last_logits=logits[0, -1].float().cpu(),
        activations={layer: cache[hook_out(layer)][0, position].detach().clone() for layer in layers},
    )


def edited_last_logits(model: LoadedModel, run: PromptRun, layer: int, patched: torch.Tensor) -> torch.Tensor:
    """Next-token logits ``[n_edits, vocab]`` with row i's activation at (layer, position) set to ``patched[i]``."""
    tokens = torch.tensor([run.ids], device=model.device).expand(patched.shape[0], -1)

    def write(activation: torch.Tensor, hook: Any) -> torch.Tensor:
        activation = activation.clone()
        activation[:, run.position, :] = patched.to(device=activation.device, dtype=activation.dtype)
        return activation

    with torch.no_grad(), model.bridge.hooks(fwd_hooks=[(hook_out(layer), write)]):
        logits = model.bridge(tokens, return_type="logits")
    return logits[:, -1].float().cpu()


def top_atoms(tokenizer: Any, decomposition: Any, dictionary: torch.Tensor) -> list[Atom]:
    support = decomposition.support.tolist()
    coordinates = decomposition.coordinates.detach().float().cpu().tolist()
    norms = torch.linalg.vector_norm(dictionary[decomposition.support.to(dictionary.device)].float(), dim=1).cpu()
    atoms = [
        Atom(token=tokenizer.decode([t]), token_id=int(t), coordinate=c, contribution=c * float(n))
        for t, c, n in zip(support, coordinates, norms.tolist(), strict=True)
    ]
    return sorted(atoms, key=lambda a: -a.contribution)[:SUPPORT_SHOWN]


@dataclass(frozen=True)
class TrialTokens:
    source_id: int
    target_id: int
    source_answer_id: int
    target_answer_id: int


def never_drawn(tokenizer: Any, d_vocab: int) -> list[int]:
    """Ids a control may never be: special tokens, and unembedding rows beyond the tokenizer's vocabulary
    (padding rows of a padded vocabulary are untrained, some have zero norm)."""
    return sorted({int(i) for i in tokenizer.all_special_ids} | set(range(len(tokenizer), d_vocab)))


def run_edit_trial(
    model: LoadedModel,
    lens: Any,
    run: PromptRun,
    layer: int,
    tokens: TrialTokens,
    settings: SwapSettings,
    record: TrialRecord,
    distance_cache: dict[tuple[int, int], torch.Tensor],
) -> TrialRecord:
    """Steps 2–3 of a trial whose baseline passed; fills ``record`` and returns it.

    ``distance_cache`` maps (layer, source id) to ‖v_t − v_source‖ for every t (it depends on nothing
    else, so a benchmark shares it across prompts and targets of one layer).
    """
    from transformer_lens.tools.analysis.jacobian_lens_coordinate_patch import solve_coordinate_patch

    tokenizer = model.tokenizer
    dictionary = lens.lens_vector_dictionary(model.bridge, layer)
    x = run.activations[layer].float().to(dictionary.device)
    if layer not in run.decompositions:
        run.decompositions[layer] = lens.decompose(model.bridge, x, layer, k=settings.k)
    decomposition = run.decompositions[layer]
    support = [int(t) for t in decomposition.support.tolist()]
    record.support = top_atoms(tokenizer, decomposition, dictionary)
    record.support_size = len(support)
    if tokens.source_id not in support:
        shown = ", ".join(repr(a.token) for a in record.support)
        record.status = INACTIVE
        record.detail = (
            f"the source atom {tokenizer.decode([tokens.source_id])!r} is not in the active support of the "
            f"activation at layer {layer}, position {run.position} ({len(support)} atoms; top: {shown})"
        )
        return record
    record.source_coordinate = float(decomposition.coordinates[support.index(tokens.source_id)])
    key = (layer, tokens.source_id)
    if key not in distance_cache:
        distance_cache[key] = distances_from(dictionary, tokens.source_id)
    distances = distance_cache[key]
    excluded = {tokens.source_answer_id, tokens.target_answer_id, *support}
    excluded.update(never_drawn(tokenizer, dictionary.shape[0]))
    pool: ControlPool = control_pool(
        dictionary, tokens.source_id, tokens.target_id, excluded, settings.control_tolerance, distances
    )
    record.target_displacement = pool.reference_distance
    record.control_pool_size = int(pool.candidates.numel())
    if pool.candidates.numel() == 0:
        nearest = "no token left to compare" if pool.nearest_ratio is None else f"{pool.nearest_ratio:.4f}"
        record.status = NO_CONTROL
        record.detail = (
            f"no token's displacement from the source matches ‖v_target − v_source‖ = {pool.reference_distance:.4f} "
            f"within tolerance {settings.control_tolerance} (closest relative mismatch: {nearest}); the tolerance is "
            "never widened silently — pass a larger control_tolerance to allow looser controls"
        )
        return record
    controls = [draw_control(pool, seed) for seed in settings.control_seeds]
    edits = [tokens.target_id, *controls]
    patches = [
        solve_coordinate_patch(
            x, dictionary, tokens.source_id, edit, decomposition=decomposition, k=settings.k, alpha=settings.alpha
        )
        for edit in edits
    ]
    logits = edited_last_logits(model, run, layer, torch.stack([x + patch.delta for patch in patches]))
    record.status = EXECUTED
    record.real = answer_score(tokenizer, logits[0], tokens.target_answer_id)
    record.real_source_answer = answer_score(tokenizer, logits[0], tokens.source_answer_id)
    record.target_was_active = not patches[0].target_was_appended
    record.real_edit_norm = float(torch.linalg.vector_norm(patches[0].delta))
    record.controls = [
        ControlDraw(
            seed=seed,
            token=tokenizer.decode([token]),
            token_id=token,
            displacement=float(distances[token]),
            edit_norm=float(torch.linalg.vector_norm(patch.delta)),
            score=answer_score(tokenizer, logits[i + 1], tokens.target_answer_id),
        )
        for i, (seed, token, patch) in enumerate(zip(settings.control_seeds, controls, patches[1:], strict=True))
    ]
    return record


# --- one trial ----------------------------------------------------------------------------------


def causal_swap_trial(
    model: LoadedModel,
    lens: Any,
    lens_info: LensInfo,
    template: str,
    source: str,
    target: str,
    source_answer: str,
    target_answer: str,
    layer: int,
    settings: SwapSettings,
) -> SwapTrialMeasurement:
    check_settings(model, settings, [layer], lens_info)
    try:
        function = SwapFunction(
            name="trial", template=template, answers={source.strip(): source_answer, target.strip(): target_answer}
        )
    except ValidationError as exc:
        raise InputError(f"Bad template: {exc.errors()[0]['msg']}.") from None
    tokenizer = model.tokenizer
    tokens = TrialTokens(
        source_id=word_token(tokenizer, source, "source concept"),
        target_id=word_token(tokenizer, target, "target concept"),
        source_answer_id=word_token(tokenizer, source_answer, "source answer"),
        target_answer_id=word_token(tokenizer, target_answer, "target answer"),
    )
    if tokens.source_id == tokens.target_id:
        raise InputError("source and target are the same token: a swap needs two different concepts.")
    if tokens.source_answer_id == tokens.target_answer_id:
        raise InputError("source_answer and target_answer are the same token: success would be indistinguishable.")
    ids, position = edit_position(tokenizer, template, source.strip(), settings.position)
    run = prompt_run(model, ids, position, [layer])
    record = new_record(tokenizer, function.name, source, target, layer, prompt_text(function, source.strip()), run)
    baseline = TrialBaseline(
        source_answer=answer_score(tokenizer, run.last_logits, tokens.source_answer_id),
        target_answer=answer_score(tokenizer, run.last_logits, tokens.target_answer_id),
    )
    if settings.require_target_known:
        target_ids, _ = edit_position(tokenizer, template, target.strip(), "last")
        target_run = prompt_run(model, target_ids, len(target_ids) - 1, [])
        baseline.target_prompt_answer = answer_score(tokenizer, target_run.last_logits, tokens.target_answer_id)
    record.baseline = baseline
    notes = []
    if not baseline.source_answer.top1:
        record.status = "excluded_not_capable"
        record.detail = capability_reason(baseline.source_answer)
    elif baseline.target_prompt_answer is not None and not baseline.target_prompt_answer.top1:
        record.status = "excluded_target_unknown"
        record.detail = "target fact not known: " + capability_reason(baseline.target_prompt_answer)
    else:
        try:
            run_edit_trial(model, lens, run, layer, tokens, settings, record, {})
        finally:
            lens.clear_device_cache()  # the dictionary is vocabulary-sized
    if record.status == EXECUTED:
        assert record.real is not None
        wins = sum(c.score.top1 for c in record.controls)
        notes.append(
            f"One trial is an anecdote: real edit {'succeeded' if record.real.top1 else 'failed'}, "
            f"{wins}/{len(record.controls)} controls succeeded. Use causal_swap_benchmark for rates with intervals."
        )
    return SwapTrialMeasurement(trial=record, settings=settings, lens=lens_info, notes=notes)


def capability_reason(score: AnswerScore) -> str:
    return (
        f"the answer {score.token!r} is not the strict top-1 unedited (rank {score.rank}, margin {score.margin:+.3f}; "
        f"top token {score.top_token!r})"
    )


def new_record(
    tokenizer: Any, function: str, source: str, target: str, layer: int, prompt: str, run: PromptRun
) -> TrialRecord:
    return TrialRecord(
        function=function,
        source=source.strip(),
        target=target.strip(),
        layer=layer,
        prompt=prompt,
        position=run.position,
        position_token=tokenizer.decode([run.ids[run.position]]),
        status=EXECUTED,  # provisional; every path below sets the real status
    )


# --- the benchmark --------------------------------------------------------------------------------


class SwapBenchmarkJob:
    """Every trial of a corpus at the given layers; ``steps()`` yields once per trial slot."""

    def __init__(
        self,
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
                f"target) needs a word that is not a single token. Not single tokens: {self.resolved.unusable}."
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
        tokenizer = self.model.tokenizer
        runs, scores = self._baselines()
        yield f"baselines: {len(runs)} prompts run, {len(self.exclusions)} excluded"
        blocked = self._blocked_trials(scores)
        distances: dict[tuple[int, int], torch.Tensor] = {}
        for layer in self.layers:
            for key in self.keys:
                reason = blocked.get((key.function, key.source, key.target))
                if reason is not None:
                    yield f"layer {layer}: {key.function} {key.source}→{key.target} excluded"
                    continue
                run = runs[(key.function, key.source)]
                record = new_record(
                    tokenizer, key.function, key.source, key.target, layer, self._prompt(key.function, key.source), run
                )
                record.baseline = TrialBaseline(
                    source_answer=scores[(key.function, key.source)],
                    target_answer=answer_score(
                        tokenizer, run.last_logits, self.resolved.answer_ids[(key.function, key.target)]
                    ),
                    target_prompt_answer=scores[(key.function, key.target)],
                )
                tokens = TrialTokens(
                    source_id=self.resolved.concept_ids[key.source],
                    target_id=self.resolved.concept_ids[key.target],
                    source_answer_id=self.resolved.answer_ids[(key.function, key.source)],
                    target_answer_id=self.resolved.answer_ids[(key.function, key.target)],
                )
                self.trials.append(
                    run_edit_trial(self.model, self.lens, run, layer, tokens, self.settings, record, distances)
                )
                yield f"layer {layer}: {key.function} {key.source}→{key.target} {record.status}"
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
                score = answer_score(tokenizer, run.last_logits, self.resolved.answer_ids[(function.name, concept)])
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
                reason = "source and target have the same answer token, so a success could not be told apart"
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


# --- summary ------------------------------------------------------------------------------------------


def rate_summary(successes: Sequence[bool], prompts: set[tuple[str, str]]) -> RateSummary:
    r = swap_stats.rate(successes)
    return RateSummary(
        successes=r.successes, n=r.n, rate=r.rate, ci_low=r.low, ci_high=r.high, n_independent_prompts=len(prompts)
    )


def summarize(trials: Sequence[TrialRecord], layers: Sequence[int], seeds: Sequence[int], excluded: int) -> SwapSummary:
    """Rates, intervals and the paired test over executed trials. Model-free (tests feed records)."""
    executed = [t for t in trials if t.status == EXECUTED]
    prompts = {(t.function, t.source) for t in executed}
    real = [bool(t.real and t.real.top1) for t in executed]
    control_rows = [[c.score.top1 for c in t.controls] for t in executed]
    by_seed = []
    per_seed_tests = []
    for i, seed in enumerate(seeds):
        column = [row[i] for row in control_rows]
        by_seed.append(SeedRate(seed=seed, rate=rate_summary(column, prompts)))
        test = swap_stats.sign_test(real, [[c] for c in column])
        per_seed_tests.append(
            SeedMcNemar(seed=seed, real_only=test.real_better, control_only=test.control_better, p_value=test.p_value)
        )
    seed_rates = [s.rate.rate for s in by_seed if s.rate.rate is not None]
    mean, sd, low, high = swap_stats.spread(seed_rates) if seed_rates else (None, None, None, None)
    paired = swap_stats.sign_test(real, control_rows)
    clustered = swap_stats.by_cluster(real, control_rows, [f"{t.function}/{t.source}" for t in executed])
    by_layer = []
    for layer in layers:
        at = [t for t in trials if t.layer == layer]
        done = [t for t in at if t.status == EXECUTED]
        layer_prompts = {(t.function, t.source) for t in done}
        by_layer.append(
            LayerSummary(
                layer=layer,
                executed=len(done),
                skipped_source_inactive=sum(t.status == INACTIVE for t in at),
                skipped_no_control_token=sum(t.status == NO_CONTROL for t in at),
                real=rate_summary([bool(t.real and t.real.top1) for t in done], layer_prompts),
                control=rate_summary([c.score.top1 for t in done for c in t.controls], layer_prompts),
            )
        )
    return SwapSummary(
        status_counts={status: sum(t.status == status for t in trials) for status in TRIAL_STATUSES},
        layers=list(layers),
        layers_executed=[s.layer for s in by_layer if s.executed],
        real=rate_summary(real, prompts),
        control=rate_summary([c for row in control_rows for c in row], prompts),
        control_by_seed=by_seed,
        control_seed_spread=SeedSpread(mean=mean, sd=sd, min=low, max=high),
        paired=PairedTest(
            test="exact two-sided sign test of real − mean(control over seeds) per executed trial (ties dropped); "
            "with one seed this is the exact McNemar test",
            real_better=paired.real_better,
            control_better=paired.control_better,
            ties=paired.ties,
            p_value=paired.p_value,
            per_seed=per_seed_tests,
            by_prompt=ClusterTest(
                real_better=clustered.real_better,
                control_better=clustered.control_better,
                ties=clustered.ties,
                p_value=clustered.p_value,
            ),
        ),
        by_layer=by_layer,
        n_independent_prompts=len(prompts),
        real_success_prompts=sorted({f"{t.function}/{t.source}" for t in executed if t.real and t.real.top1}),
        excluded_trials=excluded,
        target_was_active=sum(bool(t.target_was_active) for t in executed),
    )


def benchmark_notes(trials: Sequence[TrialRecord], settings: SwapSettings) -> list[str]:
    executed = [t for t in trials if t.status == EXECUTED]
    notes = []
    if executed:
        notes.append(
            "Trials of one prompt at several layers and targets are not independent; the intervals and the sign test "
            "treat them as if they were, so read every rate next to its n_independent_prompts."
        )
    winners = {(t.function, t.source) for t in executed if t.real and t.real.top1}
    if 0 < len(winners) < 3:
        names = ", ".join(f"{f}/{s}" for f, s in sorted(winners))
        wins = sum(bool(t.real and t.real.top1) for t in executed)
        notes.append(
            f"All {wins} real successes come from {len(winners)} prompt(s) ({names}): compare them with that prompt's "
            "own control draws in the artifact before calling it a swap."
        )
    active = sum(bool(t.target_was_active) for t in executed)
    if active:
        notes.append(
            f"In {active} executed trial(s) the target atom was already active, so the substitute edit overwrote its "
            "coordinate instead of adding to it (target_was_active in the artifact): those edits differ in size from "
            "their controls."
        )
    if not executed:
        notes.append(
            "No trial was executed, so there is no rate to report: see status_counts and the per-trial skip reasons "
            "in the artifact (a source concept that is never in the active support is itself a finding about the lens)."
        )
    prompts = {(t.function, t.source) for t in executed}
    if executed and len(prompts) < 5:
        notes.append(
            f"The {len(executed)} executed trials come from only {len(prompts)} distinct prompt(s): trials sharing a "
            "prompt are not independent, so the intervals overstate the evidence."
        )
    if settings.lens == "logit":
        notes.append("Lens: logit lens (J = I); atoms are unembedding columns, which ignore the final norm.")
    return notes
