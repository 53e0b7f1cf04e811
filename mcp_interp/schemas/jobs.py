"""Outputs of long work run as a job: the handle a background call returns, and ``job_status``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

JobState = Literal["queued", "running", "done", "failed", "cancelled", "lost"]


class JobProgress(BaseModel):
    done: float = Field(description="Steps done.")
    total: float | None = Field(default=None, description="Steps in all, when known.")
    message: str | None = None


class JobStatus(BaseModel):
    """A job's state; ``result`` holds the tool's structured result once it is done."""

    job_uri: str = Field(description="job://…: pass to job_status / job_cancel.")
    tool: str
    state: JobState = Field(description="lost: the server stopped before the job finished.")
    server: str | None = Field(default=None, description="Set when another server sharing the store runs it.")
    queue_position: int | None = Field(default=None, description="Jobs ahead of this one (queued only).")
    progress: JobProgress | None = None
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    elapsed_s: float | None = Field(default=None, description="Running time so far, or in all.")
    estimate_s: float | None = Field(default=None, description="How long the last run of this tool took here.")
    result: dict[str, Any] | None = Field(default=None, description="The tool's structured result (state done).")
    result_uri: str | None = Field(default=None, description="result://… the complete result, when it was cut.")
    error: str | None = Field(default=None, description="Why it failed (state failed or lost).")
    partial: dict[str, Any] | None = Field(default=None, description="Cancelled or failed: the best result so far.")
