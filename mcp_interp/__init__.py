"""mcp-interp: a Model Context Protocol server for mechanistic-interpretability experiments.

``from mcp_interp import Session`` is the public Python API (``mcp_interp.api``): every tool as a method. It is
imported at first use, so importing the package (the CLI, the stdio server's start) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["Session", "ToolCallError", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("Session", "ToolCallError"):
        return getattr(importlib.import_module("mcp_interp.api"), name)
    raise AttributeError(f"module 'mcp_interp' has no attribute {name!r}")
