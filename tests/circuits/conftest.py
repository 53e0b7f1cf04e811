"""Fixtures of the circuits tests: a multi-head variant of `tiny` (TransformerLens' edge tools need one)."""

from __future__ import annotations

import pytest

from mcp_interp.core.engine.backend.loader.load import boot
from mcp_interp.core.engine.backend.loader.tiny import build_tiny
from mcp_interp.core.engine.backend.model import LoadedModel


@pytest.fixture(scope="module")
def multi_head() -> LoadedModel:
    hf_model, tokenizer = build_tiny(kv_heads=4)
    return boot("tiny-mha", "tiny", "tiny-mha", hf_model, tokenizer)
