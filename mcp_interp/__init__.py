"""mcp-interp: a Model Context Protocol server for mechanistic-interpretability experiments.

``from mcp_interp import Session`` is the public Python API (``mcp_interp.app.api``): every tool as a method. It is
imported at first use, so importing the package (the CLI, the stdio server's start) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from mcp_interp.errors import ToolCallError
from mcp_interp.version import __version__

__all__ = ["Session", "ToolCallError", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Session":
        return getattr(importlib.import_module("mcp_interp.app.api"), name)
    raise AttributeError(f"module 'mcp_interp' has no attribute {name!r}")
