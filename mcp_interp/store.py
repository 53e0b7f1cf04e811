"""Server-side store of figures (PNG), reports and artifacts, served as MCP resources.

Ids are random hex generated here; an id from a client is matched against ``ID_PATTERN``
before any file is touched, so ``figure://../../etc/passwd`` can only ever be "not found".
Entries are written atomically (temp file in the same folder, then ``os.replace``), so a kill
mid-write leaves no half-written entry, and they survive a restart. The folder is the index:
one file per entry, named by its id, so a restarted server resolves every URI it handed out
without a separate index file that could disagree with the files. The store is bounded: when
it holds more than ``max_entries`` of a kind (``MCP_INTERP_STORE_MAX``, default 500), the
oldest are deleted.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ID_PATTERN = re.compile(r"^[0-9a-f]{32}$")
MAX_ENV = "MCP_INTERP_STORE_MAX"  # entries kept per kind (figures, reports, artifacts, directions)

KINDS: dict[str, str] = {"figure": ".png", "report": ".md", "artifact": ".json", "direction": ".json", "graph": ".json"}
MIME_TYPES: dict[str, str] = {
    "figure": "image/png",
    "report": "text/markdown",
    "artifact": "application/json",
    "direction": "application/json",
    "graph": "application/json",
}


class NotFound(LookupError):
    """The id is malformed or names nothing stored; the message is safe to show the client."""


@dataclass(frozen=True)
class Stored:
    kind: str
    id: str

    @property
    def uri(self) -> str:
        return f"{self.kind}://{self.id}"


class Store:
    def __init__(self, root: Path, max_entries: int | None = None) -> None:
        self.root = Path(root)
        self.max_entries = max_entries if max_entries is not None else int(os.environ.get(MAX_ENV, "500"))
        self._lock = threading.Lock()
        for kind in KINDS:
            (self.root / kind).mkdir(parents=True, exist_ok=True)
            self._remove_stale_temporaries(self.root / kind)

    @staticmethod
    def _remove_stale_temporaries(folder: Path, older_than_s: float = 60.0) -> None:
        """Delete temp files a killed writer left behind (never visible as entries: no valid id name).

        Only old ones: a younger temp file may belong to another server writing right now.
        """
        now = time.time()
        for path in folder.glob(".tmp-*"):
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > older_than_s:
                    path.unlink()

    def put(self, kind: str, data: bytes) -> Stored:
        """Write ``data`` as a new entry of ``kind`` and return its handle (id + URI)."""
        folder, suffix = self._folder(kind), KINDS[kind]
        entry_id = secrets.token_hex(16)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=folder)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, folder / f"{entry_id}{suffix}")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._evict(kind)
        return Stored(kind, entry_id)

    def get(self, kind: str, entry_id: str) -> bytes:
        """The bytes of a stored entry; ``NotFound`` for a malformed or unknown id."""
        if kind not in KINDS or not isinstance(entry_id, str) or not ID_PATTERN.fullmatch(entry_id):
            raise NotFound(f"No {kind} with id {entry_id[:80]!r}: ids are 32 lowercase hex characters.")
        path = self._folder(kind) / f"{entry_id}{KINDS[kind]}"
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise NotFound(
                f"No {kind} with id {entry_id!r} (it may have been evicted: the store keeps the "
                f"newest {self.max_entries} of each kind)."
            ) from None

    def path(self, kind: str, entry_id: str) -> Path:
        """Where an entry lives on disk (inside the output folder), for results that name the file."""
        if not ID_PATTERN.fullmatch(entry_id):
            raise NotFound(f"No {kind} with id {entry_id[:80]!r}: ids are 32 lowercase hex characters.")
        return self._folder(kind) / f"{entry_id}{KINDS[kind]}"

    def ids(self, kind: str) -> list[str]:
        """Stored ids of ``kind``, oldest first."""
        return [p.stem for p in self._entries(kind)]

    def _folder(self, kind: str) -> Path:
        if kind not in KINDS:
            raise NotFound(f"Unknown resource kind {kind!r}; known: {', '.join(KINDS)}.")
        return self.root / kind

    def _entries(self, kind: str) -> list[Path]:
        suffix = KINDS[kind]
        paths = [p for p in self._folder(kind).iterdir() if p.suffix == suffix and ID_PATTERN.fullmatch(p.stem)]
        return sorted(paths, key=lambda p: (p.stat().st_mtime_ns, p.name))

    def _evict(self, kind: str) -> None:
        with self._lock:
            entries = self._entries(kind)
            for path in entries[: max(0, len(entries) - self.max_entries)]:
                path.unlink(missing_ok=True)
