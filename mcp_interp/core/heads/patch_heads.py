"""``patch_heads``: per-head patching scores on minimal pairs — a preset of the engine's patching job.

Each head's output (its slice of ``hook_z``) is patched at the positions asked for (every real token by
default) in one cell per head; the score is the fraction of the clean−corrupt gap of the metric it restores
(``denoise``) or destroys (``noise``), ``engine.scores``: 1 = this head alone carries the whole effect,
0 = no effect, negative = it works against it. The per-head score is a ratio of means over the pairs; each
pair's own ratio is in ``per_example_score`` for the top heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.sites import Site
from mcp_interp.core.engine.numbers import metrics
from mcp_interp.core.engine.numbers.scores import TOP_WITH_EXAMPLES, directed_score, finite, gap_is_small, ranked_scores
from mcp_interp.core.engine.patching.job import CellContext, PatchingJob, PatchOutcome
from mcp_interp.core.engine.patching.sweep import Unit
from mcp_interp.core.engine.text.components import Head, PositionSpec, parse_heads, position_mask
from mcp_interp.schemas.common import PositionsSpec
from mcp_interp.schemas.heads import HeadScore, PatchHeadsMeasurement, VerifiedHead


@dataclass(kw_only=True)
class PatchHeadsJob(PatchingJob[PatchHeadsMeasurement]):
    """Per-head patching scores (see the module docstring); one step per layer swept."""

    positions: PositionsSpec = "all"
    heads: Any = None

    def site(self) -> Site:
        return "z"

    def check(self) -> None:
        require(self.model.backend, "patch_heads")

    def chosen_heads(self) -> list[Head]:
        cfg = self.model.cfg
        if self.heads is None:
            return [Head(layer, head) for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]
        return parse_heads(self.heads, cfg.n_layers, cfg.n_heads)

    def patched_layers(self) -> list[int]:
        return sorted({h.layer for h in self.chosen_heads()})

    def patch_positions(self) -> PositionSpec:
        return self.positions

    def cells(self, context: CellContext) -> list[Unit]:
        return [Unit(h.layer, h.head) for h in self.chosen_heads()]

    def report(self, outcome: PatchOutcome) -> PatchHeadsMeasurement:
        cfg = self.model.cfg
        heads = [Head(c.layer, int(c.channel or 0)) for c in outcome.cells]
        clean, corrupt, patched = outcome.clean, outcome.corrupt, outcome.patched
        scores: list[list[float | None]] = [[None] * cfg.n_heads for _ in range(cfg.n_layers)]
        patched_grid: list[list[float | None]] = [[None] * cfg.n_heads for _ in range(cfg.n_layers)]
        rows = []
        for rank, i in enumerate(ranked_scores(patched, clean, corrupt, self.direction)):
            head = heads[i]
            score = directed_score(patched[i], clean, corrupt, self.direction)
            value = finite(score.value)
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
                    per_example_score=[finite(v) for v in score.per_example] if detailed else None,
                    per_example_patched_logit_diff=[float(v) for v in patched[i]] if detailed else None,
                )
            )
        verified = None
        if outcome.verified is not None:
            verified = [
                VerifiedHead(
                    head=str(heads[i]),
                    attribution_score=finite(directed_score(patched[i], clean, corrupt, self.direction).value),
                    exact_score=finite(directed_score(exact, clean, corrupt, self.direction).value),
                )
                for i, exact in outcome.verified
            ]
        return PatchHeadsMeasurement(
            method=self.method,
            approximate=self.method == "attribution",
            direction=self.direction,
            metric=self.metric,
            answer_kind=self.scored_answer_kind(),
            positions=self.positions if self.positions is not None else "all",
            clean_logit_diff=metrics.score_of(clean),
            corrupt_logit_diff=metrics.score_of(corrupt),
            differing_positions=[d.positions for d in outcome.diffs],
            scores=scores,
            patched_logit_diff=patched_grid,
            heads=rows,
            verified=verified,
            sweep=outcome.sweep,
            engine_requests=outcome.engine_requests,
            rows=outcome.rows,
            notes=outcome.notes + self._notes(outcome),
        )

    def _notes(self, outcome: PatchOutcome) -> list[str]:
        notes = []
        gap = float((outcome.clean - outcome.corrupt).mean())
        if gap_is_small(self.metric, gap):
            notes.append(
                f"The clean−corrupt gap of {self.metric} is only {gap:+.3f}: recovered fractions divide by it "
                "and are unstable; choose pairs the model separates more clearly."
            )
        if self.method == "attribution":
            notes.append(
                "Attribution patching is a first-order (gradient) estimate of exact patching, not a measurement; "
                "use verify_top or method 'exact' before citing a head's number."
            )
        width = outcome.clean_batch.input_ids.shape[1]
        if outcome.first_diff >= width:
            notes.append("Every clean/corrupt pair is token-for-token identical: every score is undefined.")
        else:
            base = outcome.corrupt_batch if self.direction == "denoise" else outcome.clean_batch
            mask = position_mask(self.positions, base.attention_mask, base.answer_positions)
            if not bool(mask[:, outcome.first_run :].any()):  # first_run is 0 where attention is bidirectional
                notes.append(
                    f"All patched positions come before the first position where the pairs differ "
                    f"({outcome.first_diff}): attention is causal, so clean and corrupt activations are identical "
                    "there and every patch is a no-op."
                )
        return notes
