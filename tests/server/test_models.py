"""Model names → loaded models: local folders, the embedded GGUF as a file, clear failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp_interp.core.engine.backend.loader.embedded import embedded_gguf_path
from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.loader.tiny import build_tiny
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.errors import ModelLoadError


def test_tiny_is_seeded_and_reproducible(tiny: LoadedModel) -> None:
    again = load_model("tiny")
    assert again.fingerprint == tiny.fingerprint
    cfg = again.bridge.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model) == (3, 4, 64)
    assert again.bridge.original_model.config.num_key_value_heads == 2


def test_local_folder_loads_the_same_weights(tiny: LoadedModel, tmp_path: Path) -> None:
    folder = tmp_path / "tiny-copy"
    hf_model, tokenizer = build_tiny()  # unbooted: a booted bridge has wrapped the modules
    hf_model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    local = load_model(str(folder))
    assert local.source == "local"
    assert local.fingerprint == tiny.fingerprint


def test_unknown_name_offline_names_the_offline_choices() -> None:
    with pytest.raises(ModelLoadError) as err:
        load_model("surely-not/a-model-anyone-has")
    text = str(err.value)
    assert "smollm2-135m" in text and "local" in text and "hub" in text


def test_bad_dtype_and_device_are_clear_errors() -> None:
    with pytest.raises(ModelLoadError, match="float32"):
        load_model("tiny", dtype="float8")
    with pytest.raises(ModelLoadError, match="cpu"):
        load_model("tiny", device="tpu")


def test_a_local_file_that_is_not_gguf_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0")
    with pytest.raises(ModelLoadError, match=r"\.gguf"):
        load_model(str(path))


@pytest.mark.embedded
def test_gguf_file_path_gives_the_embedded_weights(embedded: LoadedModel) -> None:
    gguf = embedded_gguf_path()
    assert gguf is not None
    direct = load_model(str(gguf))
    assert direct.source == "local"
    # Same dequantized weights whether read from the GGUF or the float32 cache.
    assert direct.fingerprint == embedded.fingerprint
