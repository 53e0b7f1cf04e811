"""Argument types several tool families share; their descriptions are what an assistant reads."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from mcp_interp.schemas.common import AnswerSpec, Intervention, PatchMetricName, PositionsSpec

Prompts = Annotated[
    list[str],
    Field(description="Prompts to run, one forward pass for all; the prediction is read after the last token."),
]
OptionalIntervention = Annotated[
    Intervention | None,
    Field(
        description="Optional intervention on the measured run, e.g. "
        '{"ablate": {"targets": ["L9H3", "L28MLP", {"layer": 28, "neurons": [17]}], "method": "mean"}}.'
    ),
]
Answers = Annotated[
    str | list[str],
    Field(
        description="One single-token answer for every prompt, or a list with one per prompt. "
        "Mind the leading space: ' Mary', not 'Mary', for GPT-2-style tokenizers."
    ),
]
SequenceAnswers = Annotated[
    AnswerSpec | list[AnswerSpec],
    Field(
        description="One answer for every prompt, or a list with one per prompt. An answer is a string — one token "
        "(' Mary', mind the leading space) or several (' North America', scored by its teacher-forced "
        "log-probability) — or a set {'any_of': [' Paris', ' paris']} scored by its members' summed probability. "
        "A plain list of strings always means one answer per prompt; a set is always an object."
    ),
]
CleanPrompts = Annotated[list[str], Field(description="Prompts where the model shows the behaviour.")]
CorruptPrompts = Annotated[
    list[str], Field(description="Minimal-pair partners, one per clean prompt, same token length.")
]
OptionalCorrect = Annotated[
    SequenceAnswers | None, Field(description="Correct answer(s); enables the logit difference.")
]
OptionalIncorrect = Annotated[
    SequenceAnswers | None, Field(description="Incorrect answer(s) for the logit difference.")
]
AblationMethod = Annotated[
    Literal["zero", "mean", "resample"],
    Field(
        description="zero: the part = 0 (a direction is projected out); mean: its batch mean at the same position "
        "(by index when prompts share a length, else by distance from the last token); resample: another prompt's "
        "(seeded permutation without fixed points; equal lengths)."
    ),
]
AblationPositions = Annotated[
    PositionsSpec, Field(description="'all' (default), 'last' (answer position) or token indices.")
]
ResampleSeed = Annotated[int, Field(description="Seed of the resample permutation.")]
PatchDirection = Annotated[
    Literal["denoise", "noise"],
    Field(description="denoise: run corrupt, patch in clean (what restores it?); noise: the reverse."),
]
PatchMethod = Annotated[
    Literal["exact", "attribution"],
    Field(description="exact: real patched runs; attribution: first-order gradient estimate (approximate)."),
]
PatchMetric = Annotated[
    PatchMetricName,
    Field(
        description="logit_diff (needs correct and incorrect), log_prob (needs correct), or kl: "
        "KL(clean‖run) at the answer, which needs no answer at all."
    ),
]
VerifyTop = Annotated[int, Field(ge=0, le=64, description="With attribution: re-run this many top items exactly.")]
