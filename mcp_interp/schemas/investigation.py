"""The investigation's export (``export_investigation``): a script or notebook that reruns the session's ledger, or a
Markdown report of the claims made from its verdicts."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Claim(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an input: a key it does not take is refused, never ignored
    claim: str
    call: int = Field(description="Ledger call id.")
    numbers: list[str] | None = Field(default=None, description="Key numbers cited; default: its verdicts'.")


class ExportResult(BaseModel):
    script_uri: str | None = Field(default=None, description="script://… (format py).")
    notebook_uri: str | None = Field(default=None, description="notebook://… (format ipynb).")
    report_uri: str | None = Field(default=None, description="report://… (md).")
    format: str
    calls: list[int] = Field(description="Ledger calls exported.")
    model_name: str
    fingerprint: str = Field(description="Weights' fingerprint a rerun checks.")
    key_numbers: int = Field(description="Recorded numbers a rerun compares (every number of every result).")
    claims: int = 0
    notes: list[str] = Field(
        default_factory=list, description="Calls added for their handles; handles it cannot recreate."
    )
