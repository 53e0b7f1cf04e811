"""Pydantic I/O of the causal-swap tools (``causal_swap_trial``, ``causal_swap_benchmark``,
``verify_artifact``, ``fit_lens``); with the corpus, lens and fit-setting
models they take as input. The protocol has its own vocabulary (trials, controls, exclusion
ledger, intervals).

Conventions: ``rank`` counts tokens with a strictly larger logit (0 = top-1, ties optimistic);
``margin`` is the answer's logit minus the best other token's (> 0 = strict top-1); a trial
*succeeds* when the scored answer is the strict top-1 (margin > 0).
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
    """What a lens is, precisely enough to reproduce or compare results."""

    kind: str = Field(description="'logit' (J = I, no fitting) or 'jacobian' (a fitted Jacobian lens).")
    sha256: str | None = Field(description="SHA-256 of the lens file (jacobian); None for the logit lens.")
    path: str | None = Field(description="Where the lens file is (jacobian).")
    source_layers: list[int] = Field(description="Layers the lens can edit (outputs of these blocks).")
    corpus: str | None = Field(default=None, description="Text corpus the lens was fitted on.")
    corpus_sha256: str | None = Field(default=None, description="SHA-256 of the fitted texts (canonical JSON list).")
    n_prompts: int = Field(default=0, description="Texts that contributed to the fit.")
    settings: dict[str, Any] = Field(default_factory=dict, description="Fit settings and provenance.")


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


class AnswerScore(BaseModel):
    token: str = Field(description="The scored answer as decoded, e.g. ' Ottawa' (or ' North America').")
    token_id: int = Field(description="Its (first) token id.")
    n_tokens: int = Field(
        default=1, description="Tokens in the answer; > 1 is scored teacher-forced, step by step (greedy decoding)."
    )
    logit: float = Field(description="The (first) answer token's logit.")
    rank: int = Field(
        description="Tokens with a strictly larger logit than the (first) answer token, 0-based: 0 = top-1 (a tie "
        "counts as 0). The reference protocol's ranks are 1-based."
    )
    margin: float = Field(
        description="Answer logit minus the largest other logit (the smallest over the answer's tokens); > 0 means "
        "strict top-1 (at every step)."
    )
    top1: bool = Field(description="Strict top-1 (margin > 0) at every step: a tie for first is not a success.")
    top_token: str = Field(
        description="The model's actual top token (at the first step where the answer is not the strict top-1)."
    )


class Atom(BaseModel):
    token: str
    token_id: int
    coordinate: float = Field(description="Non-negative sparse coordinate of this lens vector (atom).")
    contribution: float = Field(description="coordinate × ‖atom‖: its share of the activation's norm.")


class PatchDiagnostics(BaseModel):
    """What TransformerLens' coordinate-patch solver reports about one edit (its postcondition witnesses)."""

    source_target_cosine: float = Field(description="Signed cosine between the source and target atoms, in [−1, 1].")
    basis_rank: int = Field(description="Rank of the column-normalised edit basis.")
    basis_condition_number: float | None = Field(
        description="Condition number of that basis; null when it is rank deficient (infinite). Large values mean "
        "coordinate attribution is not unique (the edit itself inverts nothing)."
    )
    residual_max_delta: float = Field(
        description="Largest change of the anchored residual (must be ~0: the edit preserves what the atoms miss)."
    )
    warnings: list[str] = Field(default_factory=list, description="Warnings the solver raised for this edit, verbatim.")


class ControlDraw(BaseModel):
    seed: int = Field(description="Seed of the CPU generator that drew this control token.")
    token: str
    token_id: int
    displacement: float = Field(description="‖v_control − v_source‖ (matched to ‖v_target − v_source‖).")
    edit_norm: float = Field(description="‖Δh‖ of this control edit (= α·c_src·displacement).")
    score: AnswerScore = Field(description="The target's answer in the control-edited run.")
    patch: PatchDiagnostics | None = Field(default=None, description="The solver's diagnostics of this control edit.")


class TrialBaseline(BaseModel):
    source_answer: AnswerScore = Field(description="The source prompt's own answer, unedited.")
    target_answer: AnswerScore = Field(description="The target's answer in the unedited source prompt.")
    target_prompt_answer: AnswerScore | None = Field(
        default=None, description="The target's answer in the target's own prompt (does the model know it?)."
    )


class TrialRecord(BaseModel):
    function: str
    source: str
    target: str
    layer: int = Field(description="The edited activation is the output of this block (blocks.{layer}.hook_out).")
    prompt: str
    position: int = Field(description="Token index of the edited activation.")
    position_token: str
    status: TrialStatus
    detail: str | None = Field(default=None, description="Why a trial was skipped or excluded, in words.")
    baseline: TrialBaseline | None = None
    source_coordinate: float | None = Field(default=None, description="The source atom's coordinate c_src.")
    support: list[Atom] = Field(
        default_factory=list, description="Active atoms at the edited position (top 10 by contribution)."
    )
    support_size: int | None = None
    target_displacement: float | None = Field(default=None, description="‖v_target − v_source‖.")
    control_pool_size: int | None = Field(default=None, description="Tokens the controls were drawn from.")
    real: AnswerScore | None = Field(default=None, description="The target's answer after the real edit.")
    target_was_active: bool | None = Field(
        default=None,
        description="The target atom was already in the active support, so the library's substitute mode "
        "overwrote its coordinate (Δh = α[(c_src − c_tgt)·v_tgt − c_src·v_src]) instead of adding c_src·v_tgt: "
        "the controls (never in the support) then made a differently sized edit. Reported separately.",
    )
    real_edit_norm: float | None = Field(default=None, description="‖Δh‖ of the real edit.")
    real_patch: PatchDiagnostics | None = Field(default=None, description="The solver's diagnostics of the real edit.")
    real_source_answer: AnswerScore | None = Field(
        default=None, description="The source's own answer after the real edit (was it displaced?)."
    )
    controls: list[ControlDraw] = Field(default_factory=list)


class SwapSettings(BaseModel):
    lens: Literal["logit", "jacobian"]
    position: PositionSetting
    alpha: float
    k: int
    control_seeds: list[int]
    control_tolerance: float
    require_target_known: bool
    mechanism: str = Field(
        default="coordinate_patch",
        description="coordinate_patch: TransformerLens JacobianLens anchored coordinate patch (mode "
        "'substitute': h += α·c_src·(v_target − v_source)) at one layer and one position per trial.",
    )


class SwapTrialMeasurement(Measurement):
    trial: TrialRecord
    settings: SwapSettings
    lens: LensInfo


class SwapTrialResult(Provenance, SwapTrialMeasurement):
    pass


class RateSummary(BaseModel):
    successes: int
    n: int
    rate: float | None = Field(description="successes / n; None when n = 0.")
    ci_low: float = Field(description="Exact Clopper–Pearson 95% interval, lower end.")
    ci_high: float = Field(description="Exact Clopper–Pearson 95% interval, upper end.")
    n_independent_prompts: int = Field(description="Distinct prompts behind these n (trials share prompts).")


class SeedRate(BaseModel):
    seed: int
    rate: RateSummary


class SeedMcNemar(BaseModel):
    seed: int
    real_only: int = Field(description="Trials where the real edit succeeded and this seed's control did not.")
    control_only: int
    p_value: float = Field(description="Exact two-sided McNemar (binomial) p-value.")


class PromptLevelTest(BaseModel):
    """The exchangeable-arm test with every prompt weighted equally (its n is the number of prompts)."""

    statistic: float = Field(
        description="Mean over prompts of each prompt's mean per-trial difference real − mean(controls); in [−1, 1], "
        "> 0 = real edits beat their controls."
    )
    null_mean: float = Field(description="The statistic's expectation if the real edit were one more control.")
    real_better: int = Field(description="Prompts whose mean difference is > 0.")
    control_better: int = Field(description="Prompts whose mean difference is < 0.")
    ties: int = Field(description="Prompts whose mean difference is 0.")
    p_real_better: float = Field(description="One-sided p: the real edits succeed more than exchangeability allows.")
    p_control_better: float = Field(description="One-sided p: the controls succeed more.")
    p_value: float = Field(description="Two-sided p = 2 · min(one-sided), capped at 1.")
    method: Literal["exact", "monte_carlo"] = Field(
        description="exact: the null distribution by convolution; monte_carlo: seeded draws (see monte_carlo_se)."
    )
    monte_carlo_draws: int = Field(description="Draws of the Monte Carlo null (0 when exact).")
    monte_carlo_se: float = Field(description="Standard error of the Monte Carlo p-values (0 when exact).")


class PairedTest(BaseModel):
    """Real edits against their own displacement-matched controls, by an exact conditional test."""

    test: str = Field(description="What was tested, in words.")
    real_successes: int = Field(description="Executed trials whose real edit succeeded (T).")
    expected_real_successes: float = Field(
        description="E[T] if the real edit were one more control: Σ over trials of s_i / (m_i + 1), s_i = successes "
        "among the trial's m_i + 1 arms (real + controls)."
    )
    informative_trials: int = Field(
        description="Trials whose arms disagree (some but not all succeeded); the others cannot move T under H0."
    )
    p_real_better: float = Field(description="One-sided exact p = P(T ≥ observed) under H0 (Poisson-binomial).")
    p_control_better: float = Field(description="One-sided exact p = P(T ≤ observed) under H0.")
    p_value: float = Field(description="Two-sided exact p = 2 · min(one-sided), capped at 1.")
    per_seed: list[SeedMcNemar] = Field(description="Exact McNemar test of the real edit against each seed's control.")
    by_prompt: PromptLevelTest = Field(
        description="The same relabelling test with prompts weighted equally, so one prompt's many trials do not count "
        "as independent evidence."
    )


class SeedSpread(BaseModel):
    mean: float | None
    sd: float | None = Field(description="Sample standard deviation of the per-seed control rates.")
    min: float | None
    max: float | None


class LayerSummary(BaseModel):
    layer: int
    executed: int
    skipped_source_inactive: int
    skipped_no_control_token: int
    real: RateSummary
    control: RateSummary


class Exclusion(BaseModel):
    kind: Literal["prompt", "trial"] = Field(description="prompt: a corpus prompt; trial: (function, source, target).")
    function: str
    concept: str | None = None
    source: str | None = None
    target: str | None = None
    prompt: str | None = None
    reason: str
    rank: int | None = Field(
        default=None, description="0-based rank of the prompt's own answer (0 = top-1; prompt exclusions)."
    )
    margin: float | None = None
    top_token: str | None = None


class SwapSummary(BaseModel):
    status_counts: dict[str, int] = Field(description="executed / skipped_source_inactive / skipped_no_control_token.")
    layers: list[int]
    layers_executed: list[int] = Field(description="Layers with at least one executed trial.")
    real: RateSummary = Field(description="Real-edit success (target answer strict top-1) over executed trials.")
    control: RateSummary = Field(
        description="Control success over every control draw (n = executed × seeds). Draws of one trial share its "
        "prompt and layer, so this interval is narrower than the evidence; control_by_seed (n = trials) is the "
        "conservative view."
    )
    control_by_seed: list[SeedRate]
    control_seed_spread: SeedSpread
    paired: PairedTest
    by_layer: list[LayerSummary]
    n_independent_prompts: int = Field(description="Distinct prompts among executed trials.")
    real_success_prompts: list[str] = Field(
        description="The distinct 'function/source' prompts behind the real successes: a rate resting on one prompt "
        "is an anecdote whatever its n."
    )
    excluded_trials: int = Field(description="(function, source, target, layer) slots sent to the ledger.")
    target_was_active: int = Field(
        description="Executed trials whose target atom was already active (see TrialRecord.target_was_active)."
    )


class SwapBenchmarkMeasurement(Measurement):
    corpus: str
    settings: SwapSettings
    lens: LensInfo
    summary: SwapSummary
    exclusions: list[Exclusion]
    figure_uri: str | None = None
    artifact_uri: str | None = Field(default=None, description="artifact://… — the full versioned JSON artifact.")
    artifact_path: str | None = Field(default=None, description="Where the artifact is saved in the output folder.")
    fingerprints: dict[str, Any] = Field(
        default_factory=dict,
        description="SHA-256 of the artifact's blocks; 'protocol' is the protocol fingerprint (model weights, lens, "
        "corpus, settings, layers, mechanism, definitions — not the time, device or host), equal for two runs of the "
        "same protocol.",
    )


class SwapBenchmarkResult(Provenance, SwapBenchmarkMeasurement):
    pass


class BlockCheck(BaseModel):
    block: str
    expected: str | None = Field(description="Fingerprint recorded in the artifact.")
    actual: str = Field(description="Fingerprint of the block as it is now, or 'missing' when the block is gone.")
    ok: bool


class VerifyArtifactResult(BaseModel):
    valid: bool = Field(description="Schema known and every block's fingerprint matches.")
    schema_name: str | None
    schema_version: int | None
    checks: list[BlockCheck]
    altered: list[str] = Field(description="Blocks whose content no longer matches its fingerprint.")
    message: str


class FitLensMeasurement(Measurement):
    lens: LensInfo
    from_cache: bool = Field(description="True when an identical fit was already on disk.")
    fit_seconds: float = Field(description="Time of the fit itself (0 when loaded from the cache).")
    skipped_short_texts: int = 0


class FitLensResult(Provenance, FitLensMeasurement):
    pass
