"""Hugging Face models named by a local folder, a ``.gguf`` file or a hub id, loaded with eager attention."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from mcp_interp.errors import ModelLoadError
from mcp_interp.names import EMBEDDED_NAME, describe_model_names


def _load_local(path: Path, torch_dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        if path.is_file():
            if path.suffix != ".gguf":
                raise ModelLoadError(f"{path} is a file but not a .gguf; pass a .gguf file or an HF model folder.")
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=torch_dtype, attn_implementation="eager"
            )
        else:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, attn_implementation="eager")
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"Could not load a model from {path}: {exc}. A local model must be an HF model folder "
            "(config.json, weights, tokenizer files) or a .gguf file."
        ) from exc
    return model, tokenizer


def _load_hub(name: str, torch_dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch_dtype, attn_implementation="eager")
    except Exception as exc:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        raise ModelLoadError(
            f"Model {name!r} is not available{' (HF_HUB_OFFLINE=1 is set)' if offline else ''}: "
            f"it is not a local path, so it was looked up on the Hugging Face hub, which failed "
            f"({type(exc).__name__}: {str(exc)[:300]}). Without the hub, use '{EMBEDDED_NAME}' "
            "(embedded, the default) or a local HF model folder / .gguf file. "
            f"Accepted names: {describe_model_names()}."
        ) from exc
    return model, tokenizer
