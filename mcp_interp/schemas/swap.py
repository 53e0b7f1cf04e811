"""Pydantic I/O of the causal-swap tools (``causal_swap_trial``, ``causal_swap_benchmark``,
``verify_artifact``, ``fit_lens``); with the corpus, lens and fit-setting
models they take as input. The protocol has its own vocabulary (trials, controls, exclusion
ledger, intervals).

Conventions: ``rank`` counts tokens with a strictly larger logit (0 = top-1, ties optimistic);
``margin`` is the answer's logit minus the best other token's (> 0 = strict top-1); a trial
*succeeds* when the scored answer is the strict top-1 (margin > 0); a ``margin gain`` is an
edited minus the unedited margin of the target answer (logits, > 0 = toward the target). The
output schemas are kept under 4 KB each (a client loads all 30 tools' schemas at once), so field
descriptions are short and say a sign, range or unit once; docs/tools/swap.md and ``core/swap`` say why.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from mcp_interp.schemas.common import Measurement, Provenance

SLOT = "{arg}"

TrialStatus = Literal[
    "executed",
    "skipped_source_inactive",
    "skipped_no_control_token",
    "excluded_not_capable",
    "excluded_target_unknown",
]
PositionSetting = Literal["last", "concept"] | int


# --- inputs: corpora, lenses, fit settings ---------------------------------------------------


class SwapFunction(BaseModel):
    name: str = Field(description="Short name of the relation, e.g. 'capital'.")
    template: str = Field(description="Prompt with exactly one '{arg}' slot for the concept.")
    answers: dict[str, str] = Field(description="The one-word answer for each concept, e.g. {'France': 'Paris'}.")

    @field_validator("template")
    @classmethod
    def _one_slot(cls, template: str) -> str:
        if template.count(SLOT) != 1:
            raise ValueError(f"template {template!r} must contain '{SLOT}' exactly once")
        return template


class SwapCorpus(BaseModel):
    """The shape of the shipped ``countries`` corpus; pass your own in the same shape."""

    name: str = Field(description="Corpus name, recorded in the artifact.")
    description: str = ""
    concepts: list[str] = Field(min_length=2, description="Concept words, e.g. ['France', 'Canada'].")
    functions: list[SwapFunction] = Field(min_length=1)

    @model_validator(mode="after")
    def _complete(self) -> SwapCorpus:
        if len({c.strip() for c in self.concepts}) != len(self.concepts):
            raise ValueError("concepts must be distinct (after stripping spaces)")
        names = [f.name for f in self.functions]
        if len(set(names)) != len(names):
            raise ValueError("function names must be distinct")
        for function in self.functions:
            missing = [c for c in self.concepts if c not in function.answers]
            extra = [c for c in function.answers if c not in self.concepts]
            if missing or extra:
                raise ValueError(
                    f"function {function.name!r} must give one answer per concept: missing {missing}, unknown {extra}"
                )
        return self


class LensInfo(BaseModel):
    kind: str = Field(description="logit (J = I) or jacobian (fitted).")
    sha256: str | None = Field(description="Of the lens file.")
    path: str | None
    source_layers: list[int] = Field(description="Blocks whose output it can edit.")
    corpus: str | None = None
    corpus_sha256: str | None = None
    n_prompts: int = Field(default=0, description="Texts fitted on.")
    settings: dict[str, Any] = Field(default_factory=dict)


class FitSettings(BaseModel):
    """How a Jacobian lens is fitted. The defaults are the fast fit a causal-swap run makes on first need: 8 texts of
    32 tokens, averaged from position 4 (about 4 minutes for the embedded model on 2 CPU cores; measured to let the
    decomposition find the concept atom in about half of the default benchmark's trials). Concept tokens sit early in
    short prompts, so early positions are fitted too; the reference fit (48 texts × 64 tokens from position 16) costs
    about 40 minutes."""

    max_prompts: int = Field(default=8, ge=1, le=1000)
    max_seq_len: int = Field(default=32, ge=3, le=512)
    dim_batch: int = Field(default=32, ge=1, le=1024)
    skip_first_positions: int = Field(default=4, ge=0, le=256)
    source_layers: list[int] | None = None


# --- trials ----------------------------------------------------------------------------------
# Field descriptions are an LLM's only guide to these numbers: each says sign, range or unit once, where it is needed.


class AnswerScore(BaseModel):
    token: str
    token_id: int = Field(description="Its first token.")
    n_tokens: int = Field(default=1, description="> 1: scored teacher-forced, every step.")
    logit: float = Field(description="First token's.")
    rank: int = Field(description="Tokens with a strictly larger logit; 0 = top-1.")
    margin: float = Field(description="Answer logit − best other (min over steps), logits; > 0 = strict top-1.")
    top1: bool = Field(description="margin > 0: the swap's success rule (a tie fails).")
    top_token: str = Field(description="The model's top token (at the first failing step).")


class Atom(BaseModel):
    token: str
    token_id: int
    coordinate: float = Field(description="Sparse coordinate, ≥ 0.")
    contribution: float = Field(description="coordinate × ‖atom‖.")


class PatchDiagnostics(BaseModel):
    source_target_cosine: float
    basis_rank: int
    basis_condition_number: float | None = Field(description="null = rank deficient.")
    residual_max_delta: float = Field(description="Change of the anchored residual (≈ 0).")
    warnings: list[str] = Field(default_factory=list, description="The solver's, verbatim.")


class ControlDraw(BaseModel):
    seed: int
    token: str
    token_id: int
    displacement: float = Field(description="‖v_control − v_source‖ (matched to the target's).")
    edit_norm: float = Field(description="‖Δh‖.")
    score: AnswerScore = Field(description="The target answer after this control edit.")
    patch: PatchDiagnostics | None = None


class TrialBaseline(BaseModel):
    source_answer: AnswerScore = Field(description="Unedited.")
    target_answer: AnswerScore = Field(description="In the unedited source prompt.")
    target_prompt_answer: AnswerScore | None = Field(default=None, description="In the target's own prompt.")


class TrialRecord(BaseModel):
    function: str
    source: str
    target: str
    layer: int = Field(description="Its block's output is edited.")
    prompt: str
    position: int = Field(description="Edited token index.")
    position_token: str
    status: TrialStatus
    detail: str | None = Field(default=None, description="Why skipped or excluded.")
    baseline: TrialBaseline | None = None
    source_coordinate: float | None = Field(default=None, description="c_src.")
    support: list[Atom] = Field(default_factory=list, description="Active atoms (top 10).")
    support_size: int | None = None
    target_displacement: float | None = Field(default=None, description="‖v_target − v_source‖.")
    control_pool_size: int | None = Field(default=None, description="Tokens matched at every layer of this swap.")
    real: AnswerScore | None = Field(default=None, description="The target answer after the real edit.")
    margin_gain: float | None = Field(
        default=None, description="real.margin − baseline.target_answer.margin, logits; > 0 = toward the target."
    )
    control_margin_gains: list[float] = Field(default_factory=list, description="The same per control seed.")
    target_was_active: bool | None = Field(
        default=None, description="The edit overwrote an active target atom: its size differs from the controls'."
    )
    real_edit_norm: float | None = None
    real_patch: PatchDiagnostics | None = None
    real_source_answer: AnswerScore | None = Field(default=None, description="The source answer after the edit.")
    controls: list[ControlDraw] = Field(default_factory=list)


MECHANISM = "coordinate_patch"  # TransformerLens JacobianLens anchored coordinate patch, mode 'substitute'


class SwapSettings(BaseModel):
    lens: Literal["logit", "jacobian"]
    position: PositionSetting
    alpha: float
    k: int
    control_seeds: list[int]
    control_tolerance: float
    require_target_known: bool
    mechanism: str = Field(default=MECHANISM, description="h += α·c_src·(v_target − v_source), one layer and position.")


class SwapTrialMeasurement(Measurement):
    trial: TrialRecord
    settings: SwapSettings
    lens: LensInfo


class SwapTrialResult(Provenance, SwapTrialMeasurement):
    pass


# --- benchmark summary -----------------------------------------------------------------------


class RateSummary(BaseModel):
    successes: int
    n: int
    rate: float | None
    ci_low: float = Field(description="Clopper–Pearson 95%, trials taken as independent.")
    ci_high: float
    n_independent_prompts: int


class PromptTest(BaseModel):
    """Real arm vs controls: per target one value per arm over its trials; which arm is real relabelled per target."""

    real: float = Field(description="Mean over targets, real arm.")
    control: float = Field(description="Mean over targets, controls.")
    difference: float = Field(description="real − control; > 0 = real above its controls.")
    targets: int = Field(description="Units relabelled: targets (merged where they share a control token).")
    real_above: int = Field(description="Targets where the real arm tops every control arm.")
    p_value: float = Field(description="Two-sided.")
    p_floor: float = Field(description="Smallest reachable p; above 0.05 the verdict cannot resolve.")
    p_greater: float = Field(description="One-sided, real > control.")
    method: Literal["exact", "monte_carlo"]
    draws: int = Field(description="Monte Carlo relabellings (0 = exact).")


class Specificity(BaseModel):
    """Graded effect: margin gain (TrialRecord.margin_gain, logits) of the real edit against its controls."""

    real_median_gain: float | None = Field(description="Over executed trials.")
    control_median_gain: float | None = Field(description="Over control edits.")
    margin_gain: PromptTest = Field(description="On per-target mean margin gains.")
    beats_all: int = Field(description="Trials where the real gain exceeds all m controls'.")
    trials: int
    beats_all_rate: float | None
    chance: float = Field(description="1/(m + 1).")
    beats_all_test: PromptTest = Field(description="On per-target fractions of trials each arm beats all others.")


class SeedSpread(BaseModel):
    mean: float | None
    sd: float | None
    min: float | None
    max: float | None


class LayerSummary(BaseModel):
    layer: int
    executed: int
    skipped_source_inactive: int
    skipped_no_control_token: int
    real_successes: int
    control_successes: int = Field(description="Of executed × seeds.")
    real_median_gain: float | None
    control_median_gain: float | None


class Exclusion(BaseModel):
    kind: Literal["prompt", "trial"] = Field(description="trial: (function, source, target) at every layer.")
    function: str
    concept: str | None = None
    source: str | None = None
    target: str | None = None
    prompt: str | None = None
    reason: str
    rank: int | None = None
    margin: float | None = None
    top_token: str | None = None


class SwapSummary(BaseModel):
    verdict: str = Field(description="Strict swap and specificity, each from its p-value.")
    status_counts: dict[str, int]
    layers: list[int]
    layers_executed: list[int]
    real: RateSummary = Field(description="Strict success of real edits: the headline rule.")
    control: RateSummary = Field(description="Over every control edit.")
    control_seed_spread: SeedSpread = Field(description="Of per-seed control success rates.")
    swap_test: PromptTest = Field(description="On per-target strict success rates.")
    specificity: Specificity
    by_layer: list[LayerSummary]
    n_independent_prompts: int = Field(description="Prompts (function, source) behind the executed trials.")
    real_success_prompts: list[str]
    tested_swaps: list[str] = Field(
        default_factory=list, description="The one swap per target the p-values rest on (its most executed)."
    )
    excluded_trials: int = Field(description="Layer slots in the ledger.")
    target_was_active: int
    shared_controls: list[list[str]] = Field(
        default_factory=list, description="Targets relabelled as one: their tested swaps share a control token."
    )


class SwapBenchmarkMeasurement(Measurement):
    corpus: str
    settings: SwapSettings
    lens: LensInfo
    summary: SwapSummary
    exclusions: list[Exclusion]
    figure_uri: str | None = None
    artifact_uri: str | None = Field(default=None, description="artifact://… every trial, fingerprinted.")
    artifact_path: str | None = None
    fingerprints: dict[str, Any] = Field(
        default_factory=dict, description="SHA-256 per artifact block; 'protocol' is equal for equal protocols."
    )


class SwapBenchmarkResult(Provenance, SwapBenchmarkMeasurement):
    pass


class BlockCheck(BaseModel):
    block: str
    expected: str | None = Field(description="Recorded fingerprint.")
    actual: str = Field(description="Recomputed, or 'missing'.")
    ok: bool


class VerifyArtifactResult(BaseModel):
    valid: bool = Field(description="Known schema, every fingerprint matches.")
    schema_name: str | None
    schema_version: int | None
    checks: list[BlockCheck]
    altered: list[str] = Field(description="Blocks that no longer match.")
    message: str


class FitLensMeasurement(Measurement):
    lens: LensInfo
    from_cache: bool
    fit_seconds: float = Field(description="0 when from the cache.")
    skipped_short_texts: int = 0


class FitLensResult(Provenance, FitLensMeasurement):
    pass
