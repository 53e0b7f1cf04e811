"""Shared fixtures. Tests run offline: the hub is never contacted."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Several workers share the machine's cores (./run test runs the suite in parallel): one torch thread each, in
    # the worker and in every server it starts (the variable is inherited), so OpenMP threads never outnumber the
    # cores and busy-wait against each other.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch
from mcp import Client

from mcp_interp.core.engine.backend.loader.load import boot, load_model
from mcp_interp.core.engine.backend.loader.tiny import build_tiny
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.components import Head
from mcp_interp.host import ModelHost
from mcp_interp.mcp.server import build_server


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", autouse=True)
def temporary_folders_are_allowed(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests write SAEs, lenses and transcoders under pytest's temporary folder: make it an allowed root for client
    paths (``mcp_interp.state.paths``), here and in every server process a test starts (the variable is inherited)."""
    import mcp_interp.state.paths as paths

    os.environ[paths.ENV] = str(tmp_path_factory.getbasetemp().resolve())


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return load_model("tiny")


@pytest.fixture(scope="session")
def embedded() -> LoadedModel:
    return load_model("smollm2-135m")


@pytest.fixture
def tiny_session(tiny: LoadedModel, tmp_path: Path) -> ModelHost:
    """A ModelHost whose loader hands back the already-built tiny model (built once per test run)."""
    return ModelHost("tiny", tmp_path / "out", loader=lambda name, device, dtype: tiny)


@pytest.fixture
async def tiny_client(tiny_session: ModelHost) -> AsyncIterator[Client]:
    """An in-process MCP client of a server over ``tiny_session`` (every in-process server test starts here)."""
    async with Client(build_server(tiny_session)) as client:
        yield client


CARRIER = Head(1, 2)  # the one head of `one_head_model` whose output reaches the residual stream


@pytest.fixture(scope="session")
def one_head_model() -> LoadedModel:
    """`tiny` with every attention head's output projection zeroed except CARRIER's (amplified ×30, so the
    clean−corrupt gap is large).

    Attention is the only way information moves between positions, so in this model the difference between a
    clean and a corrupt prompt reaches the answer position through CARRIER alone: patching it restores exactly
    the clean run; patching any other head (whose output is multiplied by zero) changes nothing.
    """
    hf_model, tokenizer = build_tiny()
    d_head = hf_model.config.head_dim
    with torch.no_grad():
        for layer, block in enumerate(hf_model.model.layers):
            weight = block.self_attn.o_proj.weight  # [d_model, n_heads * d_head]
            keep = weight[:, CARRIER.head * d_head : (CARRIER.head + 1) * d_head].clone()
            weight.zero_()
            if layer == CARRIER.layer:
                weight[:, CARRIER.head * d_head : (CARRIER.head + 1) * d_head] = 30 * keep
    return boot("tiny-one-head", "tiny", "tiny-one-head", hf_model, tokenizer)
