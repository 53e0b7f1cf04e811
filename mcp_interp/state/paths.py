"""Paths a client names (an SAE folder, a lens file, transcoders): read only inside the allowed roots.

A tool argument that names a path is a read of the server's filesystem chosen by whoever can call the tool — over
HTTP, anyone who can reach the port. So every such path is resolved (``~`` expanded, symlinks followed) *before*
anything looks at it, and refused with one message that does not depend on whether the path exists unless it lies
inside an allowed root: no error text can tell an existing file from a missing one, or list what is there, outside.

The roots (``--allow-root DIR``, repeatable, or ``MCP_INTERP_ALLOW_ROOT`` with ``os.pathsep``-separated folders):
over stdio by default the working directory, the server's cache folder, the Hugging Face cache and the user's home
(a local user runs the server); over HTTP only the roots given explicitly (none by default: every client path is
refused). Process-wide, set once by the CLI, like ``limits``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from mcp_interp.errors import InputError

ENV = "MCP_INTERP_ALLOW_ROOT"

_roots: tuple[Path, ...] | None = None  # None: the stdio defaults


def stdio_defaults() -> list[Path]:
    """The working directory, the server's cache, the Hugging Face cache and the user's home."""
    from mcp_interp.state.folders import cache_dir

    hf_home = os.environ.get("HF_HOME", str(Path("~/.cache/huggingface").expanduser()))
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or str(Path(hf_home) / "hub")
    return [Path.cwd(), cache_dir(), Path(hub), Path.home()]


def configure(roots: Sequence[str | Path] | None) -> None:
    """Set the allowed roots (None: the stdio defaults; an empty list: no client path at all)."""
    global _roots
    _roots = None if roots is None else tuple(Path(root).expanduser().resolve() for root in roots)


def allowed_roots() -> tuple[Path, ...]:
    if _roots is not None:
        return _roots
    extra = [Path(p) for p in os.environ.get(ENV, "").split(os.pathsep) if p]
    return tuple(p.expanduser().resolve() for p in [*stdio_defaults(), *extra])


def client_path(value: str, argument: str) -> Path:
    """``value`` (a path a client sent as ``argument``) resolved, if it lies inside an allowed root; otherwise an
    ``InputError`` that says only that it is outside them (the same words whether or not it exists)."""
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"`{argument}` must be a path, got {value!r}.")
    try:
        resolved = Path(value).expanduser().resolve(strict=False)  # symlinks followed before the check
    except (OSError, RuntimeError, ValueError):  # ValueError: a NUL byte, which no file's name holds
        resolved = None
    roots = allowed_roots()
    if resolved is None or not any(resolved == root or root in resolved.parents for root in roots):
        shown = ", ".join(str(r) for r in roots) if roots else "none"
        raise InputError(
            f"`{argument}` names a path outside the folders this server may read (allowed roots: {shown}). Put the "
            "files under one of them, or start the server with --allow-root DIR (repeatable)."
        )
    return resolved


def existing_inside(value: str) -> Path | None:
    """``value`` resolved, if it lies inside an allowed root and exists there; None otherwise — the same None for a
    path outside the roots whether or not it exists (for tools that read a name as a path when there is such a
    folder, else as a hub id: outside the roots it is always the hub id, so the answer tells nothing)."""
    try:
        path = client_path(value, "path")
        return path if path.exists() else None
    except (InputError, OSError):
        return None
