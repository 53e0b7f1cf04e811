"""``explain``: why did the model predict `answer` over `baseline`? One call, cited numbers.

Stages, each the same computation as the single tool of that name (so their numbers agree):
logit lens (where the answer forms), direct logit attribution (who writes it); when a corrupt
minimal pair is given, exact head patching (whose effect is causal) and the layer × position maps of
``patch`` — resid_pre everywhere, attn_out and mlp_out at the positions that carry the gap (which
position carries the information at each layer, where attention moves it, which MLPs write it,
``positions``); then the attention patterns of the top heads (what they read). Findings are sentences
that quote those numbers (``findings``); ``report.report_markdown`` renders them with every figure linked.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import Job
from mcp_interp.core.engine.text.answers import resolve_answer
from mcp_interp.core.explain import positions as where
from mcp_interp.core.explain.findings import causal_heads, layer_words, route_finding
from mcp_interp.core.heads.patch_heads import PatchHeadsJob
from mcp_interp.core.lens.attention import attention
from mcp_interp.core.lens.dla import dla
from mcp_interp.core.lens.logit_lens import logit_lens
from mcp_interp.core.localize.patch import PatchJob
from mcp_interp.errors import InputError
from mcp_interp.schemas.explain import ExplainMeasurement
from mcp_interp.schemas.heads import PatchHeadsMeasurement
from mcp_interp.schemas.lens import AttentionMeasurement, DLAMeasurement, LogitLensMeasurement
from mcp_interp.schemas.localize import Component, PatchMeasurement

MAPPED_COMPONENTS: tuple[Component, ...] = ("resid_pre", "attn_out", "mlp_out")


@dataclass(kw_only=True)
class ExplainJob(Job[ExplainMeasurement]):
    """The stages above as an ``engine.jobs.Job``: one step per stage, and one per layer of each patching sweep."""

    model: LoadedModel
    prompt: str
    answer: str
    baseline: str
    corrupt: str | None = None
    top_k: int = 5
    lens: LogitLensMeasurement | None = field(default=None, init=False)
    attribution: DLAMeasurement | None = field(default=None, init=False)
    patching: PatchHeadsMeasurement | None = field(default=None, init=False)
    corrupt_attribution: DLAMeasurement | None = field(default=None, init=False)
    maps: dict[str, PatchMeasurement] = field(default_factory=dict, init=False)
    attentions: list[AttentionMeasurement] = field(default_factory=list, init=False)
    stage_seconds: dict[str, float] = field(default_factory=dict, init=False)
    result: ExplainMeasurement | None = field(default=None, init=False)

    def total_steps(self) -> int:
        if self.corrupt is None:
            return 3
        return (
            3 + self._patching_job().total_steps() + len(MAPPED_COMPONENTS) * self._map_job("resid_pre").total_steps()
        )

    def _pair(self) -> dict[str, Any]:
        """The prompt and its corrupt partner as the patching jobs take them (what `patch_heads` and `patch` get)."""
        assert self.corrupt is not None
        return {
            "model": self.model,
            "clean_prompts": [self.prompt],
            "corrupt_prompts": [self.corrupt],
            "correct": self.answer,
            "incorrect": self.baseline,
        }

    def _patching_job(self) -> PatchHeadsJob:
        return PatchHeadsJob(**self._pair())

    def _map_job(self, component: Component, positions: list[int] | None = None) -> PatchJob:
        """The ``patch`` call whose layer × position map explain reports for `component` (same arguments)."""
        return PatchJob(**self._pair(), component=component, positions=positions)

    def _position_maps(self) -> Iterator[str]:
        """resid_pre at every layer × position, then attn_out and mlp_out at the positions that carry the gap."""
        job = self._map_job("resid_pre")
        yield from job.steps()
        assert job.result is not None and job.result.scores is not None
        self.maps["resid_pre"] = job.result
        chosen = where.mapped_positions(job.result.scores)
        if not chosen:
            yield f"no position's resid_pre recovers {where.MAPPED:.0%} of the gap: attn_out and mlp_out not mapped"
            return
        for component in MAPPED_COMPONENTS[1:]:
            job = self._map_job(component, chosen)
            yield from job.steps()
            assert job.result is not None
            self.maps[component] = job.result

    def steps(self) -> Iterator[str]:
        import time

        require(self.model.backend, "explain")
        if not 1 <= self.top_k <= 20:
            raise InputError(f"top_k must be between 1 and 20, got {self.top_k}.")
        if resolve_answer(self.model.tokenizer, self.answer) == resolve_answer(self.model.tokenizer, self.baseline):
            raise InputError(
                f"answer {self.answer!r} and baseline {self.baseline!r} are the same token: there is no preference "
                "between them to explain (their logit difference is 0 by construction). Pass a different baseline, "
                "e.g. the answer the model should not give."
            )
        tokenizer = self.model.tokenizer
        if self.corrupt is not None and tokenizer(self.corrupt).input_ids == tokenizer(self.prompt).input_ids:
            raise InputError(
                "`corrupt` tokenizes exactly like `prompt`: patching between identical runs measures nothing. Pass a "
                "minimal pair that changes the detail the answer depends on (same token length), or omit `corrupt`."
            )
        started = time.perf_counter()
        self.lens = logit_lens(self.model, self.prompt, self.answer)
        self.stage_seconds["logit_lens"] = time.perf_counter() - started
        yield "logit lens done"

        started = time.perf_counter()
        self.attribution = dla(self.model, self.prompt, self.answer, self.baseline, top_k=max(10, self.top_k))
        self.stage_seconds["dla"] = time.perf_counter() - started
        yield "direct logit attribution done"

        if self.corrupt is not None:
            started = time.perf_counter()
            job = self._patching_job()
            yield from job.steps()
            self.patching = job.result
            # The corrupt run's per-head direct terms and final-norm scale, to read the patch's direct part against.
            self.corrupt_attribution = dla(self.model, self.corrupt, self.answer, self.baseline)
            self.stage_seconds["patch_heads"] = time.perf_counter() - started
            started = time.perf_counter()
            yield from self._position_maps()
            self.stage_seconds["position_maps"] = time.perf_counter() - started

        started = time.perf_counter()
        for name in self._top_heads():
            layer, head = (int(x) for x in name[1:].split("H"))
            self.attentions.append(attention(self.model, self.prompt, layer, head))
        self.stage_seconds["attention"] = time.perf_counter() - started
        yield "attention patterns done"
        self.result = self._measurement()

    def _top_heads(self) -> list[str]:
        if self.patching is not None:
            return [h.head for h in self.patching.heads[: self.top_k]]
        assert self.attribution is not None
        heads = sorted(
            ((f"L{layer}H{h}", v) for layer, row in enumerate(self.attribution.heads) for h, v in enumerate(row)),
            key=lambda item: -abs(item[1]),
        )
        return [name for name, _ in heads[: self.top_k]]

    def _reading(self) -> where.Reading | None:
        """What the maps say (``positions``); None without a corrupt prompt."""
        if not self.maps:
            return None
        return where.read_maps(self.maps["resid_pre"], self.maps.get("attn_out"), self.maps.get("mlp_out"), self.top_k)

    def _measurement(self) -> ExplainMeasurement:
        lens, attribution = self.lens, self.attribution
        assert lens is not None and attribution is not None
        final = lens.layers[-1]
        reading = self._reading()
        tie = f", tied with {final.target_tied} other token(s)" if final.target_tied else ""
        findings = [
            f"The model gives {lens.target!r} probability {lens.final_prob:.3f} (rank {final.target_rank}{tie}); "
            f"logit({lens.target!r}) − logit({attribution.baseline!r}) = {attribution.measured:+.3f}."
        ]
        if lens.first_top1_layer is None and final.target_rank == 0 and final.target_tied:
            findings.append(
                f"{lens.target!r} shares the top logit with {final.target_tied} other token(s) at the last layer: the "
                "output is tied (flat where every value shares it), so the model predicts no single value here."
            )
        elif lens.first_top1_layer is None:
            findings.append(
                f"In the logit lens {lens.target!r} is not top-1 at the last layer, so it never settles as the "
                "model's prediction."
            )
        else:
            at = next(row for row in lens.layers if row.layer == lens.first_top1_layer)
            findings.append(
                f"In the logit lens {lens.target!r} becomes top-1 at {layer_words(lens.first_top1_layer)} "
                f"(probability {at.target_prob:.3f} there) and stays top-1 to the end."
            )
        tops = ", ".join(f"{c.component} {c.value:+.3f}" for c in attribution.top[: self.top_k])
        findings.append(
            f"Largest direct contributions to {attribution.quantity}: {tops} (all components sum to "
            f"{attribution.total:+.3f}; measured {attribution.measured:+.3f})."
        )
        causal = None
        gap = None
        if self.patching is not None:
            assert self.corrupt_attribution is not None
            gap = self.patching.clean_logit_diff.value - self.patching.corrupt_logit_diff.value
            causal = causal_heads(self.patching, attribution, self.corrupt_attribution, self.top_k)
            listed = ", ".join(
                f"{c.head} {c.recovered_fraction:+.1%}" for c in causal if c.recovered_fraction is not None
            )
            findings.append(
                f"Patching each head's output from the prompt into the corrupt one ({self.corrupt!r}; "
                f"clean−corrupt gap {gap:+.3f}) restores: {listed}."
            )
            in_last = {h.head for h in self.patching.heads if h.layer == self.model.cfg.n_layers - 1}
            findings += [
                s
                for c in causal[:3]
                if (s := route_finding(c.head, c.patch_effect, c.direct_effect, c.head in in_last))
            ]
            findings += reading.findings() if reading is not None else []
        for att in self.attentions[:3]:
            top = att.top_attended[0]
            findings.append(
                f"L{att.layer}H{att.head} at the answer position attends most to {top.token!r} "
                f"(position {top.position}, weight {top.weight:.2f})."
            )
        caveats = [
            "DLA and attention patterns are correlational; only patching (or ablation) tests a causal role.",
            "All numbers come from one prompt; check them on more prompts (patch_heads and ablate_head take lists).",
        ]
        if final.target_rank == 0 and not final.target_tied:
            caveats.append(
                "The answer is already top-1, so its rank is saturated; the logit difference is the measure to watch."
            )
        if gap is not None and abs(gap) < 0.5:
            caveats.append(f"The clean−corrupt gap is only {gap:+.3f}: recovered fractions divide by it.")
        return ExplainMeasurement(
            prompt=self.prompt,
            answer=lens.target,
            baseline=attribution.baseline or self.baseline,
            corrupt=self.corrupt,
            logit_diff=attribution.measured,
            answer_prob=lens.final_prob,
            answer_rank=final.target_rank,
            forms_at_layer=lens.first_top1_layer,
            top_dla=attribution.top[: self.top_k],
            causal_heads=causal,
            clean_corrupt_gap=gap,
            **(reading.fields() if reading is not None else {}),
            findings=findings,
            caveats=caveats,
            stage_seconds={k: round(v, 3) for k, v in self.stage_seconds.items()},
        )
