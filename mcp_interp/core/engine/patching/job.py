"""The one activation-patching job: minimal pairs → answers → forward capture → exact sweep or attribution.

``patch`` (one component at every layer × position) and ``patch_heads`` (every head's output over its
positions) are presets of this job, as TransformerLens' public patchers are presets of its
``generic_activation_patch``: a preset says which site is patched, which cells (``sweep.Unit``) there
are, at which positions a cell without a position is patched, and how the outcome is reported. So
every option one preset has — multi-token answers and sets, the three metrics, both directions,
attribution with exact verification, both sweeps — the other has too.

What the job measures, per cell and pair: the metric m at the answer with that cell's activation
taken from the other run (``denoise``: the corrupt run with clean activations; ``noise``: the clean
run with corrupt ones), next to m on the clean and corrupt runs (``PatchOutcome``). Positions
before the first token where any pair differs carry identical activations in both runs, so a cell
there is a no-op: its value is the base run's, and it is not run. Answers of several tokens are
read teacher-forced, one row per answer token (``rows.RowPlan``), and folded back into one value
per pair.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic

import torch

import mcp_interp.state.limits as limits
from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.edits import Edit
from mcp_interp.core.engine.backend.forward import Capture
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.points import site_hook
from mcp_interp.core.engine.backend.sites import Site
from mcp_interp.core.engine.jobs import Job, R
from mcp_interp.core.engine.numbers.row_readouts import Readout, TokenLogProbsReadout, make_readout
from mcp_interp.core.engine.numbers.scores import ranked_scores
from mcp_interp.core.engine.patching.edit_sweep import ChosenEditSweep, edit_sweep
from mcp_interp.core.engine.patching.first_order import Attribution, attribution_terms
from mcp_interp.core.engine.patching.noise import draw_noise, noised_positions
from mcp_interp.core.engine.patching.rows import RowPlan
from mcp_interp.core.engine.patching.suffix_sweep import ChosenSweep, best_sweep
from mcp_interp.core.engine.patching.sweep import Unit
from mcp_interp.core.engine.text.answers import Answer, answer_kind, resolve_answer_specs, spacing_notes
from mcp_interp.core.engine.text.components import PositionSpec, position_mask
from mcp_interp.core.engine.text.tokens import Batch, PairDiff, encode, validate_pairs
from mcp_interp.errors import InputError, require_choice
from mcp_interp.schemas.common import AnswerKind, PatchDirection, PatchMethod, PatchMetric
from mcp_interp.schemas.localize import NoiseCorruption, NoiseInfo


@dataclass(kw_only=True)
class CellContext:
    """What a preset may use to choose its cells: the pairs' width, the first position whose patch is run
    (``first_run``: see ``PatchOutcome``), and — when the preset asked for it — the attribution terms of every layer
    with the rows' mask and base values (to rank cells by estimate before running any exactly)."""

    width: int
    first_run: int
    attribution: Attribution | None
    mask: torch.Tensor  # [rows, seq] positions patched for cells without a position
    base_rows: torch.Tensor  # [rows] the base run's metric per row


@dataclass(kw_only=True)
class PatchOutcome:
    """What a patching job measured. ``patched`` [cells, pairs] is the metric with each cell patched (no-op
    cells: the base run's value); ``clean``/``corrupt`` [pairs]; ``verified`` (attribution with verify_top) lists
    (cell index, exact patched values [pairs]) for the top cells. ``first_diff`` is the first position where a pair
    differs (the width when none does); ``first_run`` the first position whose patch is run: ``first_diff`` where
    attention is causal (before it, clean and corrupt activations are identical, so a patch there is a no-op), 0 where
    it is bidirectional (every position reads the difference)."""

    cells: list[Unit]
    patched: torch.Tensor
    clean: torch.Tensor
    corrupt: torch.Tensor
    clean_batch: Batch
    corrupt_batch: Batch
    diffs: list[PairDiff]
    first_diff: int
    first_run: int
    verified: list[tuple[int, torch.Tensor]] | None
    sweep: str | None
    notes: list[str]
    noise: NoiseInfo | None = None
    engine_requests: int | None = None  # a remote backend's requests for the exact runs (None: a local backend)
    rows: int | None = None  # the patched rows those requests carried


@dataclass(kw_only=True)
class PatchingJob(Job[R], ABC, Generic[R]):
    """The job (see the module docstring); a preset subclasses it. One step per layer swept."""

    model: LoadedModel
    clean_prompts: Sequence[str]
    corrupt_prompts: Sequence[str] | None
    correct: Any = None  # answers as the tools take them (``answers``): strings, {"any_of": [...]}, or a list
    incorrect: Any = None
    direction: PatchDirection = "denoise"
    method: PatchMethod = "exact"
    metric: PatchMetric = "logit_diff"
    verify_top: int = 0
    noise: NoiseCorruption | None = None  # corrupt by Gaussian noise on the clean prompts' embeddings instead
    result: R | None = field(default=None, init=False)
    outcome: PatchOutcome | None = field(default=None, init=False)
    sweep: str | None = field(default=None, init=False)
    notes: list[str] = field(default_factory=list, init=False)
    engine_requests: int | None = field(default=None, init=False)
    engine_rows: int | None = field(default=None, init=False)
    plan: RowPlan = field(default_factory=lambda: RowPlan.identity(0), init=False)
    _token_answers: tuple[list[Answer] | None, list[Answer] | None] = field(default=(None, None), init=False)

    # --- what a preset says ---------------------------------------------------------------------

    @abstractmethod
    def site(self) -> Site:
        """Where cells are patched."""

    @abstractmethod
    def patched_layers(self) -> list[int]:
        """The layers whose source activations are captured (every cell's layer is one of them)."""

    @abstractmethod
    def cells(self, context: CellContext) -> list[Unit]:
        """Every cell asked for (cells at positions before ``context.first_run`` included: they are not run)."""

    @abstractmethod
    def report(self, outcome: PatchOutcome) -> R:
        """The preset's result."""

    def check(self) -> None:
        """The preset's own argument checks (before any model work); the common ones are in ``_check``."""

    def patch_positions(self) -> PositionSpec:
        """Where a cell without a position is patched, in prompt positions: 'all' (every real token of each row,
        answer continuation included), 'last' (the prompt's last token) or prompt indices."""
        return "all"

    def cells_need_attribution(self) -> bool:
        """True when ``cells`` ranks candidates by their attribution estimate (computed first)."""
        return False

    # --- the job --------------------------------------------------------------------------------

    def total_steps(self) -> int:
        sweep = self.model.cfg.n_layers - min(self.patched_layers())
        chooser = 1 if self.cells_need_attribution() else 0
        work = sweep if self.method == "exact" else 1 + (sweep if self.verify_top else 0)
        return 1 + chooser + work

    def steps(self) -> Iterator[str]:
        self._check()
        self.check()
        model, tokenizer, backend = self.model, self.model.tokenizer, self.model.backend
        prompts, samples = self._pairs()
        names = ("clean_prompts", "corrupt_prompts")
        diffs = validate_pairs(tokenizer, self.clean_prompts, prompts, names)
        shown_clean = encode(tokenizer, self.clean_prompts, model.device)
        shown_corrupt = encode(tokenizer, prompts, model.device)
        noise = None
        if self.noise is not None:
            positions = noised_positions(tokenizer, self.clean_prompts, self.noise)
            diffs = [PairDiff(i, p) for i, p in enumerate(positions)]
        # Each pair is run `samples` times in a row (noise draws; 1 without noise), then folded back (``_fold``).
        clean = encode(tokenizer, [t for t in self.clean_prompts for _ in range(samples)], model.device)
        corrupt = encode(tokenizer, [t for t in prompts for _ in range(samples)], model.device)
        if self.noise is not None:
            noise = draw_noise(backend, corrupt, positions, self.noise)
        n, width = len(clean.texts), clean.input_ids.shape[1]
        first_diff = min((p for d in diffs for p in d.positions[:1]), default=width)
        first_run = first_diff if backend.causal or first_diff >= width else 0
        if first_run < first_diff:
            self.notes.append(
                f"Attention is bidirectional in this model: positions before the first difference ({first_diff}) "
                "read it too, so their cells are patched and run like the others (a causal model's would be "
                "identical there, and skipped)."
            )
        site, layers = self.site(), self.patched_layers()
        self.plan = self._row_plan(n, samples)
        base_prompts = corrupt if self.direction == "denoise" else clean
        base, source = self.plan.extend(corrupt), self.plan.extend(clean)
        if self.direction == "noise":
            base, source = source, base
        rows = base.input_ids.shape[0]
        # The corrupt side's runs carry the noise (the base run when denoising, the source run when noising).
        corrupting: list[Edit] = [] if noise is None else [noise.edit(self.plan.row_pair, base.input_ids.shape[1])]
        base_edits, source_edits = (corrupting, []) if self.direction == "denoise" else ([], corrupting)
        if noise is not None:
            require(backend, "patch_noise")

        if self.method == "attribution" or self.cells_need_attribution():
            require(backend, "patch_attribution")
        site_points = [site_hook(site, layer) for layer in layers]
        source_run = backend.capture(source.input_ids, site_points, edits=source_edits)
        source_acts = {layer: source_run.acts[site_hook(site, layer)] for layer in layers}
        everyone = torch.arange(rows)
        # The base run is a traced forward for exact patching; for attribution it is the forward the
        # gradient goes through — except that KL in the noise direction needs its logits first. A backend without
        # block calls patches by setting values in whole forwards (``edit_sweep``): it needs the base run's values
        # at the site instead of a trace.
        blocks = backend.supports("block_calls")
        kl_needs_base = self.metric == "kl" and self.direction == "noise"
        base_run = None
        if self.method == "exact" or kl_needs_base:
            traced = self.method == "exact" and blocks
            base_run = backend.capture(base.input_ids, [] if blocks else site_points, edits=base_edits, trace=traced)
        clean_logits = None
        if self.metric == "kl":
            clean_run, clean_batch = (source_run, source) if self.direction == "denoise" else (base_run, base)
            assert clean_run is not None
            clean_logits = backend.logits_at(clean_run, clean_batch.answer_positions)
        readout = self._readout(clean_logits)
        attribution = None
        if self.method == "attribution" or self.cells_need_attribution():
            attribution = attribution_terms(
                backend, base.input_ids, site, source_acts, base.answer_positions, readout.from_residual,
                self.plan.objective, base_edits,
            )  # fmt: skip
        with torch.inference_mode():
            if base_run is not None:
                base_rows_m = answer_metric(readout, base_run, base)
            else:
                assert attribution is not None
                base_rows_m = readout.from_residual(attribution.base_answer_residual, everyone)
            source_rows_m = answer_metric(readout, source_run, source)
        base_m, source_m = self.plan.combine(base_rows_m), self.plan.combine(source_rows_m)
        clean_m, corrupt_m = (source_m, base_m) if self.direction == "denoise" else (base_m, source_m)
        yield "clean and corrupt runs"

        mask = self._mask(base, base_prompts)
        context = CellContext(
            width=width, first_run=first_run, attribution=attribution, mask=mask, base_rows=base_rows_m
        )
        cells = self.cells(context)
        if self.cells_need_attribution():
            yield "attribution over every candidate: cells chosen"
        # Only the patched runs this method performs count: exact runs every cell at or after ``first_run`` (the
        # others are the base run, not run); attribution runs none, but its verified top cells.
        performed = (
            sum(1 for c in cells if c.position is None or c.position >= first_run)
            if self.method == "exact"
            else min(self.verify_top, len(cells))
        )
        limits.check("max_patch_rows", performed * rows, "Patched runs (cells run × answer rows)")
        verified = None
        if self.method == "exact":
            assert base_run is not None
            patched_rows = yield from self._exact(base_run, site, source_acts, cells, mask, base, readout,
                                                  first_run)  # fmt: skip
            patched = self.plan.combine(patched_rows)
        else:
            assert attribution is not None
            patched = base_m + self.plan.to_pairs(_estimates(attribution.terms, cells, mask))
            yield "attribution: one forward per input and one backward"
            if self.verify_top:
                ranked = ranked_scores(patched, clean_m, corrupt_m, self.direction)
                runnable = [i for i in ranked if (p := cells[i].position) is None or p >= first_run]  # no no-ops
                order = runnable[: self.verify_top]
                exact_rows = yield from self._exact(
                    backend.capture(base.input_ids, edits=base_edits, trace=True), site, source_acts,
                    [cells[i] for i in order], mask,
                    base, readout, first_run,
                )  # fmt: skip
                exact = self.plan.combine(exact_rows)
                verified = [(i, exact[j]) for j, i in enumerate(order)]
        if verified is not None:
            verified = [(i, _fold(values, samples)) for i, values in verified]
        self.outcome = PatchOutcome(
            cells=cells,
            patched=_fold(patched, samples),
            clean=_fold(clean_m, samples),
            corrupt=_fold(corrupt_m, samples),
            clean_batch=shown_clean,
            corrupt_batch=shown_corrupt,
            diffs=diffs,
            first_diff=first_diff,
            first_run=first_run,
            verified=verified,
            sweep=self.sweep if self.method == "exact" or verified else None,
            notes=self.notes,
            noise=None if noise is None else noise.info,
            engine_requests=self.engine_requests,
            rows=self.engine_rows,
        )
        self.result = self.report(self.outcome)

    # --- inputs -----------------------------------------------------------------------------------

    def _check(self) -> None:
        require_choice("direction", self.direction, PatchDirection)
        require_choice("method", self.method, PatchMethod)
        require_choice("metric", self.metric, PatchMetric)
        if self.metric != "kl" and self.correct is None:
            raise InputError(f"metric {self.metric!r} needs `correct`; or use metric 'kl', which needs no answer.")
        if self.metric in ("logit_diff", "prob_diff") and self.incorrect is None:
            raise InputError(f"metric {self.metric!r} needs `incorrect` too; or use 'log_prob' or 'kl'.")

    def _pairs(self) -> tuple[Sequence[str], int]:
        """The corrupt prompts, and how many times each pair is run: the given pairs once, or — corrupting by noise —
        the clean prompts themselves, once per noise draw."""
        if self.noise is None:
            if self.corrupt_prompts is None:
                raise InputError(
                    "Give `corrupt_prompts` (one per clean prompt), or `noise` to corrupt by Gaussian noise."
                )
            return self.corrupt_prompts, 1
        if self.corrupt_prompts is not None:
            raise InputError(
                "Give `corrupt_prompts` or `noise`, not both: noise corrupts the clean prompts themselves."
            )
        return self.clean_prompts, self.noise.samples

    def _answers(self, n: int, samples: int = 1) -> tuple[list[Answer] | None, list[Answer] | None]:
        """The answers of the ``n`` rows (each pair's ``samples`` rows share the pair's answers)."""
        tokenizer = self.model.tokenizer
        good = bad = None
        if self.metric != "kl":
            good = _repeated(resolve_answer_specs(tokenizer, self.correct, n // samples, "correct"), samples)
        if self.metric in ("logit_diff", "prob_diff"):
            bad = _repeated(resolve_answer_specs(tokenizer, self.incorrect, n // samples, "incorrect"), samples)
        return good, bad

    def scored_answer_kind(self) -> AnswerKind | None:
        """The kind of the answers the metric scored (a result's ``answer_kind``), once the job has read them; None
        for metric 'kl', which scores no answer."""
        good, bad = self._token_answers
        return None if good is None else answer_kind(good + (bad or []))

    def _row_plan(self, n: int, samples: int = 1) -> RowPlan:
        """One row per pair, or the rows answers that are sets or several tokens need (``rows``)."""
        good, bad = self._answers(n, samples)
        self._token_answers = (good, bad)
        answers = good + (bad or []) if good is not None else []
        if good is None or (self.metric != "prob_diff" and all(a.kind == "token" for a in answers)):
            return RowPlan.identity(n)
        plan = RowPlan.answers(self.metric, good, bad)
        if any(a.kind != "token" for a in answers):
            formula = {"logit_diff": "log P(correct) − log P(incorrect)", "log_prob": "log P(correct)",
                       "prob_diff": "P(correct) − P(incorrect)"}[self.metric]  # fmt: skip
            self.notes.append(
                f"Answers that are sets or several tokens are read from {plan.n_rows} rows for {n} pairs (each pair's "
                "prompt, and the prompt followed by the earlier tokens of a multi-token alternative, teacher-forced; "
                f"a set is its members' summed probability), folded into {formula}; positions are the prompt's."
            )
        self.notes.extend(spacing_notes(self.model.tokenizer, answers))
        return plan

    def _readout(self, clean_logits: torch.Tensor | None) -> Readout:
        if self.plan.reads is not None:
            return TokenLogProbsReadout(self.model.backend, self.plan.reads)
        good, bad = self._token_answers
        correct = torch.tensor([a.first_token for a in good]) if good is not None else None
        incorrect = torch.tensor([a.first_token for a in bad]) if bad is not None else None
        return make_readout(self.metric, self.model.backend, correct, incorrect, clean_logits)

    def _mask(self, rows: Batch, prompts: Batch) -> torch.Tensor:
        """``[rows, seq]``: where a cell without a position is patched in each row (``patch_positions``)."""
        spec = self.patch_positions()
        if spec is None or spec == "all":
            return position_mask("all", rows.attention_mask, rows.answer_positions)
        by_prompt = position_mask(spec, prompts.attention_mask, prompts.answer_positions)
        mask = torch.zeros_like(rows.attention_mask, dtype=torch.bool)
        width = min(by_prompt.shape[1], mask.shape[1])
        mask[:, :width] = by_prompt[self.plan.row_pair, :width]
        return mask

    # --- runs -------------------------------------------------------------------------------------

    def _exact(
        self,
        base_run: Capture,
        site: Site,
        source_acts: dict[int, torch.Tensor],
        cells: list[Unit],
        mask: torch.Tensor,
        base: Batch,
        readout: Readout,
        first_run: int,
    ) -> Generator[str, None, torch.Tensor]:
        """Patched metric per cell and row, ``[len(cells), rows]``; cells before ``first_run`` (no-ops) copy the base
        run."""
        with torch.inference_mode():
            base_values = answer_metric(readout, base_run, base)
        patched = base_values.unsqueeze(0).repeat(len(cells), *([1] * base_values.dim()))
        run = [i for i, c in enumerate(cells) if c.position is None or c.position >= first_run]
        if not run:
            return patched
        units = [cells[i] for i in run]
        chosen: ChosenSweep | ChosenEditSweep
        if base_run.trace is None:  # a backend without block calls
            chosen = edit_sweep(self.model.backend, base.input_ids, site, base_run.acts, source_acts, units, mask,
                                base.answer_positions, readout.from_logits)  # fmt: skip
        else:
            chosen = best_sweep(self.model.backend, base_run.trace, site, source_acts, units, mask,
                                base.answer_positions, readout.from_residual, first_run)  # fmt: skip
        self.sweep = chosen.label
        if chosen.note and chosen.note not in self.notes:
            self.notes.append(chosen.note)
        last = self.model.cfg.n_layers - 1
        for layer in chosen.sweep.steps():
            yield f"exact patching: layer {layer} of {last} done"
        assert chosen.sweep.values is not None
        patched[run] = chosen.sweep.values
        if isinstance(chosen, ChosenEditSweep):
            self.engine_requests = (self.engine_requests or 0) + chosen.sweep.requests
            self.engine_rows = (self.engine_rows or 0) + chosen.sweep.rows
        return patched


def answer_metric(readout: Readout, run: Capture, batch: Batch) -> torch.Tensor:
    """The readout at each row's answer position of ``run``: from the backend's logits where it returned them (a
    remote backend), else from the final residual (the two vocabulary rows a logit difference needs, not all)."""
    rows = torch.arange(batch.input_ids.shape[0])
    if run.logits is not None:
        return readout.from_logits(run.logits[rows, batch.answer_positions], rows)
    return readout.from_residual(run.final[rows, batch.answer_positions], rows)


def _repeated(answers: list[Answer], samples: int) -> list[Answer]:
    return [a for a in answers for _ in range(samples)]


def _fold(values: torch.Tensor, samples: int) -> torch.Tensor:
    """Values of every run ``[..., pairs × samples]`` → per pair ``[..., pairs]``: the mean over its noise draws."""
    if samples == 1:
        return values
    return values.reshape(*values.shape[:-1], -1, samples).mean(dim=-1)


def _estimates(terms: dict[int, torch.Tensor], cells: list[Unit], mask: torch.Tensor) -> torch.Tensor:
    """Estimated change of each row's metric per cell, ``[cells, rows]``: Σ over the cell of Δa · ∂m/∂a."""
    rows = []
    for cell in cells:
        term = terms[cell.layer]  # [rows, seq] or [rows, seq, channels]
        if cell.channel is not None:
            term = term[:, :, cell.channel]
        rows.append((term * mask).sum(dim=1) if cell.position is None else term[:, cell.position])
    return torch.stack(rows)
