"""Argument types several tool families share. Their descriptions are what an assistant reads, in every tool that
takes them, so each says what it must in one line; the conventions behind them (answers, components, positions)
are written once, in the server's instructions."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, TypeAdapter, WithJsonSchema

from mcp_interp.schemas.common import (
    TARGETS_DESCRIPTION,
    AblationMethod,
    AnswerSpec,
    Intervention,
    PairMetric,
    PatchDirection,
    PatchMethod,
    PatchMetric,
    PositionsSpec,
    TargetSpec,
)

Prompts = list[str]  # read at each prompt's last token: described in the instructions
# The intervention and component unions are published by shape (validated in full on arrival, errors naming the
# fix): their fields are in the server's instructions, and inlined they were a fifth of the tool definitions.
# Each field's own schema, but for the components (strings or objects) and the positions ('all', 'last' or a list).
_COMPACT = {
    "ablate": {"type": "array", "items": {"type": ["string", "object"]}},
    "positions": {"type": ["string", "array"]},
}
INTERVENTION_SHAPE = {
    "type": ["object", "null"],
    "properties": {
        name: _COMPACT.get(name) or TypeAdapter(Any if field.annotation is None else field.annotation).json_schema()
        for name, field in Intervention.model_fields.items()
    },
    "required": [name for name, field in Intervention.model_fields.items() if field.is_required()],
}
OptionalIntervention = Annotated[
    Intervention | None,
    WithJsonSchema(INTERVENTION_SHAPE),
    Field(description='{"ablate": ["L9H3", "L28MLP"], "method": "mean"}'),
]
# Answers of any length are published by shape only (validated in full when a call arrives): the nested union
# of strings and {any_of} objects, inlined in a dozen tools, was a tenth of the model-facing definitions.
ANSWER_SHAPE = {"type": ["string", "array", "object"]}
Answers = Annotated[
    AnswerSpec | list[AnswerSpec],
    WithJsonSchema(ANSWER_SHAPE),
    Field(description="One token or {any_of: [tokens]}, for all prompts or one per prompt."),
]
OtherAnswers = Annotated[AnswerSpec | list[AnswerSpec], WithJsonSchema(ANSWER_SHAPE)]  # as `correct`
SequenceAnswers = Annotated[
    AnswerSpec | list[AnswerSpec],
    WithJsonSchema(ANSWER_SHAPE),
    Field(description="One answer for all prompts or one per prompt: a string (any length) or {any_of: [...]}."),
]
OtherSequenceAnswers = Annotated[AnswerSpec | list[AnswerSpec], WithJsonSchema(ANSWER_SHAPE)]  # as `correct`
CleanPrompts = list[str]  # described in the instructions (minimal pairs)
CorruptPrompts = list[str]
OPTIONAL_ANSWER_SHAPE = {"type": ["string", "array", "object", "null"]}
OptionalCorrect = Annotated[AnswerSpec | list[AnswerSpec] | None, WithJsonSchema(OPTIONAL_ANSWER_SHAPE)]
OptionalIncorrect = OptionalCorrect
Targets = Annotated[
    list[TargetSpec],
    WithJsonSchema({"type": "array", "items": {"type": ["string", "object"]}}),
    Field(description=TARGETS_DESCRIPTION),
]
# An intervention's fields (method, positions, seed, reference_prompts) are described in the instructions.
AblationMethodArgument = AblationMethod
AblationPositions = PositionsSpec
ResampleSeed = int  # described in the instructions
ReferencePrompts = list[str] | None
MostRandomDraws = Annotated[
    int,
    Field(ge=19, le=1000, description="Most random draws (it stops early once p is clear)."),
]
PatchDirectionArgument = Annotated[
    PatchDirection, Field(description="denoise: corrupt run, clean patched in; noise: the reverse.")
]
PatchMethodArgument = Annotated[PatchMethod, Field(description="attribution: a first-order estimate (fast).")]
PairMetricArgument = Annotated[PairMetric, Field(description="prob_diff: P(correct) − P(incorrect).")]
PatchMetricArgument = Annotated[
    PatchMetric,
    Field(description="kl needs no answers; log_prob `correct` only; prob_diff: P(correct) − P(incorrect)."),
]
VerifyTop = Annotated[int, Field(ge=0, le=64, description="With attribution: rerun the top items exactly.")]
Top = Annotated[int, Field(ge=1, le=1000)]
# Arguments every tool reads alike are described once, in the server's instructions (mcp/server.py) and
# docs/conventions.md, not in each tool's schema: tools/list is read into the assistant's context.
Background = bool
