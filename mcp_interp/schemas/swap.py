"""Pydantic I/O of the causal-swap tools (``causal_swap_trial``, ``causal_swap_benchmark``,
``verify_artifact``, ``fit_lens``); with the corpus, lens and fit-setting
models they take as input. The protocol has its own vocabulary (trials, controls, exclusion
ledger, intervals).

Conventions: ``rank`` counts tokens with a strictly larger logit (0 = top-1, ties optimistic);
``margin`` is the answer's logit minus the best other token's (> 0 = strict top-1); a trial
*succeeds* when the scored answer is the strict top-1 (margin > 0); a ``margin gain`` is an
edited minus the unedited margin of the target answer (logits, > 0 = toward the target). The
output schemas are kept under 4 KB each (a client loads all 30 tools' schemas at once), so field
descriptions are short and say a sign, range or unit once; the README and ``core/swap`` say why.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, WithJsonSchema, field_validator, model_validator

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
# An LLM reads these schemas with all 30 tools' at once: descriptions say a sign, range or unit once, in ASCII.


class AnswerScore(BaseModel):
    token: str
    token_id: int
    n_tokens: int = Field(default=1, description=">1: every step scored, teacher-forced.")
    rank: int = Field(description="0 = top-1.")
    margin: float = Field(description="Logit minus best other's (min over steps); >0 = top-1.")
    top1: bool = Field(description="Success: margin > 0.")
    top_token: str


class Atom(BaseModel):
    token: str
    coordinate: float
    contribution: float = Field(description="coordinate * atom norm.")


class ControlDraw(BaseModel):
    seed: int
    token: str
    token_id: int
    displacement: float = Field(description="Matched to target_displacement.")
    edit_norm: float
    score: AnswerScore = Field(description="Target answer after this edit.")


class TrialBaseline(BaseModel):
    source_answer: AnswerScore = Field(description="Unedited, as all three.")
    target_answer: AnswerScore = Field(description="In the source prompt.")
    target_prompt_answer: AnswerScore | None = Field(default=None, description="In the target's prompt.")


class TrialRecord(BaseModel):
    function: str
    source: str
    target: str
    layer: int
    prompt: str
    position: int
    position_token: str
    status: TrialStatus
    detail: str | None = Field(default=None, description="Why skipped or excluded.")
    baseline: TrialBaseline | None = None
    source_coordinate: float | None = None
    support: list[Atom] = Field(default_factory=list, description="Active atoms, top 10.")
    target_displacement: float | None = Field(default=None, description="|v_target - v_source|.")
    control_pool_size: int | None = Field(default=None, description="Matched at all this swap's layers.")
    real: AnswerScore | None = Field(default=None, description="Target answer after the real edit.")
    margin_gain: float | None = Field(
        default=None, description="real.margin - baseline.target_answer.margin, logits; >0 = toward the target."
    )
    control_margin_gains: list[float] = Field(default_factory=list, description="Same, per control.")
    target_was_active: bool | None = Field(default=None, description="Edit overwrote an active target atom.")
    real_edit_norm: float | None = None
    real_source_answer: AnswerScore | None = None
    controls: list[ControlDraw] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list, description="The patch solver's, per edit.")


# TransformerLens JacobianLens anchored coordinate patch, mode 'substitute': h += alpha * c_src * (v_target - v_source)
# at one layer and one position (recorded in the artifact's protocol).
MECHANISM = "coordinate_patch"


class SwapSettings(BaseModel):
    lens: Literal["logit", "jacobian"]
    position: PositionSetting
    alpha: float
    k: int
    control_seeds: list[int]
    control_tolerance: float
    require_target_known: bool


# The protocol's settings and its lens in a result, published by shape once (the tools' arguments, and fit_lens's
# result) and elsewhere as an object — as the toolkit does for ModelRef — so each output schema stays under 4 KB.
Settings = Annotated[
    SwapSettings,
    WithJsonSchema({"type": "object", "description": "The protocol arguments (lens, position, alpha, k, control_*)."}),
]
Lens = Annotated[
    LensInfo, WithJsonSchema({"type": "object", "description": "kind, sha256, path, source_layers, settings."})
]


class SwapTrialMeasurement(Measurement):
    trial: TrialRecord
    settings: Settings
    lens: Lens


class SwapTrialResult(Provenance, SwapTrialMeasurement):
    pass


# --- benchmark summary -----------------------------------------------------------------------


class RateSummary(BaseModel):
    successes: int
    n: int
    rate: float | None
    ci_low: float = Field(description="Clopper-Pearson 95%.")
    ci_high: float


class PromptTest(BaseModel):
    """Per (prompt, arm) values; real arm relabelled per prompt."""

    real: float = Field(description="Mean over prompts.")
    control: float
    difference: float = Field(description="real - control.")
    p_value: float = Field(description="Two-sided.")
    p_greater: float = Field(description="real > control.")
    draws: int = Field(description="0 = exact.")


class Specificity(BaseModel):
    real_median_gain: float | None = Field(description="Of margin_gain, logits.")
    control_median_gain: float | None
    margin_gain: PromptTest
    beats_all: int = Field(description="Trials where the real gain tops every control's.")
    chance: float = Field(description="1/(controls + 1).")
    beats_all_test: PromptTest


class LayerSummary(BaseModel):
    layer: int
    executed: int
    skipped: int
    real_successes: int
    control_successes: int
    real_median_gain: float | None
    control_median_gain: float | None


class Exclusion(BaseModel):
    kind: Literal["prompt", "trial"]
    function: str
    source: str
    target: str | None = None
    reason: str


class SwapSummary(BaseModel):
    verdict: str = Field(description="Strict swap and specificity, from their p-values.")
    status_counts: dict[str, int]
    real: RateSummary = Field(description="Strict success of real edits: the headline.")
    control: RateSummary
    swap_test: PromptTest = Field(description="On strict success.")
    specificity: Specificity
    by_layer: list[LayerSummary]
    n_independent_prompts: int
    real_success_prompts: list[str]
    excluded_trials: int = Field(description="Layer slots ledgered.")
    target_was_active: int


class SwapBenchmarkMeasurement(Measurement):
    corpus: str
    settings: Settings
    lens: Lens
    summary: SwapSummary
    exclusions: list[str] = Field(description="The ledger; artifact: structured.")
    figure_uri: str | None = None
    artifact_uri: str | None = None
    artifact_path: str | None = None
    fingerprints: dict[str, str] = Field(default_factory=dict, description="SHA-256 per artifact block.")


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
