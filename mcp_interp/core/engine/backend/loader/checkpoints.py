"""Checkpoint folders the placed and remote backends load a model from: which kind of name it is, the folder it lives
in (``tiny`` and the embedded model saved to the cache once, a local folder, the hub's snapshot), written atomically.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mcp_interp.core.engine.backend.loader.atomic import save_atomically
from mcp_interp.core.engine.backend.loader.embedded import (
    _load_embedded,
    convert_embedded,
    embedded_cache_folder,
    embedded_gguf_path,
)
from mcp_interp.core.engine.backend.loader.tiny import build_tiny
from mcp_interp.errors import ModelLoadError
from mcp_interp.names import EMBEDDED_NAME, TINY_NAME, TINY_SEED
from mcp_interp.schemas.common import ModelSource
from mcp_interp.state.folders import cache_dir


def hub_folder(name: str) -> Path:
    """The local snapshot of a hub model (downloaded now unless HF_HUB_OFFLINE=1, then from the cache)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken"])
        )
    except Exception as exc:  # offline and not cached, a typo, a gated repo: say which
        raise ModelLoadError(f"Model {name!r} could not be found on the hub or in its cache: {exc}") from exc


def checkpoint_folder(name: str, source: ModelSource) -> Path:
    """The folder of safetensors weights and tokenizer the placed and remote backends load ``name`` from: ``tiny``
    saved once to the cache, the embedded model's converted copy, a local folder, or the hub's snapshot."""
    if source == "tiny":

        def save_tiny(staging: Path) -> None:
            model, tokenizer = build_tiny()
            model.save_pretrained(str(staging))
            tokenizer.save_pretrained(str(staging))

        return save_atomically(cache_dir() / f"tiny-llama-seed{TINY_SEED}", save_tiny)
    if source == "embedded":
        gguf = embedded_gguf_path()
        if gguf is None and not (embedded_cache_folder() / "config.json").is_file():
            _load_embedded(torch.float32)  # the error that says to run `mcp-interp setup`
        return embedded_cache_folder() if gguf is None else convert_embedded(gguf)
    if source == "local":
        path = Path(name).expanduser().resolve()
        if path.is_file():
            raise ModelLoadError(
                f"{path} is a single file: the placed and remote backends load an HF model folder (config.json, "
                "safetensors weights, tokenizer). Convert the GGUF to a folder first (load it once without --backend "
                "or --device-map and save it with save_pretrained)."
            )
        return path
    return hub_folder(name)


def model_source(name: str) -> ModelSource:
    if name == TINY_NAME:
        return "tiny"
    if name == EMBEDDED_NAME:
        return "embedded"
    return "local" if Path(name).expanduser().exists() else "hub"
