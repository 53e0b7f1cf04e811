"""The investigation's export: a script that reruns the session's ledger (``export_investigation``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ExportResult(BaseModel):
    notebook_uri: str = Field(description="notebook://…: the Python script (run it with `python script.py [--json]`).")
    format: str = Field(description="The script's format ('py').")
    calls: list[int] = Field(description="The ledger calls the script reruns, in order.")
    model_name: str
    fingerprint: str = Field(description="The weights' fingerprint the script checks before rerunning.")
    key_numbers: int = Field(description="How many recorded numbers the script compares.")
    notes: list[str] = Field(
        default_factory=list, description="Calls added for their handles; handles it cannot recreate."
    )
