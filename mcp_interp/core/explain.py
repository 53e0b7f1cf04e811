"""``explain``: why did the model predict `answer` over `baseline`? One call, cited numbers.

Stages, each the same computation as the single tool of that name (so their numbers agree):
logit lens (where the answer forms), direct logit attribution (who writes it), exact head
patching when a corrupt minimal pair is given (whose effect is causal), and the attention
patterns of the top heads (what they read). Findings are sentences that quote those numbers;
``report_markdown`` renders them with every figure linked.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from mcp_interp.core.jobs import Job
from mcp_interp.core.lens import attention, dla, logit_lens
from mcp_interp.core.patch_heads import PatchHeadsJob
from mcp_interp.core.tokens import resolve_answer
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.common import ModelRef
from mcp_interp.schemas.explain import CausalHead, ExplainMeasurement
from mcp_interp.schemas.heads import PatchHeadsMeasurement
from mcp_interp.schemas.lens import AttentionMeasurement, DLAMeasurement, LogitLensMeasurement


@dataclass
class ExplainJob(Job[ExplainMeasurement]):
    """The stages above as a ``core.jobs.Job``: one step per stage, and one per layer of head patching."""

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
    attentions: list[AttentionMeasurement] = field(default_factory=list, init=False)
    stage_seconds: dict[str, float] = field(default_factory=dict, init=False)
    result: ExplainMeasurement | None = field(default=None, init=False)

    def total_steps(self) -> int:
        patch_layers = self.model.bridge.cfg.n_layers if self.corrupt is not None else 0
        return 3 + patch_layers

    def steps(self) -> Iterator[str]:
        import time

        if not 1 <= self.top_k <= 20:
            raise InputError(f"top_k must be between 1 and 20, got {self.top_k}.")
        resolve_answer(self.model.tokenizer, self.answer)
        resolve_answer(self.model.tokenizer, self.baseline)
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
            job = PatchHeadsJob(self.model, [self.prompt], [self.corrupt], self.answer, self.baseline)
            yield from job.steps()
            self.patching = job.result
            # The corrupt run's per-head direct terms and final-norm scale, to read the patch's direct part against.
            self.corrupt_attribution = dla(self.model, self.corrupt, self.answer, self.baseline)
            self.stage_seconds["patch_heads"] = time.perf_counter() - started

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

    def _measurement(self) -> ExplainMeasurement:
        lens, attribution = self.lens, self.attribution
        assert lens is not None and attribution is not None
        final = lens.layers[-1]
        findings = [
            f"The model gives {lens.target!r} probability {lens.final_prob:.3f} (rank {final.target_rank}); "
            f"logit({lens.target!r}) − logit({attribution.baseline!r}) = {attribution.measured:+.3f}."
        ]
        if lens.first_top1_layer is None:
            findings.append(
                f"In the logit lens {lens.target!r} is not top-1 at the last layer, so it never settles as the "
                "model's prediction."
            )
        else:
            at = next(row for row in lens.layers if row.layer == lens.first_top1_layer)
            findings.append(
                f"In the logit lens {lens.target!r} becomes top-1 at layer {lens.first_top1_layer} "
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
            findings += [s for c in causal[:3] if (s := route_finding(c.head, c.patch_effect, c.direct_effect))]
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
        if final.target_rank == 0:
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
            findings=findings,
            caveats=caveats,
            stage_seconds={k: round(v, 3) for k, v in self.stage_seconds.items()},
        )


def report_markdown(result: ExplainMeasurement, model: ModelRef, figures: dict[str, str]) -> str:
    """The Markdown report: every number in `result`, every figure (name → URI) linked."""
    lines = [
        f"# Why does the model say {result.answer!r}?",
        "",
        f"Prompt: `{result.prompt}`  ",
        f"Answer {result.answer!r} vs baseline {result.baseline!r}"
        + (f"; corrupt prompt `{result.corrupt}`" if result.corrupt else ""),
        "",
        f"Model: {model.name} ({model.source}), weights fingerprint `{model.fingerprint}`, {model.dtype} on "
        f"{model.device}; " + ", ".join(f"{k} {v}" for k, v in model.versions.items()),
        "",
        "## Numbers",
        "",
        "| quantity | value |",
        "| --- | --- |",
        f"| logit({result.answer}) − logit({result.baseline}) | {result.logit_diff:+.4f} |",
        f"| P({result.answer}) | {result.answer_prob:.4f} |",
        f"| rank of {result.answer!r} (0 = top-1) | {result.answer_rank} |",
        f"| first layer where it is top-1 (logit lens) | {result.forms_at_layer} |",
    ]
    if result.clean_corrupt_gap is not None:
        lines.append(f"| clean − corrupt logit difference | {result.clean_corrupt_gap:+.4f} |")
    lines += ["", "## Findings", ""] + [f"- {f}" for f in result.findings]
    lines += ["", "## Direct logit attribution (top components)", "", "| component | contribution |", "| --- | --- |"]
    lines += [f"| {c.component} | {c.value:+.4f} |" for c in result.top_dla]
    if result.causal_heads:
        lines += ["", "## Head patching (exact)", "", "| head | recovered fraction | DLA |", "| --- | --- | --- |"]
        for c in result.causal_heads:
            fraction = "n/a" if c.recovered_fraction is None else f"{c.recovered_fraction:+.4f}"
            lines.append(f"| {c.head} | {fraction} | {c.dla:+.4f} |")
    lines += ["", "## Figures", ""] + [f"- {name}: ![{name}]({uri}) `{uri}`" for name, uri in figures.items()]
    lines += ["", "## Caveats", ""] + [f"- {c}" for c in result.caveats]
    lines += ["", "## Time per stage", ""] + [f"- {k}: {v:.2f} s" for k, v in result.stage_seconds.items()]
    return "\n".join(lines) + "\n"


def causal_heads(
    patching: PatchHeadsMeasurement, clean: DLAMeasurement, corrupt: DLAMeasurement, top_k: int
) -> list[CausalHead]:
    """The top patched heads with their total and direct effects, in logits.

    A head's direct effect is the DLA of its *change*: output(clean) − output(corrupt) at the answer
    position, read through the unembedding with the corrupt run's final-norm scale frozen (the run
    being patched). DLA terms are linear in the output, so the clean term rescaled to the corrupt
    scale minus the corrupt term is exactly that. Comparing it with the patch's total effect says how
    much of the effect is direct; comparing the clean-run DLA with the patch score would not, since a
    head can write a lot in both runs and change nothing.
    """
    corrupt_ld = patching.corrupt_logit_diff.value
    rescale = clean.final_norm_scale / corrupt.final_norm_scale
    heads = []
    for h in patching.heads[:top_k]:
        clean_term, corrupt_term = clean.heads[h.layer][h.head_index], corrupt.heads[h.layer][h.head_index]
        heads.append(
            CausalHead(
                head=h.head,
                recovered_fraction=h.score,
                dla=clean_term,
                patch_effect=h.patched_logit_diff - corrupt_ld,
                direct_effect=clean_term * rescale - corrupt_term,
            )
        )
    return heads


NEGLIGIBLE_EFFECT = 0.1  # logits: a patch that moves the logit difference less than this gets no sentence
MOSTLY = 0.25  # a share below this of the total effect is "a small part"


def route_finding(head: str, total: float, direct: float) -> str | None:
    """How a head's patch effect reaches the logits: directly, through later layers, or both (None if negligible)."""
    if abs(total) < NEGLIGIBLE_EFFECT:
        return None
    indirect = total - direct
    numbers = f"patching it moves the logit difference by {total:+.3f}, of which {direct:+.3f} is its changed output "
    numbers += f"read directly by the unembedding and {indirect:+.3f} passes through later layers"
    if abs(indirect) <= MOSTLY * abs(total):
        return f"{head} acts mostly directly: {numbers}."
    if abs(direct) <= MOSTLY * abs(total) or direct * total < 0:
        return f"{head} acts mostly through later layers: {numbers}."
    return f"{head} acts both directly and through later layers: {numbers}."
