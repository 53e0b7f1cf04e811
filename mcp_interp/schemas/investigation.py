"""The investigation's export (``export_investigation``): a script or notebook that reruns the session's ledger, or a
Markdown report of the claims made from its verdicts."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Claim(BaseModel):
    claim: str
    call: int = Field(description="Ledger call id.")
    numbers: list[str] | None = Field(default=None, description="Key numbers cited; default: its verdicts'.")


class ExportResult(BaseModel):
    notebook_uri: str | None = Field(
        default=None,
        description="script://… (py: `python it.py [--json]`) or notebook://… (ipynb: `jupyter execute it.ipynb`).",
    )
    report_uri: str | None = Field(default=None, description="report://…: the Markdown report (md).")
    format: str
    calls: list[int] = Field(description="The ledger calls exported, in order.")
    model_name: str
    fingerprint: str = Field(description="The weights' fingerprint a rerun checks first.")
    key_numbers: int = Field(description="Recorded numbers a rerun compares.")
    claims: int = Field(default=0, description="Claims in the report.")
    notes: list[str] = Field(
        default_factory=list, description="Calls added for their handles; handles it cannot recreate."
    )
