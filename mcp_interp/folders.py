"""The server's own folders, named once: where converted weights are cached and where stored results are written."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where converted weights live: ``$MCP_INTERP_CACHE`` or the platform's user cache."""
    override = os.environ.get("MCP_INTERP_CACHE")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("mcp-interp"))


def default_output_dir() -> Path:
    """Where figures, reports and stored results are written: ``$MCP_INTERP_OUTPUT`` or the user data folder."""
    override = os.environ.get("MCP_INTERP_OUTPUT")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("mcp-interp")) / "output"
