"""The measurement behind ``patch``: activation patching of one component at every layer × position.

For a minimal pair (clean, corrupt) and a metric m read at the answer position, each *cell* —
a component at one layer and one token position (one head too for ``heads_by_pos``; one MLP
neuron over every position for ``mlp_neurons``) — gets its activation from the other run:

* ``denoise`` (run corrupt, patch in clean): score = (m_patched − m_corrupt) / (m_clean − m_corrupt),
  the fraction of the gap the cell *restores*;
* ``noise`` (run clean, patch in corrupt): score = (m_clean − m_patched) / (m_clean − m_corrupt),
  the fraction it *destroys*.

Positions before the first token where any pair differs carry identical activations in both
runs, so their patch is a no-op: they score exactly 0 and are not run. Exact patching uses the
sweep of ``core.patching`` (rows join at their layer from the cached residual; the suffix
engine recomputes only positions from the first difference on). Attribution is the gradient
estimate Δa · ∂m/∂a, summed over the cell's width, from one forward per input and one backward.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mcp_interp import limits
from mcp_interp.core.answers import Answer, resolve_answer_specs, spacing_notes
from mcp_interp.core.bridge import logits_from_residual, site_hook
from mcp_interp.core.heads import position_mask
from mcp_interp.core.jobs import Job
from mcp_interp.core.localize.readouts import LogProbReadout, Readout, make_readout
from mcp_interp.core.localize.report import PatchReport, finite
from mcp_interp.core.localize.rows import RowPlan
from mcp_interp.core.patching import BlockTrace, Site, Unit, attribution_terms, capture_forward, trace_blocks
from mcp_interp.core.suffix_sweep import best_sweep
from mcp_interp.core.tokens import Batch, encode, token_strings, validate_pairs
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.localize import PatchMeasurement, VerifiedCell

COMPONENTS: dict[str, Site] = {
    "resid_pre": "resid_pre",
    "resid_mid": "resid_mid",
    "resid_post": "resid_post",
    "attn_out": "attn_out",
    "mlp_out": "mlp_out",
    "heads_by_pos": "z",
    "mlp_neurons": "mlp_post",
}
METRICS = ("logit_diff", "log_prob", "kl")
TOP_NEURONS_DEFAULT = 10


@dataclass
class PatchJob(Job[PatchMeasurement]):
    """Patching scores of one component per cell (see the module docstring); one step per layer swept."""

    model: LoadedModel
    clean_prompts: Sequence[str]
    corrupt_prompts: Sequence[str]
    correct: Any  # answers as the tools take them (core.answers): strings, {"any_of": [...]}, or a list
    incorrect: Any
    component: str
    direction: str = "denoise"
    method: str = "exact"
    metric: str = "logit_diff"
    layers: Sequence[int] | None = None
    positions: Sequence[int] | None = None
    neurons: Sequence[int] | None = None
    top_neurons: int = TOP_NEURONS_DEFAULT
    verify_top: int = 0
    result: PatchMeasurement | None = field(default=None, init=False)
    engine: str | None = field(default=None, init=False)
    notes: list[str] = field(default_factory=list, init=False)
    report: PatchReport | None = field(default=None, init=False)
    plan: RowPlan = field(default_factory=lambda: RowPlan.identity(0), init=False)

    # --- inputs -------------------------------------------------------------------------------

    def _check(self) -> None:
        choices = {
            "component": (self.component, tuple(COMPONENTS)),
            "direction": (self.direction, ("denoise", "noise")),
            "method": (self.method, ("exact", "attribution")),
            "metric": (self.metric, METRICS),
        }
        for name, (value, allowed) in choices.items():
            if value not in allowed:
                raise InputError(f"`{name}` must be one of {list(allowed)}, got {value!r}.")
        if self.metric in ("logit_diff", "log_prob") and self.correct is None:
            raise InputError(f"metric {self.metric!r} needs `correct`; or use metric 'kl', which needs no answer.")
        if self.metric == "logit_diff" and self.incorrect is None:
            raise InputError("metric 'logit_diff' needs `incorrect` too; or use 'log_prob' or 'kl'.")
        if self.neurons is not None and self.component != "mlp_neurons":
            raise InputError("`neurons` applies only to component 'mlp_neurons'.")

    def _layers(self) -> list[int]:
        n_layers = self.model.bridge.cfg.n_layers
        if self.layers is None:
            return list(range(n_layers))
        layers = sorted(set(self.layers))
        bad = [layer for layer in layers if not 0 <= layer < n_layers]
        if not layers or bad:
            raise InputError(
                f"`layers` must be a non-empty list of layers in 0..{n_layers - 1}; got {list(self.layers)}."
            )
        return layers

    def _positions(self, width: int) -> list[int]:
        if self.positions is None:
            return list(range(width))
        positions = sorted(set(self.positions))
        bad = [p for p in positions if not isinstance(p, int) or not 0 <= p < width]
        if not positions or bad:
            raise InputError(
                f"`positions` must be token indices in 0..{width - 1} (the pairs have {width} tokens at most); "
                f"got {list(self.positions)}. Omit it to patch every position."
            )
        return positions

    def _neurons(self) -> list[int] | None:
        if self.neurons is None:
            return None
        d_mlp = int(self.model.bridge.cfg.d_mlp)
        neurons = sorted(set(self.neurons))
        bad = [n for n in neurons if not isinstance(n, int) or not 0 <= n < d_mlp]
        if not neurons or bad:
            raise InputError(
                f"Neuron index {bad[0] if bad else 'list'} is out of range: this model's MLPs have neurons "
                f"0..{d_mlp - 1}; pass `neurons` as a non-empty list of such indices, or omit it to patch the "
                f"top {self.top_neurons} neurons of each layer by attribution."
            )
        return neurons

    def total_steps(self) -> int:
        n_layers = self.model.bridge.cfg.n_layers
        layers = self._layers()
        return n_layers - min(layers) + 1

    # --- run ----------------------------------------------------------------------------------

    def steps(self) -> Iterator[str]:
        self._check()
        model, tokenizer, bridge = self.model, self.model.tokenizer, self.model.bridge
        names = ("clean_prompts", "corrupt_prompts")
        diffs = validate_pairs(tokenizer, self.clean_prompts, self.corrupt_prompts, names)
        clean = encode(tokenizer, self.clean_prompts, model.device)
        corrupt = encode(tokenizer, self.corrupt_prompts, model.device)
        n, width = len(clean.texts), clean.input_ids.shape[1]
        layers, positions, neurons = self._layers(), self._positions(width), self._neurons()
        cfg = bridge.cfg
        self.report = PatchReport(
            self.component, self.direction, self.method, self.metric, cfg.n_layers, cfg.n_heads, tokenizer,
            token_strings(tokenizer, clean.ids(0)),
        )  # fmt: skip
        first_diff = min((p for d in diffs for p in d.positions[:1]), default=width)
        site = COMPONENTS[self.component]
        self.plan = self._row_plan(n)
        base, source = (self.plan.extend(corrupt), self.plan.extend(clean))
        if self.direction == "noise":
            base, source = source, base
        rows = base.input_ids.shape[0]

        source_run = capture_forward(bridge, source.input_ids, [site_hook(site, layer) for layer in layers])
        source_acts = {layer: source_run.acts[site_hook(site, layer)] for layer in layers}
        everyone = torch.arange(rows)
        source_answer = source_run.final[everyone, source.answer_positions]
        # The base run is a traced forward for exact patching; for attribution it is the forward the
        # gradient goes through — except that KL in the noise direction needs its logits first.
        kl_needs_base = self.metric == "kl" and self.direction == "noise"
        base_run = None
        if self.method == "exact" or kl_needs_base:
            base_run = capture_forward(bridge, base.input_ids, trace=self.method == "exact")
        clean_logits = None
        if self.metric == "kl":
            if self.direction == "denoise":
                clean_answer = source_answer
            else:
                assert base_run is not None
                clean_answer = base_run.final[everyone, base.answer_positions]
            with torch.inference_mode():
                clean_logits = logits_from_residual(bridge, clean_answer)
        readout = self._readout(clean_logits)
        choose_neurons = self.component == "mlp_neurons" and neurons is None
        attribution = None
        if self.method == "attribution" or choose_neurons:
            attribution = attribution_terms(
                bridge, base.input_ids, site, source_acts, base.answer_positions, readout.from_residual
            )
        if base_run is not None:
            base_answer = base_run.final[everyone, base.answer_positions]
        else:
            assert attribution is not None
            base_answer = attribution.base_answer_residual
        with torch.inference_mode():
            base_m, source_m = (
                readout.from_residual(base_answer, everyone),
                readout.from_residual(source_answer, everyone),
            )
        base_rows_m = base_m
        base_m, source_m = self.plan.combine(base_m), self.plan.combine(source_m)
        clean_m, corrupt_m = (source_m, base_m) if self.direction == "denoise" else (base_m, source_m)
        yield "clean and corrupt runs"

        cells = self._cells(layers, positions, first_diff, neurons)
        mask = position_mask("all", base.attention_mask, base.answer_positions)
        if choose_neurons:
            assert attribution is not None
            cells = self._top_neurons(attribution.terms, layers, mask, base_rows_m)
            yield f"attribution over every neuron: top {self.top_neurons} per layer chosen"
        limits.check("max_patch_rows", len(cells) * rows, "Patched runs (cells × pairs × answer tokens)")
        verified = None
        if self.method == "exact":
            assert base_run is not None and base_run.trace is not None
            patched_rows = yield from self._exact(
                base_run.trace, site, source_acts, cells, mask, base, readout, first_diff
            )
            patched = self.plan.combine(patched_rows)
        else:
            assert attribution is not None
            patched = base_m + self.plan.fold(base_rows_m, self._attribution(attribution.terms, cells, mask))
            yield "attribution: one forward per input and one backward"
            if self.verify_top:
                verified = yield from self._verify(
                    base, site, source_acts, cells, patched, mask, readout, first_diff, clean_m, corrupt_m
                )
        self.result = self.report.measurement(
            cells, patched, clean_m, corrupt_m, clean, corrupt, diffs, layers, positions, first_diff, verified,
            self.engine, self.notes,
        )  # fmt: skip

    def _answers(self, n: int) -> tuple[list[Answer] | None, list[Answer] | None]:
        tokenizer = self.model.tokenizer
        good = bad = None
        if self.metric in ("logit_diff", "log_prob"):
            good = resolve_answer_specs(tokenizer, self.correct, n, "correct")
        if self.metric == "logit_diff":
            bad = resolve_answer_specs(tokenizer, self.incorrect, n, "incorrect")
        return good, bad

    def _row_plan(self, n: int) -> RowPlan:
        """One row per pair, or one per answer token when some answer is several tokens or a set."""
        good, bad = self._answers(n)
        if good is None or all(a.kind == "token" for a in good + (bad or [])):
            return RowPlan.identity(n)
        self.notes.append(
            "Some answer is several tokens or a set: each pair is patched once per answer token (prompt + the "
            "answer's earlier tokens, teacher-forced), and the metric is rebuilt from those log-probs "
            f"({'log P(correct) − log P(incorrect)' if bad is not None else 'log P(correct)'}); positions are "
            "the prompt's."
        )
        self.notes.extend(spacing_notes(self.model.tokenizer, good + (bad or [])))
        return RowPlan.sequences(good, bad)

    def _readout(self, clean_logits: torch.Tensor | None) -> Readout:
        if not self.plan.is_identity:
            assert self.plan.targets is not None
            return LogProbReadout(self.model.bridge, self.plan.targets)
        good, bad = self._answers(len(self.clean_prompts))
        correct = torch.tensor([a.first_token for a in good]) if good is not None else None
        incorrect = torch.tensor([a.first_token for a in bad]) if bad is not None else None
        return make_readout(self.metric, self.model.bridge, correct, incorrect, clean_logits)

    def _cells(self, layers: list[int], positions: list[int], first_diff: int, neurons: list[int] | None) -> list[Unit]:
        """Every cell asked for (positions before ``first_diff`` included: they are scored 0, not run)."""
        if self.component == "mlp_neurons":
            return [Unit(layer, n) for layer in layers for n in (neurons or [])]
        if self.component == "heads_by_pos":
            n_heads = self.model.bridge.cfg.n_heads
            return [Unit(layer, h, p) for layer in layers for h in range(n_heads) for p in positions]
        return [Unit(layer, None, p) for layer in layers for p in positions]

    def _exact(
        self,
        trace: BlockTrace,
        site: Site,
        source_acts: dict[int, torch.Tensor],
        cells: list[Unit],
        mask: torch.Tensor,
        base: Batch,
        readout: Readout,
        first_diff: int,
    ) -> Generator[str, None, torch.Tensor]:
        """Patched metric per cell and prompt, ``[len(cells), batch]``; no-op cells copy the base run."""
        n = base.input_ids.shape[0]
        with torch.inference_mode():
            base_values = readout.from_residual(trace.final[torch.arange(n), base.answer_positions], torch.arange(n))
        patched = base_values.repeat(len(cells), 1)
        run = [i for i, c in enumerate(cells) if c.position is None or c.position >= first_diff]
        if not run:
            return patched
        chosen = best_sweep(
            self.model.bridge,
            trace,
            site,
            source_acts,
            [cells[i] for i in run],
            mask,
            base.answer_positions,
            readout.from_residual,
            first_diff,
        )
        self.engine = chosen.engine
        if chosen.note:
            self.notes.append(chosen.note)
        last = self.model.bridge.cfg.n_layers - 1
        for layer in chosen.sweep.steps():
            yield f"exact patching: layer {layer} of {last} done"
        assert chosen.sweep.values is not None
        patched[run] = chosen.sweep.values
        return patched

    def _attribution(self, terms: dict[int, torch.Tensor], cells: list[Unit], mask: torch.Tensor) -> torch.Tensor:
        """Estimated change of each row's metric per cell, ``[cells, rows]``: Σ over the cell of Δa · ∂m/∂a."""
        rows = []
        for cell in cells:
            term = terms[cell.layer]  # [batch, seq] or [batch, seq, channels]
            if cell.channel is not None:
                term = term[:, :, cell.channel]
            if cell.position is None:
                rows.append((term * mask).sum(dim=1))
            else:
                rows.append(term[:, cell.position])
        return torch.stack(rows)

    def _top_neurons(
        self, terms: dict[int, torch.Tensor], layers: list[int], mask: torch.Tensor, base_rows_m: torch.Tensor
    ) -> list[Unit]:
        """The ``top_neurons`` neurons of each layer with the largest |attribution estimate| (mean over pairs)."""
        cells = []
        for layer in layers:
            per_row = (terms[layer] * mask.unsqueeze(-1)).sum(dim=1)  # [rows, d_mlp]
            per_neuron = self.plan.fold(base_rows_m, per_row.T).mean(dim=-1)  # [d_mlp]
            top = per_neuron.abs().topk(min(self.top_neurons, per_neuron.numel())).indices
            cells += [Unit(layer, int(n)) for n in sorted(top.tolist())]
        return cells

    def _verify(
        self,
        base: Batch,
        site: Site,
        source_acts: dict[int, torch.Tensor],
        cells: list[Unit],
        estimated: torch.Tensor,
        mask: torch.Tensor,
        readout: Readout,
        first_diff: int,
        clean_m: torch.Tensor,
        corrupt_m: torch.Tensor,
    ) -> Generator[str, None, list[VerifiedCell]]:
        report = self.report
        assert report is not None
        order = report.ranked(estimated, clean_m, corrupt_m)[: self.verify_top]
        top = [cells[i] for i in order]
        exact_rows = yield from self._exact(
            trace_blocks(self.model.bridge, base.input_ids), site, source_acts, top, mask, base, readout, first_diff
        )
        exact = self.plan.combine(exact_rows)
        return [
            VerifiedCell(
                label=report.label(cells[i]),
                attribution_score=finite(report.score(estimated[i], clean_m, corrupt_m).value),
                exact_score=finite(report.score(exact[j], clean_m, corrupt_m).value),
            )
            for j, i in enumerate(order)
        ]
