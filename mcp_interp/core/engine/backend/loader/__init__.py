"""The loader: a model name (and ``LoadOptions``) turned into a ``LoadedModel`` whose backend every measurement runs
through. ``load`` decides which kind of name it is; ``embedded``, ``tiny`` and ``hf`` obtain the HF model;
``checkpoints`` and ``fingerprints`` serve the backends that load a checkpoint folder themselves. The placement and
backend flags (``LoadOptions``) live beside ``LoadedModel`` in ``backend/options.py``, so the model's module never
imports this package (which imports the model).
"""

from __future__ import annotations

from mcp_interp.core.engine.backend.loader.fingerprints import weights_fingerprint
from mcp_interp.core.engine.backend.loader.load import boot, load_model
from mcp_interp.core.engine.backend.loader.tiny import build_tiny, tiny_tokenizer_dir
from mcp_interp.core.engine.backend.options import LoadOptions, parse_dtype

__all__ = [
    "LoadOptions",
    "boot",
    "build_tiny",
    "load_model",
    "parse_dtype",
    "tiny_tokenizer_dir",
    "weights_fingerprint",
]
