"""Shared fixtures. Tests run offline: the hub is never contacted."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import pytest

from mcp_interp.models import LoadedModel, load_model
from mcp_interp.session import Session


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return load_model("tiny")


@pytest.fixture(scope="session")
def embedded() -> LoadedModel:
    return load_model("smollm2-135m")


@pytest.fixture
def tiny_session(tiny: LoadedModel, tmp_path: Path) -> Session:
    """A Session whose loader hands back the already-built tiny model (built once per test run)."""
    return Session("tiny", tmp_path / "out", loader=lambda name, device, dtype: tiny)
