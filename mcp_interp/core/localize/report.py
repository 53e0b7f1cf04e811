"""What ``patch`` reports: scores of cells (``engine.scores``), their labels in words, the grids, and the notes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mcp_interp.core.engine.numbers import metrics
from mcp_interp.core.engine.numbers.scores import (
    TOP_WITH_EXAMPLES,
    directed_score,
    finite,
    gap_is_small,
    ranked_scores,
    score_interval,
)
from mcp_interp.core.engine.patching.job import PatchOutcome
from mcp_interp.core.engine.patching.sweep import Unit
from mcp_interp.core.engine.text.tokens import Batch, PairDiff, token_strings
from mcp_interp.schemas.common import AnswerKind, PatchDirection, PatchMethod, PatchMetric, Score
from mcp_interp.schemas.localize import Component, PatchCell, PatchMeasurement, PositionToken, VerifiedCell


@dataclass(kw_only=True)
class PatchReport:
    """The settings a ``patch`` result is read with, and the model's shape and first clean prompt's tokens."""

    component: Component
    direction: PatchDirection
    method: PatchMethod
    metric: PatchMetric
    answer_kind: AnswerKind | None
    n_layers: int
    n_heads: int
    tokenizer: Any
    clean_tokens: list[str]

    def score(self, patched: torch.Tensor, clean: torch.Tensor, corrupt: torch.Tensor) -> Score:
        return directed_score(patched, clean, corrupt, self.direction)

    def label(self, cell: Unit) -> str:
        if self.component == "mlp_neurons" or cell.position is None:
            return f"layer {cell.layer}, MLP neuron {cell.channel} (every position)"
        known = cell.position < len(self.clean_tokens)
        token = self.clean_tokens[cell.position] if known else "<pad>"
        where = f"token {token!r} (position {cell.position})"
        if self.component == "heads_by_pos":
            return f"head L{cell.layer}H{cell.channel}, {where}"
        return f"layer {cell.layer} {self.component}, {where}"

    def measurement(self, outcome: PatchOutcome, layers: list[int], positions: list[int]) -> PatchMeasurement:
        cells, patched, clean_m, corrupt_m = outcome.cells, outcome.patched, outcome.clean, outcome.corrupt
        first_diff, first_run, diffs = outcome.first_diff, outcome.first_run, outcome.diffs
        tokens = position_tokens(self.tokenizer, outcome.clean_batch, outcome.corrupt_batch, diffs)
        verified = None
        if outcome.verified is not None:
            verified = [
                VerifiedCell(
                    label=self.label(cells[i]),
                    attribution_score=finite(self.score(patched[i], clean_m, corrupt_m).value),
                    exact_score=finite(self.score(exact, clean_m, corrupt_m).value),
                )
                for i, exact in outcome.verified
            ]
        scores = [self.score(row, clean_m, corrupt_m) for row in patched]
        grid: list[list[float | None]] | None = None
        patched_grid: list[list[float | None]] | None = None
        head_grid: list[list[list[float | None]]] | None = None
        head_patched: list[list[list[float | None]]] | None = None
        if self.component == "heads_by_pos":
            head_grid = [[[None] * len(tokens) for _ in range(self.n_heads)] for _ in range(self.n_layers)]
            head_patched = [[[None] * len(tokens) for _ in range(self.n_heads)] for _ in range(self.n_layers)]
        elif self.component != "mlp_neurons":
            grid = [[None] * len(tokens) for _ in range(self.n_layers)]
            patched_grid = [[None] * len(tokens) for _ in range(self.n_layers)]
        for cell, score, row in zip(cells, scores, patched, strict=True):
            value = 0.0 if cell.position is not None and cell.position < first_run else finite(score.value)
            if cell.position is None:
                continue
            if head_grid is not None and head_patched is not None and cell.channel is not None:
                head_grid[cell.layer][cell.channel][cell.position] = value
                head_patched[cell.layer][cell.channel][cell.position] = float(row.mean())
            elif grid is not None and patched_grid is not None:
                grid[cell.layer][cell.position] = value
                patched_grid[cell.layer][cell.position] = float(row.mean())
        # Cells before first_run were not run (a causal model's no-ops): they are in the grids as 0, never listed.
        order = [
            i
            for i in ranked_scores(patched, clean_m, corrupt_m, self.direction)
            if (p := cells[i].position) is None or p >= first_run
        ]
        rows = []
        for rank, i in enumerate(order):
            cell = cells[i]
            token = tokens[cell.position].clean_token if cell.position is not None else None
            detailed = rank < TOP_WITH_EXAMPLES
            rows.append(
                PatchCell(
                    label=self.label(cell),
                    layer=cell.layer,
                    head=cell.channel if self.component == "heads_by_pos" else None,
                    neuron=cell.channel if self.component == "mlp_neurons" else None,
                    position=cell.position,
                    token=token,
                    score=finite(scores[i].value),
                    patched=float(patched[i].mean()),
                    per_example_score=[finite(v) for v in scores[i].per_example] if detailed else None,
                    per_example_patched=[float(v) for v in patched[i]] if detailed else None,
                    interval=_interval(patched[i], clean_m, corrupt_m, self.direction) if detailed else None,
                )
            )
        return PatchMeasurement(
            component=self.component,
            method=self.method,
            approximate=self.method == "attribution",
            direction=self.direction,
            metric=self.metric,
            answer_kind=self.answer_kind,
            clean=metrics.score_of(clean_m),
            corrupt=metrics.score_of(corrupt_m),
            tokens=tokens,
            differing_positions=[d.positions for d in diffs],
            skipped_positions=[p for p in positions if p < first_run] if self.component != "mlp_neurons" else [],
            scores=grid,
            patched=patched_grid,
            head_scores=head_grid,
            head_patched=head_patched,
            cells=rows,
            verified=verified,
            sweep=outcome.sweep,
            engine_requests=outcome.engine_requests,
            rows=outcome.rows,
            noise=outcome.noise,
            notes=outcome.notes
            + self.notes(clean_m, corrupt_m, first_diff, len(tokens))
            + _interval_note(rows, outcome),
        )

    def notes(self, clean_m: torch.Tensor, corrupt_m: torch.Tensor, first_diff: int, width: int) -> list[str]:
        notes = []
        gap = float((clean_m - corrupt_m).mean())
        if gap_is_small(self.metric, gap):
            notes.append(
                f"The clean−corrupt gap of {self.metric} is only {gap:+.3f}: scores divide by it and are unstable; "
                "choose pairs the model separates more clearly."
            )
        if first_diff >= width:
            notes.append("Every clean/corrupt pair is token-for-token identical: every score is undefined.")
        if self.method == "attribution":
            notes.append(
                "Attribution is a first-order (gradient) estimate of exact patching, not a measurement; "
                "use verify_top or method 'exact' before citing a cell's number."
            )
        if self.metric == "kl" and self.method == "attribution" and self.direction == "noise":
            notes.append(
                "KL(clean‖run) is minimal (0) at the clean run, so its gradient there is 0: attribution in the "
                "noise direction estimates 0 for every cell to first order. Use method 'exact', or 'denoise'."
            )
        if self.metric == "kl":
            notes.append(
                "With metric 'kl' the clean value is 0 by definition: a score of 1 means the patched run's "
                "distribution at the answer equals the clean one."
            )
        return notes


def _interval(patched: torch.Tensor, clean: torch.Tensor, corrupt: torch.Tensor, direction: PatchDirection) -> Any:
    found = score_interval(patched, clean, corrupt, direction)
    return None if found is None else [round(found[0], 4), round(found[1], 4)]


def _interval_note(rows: list[PatchCell], outcome: PatchOutcome) -> list[str]:
    """Which top cells' bootstrap intervals exclude 0 (an interval over pairs, not a test corrected for the many
    cells of a map), and how the noise corruption was run."""
    notes = []
    if outcome.noise is not None:
        info = outcome.noise
        notes.append(
            f"Corrupt runs: each clean prompt with Gaussian noise of σ = {info.sigma:.4g} ({info.scale:g} × the std "
            f"{info.embedding_std:.4g} of {info.std_of}) on the token embeddings at the noised positions, "
            f"{info.samples} draws averaged (seed {info.seed})."
        )
    shown = [r for r in rows if r.interval is not None]
    if shown:
        excluding = [r.label for r in shown if r.interval is not None and (r.interval[0] > 0 or r.interval[1] < 0)]
        notes.append(
            f"Of the top {len(shown)} cells, {len(excluding)} have a 95% bootstrap interval over pairs that excludes 0"
            + (f" ({'; '.join(excluding[:5])}{' …' if len(excluding) > 5 else ''})" if excluding else "")
            + "; the intervals are per cell, not corrected for the map's many cells."
        )
    return notes


def position_tokens(tokenizer: Any, clean: Batch, corrupt: Batch, diffs: list[PairDiff]) -> list[PositionToken]:
    width = clean.input_ids.shape[1]
    clean_tokens = token_strings(tokenizer, clean.ids(0))
    corrupt_tokens = token_strings(tokenizer, corrupt.ids(0))
    counts = [0] * width
    for diff in diffs:
        for p in diff.positions:
            counts[p] += 1
    return [
        PositionToken(
            position=p,
            clean_token=clean_tokens[p] if p < len(clean_tokens) else "",
            corrupt_token=corrupt_tokens[p] if p < len(corrupt_tokens) else "",
            differs_in_pairs=counts[p],
        )
        for p in range(width)
    ]
