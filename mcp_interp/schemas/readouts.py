"""Outputs of the readout tools: ``model_info``, ``tokenize``, ``logit_diff``, ``kl``, ``answer_rank``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from mcp_interp.schemas.common import ANSWER_KIND, AnswerKind, BackendName, Measurement, Provenance, Score

# --- model_info -----------------------------------------------------------------------------


class BlockFacts(BaseModel):
    """How this model's transformer blocks are built, where it changes what a measurement means."""

    parallel_attn_mlp: bool = Field(
        description="Attention and MLP both read the block's input (GPT-NeoX/Pythia, GPT-J, Phi-1/2): there is no "
        "resid_mid, and no head feeds its own layer's MLP (the edge graph has no such edge)."
    )
    attention_post_norm: bool = Field(
        description="A norm sits between the heads' sum and the residual add (Gemma-2/3, OLMo-2): one head's write "
        "is not a term of the residual stream, so per-head edge tools are refused."
    )
    mixture_of_experts: bool = Field(description="Some MLP is a mixture of experts: it has no single layer of neurons.")
    final_logit_softcap: float | None = Field(
        description="c in logits = c·tanh(x/c) after the unembedding (Gemma-2: 30), applied by every tool that "
        "rebuilds logits from the residual stream; null when the model has none."
    )


class Capability(BaseModel):
    """Whether a tool, or one option of some tools, applies to the loaded model on its backend."""

    tools: list[str] = Field(description="The tools this entry is about.")
    option: str | None = Field(description="The option of those tools it is about; null: the tools as a whole.")
    available: bool = Field(description="false: a call using it is refused with a tool error quoting `reason`.")
    missing_feature: str | None = Field(description="What the architecture or the backend lacks, when not available.")
    reason: str | None = Field(description="Why it is missing and what to do instead (another backend, another "
                               "tool), when not available.")  # fmt: skip


class CompiledProgramFacts(BaseModel):
    """A RASP program compiled by tracr (``mcp-interp compile-rasp``): its output at each position is the program's
    value there."""

    output: str | None = Field(
        default=None,
        description="The output node's label (--reveal-ground-truth); the answer is its value at the last position.",
    )
    max_seq_len: int = Field(description="Most input values per prompt (BOS not counted).")
    input_values: list[str]
    output_values: list[str] = Field(description="The possible answers.")
    n_nodes: int | None = Field(default=None, description="RASP nodes of the program (--reveal-ground-truth).")
    ground_truth: list[dict[str, Any]] | None = Field(
        default=None, description="Per RASP node, its components and residual dimensions (--reveal-ground-truth)."
    )


class ModelInfoMeasurement(Measurement):
    name: str
    source: Literal["embedded", "hub", "local", "tiny"]
    architecture: str = Field(description="HF architecture class, e.g. LlamaForCausalLM.")
    n_layers: int
    n_heads: int = Field(description="Query heads per layer; heads are numbered 0..n_heads-1.")
    n_kv_heads: int = Field(description="Key/value heads per layer (< n_heads: grouped-query attention).")
    d_model: int
    d_head: int
    d_mlp: int
    d_vocab: int
    n_ctx: int = Field(description="Longest context the model was configured for, in tokens.")
    dtype: str
    device: str = Field(description="Where inputs go (the embedding's device when the model is placed over several).")
    backend: BackendName = Field(
        description="The backend running the model: transformers (TransformerBridge: every tool), inspect or vllm "
        "(TransformerLens' RemoteBridge: captures and set/add/scale/suppress edits, no gradients, no weights)."
    )
    device_map: dict[str, str] | None = Field(
        description="Where each module's weights sit (module → device: 'cpu', a GPU index, or 'disk'), when the "
        "model was placed with --device-map; null: all on `device`."
    )
    fingerprint: str
    load_seconds: float = Field(description="Seconds to load and boot the model in this process.")
    prepends_bos: bool = Field(description="Whether every prompt starts with a BOS token under the rule.")
    tokenization_rule: str = Field(description="How every tool tokenizes text.")
    block: BlockFacts = Field(description="How the transformer blocks are built.")
    capabilities: list[Capability] = Field(
        description="Every tool, and every option whose availability depends on the architecture or the backend, for "
        "this model on this backend. The same test decides a tool's refusal, so what is listed available runs."
    )
    program: CompiledProgramFacts | None = Field(default=None, description="Set for a compiled RASP program.")


class ModelInfoResult(Provenance, ModelInfoMeasurement):
    pass


# --- tokenize -------------------------------------------------------------------------------


class TopToken(BaseModel):
    token: str
    prob: float


class TokenizedText(BaseModel):
    text: str
    ids: list[int] = Field(description="Token ids exactly as every tool feeds them to the model.")
    tokens: list[str] = Field(description="Each id decoded on its own; leading spaces are kept.")
    n_tokens: int
    predicted: list[str | None] | None = Field(default=None, description="Per position (top_k): top-1; null: a tie.")
    top: list[list[TopToken]] | None = Field(default=None, description="Per position (top_k): the top k.")


class TokenizeMeasurement(Measurement):
    texts: list[TokenizedText]
    tokenization_rule: str


class TokenizeResult(Provenance, TokenizeMeasurement):
    pass


# --- logit_diff -----------------------------------------------------------------------------


class LogitDiffExample(BaseModel):
    prompt: str
    correct: str
    incorrect: str
    correct_id: int | None = Field(description="The answer's (first) token id; null for a set (see `correct`).")
    incorrect_id: int | None
    logit_diff: float = Field(
        description="logit(correct) − logit(incorrect); > 0 prefers correct. For sequence answers: "
        "log P(correct) − log P(incorrect) of the teacher-forced sequences."
    )
    correct_log_prob: float | None = Field(
        default=None, description="log P(correct | prompt) (teacher-forced; a set: its members' summed), ≤ 0."
    )
    incorrect_log_prob: float | None = Field(default=None, description="The same for `incorrect`.")
    top1_token: str = Field(description="The model's most likely next token at the answer position.")
    top1_id: int
    answer_position: int = Field(description="Index of the last real token (where the prediction is read).")


class LogitDiffMeasurement(Measurement):
    intervention: str | None = Field(default=None, description="The intervention applied to the measured run, if any.")
    answer_kind: AnswerKind = Field(default="token", description=ANSWER_KIND)
    logit_diff: Score = Field(
        description="logit(correct) − logit(incorrect) at the answer position; positive means "
        "the model prefers the correct answer; unbounded; 0 = indifferent."
    )
    prob_diff: Score | None = Field(
        default=None, description="P(correct) − P(incorrect) (a set: its members' summed probability), in [−1, 1]."
    )
    examples: list[LogitDiffExample]


class LogitDiffResult(Provenance, LogitDiffMeasurement):
    pass


# --- kl -------------------------------------------------------------------------------------


class KLExample(BaseModel):
    prompt: str
    compare_prompt: str
    kl: float = Field(description="KL(P‖Q) for this pair, nats, ≥ 0.")
    differing_positions: list[int] = Field(description="Token positions where the two prompts differ.")
    top1_p: str = Field(description="Top-1 next token of the run on `prompt` (P).")
    top1_q: str = Field(description="Top-1 next token of the run on `compare_prompt` (Q).")


class KLMeasurement(Measurement):
    intervention: str | None = Field(default=None, description="The intervention applied to the measured run, if any.")
    kl: Score = Field(
        description="KL(P‖Q) of the next-token distributions at the answer position, in nats; "
        "P = run on `prompts`, Q = run on `compare_prompts`; ≥ 0, 0 = identical."
    )
    examples: list[KLExample]


class KLResult(Provenance, KLMeasurement):
    pass


# --- answer_rank ----------------------------------------------------------------------------


class AnswerRankExample(BaseModel):
    prompt: str
    correct: str
    correct_id: int
    rank: int = Field(
        description="Tokens with a strictly higher logit; 0 = top-1 (ties count for the answer). Sequence "
        "answers: the rank of the first token (of the best-ranked alternative of a set)."
    )
    tied: int = Field(default=0, description="Other tokens whose logit equals the answer's (a shared rank).")
    log_prob: float = Field(description="log P(correct) at the answer position, ≤ 0 (sequences: teacher-forced).")
    prob: float
    top1_token: str | None = Field(description="null when several tokens share the top logit (a flat output).")
    top1_id: int | None


class AnswerRankMeasurement(Measurement):
    intervention: str | None = Field(default=None, description="The intervention applied to the measured run, if any.")
    answer_kind: AnswerKind = Field(default="token", description=ANSWER_KIND)
    rank: Score = Field(description="Rank of the correct answer: 0 = top-1; saturates at 0.")
    log_prob: Score = Field(description="log P(correct), ≤ 0; the negative is the loss.")
    examples: list[AnswerRankExample]


class AnswerRankResult(Provenance, AnswerRankMeasurement):
    pass
