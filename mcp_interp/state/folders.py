"""The server's own folders, named once: where converted weights are cached and where stored results are written."""

from __future__ import annotations

import os
import re
from pathlib import Path

PRINCIPAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a principal's name (``--auth-tokens``): a plain word
PRINCIPALS_FOLDER = "principals"  # under the output folder: one store per named principal


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


def principal_dir(output_dir: Path, principal: str) -> Path:
    """Where a named principal's stored entries live: its own folder under the output folder (``mcp.workspace``)."""
    if not PRINCIPAL_NAME.fullmatch(principal):  # the tokens file admits no other name: a folder name stays plain
        raise ValueError(f"not a principal's name: {principal[:80]!r}")
    return output_dir / PRINCIPALS_FOLDER / principal
