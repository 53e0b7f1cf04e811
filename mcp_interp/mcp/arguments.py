"""Argument types several tool families share. Their descriptions are what an assistant reads, in every tool that
takes them, so each says what it must in one line; the conventions behind them (answers, components, positions)
are written once, in the server's instructions."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, TypeAdapter, WithJsonSchema

from mcp_interp.schemas.common import (
    METHOD_DESCRIPTION,
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

Prompts = Annotated[list[str], Field(description="Read at each prompt's last token.")]
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
    Field(description='e.g. {"ablate": ["L9H3", "L28MLP"], "method": "mean"}.'),
]
# Answers of any length are published by shape only (validated in full when a call arrives): the nested union
# of strings and {any_of} objects, inlined in a dozen tools, was a tenth of the model-facing definitions.
ANSWER_SHAPE = {"type": ["string", "array", "object"]}
Answers = Annotated[
    AnswerSpec | list[AnswerSpec],
    WithJsonSchema(ANSWER_SHAPE),
    Field(description="One token or {any_of: [tokens]}, for all prompts or one per prompt."),
]
OtherAnswers = Annotated[
    AnswerSpec | list[AnswerSpec], WithJsonSchema(ANSWER_SHAPE), Field(description="Like `correct`.")
]
SequenceAnswers = Annotated[
    AnswerSpec | list[AnswerSpec],
    WithJsonSchema(ANSWER_SHAPE),
    Field(description="One answer for all prompts or one per prompt: a string (any length) or {any_of: [...]}."),
]
OtherSequenceAnswers = Annotated[
    AnswerSpec | list[AnswerSpec], WithJsonSchema(ANSWER_SHAPE), Field(description="Like `correct`.")
]
CleanPrompts = Annotated[list[str], Field(description="Prompts showing the behaviour.")]
CorruptPrompts = Annotated[list[str], Field(description="One per clean prompt, same token length.")]
OPTIONAL_ANSWER_SHAPE = {"type": ["string", "array", "object", "null"]}
OptionalCorrect = Annotated[
    AnswerSpec | list[AnswerSpec] | None, WithJsonSchema(OPTIONAL_ANSWER_SHAPE), Field(description="Correct answer(s).")
]
OptionalIncorrect = Annotated[
    AnswerSpec | list[AnswerSpec] | None,
    WithJsonSchema(OPTIONAL_ANSWER_SHAPE),
    Field(description="Incorrect answer(s)."),
]
Targets = Annotated[
    list[TargetSpec],
    WithJsonSchema({"type": "array", "items": {"type": ["string", "object"]}}),
    Field(description=TARGETS_DESCRIPTION),
]
AblationMethodArgument = Annotated[AblationMethod, Field(description=METHOD_DESCRIPTION)]
AblationPositions = Annotated[PositionsSpec, Field(description="'all', 'last' (the answer) or token indices.")]
ResampleSeed = Annotated[int, Field(description="Seeds resampling and random baselines.")]
ReferencePrompts = Annotated[list[str] | None, Field(description="mean: prompts whose mean is used (default: these).")]
MostRandomDraws = Annotated[
    int,
    Field(ge=19, le=1000, description="Most random directions/features drawn (it stops early once p is clear)."),
]
PatchDirectionArgument = Annotated[
    PatchDirection, Field(description="denoise: corrupt run, clean patched in; noise: the reverse.")
]
PatchMethodArgument = Annotated[PatchMethod, Field(description="attribution: a first-order estimate (fast).")]
PairMetricArgument = Annotated[PairMetric, Field(description="prob_diff: P(correct) − P(incorrect).")]
PatchMetricArgument = Annotated[
    PairMetric,
    PatchMetric,
    Field(description="kl needs no answers; log_prob `correct` only; prob_diff: P(correct) − P(incorrect)."),
]
VerifyTop = Annotated[int, Field(ge=0, le=64, description="With attribution: rerun the top items exactly.")]
Top = Annotated[int, Field(ge=1, le=1000, description="Ranked items returned (all in result://).")]
Background = Annotated[bool, Field(description="Return a job:// handle at once (job_status).")]
