"""Argument types several tool families share; their descriptions are what an assistant reads."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from mcp_interp.schemas.common import Intervention

Prompts = Annotated[
    list[str],
    Field(description="Prompts to run, one forward pass for all; the prediction is read after the last token."),
]
OptionalIntervention = Annotated[
    Intervention | None,
    Field(
        description='Optional intervention on the measured run, e.g. {"ablate": {"heads": ["L9H3"], "method": "mean"}}.'
    ),
]
Answers = Annotated[
    str | list[str],
    Field(
        description="One single-token answer for every prompt, or a list with one per prompt. "
        "Mind the leading space: ' Mary', not 'Mary', for GPT-2-style tokenizers."
    ),
]
