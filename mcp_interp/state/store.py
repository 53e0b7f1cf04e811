"""Server-side store of everything a tool hands out as a URI: figures, reports, artifacts, directions, complete
results, circuits, job records — served as MCP resources and accepted back by later calls.

Ids are random hex generated here; an id from a client is matched against ``ID_PATTERN`` before any file is
touched, so ``figure://../../etc/passwd`` can only ever be "not found". The folder is the index: one file per
entry, named by its id, written atomically (a temp file in the same folder, then ``os.replace``), so a killed
writer leaves no half-written entry and a restarted server resolves every URI it handed out.

The store is bounded per kind (``DEFAULT_MAX``; ``MCP_INTERP_STORE_MAX`` sets every kind,
``MCP_INTERP_STORE_MAX_<KIND>`` one kind). Past the bound the *least recently used* entry goes (a read refreshes an
entry), but never one that another live entry references (a report's figures, a job's result): ``put`` records
what an entry references. An evicted id leaves a tombstone, so reading it says when and why it went — not the
same words as an id that never existed. Several server processes may share one folder (the per-user default is
shared by every server a user starts): eviction runs under a per-kind lock file and tolerates files another
process removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from mcp_interp.errors import NotFound

ID_PATTERN = re.compile(r"^[0-9a-f]{32}$")
URI_PATTERN = re.compile(r"^([a-z]+)://([0-9a-f]{32})$")
MAX_ENV = "MCP_INTERP_STORE_MAX"  # every kind; MCP_INTERP_STORE_MAX_<KIND> for one kind

KINDS: dict[str, str] = {
    "figure": ".png",
    "report": ".md",
    "artifact": ".json",
    "direction": ".json",
    "result": ".json",
    "circuit": ".json",
    "job": ".json",
    "graph": ".json",
    "explanation": ".json",
    "quiz": ".json",
    "script": ".py",
    "notebook": ".ipynb",
}
MIME_TYPES: dict[str, str] = {
    kind: {
        ".png": "image/png",
        ".md": "text/markdown",
        ".py": "text/x-python",
        ".ipynb": "application/x-ipynb+json",
    }.get(suffix, "application/json")
    for kind, suffix in KINDS.items()
}
DEFAULT_MAX: dict[str, int] = {
    "figure": 500,
    "report": 500,
    "artifact": 100,  # a default causal-swap artifact is ~8 MB
    "direction": 5000,  # a 30-layer probe stores 30
    "result": 500,
    "circuit": 500,
    "job": 500,
    "graph": 200,  # a pruned attribution graph's Neuronpedia JSON is up to a few MB
    "explanation": 2000,  # a scored explanation of a feature (feature_examples lists them per feature)
    "quiz": 2000,  # a detection quiz and its hidden truth
    "script": 500,  # a rerun script written by export_investigation
    "notebook": 500,  # the same as a Jupyter notebook
}
TOMBSTONES = ".evicted"  # per kind: one small JSON file per evicted id
REFS_SUFFIX = ".refs"  # beside an entry: the URIs it references, one JSON list


@dataclass(frozen=True)
class Stored:
    kind: str
    id: str

    @property
    def uri(self) -> str:
        return f"{self.kind}://{self.id}"


def parse_uri(uri: str, kind: str | None = None) -> Stored:
    """``kind://<32 hex>`` as a ``Stored`` handle (checked to be of ``kind`` when given), or ``NotFound``."""
    match = URI_PATTERN.fullmatch(uri) if isinstance(uri, str) else None
    if match is None or match.group(1) not in KINDS or (kind is not None and match.group(1) != kind):
        wanted = f"{kind}://<32 hex>" if kind else "kind://<32 hex>"
        raise NotFound(f"{str(uri)[:100]!r} is not a stored URI; they look like {wanted}.")
    return Stored(match.group(1), match.group(2))


class Store:
    def __init__(self, root: Path, max_entries: int | dict[str, int] | None = None) -> None:
        self.root = Path(root)
        self.max_entries = {kind: self._bound(kind, max_entries) for kind in KINDS}
        self.version = 0  # entries this process has stored (a tool that moves it changed the resources list)
        for kind in KINDS:
            (self.root / kind / TOMBSTONES).mkdir(parents=True, exist_ok=True)
            self._remove_stale_temporaries(self.root / kind)

    @staticmethod
    def _bound(kind: str, given: int | dict[str, int] | None) -> int:
        if isinstance(given, int):
            return given
        if isinstance(given, dict) and kind in given:
            return given[kind]
        for name in (f"{MAX_ENV}_{kind.upper()}", MAX_ENV):
            if os.environ.get(name):
                return max(1, int(os.environ[name]))
        return DEFAULT_MAX[kind]

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

    # --- writing -----------------------------------------------------------------------------------

    def put(self, kind: str, data: bytes, references: Iterable[str] = ()) -> Stored:
        """Write ``data`` as a new entry of ``kind``; ``references`` are the URIs of stored entries it links to
        (kept while it lives). Returns its handle (id + URI)."""
        folder, suffix = self._folder(kind), KINDS[kind]
        entry_id = secrets.token_hex(16)
        refs = sorted({uri for uri in references if URI_PATTERN.fullmatch(uri)})
        if refs:
            self._write(folder, f"{entry_id}{REFS_SUFFIX}", json.dumps(refs).encode())
        self._write(folder, f"{entry_id}{suffix}", data)
        self.version += 1
        self._evict(kind)
        return Stored(kind, entry_id)

    def replace(self, kind: str, entry_id: str, data: bytes, references: Iterable[str] = ()) -> None:
        """Overwrite an existing entry in place (atomically) — a job record as its job moves on — and add to what it
        references."""
        self._check_id(kind, entry_id)
        folder = self._folder(kind)
        refs = {uri for uri in references if URI_PATTERN.fullmatch(uri)}
        if refs:
            with contextlib.suppress(OSError, ValueError):
                refs.update(json.loads((folder / f"{entry_id}{REFS_SUFFIX}").read_bytes()))
            self._write(folder, f"{entry_id}{REFS_SUFFIX}", json.dumps(sorted(refs)).encode())
        self._write(folder, f"{entry_id}{KINDS[kind]}", data)

    def update(
        self, kind: str, entry_id: str, change: Callable[[bytes | None], bytes | None], references: Iterable[str] = ()
    ) -> bool:
        """Read, compare and write an entry under the kind's lock, so servers sharing this folder never overwrite
        each other's writes unseen (a job record's "done"): ``change`` gets the current bytes (None when there are
        none) and returns the new bytes, or None to leave the entry as it is. Returns whether it wrote."""
        self._check_id(kind, entry_id)
        with self._locked(kind):
            try:
                current: bytes | None = (self._folder(kind) / f"{entry_id}{KINDS[kind]}").read_bytes()
            except FileNotFoundError:
                current = None
            new = change(current)
            if new is None:
                return False
            self.replace(kind, entry_id, new, references)
            return True

    @staticmethod
    def _write(folder: Path, name: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, folder / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    # --- reading -----------------------------------------------------------------------------------

    def get(self, kind: str, entry_id: str) -> bytes:
        """The bytes of a stored entry (and it becomes the most recently used); ``NotFound`` for a malformed id, an
        evicted one (saying when and why) or one never stored here."""
        self._check_id(kind, entry_id)
        path = self._folder(kind) / f"{entry_id}{KINDS[kind]}"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise NotFound(self._missing(kind, entry_id)) from None
        with contextlib.suppress(OSError):  # least recently *used*: a read refreshes the entry
            os.utime(path)
        return data

    def path(self, kind: str, entry_id: str) -> Path:
        """Where an entry lives on disk (inside the output folder), for results that name the file."""
        self._check_id(kind, entry_id)
        return self._folder(kind) / f"{entry_id}{KINDS[kind]}"

    def ids(self, kind: str) -> list[str]:
        """Stored ids of ``kind``, least recently used first."""
        return [path.stem for path, _ in self._entries(kind)]

    def evicted(self, kind: str, entry_id: str) -> dict[str, str] | None:
        """The tombstone of an evicted entry ({evicted_at, reason}), or None."""
        try:
            data: dict[str, str] = json.loads((self._folder(kind) / TOMBSTONES / entry_id).read_bytes())
            return data
        except (OSError, ValueError):
            return None

    def _missing(self, kind: str, entry_id: str) -> str:
        tombstone = self.evicted(kind, entry_id)
        if tombstone is not None:
            return (
                f"{kind}://{entry_id} was evicted at {tombstone.get('evicted_at')}: {tombstone.get('reason')} "
                "Run the tool again to recreate it."
            )
        # The same words for an id never stored and one stored by another principal (whose entries live in another
        # folder), and no server path: an error reaches the client.
        return f"No {kind} with id {entry_id!r} was ever stored here."

    def _check_id(self, kind: str, entry_id: str) -> None:
        if kind not in KINDS or not isinstance(entry_id, str) or not ID_PATTERN.fullmatch(entry_id):
            raise NotFound(f"No {kind} with id {str(entry_id)[:80]!r}: ids are 32 lowercase hex characters.")

    def _folder(self, kind: str) -> Path:
        if kind not in KINDS:
            raise NotFound(f"Unknown resource kind {kind!r}; known: {', '.join(KINDS)}.")
        return self.root / kind

    def _entries(self, kind: str) -> list[tuple[Path, int]]:
        """(path, mtime) of every entry of ``kind``, least recently used first; files another process removes
        while this runs are skipped."""
        suffix = KINDS[kind]
        found = []
        for path in self._folder(kind).iterdir():
            if path.suffix != suffix or not ID_PATTERN.fullmatch(path.stem):
                continue
            with contextlib.suppress(FileNotFoundError):
                found.append((path, path.stat().st_mtime_ns))
        return sorted(found, key=lambda item: (item[1], item[0].name))

    # --- eviction ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, kind: str) -> Iterator[None]:
        """One evicting or updating process per kind at a time (several servers may share this folder)."""
        with open(self._folder(kind) / ".lock", "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def referenced(self) -> set[str]:
        """Every URI some live entry references."""
        uris: set[str] = set()
        for kind in KINDS:
            for path in self._folder(kind).glob(f"*{REFS_SUFFIX}"):
                entry = path.with_name(path.name[: -len(REFS_SUFFIX)] + KINDS[kind])
                with contextlib.suppress(OSError, ValueError):
                    if entry.exists():
                        uris.update(json.loads(path.read_bytes()))
        return uris

    def _evict(self, kind: str) -> None:
        bound = self.max_entries[kind]
        with self._locked(kind):
            entries = self._entries(kind)
            excess = len(entries) - bound
            if excess <= 0:
                return
            kept_by_reference = self.referenced()
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            reason = (
                f"the store keeps the {bound} most recently used {kind} entries (raise {MAX_ENV}_{kind.upper()} or "
                f"{MAX_ENV} to keep more)."
            )
            for path, _ in entries:
                if excess <= 0:
                    break
                uri = f"{kind}://{path.stem}"
                if uri in kept_by_reference:
                    continue  # a live entry links to it
                tombstone = json.dumps({"evicted_at": stamp, "reason": reason}).encode()
                with contextlib.suppress(OSError):
                    self._write(self._folder(kind) / TOMBSTONES, path.stem, tombstone)
                path.unlink(missing_ok=True)
                path.with_name(path.stem + REFS_SUFFIX).unlink(missing_ok=True)
                excess -= 1
            self._trim_tombstones(kind, 10 * bound)

    def _trim_tombstones(self, kind: str, keep: int) -> None:
        """Tombstones are bounded too (10 × the entries' bound): the oldest go."""
        folder = self._folder(kind) / TOMBSTONES
        stones = []
        for path in folder.iterdir():
            with contextlib.suppress(FileNotFoundError):
                stones.append((path.stat().st_mtime_ns, path))
        for _, path in sorted(stones)[: max(0, len(stones) - keep)]:
            path.unlink(missing_ok=True)
