"""The measurement behind ``patch_heads``: per-head patching scores on minimal pairs.

Score convention (one number per head, same reading in both directions):

* ``denoise`` (run corrupt, patch in the clean z): score = (patched − corrupt) / (clean − corrupt),
  the fraction of the clean−corrupt logit-difference gap the head *restores*;
* ``noise`` (run clean, patch in the corrupt z): score = (clean − patched) / (clean − corrupt),
  the fraction of the gap the head *destroys*.

1 = this head alone carries the whole effect; 0 = no effect; negative = it works against it.
The work is a generator of steps (one per layer) so a caller can report progress and stop
between layers.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from mcp_interp.core import metrics
from mcp_interp.core.bridge import hook_z
from mcp_interp.core.heads import Head, PositionSpec, parse_heads, position_mask
from mcp_interp.core.jobs import Job
from mcp_interp.core.patching import (
    BlockTrace,
    LogitDiffReadout,
    Unit,
    attribution_estimates,
    capture_forward,
    trace_blocks,
)
from mcp_interp.core.suffix_sweep import best_sweep
from mcp_interp.core.tokens import encode, resolve_answers, validate_pairs
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.common import Score
from mcp_interp.schemas.heads import HeadScore, PatchHeadsMeasurement, VerifiedHead

Direction = Literal["denoise", "noise"]
Method = Literal["exact", "attribution"]

SMALL_GAP = 0.5  # |clean − corrupt| logit difference below which fractions are unstable
TOP_WITH_EXAMPLES = 10


@dataclass
class PatchHeadsJob(Job[PatchHeadsMeasurement]):
    """Per-head patching scores (see the module docstring); a ``core.jobs.Job``, one step per layer swept."""

    model: LoadedModel
    clean_prompts: Sequence[str]
    corrupt_prompts: Sequence[str]
    correct: str | Sequence[str]
    incorrect: str | Sequence[str]
    direction: Direction = "denoise"
    method: Method = "exact"
    positions: PositionSpec = "all"
    heads: Any = None
    verify_top: int = 0
    result: PatchHeadsMeasurement | None = field(default=None, init=False)
    engine: str | None = field(default=None, init=False)
    engine_note: str | None = field(default=None, init=False)
    first_diff: int = field(default=0, init=False)

    def total_steps(self) -> int:
        return self._layers_to_sweep(self._heads()) if self.method == "exact" else 1 + (1 if self.verify_top else 0)

    def _heads(self) -> list[Head]:
        cfg = self.model.bridge.cfg
        if self.heads is None:
            return [Head(layer, head) for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]
        return parse_heads(self.heads, cfg.n_layers, cfg.n_heads)

    def _layers_to_sweep(self, heads: list[Head]) -> int:
        return self.model.bridge.cfg.n_layers - min(h.layer for h in heads)

    def steps(self) -> Iterator[str]:
        """Run the job; yields a progress message per unit of work; sets ``self.result``."""
        if self.direction not in ("denoise", "noise"):
            raise InputError(f"direction must be 'denoise' or 'noise', got {self.direction!r}.")
        if self.method not in ("exact", "attribution"):
            raise InputError(f"method must be 'exact' or 'attribution', got {self.method!r}.")
        model, tokenizer = self.model, self.model.tokenizer
        diffs = validate_pairs(
            tokenizer, self.clean_prompts, self.corrupt_prompts, ("clean_prompts", "corrupt_prompts")
        )
        # Positions before this one are identical in every pair: the fast engine skips them.
        self.first_diff = min((d.positions[0] for d in diffs if d.positions), default=0)
        heads = self._heads()
        clean = encode(tokenizer, self.clean_prompts, model.device)
        corrupt = encode(tokenizer, self.corrupt_prompts, model.device)
        n = len(clean.texts)
        correct_ids = torch.tensor(resolve_answers(tokenizer, self.correct, n, "correct"))
        incorrect_ids = torch.tensor(resolve_answers(tokenizer, self.incorrect, n, "incorrect"))

        readout = LogitDiffReadout(model.bridge, correct_ids, incorrect_ids)
        row_metric = readout.from_residual

        everyone = torch.arange(n)
        base, source = (corrupt, clean) if self.direction == "denoise" else (clean, corrupt)
        mask = position_mask(self.positions, base.attention_mask, base.answer_positions)
        layers = sorted({h.layer for h in heads})
        bridge = model.bridge
        # Two forwards serve everything: the source run (its z) and the base run (traced for exact
        # patching; for attribution, the forward the gradient is taken through). Both stop before
        # the unembedding, which is applied at the answer only.
        source_run = capture_forward(bridge, source.input_ids, [hook_z(layer) for layer in layers])
        source_z = {layer: source_run.acts[hook_z(layer)] for layer in layers}

        def final_metric(answer: torch.Tensor) -> torch.Tensor:
            with torch.inference_mode():
                return row_metric(answer, everyone)

        source_ld = final_metric(source_run.final[everyone, source.answer_positions])
        verified = None
        if self.method == "exact":
            base_run = capture_forward(bridge, base.input_ids, trace=True)
            assert base_run.trace is not None
            base_ld = final_metric(base_run.final[everyone, base.answer_positions])
            patched = yield from self._exact(base_run.trace, source_z, heads, mask, base.answer_positions, row_metric)
        else:
            n_heads = model.bridge.cfg.n_heads
            estimates, base_answer = attribution_estimates(
                model.bridge, base.input_ids, source_z, mask, base.answer_positions, readout.from_residual, n_heads
            )
            base_ld = final_metric(base_answer)
            patched = torch.stack([estimates[h.layer, h.head] + base_ld for h in heads])
            yield "attribution: one forward per input and one backward"
        clean_ld, corrupt_ld = (source_ld, base_ld) if self.direction == "denoise" else (base_ld, source_ld)
        if self.method == "attribution" and self.verify_top:
            top = self._ranked(heads, patched, clean_ld, corrupt_ld)[: self.verify_top]
            exact = yield from self._exact(
                trace_blocks(bridge, base.input_ids),
                source_z,
                [heads[i] for i in top],
                mask,
                base.answer_positions,
                row_metric,
            )
            verified = [
                VerifiedHead(
                    head=str(heads[i]),
                    attribution_score=self._score(patched[i], clean_ld, corrupt_ld).value,
                    exact_score=self._score(exact[j], clean_ld, corrupt_ld).value,
                )
                for j, i in enumerate(top)
            ]
        self.result = self._measurement(heads, patched, clean_ld, corrupt_ld, diffs, mask, verified)

    def _exact(
        self,
        trace: BlockTrace,
        source_z: dict[int, torch.Tensor],
        heads: list[Head],
        mask: torch.Tensor,
        answer_positions: torch.Tensor,
        row_metric: Any,
    ) -> Generator[str, None, torch.Tensor]:
        units = [Unit(h.layer, h.head) for h in heads]
        chosen = best_sweep(
            self.model.bridge, trace, "z", source_z, units, mask, answer_positions, row_metric, self.first_diff
        )
        sweep, self.engine = chosen.sweep, chosen.engine
        self.engine_note = self.engine_note or chosen.note
        for layer in sweep.steps():
            yield f"exact patching: layer {layer} of {self.model.bridge.cfg.n_layers - 1} done"
        assert sweep.values is not None
        return sweep.values

    def _score(self, patched: torch.Tensor, clean: torch.Tensor, corrupt: torch.Tensor) -> Score:
        fraction = metrics.recovered_fraction(patched, clean, corrupt)
        if self.direction == "denoise":
            return fraction
        return Score(value=1.0 - fraction.value, per_example=[1.0 - v for v in fraction.per_example])

    def _ranked(
        self, heads: list[Head], patched: torch.Tensor, clean: torch.Tensor, corrupt: torch.Tensor
    ) -> list[int]:
        def key(i: int) -> float:
            value = self._score(patched[i], clean, corrupt).value
            return -abs(value) if value == value else 0.0  # NaN sorts last

        return sorted(range(len(heads)), key=key)

    def _measurement(
        self,
        heads: list[Head],
        patched: torch.Tensor,
        clean_ld: torch.Tensor,
        corrupt_ld: torch.Tensor,
        diffs: list[Any],
        mask: torch.Tensor,
        verified: list[VerifiedHead] | None,
    ) -> PatchHeadsMeasurement:
        cfg = self.model.bridge.cfg
        scores: list[list[float | None]] = [[None] * cfg.n_heads for _ in range(cfg.n_layers)]
        patched_grid: list[list[float | None]] = [[None] * cfg.n_heads for _ in range(cfg.n_layers)]
        rows = []
        order = self._ranked(heads, patched, clean_ld, corrupt_ld)
        for rank, i in enumerate(order):
            head = heads[i]
            score = self._score(patched[i], clean_ld, corrupt_ld)
            value = _finite(score.value)
            scores[head.layer][head.head] = value
            patched_grid[head.layer][head.head] = float(patched[i].mean())
            detailed = rank < TOP_WITH_EXAMPLES
            rows.append(
                HeadScore(
                    head=str(head),
                    layer=head.layer,
                    head_index=head.head,
                    score=value,
                    patched_logit_diff=float(patched[i].mean()),
                    per_example_score=[_finite(v) for v in score.per_example] if detailed else None,
                    per_example_patched_logit_diff=[float(v) for v in patched[i]] if detailed else None,
                )
            )
        notes = []
        gap = float((clean_ld - corrupt_ld).mean())
        if abs(gap) < SMALL_GAP:
            notes.append(
                f"The clean−corrupt logit-difference gap is only {gap:+.3f}: recovered fractions divide by it "
                "and are unstable; choose pairs the model separates more clearly."
            )
        if self.engine_note:
            notes.append(self.engine_note)
        if self.method == "attribution":
            notes.append(
                "Attribution patching is a first-order (gradient) estimate of exact patching, not a measurement; "
                "use verify_top or method 'exact' before citing a head's number."
            )
        first_diff = min((d.positions[0] for d in diffs if d.positions), default=None)
        if first_diff is None:
            notes.append("Every clean/corrupt pair is token-for-token identical: every score is undefined.")
        elif not bool(mask[:, first_diff:].any()):
            notes.append(
                f"All patched positions come before the first position where the pairs differ ({first_diff}): "
                "clean and corrupt activations are identical there, so every patch is a no-op."
            )
        return PatchHeadsMeasurement(
            method=self.method,
            approximate=self.method == "attribution",
            direction=self.direction,
            positions=self.positions if self.positions is not None else "all",  # type: ignore[arg-type]
            clean_logit_diff=metrics.score_of(clean_ld),
            corrupt_logit_diff=metrics.score_of(corrupt_ld),
            differing_positions=[d.positions for d in diffs],
            scores=scores,
            patched_logit_diff=patched_grid,
            heads=rows,
            verified=verified,
            engine=self.engine,
            notes=notes,
        )


def _finite(value: float) -> float | None:
    return None if value != value or value in (float("inf"), float("-inf")) else float(value)
