"""Fixtures of the architecture tests: every tiny architecture saved once per session as a local HF folder
(what a user's ``--model <folder>`` reads) and booted once through ``load_model``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.model import LoadedModel
from tests.architectures.builders import CONFIGS, save_arch


@pytest.fixture(scope="session")
def arch_folder(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``arch_folder(name)``: the folder of architecture ``name``, written on first use and kept for the session."""
    root = tmp_path_factory.mktemp("architectures")
    written: dict[str, Path] = {}

    def folder(name: str) -> Path:
        if name not in written:
            assert name in CONFIGS, name
            written[name] = save_arch(name, root / name)
        return written[name]

    return folder


@pytest.fixture(scope="session")
def arch_model(arch_folder: Callable[[str], Path]) -> Callable[[str], LoadedModel]:
    """``arch_model(name)``: architecture ``name`` loaded from its folder (float32, CPU), once per session."""
    loaded: dict[str, LoadedModel] = {}

    def model(name: str) -> LoadedModel:
        if name not in loaded:
            loaded[name] = load_model(str(arch_folder(name)))
        return loaded[name]

    return model


@pytest.fixture(scope="session")
def remote_arch_model(arch_folder: Callable[[str], Path]) -> Callable[[str, str], LoadedModel]:
    """``remote_arch_model(name, backend)``: architecture ``name`` served by a RemoteBridge engine (``inspect``), once
    per session."""
    from mcp_interp.core.engine.backend.options import LoadOptions

    loaded: dict[tuple[str, str], LoadedModel] = {}

    def model(name: str, backend: str) -> LoadedModel:
        if (name, backend) not in loaded:
            loaded[name, backend] = load_model(str(arch_folder(name)), options=LoadOptions(backend=backend))  # type: ignore[arg-type]
        return loaded[name, backend]

    return model
