"""A model folder written atomically: saved into a fresh staging folder, renamed into place once complete, so a
reader never sees half a checkpoint and two processes converting the same model both end with a whole one."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def save_atomically(folder: Path, save: Callable[[Path], None]) -> Path:
    """``save(staging)`` into a fresh folder renamed to ``folder`` once complete (a concurrent writer's copy wins)."""
    if (folder / "config.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=folder.parent))
    try:
        save(staging)
        try:
            os.rename(staging, folder)
        except OSError:
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder
