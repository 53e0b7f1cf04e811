"""One trial of the controlled causal-swap protocol (``benchmark`` runs many over a corpus).

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
3. **Displacement-matched controls**, one token per seed for the whole swap (function, source,
   target), matched at every layer it is edited at (``swap.controls``), edited and scored
   identically; too few qualifying tokens → ``skipped_no_control_token``.
4. **Graded effect.** Beside strict success, each edit's ``margin gain``: the target answer's
   margin after the edit minus before it (logits; > 0 = the edit moved the answer toward the
   target's), for the real edit (``margin_gain``) and each control (``control_margin_gains``).

Implementation note: the real and control edits of one trial differ only in the target atom, so
their patched activations are computed with the library's ``solve_coordinate_patch`` (what
``coordinate_patch_hooks`` calls inside its hook) and run as one batch with a hook that writes
them at (ℓ, position). Upstream of that hook the batch equals the unedited run, so this is the
same computation as one ``coordinate_patch_hooks`` run per edit (a test checks it), six times
cheaper. Any other error propagates: a skip status is only ever one of the two named conditions.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch
from pydantic import ValidationError

from mcp_interp.core.engine.backend import jacobian_lens
from mcp_interp.core.engine.backend.edits import Set
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.points import hook_out
from mcp_interp.core.engine.text.tokens import token_ids
from mcp_interp.core.swap import stats
from mcp_interp.core.swap.controls import SharedPool, control_pool, distances_from, draw_controls
from mcp_interp.core.swap.corpus import prompt_text, single_token, word_tokens
from mcp_interp.core.swap.lenses import resolve_lens
from mcp_interp.errors import InputError, NumericalError
from mcp_interp.schemas.swap import (
    SLOT,
    AnswerScore,
    Atom,
    ControlDraw,
    LensInfo,
    PatchDiagnostics,
    SwapFunction,
    SwapSettings,
    SwapTrialMeasurement,
    TrialBaseline,
    TrialRecord,
)

EXECUTED: Final = "executed"
INACTIVE: Final = "skipped_source_inactive"
NO_CONTROL: Final = "skipped_no_control_token"
TRIAL_STATUSES = (EXECUTED, INACTIVE, NO_CONTROL)
SUPPORT_SHOWN = 10
# α = 1 moves the source's whole coordinate to the target (the substitution); α in [0, 1] interpolates inside the
# non-negative decomposition and |α| > 1 extrapolates past it (the solver warns; the warning is recorded per edit).
# The edit is exactly proportional to α, real and controls alike, so a dose-response over α stays controlled. At
# α = 1 the default benchmark's edits are ~4.5 in norm and move the target's margin by well under a logit, while a
# swap needs ~8, so α is allowed far past 1; the bound only keeps a typo (α = 1e6) from being a run of NaNs.
MAX_ALPHA = 100.0


def check_settings(model: LoadedModel, settings: SwapSettings, layers: Sequence[int], lens_info: LensInfo) -> None:
    if not settings.control_seeds:
        raise InputError("`control_seeds` must name at least one seed: the controls are the point of the protocol.")
    if len(set(settings.control_seeds)) != len(settings.control_seeds):
        raise InputError("`control_seeds` must be distinct.")
    if not 1 <= settings.k <= 25:
        raise InputError(f"`k` (atoms in the sparse decomposition) must be between 1 and 25, got {settings.k}.")
    if not -MAX_ALPHA <= settings.alpha <= MAX_ALPHA:
        raise InputError(f"`alpha` must be within ±{MAX_ALPHA:g} (1 = full substitution), got {settings.alpha}.")
    if not settings.control_tolerance >= 0:
        raise InputError(f"`control_tolerance` must be >= 0, got {settings.control_tolerance}.")
    if not layers:
        raise InputError("Name at least one layer.")
    bad = [layer for layer in layers if layer not in lens_info.source_layers]
    if bad:
        first, last = lens_info.source_layers[0], lens_info.source_layers[-1]
        raise InputError(
            f"Layers {bad} cannot be edited with this lens: it covers the outputs of blocks {first}..{last} "
            f"(the last block, {model.cfg.n_layers - 1}, is the model's output itself)."
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


def answer_tokens(tokenizer: Any, word: str, what: str) -> tuple[int, ...]:
    """The tokens of ``" " + word.strip()``: one, or several (scored as a sequence)."""
    tokens, why = word_tokens(tokenizer, word)
    if tokens is None:
        raise InputError(f"The {what} {word!r} cannot be scored: {why}. Check it with the `tokenize` tool.")
    return tokens


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


def answer_score(tokenizer: Any, logits: torch.Tensor, answer: int | Sequence[int]) -> AnswerScore:
    """Score an answer from its step logits: ``[len(answer), vocab]`` teacher-forced, or ``[vocab]`` for one token."""
    tokens = [answer] if isinstance(answer, int) else list(answer)
    steps = logits.unsqueeze(0) if logits.ndim == 1 else logits
    score = stats.score_sequence(steps, tokens)
    return AnswerScore(
        token=tokenizer.decode(tokens),
        token_id=tokens[0],
        n_tokens=len(tokens),
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
    names = [hook_out(layer) for layer in layers]
    tokens = torch.tensor([ids], device=model.device)
    run = model.backend.run(tokens, capture=names, mode="no_grad")
    logits, cache = run.logits, run.acts
    assert logits is not None
    return PromptRun(
        ids=ids,
        position=position,
        last_logits=require_finite(logits[0, -1].float().cpu(), model.tokenizer, ids, "in the unedited run"),
        activations={layer: cache[hook_out(layer)][0, position].detach().clone() for layer in layers},
    )


def teacher_forced_logits(model: LoadedModel, run: PromptRun, answer: Sequence[int]) -> torch.Tensor:
    """Unedited step logits of an answer, ``[len(answer), vocab]``: the prompt's last-position logits, then
    (for several tokens) one forward of the prompt followed by the answer's earlier tokens."""
    if len(answer) == 1:
        return run.last_logits.unsqueeze(0)
    tokens = torch.tensor([run.ids + list(answer[:-1])], device=model.device)
    logits = model.backend.logits(tokens, mode="no_grad")[0, len(run.ids) - 1 :]
    return require_finite(logits.float().cpu(), model.tokenizer, run.ids, "teacher-forcing the answer")


def edited_last_logits(model: LoadedModel, run: PromptRun, layer: int, patched: torch.Tensor) -> torch.Tensor:
    """Next-token logits ``[n_edits, vocab]`` with row i's activation at (layer, position) set to ``patched[i]``."""
    return edited_logits(model, run, layer, patched)[:, 0]


def edited_logits(
    model: LoadedModel, run: PromptRun, layer: int, patched: torch.Tensor, continuation: Sequence[int] = ()
) -> torch.Tensor:
    """Logits ``[n_edits, 1 + len(continuation), vocab]`` at the prompt's last position and after each
    continuation token, with row i's activation at (layer, position) set to ``patched[i]``."""
    tokens = torch.tensor([run.ids + list(continuation)], device=model.device).expand(patched.shape[0], -1)
    edit = Set(hook_out(layer), patched.unsqueeze(1), pos=[run.position])  # row i: patched[i] at the position
    logits = model.backend.logits(tokens, [edit], mode="no_grad")
    where = f"after an edit at layer {layer}, position {run.position}"
    return require_finite(logits[:, len(run.ids) - 1 :].float().cpu(), model.tokenizer, run.ids, where)


def patch_diagnostics(patch: Any, raised: list[str]) -> PatchDiagnostics:
    condition = float(patch.basis_condition_number)
    return PatchDiagnostics(
        source_target_cosine=float(patch.source_target_cosine),
        basis_rank=int(patch.basis_rank),
        basis_condition_number=condition if math.isfinite(condition) else None,
        residual_max_delta=float(patch.residual_max_delta),
        warnings=raised,
    )


def require_finite(logits: torch.Tensor, tokenizer: Any, ids: list[int], where: str) -> torch.Tensor:
    """Refuse to score non-finite logits: a NaN must never be counted as a failed swap."""
    if not bool(torch.isfinite(logits).all()):
        raise NumericalError(
            f"The model produced non-finite logits (NaN or inf) {where} on the prompt {tokenizer.decode(ids)!r}; "
            "nothing was scored. Check the model's dtype (float32 is safest) and the edit strength alpha."
        )
    return logits


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
    source_answer: tuple[int, ...]  # the answer's token ids: one, or several (a sequence)
    target_answer: tuple[int, ...]


def never_drawn(tokenizer: Any, d_vocab: int) -> list[int]:
    """Ids a control may never be: special tokens, and unembedding rows beyond the tokenizer's vocabulary
    (padding rows of a padded vocabulary are untrained, some have zero norm)."""
    return sorted({int(i) for i in tokenizer.all_special_ids} | set(range(len(tokenizer), d_vocab)))


@dataclass
class EditPlan:
    """A trial's edits, solved but not yet run: the real edit first, then one control per seed."""

    record: TrialRecord
    tokens: TrialTokens
    controls: list[int]
    distances: torch.Tensor
    patched: torch.Tensor  # [1 + seeds, d_model]: the edited activations, real first
    patches: list[Any]
    diagnostics: list[PatchDiagnostics]


def decomposition_at(model: LoadedModel, lens: Any, run: PromptRun, layer: int, k: int) -> Any:
    """The sparse decomposition of the prompt's activation at ``layer`` (computed once per run and layer)."""
    if layer not in run.decompositions:
        dictionary = jacobian_lens.dictionary(lens, model.backend, layer)
        x = run.activations[layer].float().to(dictionary.device)
        run.decompositions[layer] = jacobian_lens.decompose(lens, model.backend, x, layer, k)
    return run.decompositions[layer]


def source_distances(
    dictionary: torch.Tensor, layer: int, source_id: int, cache: dict[tuple[int, int], torch.Tensor]
) -> torch.Tensor:
    """‖v_t − v_source‖ at ``layer`` for every t; ``cache`` maps (layer, source id) to it (it depends on nothing else,
    so a benchmark shares it across prompts and targets of one layer)."""
    key = (layer, source_id)
    if key not in cache:
        cache[key] = distances_from(dictionary, source_id)
    return cache[key]


def match_controls(
    model: LoadedModel,
    lens: Any,
    run: PromptRun,
    layer: int,
    swaps: Sequence[tuple[TrialTokens, SharedPool]],
    settings: SwapSettings,
    distance_cache: dict[tuple[int, int], torch.Tensor],
) -> None:
    """Narrow each swap's shared control pool to the tokens that also qualify at ``layer`` — when its source atom is
    active there (the only layers it is edited at). Every swap of ``swaps`` is one target of this run's prompt.

    A control must be displacement-matched at every layer its swap is edited at, since it stays the same token at
    all of them (``swap.controls``); the active support is excluded per layer, as for a single layer."""
    dictionary = jacobian_lens.dictionary(lens, model.backend, layer)
    support = [int(t) for t in decomposition_at(model, lens, run, layer, settings.k).support.tolist()]
    for tokens, shared in swaps:
        if tokens.source_id not in support:
            continue
        distances = source_distances(dictionary, layer, tokens.source_id, distance_cache)
        excluded = {*tokens.source_answer, *tokens.target_answer, *support}
        excluded.update(never_drawn(model.tokenizer, dictionary.shape[0]))
        shared.add(
            layer,
            control_pool(
                dictionary, tokens.source_id, tokens.target_id, excluded, settings.control_tolerance, distances
            ),
        )


def swap_name(function: str, source: str, target: str) -> str:
    return f"{function}/{source}→{target}"


def chosen_controls(
    shared: SharedPool, seeds: Sequence[int], swap: str, avoid: Collection[int] = ()
) -> list[int] | None:
    """One distinct control token per seed from a swap's shared pool (drawn by (seed, swap): ``draw_controls``), or
    None when it has fewer tokens than seeds. Tokens in ``avoid`` (other targets' controls, in a benchmark) are left
    out while enough others remain."""
    if shared.candidates is None or shared.size < len(seeds):
        return None
    candidates = shared.candidates
    if avoid:
        kept = candidates[~torch.isin(candidates, torch.tensor(sorted(avoid), dtype=candidates.dtype))]
        candidates = kept if kept.numel() >= len(seeds) else candidates
    return draw_controls(candidates, seeds, swap)


def plan_edit_trial(
    model: LoadedModel,
    lens: Any,
    run: PromptRun,
    layer: int,
    tokens: TrialTokens,
    settings: SwapSettings,
    record: TrialRecord,
    distance_cache: dict[tuple[int, int], torch.Tensor],
    shared: SharedPool,
    controls: list[int] | None,
) -> EditPlan | None:
    """Step 2 of a trial: decompose, check the source is active and solve every edit — toward the target and toward
    the swap's ``controls`` (drawn by ``chosen_controls`` from ``shared``, the pool matched at every layer the swap is
    edited at; None when too few tokens qualify). Returns None (with ``record`` skipped and explained) when the trial
    cannot execute. Separate from the forward so a benchmark can run the edits of several trials of one prompt and
    layer in one batch."""
    tokenizer = model.tokenizer
    dictionary = jacobian_lens.dictionary(lens, model.backend, layer)
    x = run.activations[layer].float().to(dictionary.device)
    decomposition = decomposition_at(model, lens, run, layer, settings.k)
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
        return None
    record.source_coordinate = float(decomposition.coordinates[support.index(tokens.source_id)])
    distances = source_distances(dictionary, layer, tokens.source_id, distance_cache)
    record.target_displacement = float(distances[tokens.target_id])
    record.control_pool_size = shared.size
    if controls is None:
        sizes = shared.layer_sizes.values()
        nearest = "no token left to compare" if shared.nearest_ratio is None else f"{shared.nearest_ratio:.4f}"
        record.status = NO_CONTROL
        record.detail = (
            f"{shared.size} token(s) for {len(settings.control_seeds)} control seeds: a control must match "
            f"‖v_target − v_source‖ (here {record.target_displacement:.4f}) within tolerance "
            f"{settings.control_tolerance} at every layer this swap is edited at ({len(shared.layer_sizes)} layers, "
            f"{min(sizes)}–{max(sizes)} tokens qualify at each; closest relative mismatch at the worst: {nearest}); "
            "the tolerance is never widened silently — pass a larger control_tolerance to allow looser controls"
        )
        return None
    edits = [tokens.target_id, *controls]
    patches, diagnostics = [], []
    for edit in edits:
        with warnings.catch_warnings(record=True) as raised:
            warnings.simplefilter("always")
            patch = jacobian_lens.coordinate_patch(
                x, dictionary, tokens.source_id, edit, decomposition=decomposition, k=settings.k, alpha=settings.alpha
            )
        patches.append(patch)
        diagnostics.append(patch_diagnostics(patch, [str(w.message) for w in raised]))
    patched = torch.stack([x + patch.delta for patch in patches])
    return EditPlan(record, tokens, controls, distances, patched, patches, diagnostics)


def run_edits(model: LoadedModel, run: PromptRun, layer: int, plans: Sequence[EditPlan]) -> list[EditLogits]:
    """The edited runs of several trials of one prompt at one layer. One-token answers: one batched forward
    of every edit. Answers of several tokens: per trial, the edits teacher-forced through the target's answer
    (and the real edit through the source's answer)."""
    if all(len(p.tokens.target_answer) == len(p.tokens.source_answer) == 1 for p in plans):
        logits = edited_last_logits(model, run, layer, torch.cat([p.patched for p in plans]))
        return [EditLogits(rows, rows[0]) for rows in logits.split([len(p.patched) for p in plans])]
    out = []
    for plan in plans:
        target = edited_logits(model, run, layer, plan.patched, plan.tokens.target_answer[:-1])
        source = target[0, :1]  # the first step is the same position for both answers
        if len(plan.tokens.source_answer) > 1:
            source = edited_logits(model, run, layer, plan.patched[:1], plan.tokens.source_answer[:-1])[0]
        out.append(EditLogits(target, source))
    return out


@dataclass
class EditLogits:
    """A trial's edited logits: ``target`` for every edit (real first), ``[edits, vocab]`` or teacher-forced
    ``[edits, steps, vocab]``; ``source`` for the real edit through the source's answer, ``[vocab]`` or
    ``[steps, vocab]``."""

    target: torch.Tensor
    source: torch.Tensor


def score_edit_trial(model: LoadedModel, plan: EditPlan, logits: EditLogits, settings: SwapSettings) -> None:
    """Step 3: score the target's answer in each edited run (real first) and the source's in the real one."""
    tokenizer, record, tokens, patches = model.tokenizer, plan.record, plan.tokens, plan.patches
    record.status = EXECUTED
    record.real = answer_score(tokenizer, logits.target[0], tokens.target_answer)
    record.real_source_answer = answer_score(tokenizer, logits.source, tokens.source_answer)
    record.target_was_active = not patches[0].target_was_appended
    record.real_edit_norm = float(torch.linalg.vector_norm(patches[0].delta))
    record.real_patch = plan.diagnostics[0]
    record.controls = [
        ControlDraw(
            seed=seed,
            token=tokenizer.decode([token]),
            token_id=token,
            displacement=float(plan.distances[token]),
            edit_norm=float(torch.linalg.vector_norm(patch.delta)),
            score=answer_score(tokenizer, logits.target[i + 1], tokens.target_answer),
            patch=plan.diagnostics[i + 1],
        )
        for i, (seed, token, patch) in enumerate(zip(settings.control_seeds, plan.controls, patches[1:], strict=True))
    ]
    assert record.baseline is not None  # every caller scores the unedited run first
    unedited = record.baseline.target_answer.margin
    record.margin_gain = record.real.margin - unedited
    record.control_margin_gains = [c.score.margin - unedited for c in record.controls]


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
        source_answer=answer_tokens(tokenizer, source_answer, "source answer"),
        target_answer=answer_tokens(tokenizer, target_answer, "target answer"),
    )
    if tokens.source_id == tokens.target_id:
        raise InputError("source and target are the same token: a swap needs two different concepts.")
    if tokens.source_answer == tokens.target_answer:
        raise InputError("source_answer and target_answer are the same tokens: success would be indistinguishable.")
    ids, position = edit_position(tokenizer, template, source.strip(), settings.position)
    run = prompt_run(model, ids, position, [layer])
    record = new_record(tokenizer, function.name, source, target, layer, prompt_text(function, source.strip()), run)
    baseline = TrialBaseline(
        source_answer=answer_score(
            tokenizer, teacher_forced_logits(model, run, tokens.source_answer), tokens.source_answer
        ),
        target_answer=answer_score(
            tokenizer, teacher_forced_logits(model, run, tokens.target_answer), tokens.target_answer
        ),
    )
    if settings.require_target_known:
        target_ids, _ = edit_position(tokenizer, template, target.strip(), "last")
        target_run = prompt_run(model, target_ids, len(target_ids) - 1, [])
        target_logits = teacher_forced_logits(model, target_run, tokens.target_answer)
        baseline.target_prompt_answer = answer_score(tokenizer, target_logits, tokens.target_answer)
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
            shared, distances = SharedPool(), dict[tuple[int, int], torch.Tensor]()
            match_controls(model, lens, run, layer, [(tokens, shared)], settings, distances)
            controls = chosen_controls(
                shared, settings.control_seeds, swap_name(function.name, source.strip(), target.strip())
            )
            plan = plan_edit_trial(model, lens, run, layer, tokens, settings, record, distances, shared, controls)
            if plan is not None:
                score_edit_trial(model, plan, run_edits(model, run, layer, [plan])[0], settings)
        finally:
            lens.clear_device_cache()  # the dictionary is vocabulary-sized
    if record.status == EXECUTED:
        assert record.real is not None
        wins = sum(c.score.top1 for c in record.controls)
        assert record.margin_gain is not None
        beaten = sum(record.margin_gain > g for g in record.control_margin_gains)
        notes.append(
            f"One trial is an anecdote: real edit {'succeeded' if record.real.top1 else 'failed'}, "
            f"{wins}/{len(record.controls)} controls succeeded; margin gain {record.margin_gain:+.3f} logits, above "
            f"{beaten} of {len(record.controls)} controls'. Use causal_swap_benchmark for tests against the controls."
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


def trial_with_lens(
    model: LoadedModel,
    lens_kind: str,
    lens_path: str | None,
    template: str,
    source: str,
    target: str,
    source_answer: str,
    target_answer: str,
    layer: int,
    settings: SwapSettings,
) -> SwapTrialMeasurement:
    """``causal_swap_trial`` with the lens named as a tool names it (kind, optional file)."""
    lens, info = resolve_lens(model, lens_kind, lens_path)
    return causal_swap_trial(model, lens, info, template, source, target, source_answer, target_answer, layer, settings)
