"""The session's ledger: every tool call, in order, with what is needed to rerun it and check it.

An entry holds the tool, its arguments as sent, each handle in them (``direction://…``, ``circuit://…``, any stored URI)
resolved to the call that made it and hashed, the seeds among the arguments, the weights' fingerprint and library
versions, the wall time, the result's ``key_numbers`` and ``result_uri`` — or the error the call raised. The ledger is
kept in memory beside the store, not in it: evicting ``result://`` entries never drops a ledger entry. It is bounded
(``MAX_ENV``, default ``DEFAULT_MAX`` entries); past the bound the oldest entries go and ``page`` says how many.

Nothing here knows MCP or the model: ``mcp/recording.py`` fills it, ``investigation.py`` turns it into a script.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from mcp_interp.state.store import URI_PATTERN

MAX_ENV = "MCP_INTERP_LEDGER_MAX"
DEFAULT_MAX = 10_000
PAGE_SIZE = 50
MAX_KEY_NUMBERS = 5000  # per entry (a returned result is ≤ 16 KB, so this bound is rarely reached)
MAX_SUMMARY = 1000  # characters of a result's text summary kept in its entry
MAX_NOTES = 8  # of a result's notes kept in its entry
# Wall times, recorded once per entry and never compared: a field named ``…_s`` or ``…_seconds`` (elapsed_s,
# load_seconds, an attribution graph's forward_s, explain's stage_seconds) and every number inside one.
WALL_TIME_SUFFIXES = ("_s", "_seconds")
# Texts a rerun cannot reproduce or need not: its own run id, handles (renamed on a rerun), notes and summaries (they
# quote handles and timings), paths of its temporary folder, the model's record (its fingerprint is checked apart).
UNCOMPARED_TEXTS = frozenset({"run_id", "notes", "model", "summary", "created_at", "started_at", "finished_at"})
SEED_WORDS = ("seed", "seeds")  # an argument named so, or ending in _seed / _seeds, anywhere in the arguments
VERSIONED = ("torch", "transformer-lens", "mcp-interp")


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_wall_time(path: str) -> bool:
    """Whether a JSON path (``stage_seconds.dla``, ``runs[0].elapsed_s``) is a wall time or lies inside one."""
    return any(part.split("[", 1)[0].endswith(WALL_TIME_SUFFIXES) for part in path.split("."))


def key_numbers(data: Any) -> dict[str, float]:
    """The numbers of a structured result that a rerun must reproduce, by JSON path (``heads[0].score``,
    ``scores[2][5]``) — defined here only: every number in it but the wall times, at most ``MAX_KEY_NUMBERS``."""
    found: dict[str, float] = {}
    for path, value in _leaves(data, ""):
        if is_number(value) and not is_wall_time(path) and len(found) < MAX_KEY_NUMBERS:
            found[path] = value
    return found


def key_texts(data: Any) -> dict[str, str | bool]:
    """The texts and flags of a structured result a rerun must reproduce, by JSON path (the method, component,
    labels, answers, verdicts…): every string and boolean but those ``UNCOMPARED_TEXTS`` names and handles."""
    found: dict[str, str | bool] = {}
    for path, value in _leaves(data, ""):
        if isinstance(value, str | bool) and len(found) < MAX_KEY_NUMBERS:
            last = path.rsplit(".", 1)[-1].split("[", 1)[0]
            if last in UNCOMPARED_TEXTS or last.endswith(("_uri", "_path")) or last == "uri":
                continue
            if isinstance(value, str) and "://" in value:  # a handle, renamed on a rerun
                continue
            found[path] = value
    return found


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every scalar inside ``value`` with its JSON path, skipping the subtrees ``UNCOMPARED_TEXTS`` names."""
    if isinstance(value, dict):
        for key, sub in value.items():
            if key in ("model", "notes"):
                continue
            yield from _leaves(sub, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            yield from _leaves(sub, f"{path}[{index}]")
    else:
        yield path, value


def verdicts(data: Any) -> dict[str, str]:
    """Every verdict a structured result states (a ``verdict`` string anywhere in it), by the JSON path of the object
    holding it: the claims a result licenses, each beside its p-value among the key numbers (same path)."""
    return {
        path: obj["verdict"]
        for path, obj in _objects(data, "")
        if isinstance(obj.get("verdict"), str) and obj["verdict"]
    }


def intervals(data: Any) -> dict[str, list[float]]:
    """Every interval a structured result reports (a pair of numbers under a key ``ci``, ``…_ci`` or ``interval``), by
    its JSON path, at most ``MAX_KEY_NUMBERS``: what a claim's report cites beside a p-value."""
    found: dict[str, list[float]] = {}
    for path, obj in _objects(data, ""):
        for key, value in obj.items():
            named = key in ("ci", "interval") or str(key).endswith(("_ci", "_interval"))
            pair = isinstance(value, list) and len(value) == 2 and all(is_number(v) for v in value)
            if named and pair and len(found) < MAX_KEY_NUMBERS:
                found[f"{path}.{key}" if path else str(key)] = [float(v) for v in value]
    return found


def _objects(value: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every JSON object inside ``value`` with its path (``a.b[3].c``), outermost first."""
    if isinstance(value, dict):
        yield path, value
        for key, sub in value.items():
            yield from _objects(sub, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            yield from _objects(sub, f"{path}[{index}]")


def uris_at(value: Any, path: str = "") -> dict[str, str]:
    """Every stored URI inside ``value``, by its JSON path."""
    if isinstance(value, str):
        return {path: value} if URI_PATTERN.fullmatch(value) else {}
    found: dict[str, str] = {}
    if isinstance(value, dict):
        for key, sub in value.items():
            found.update(uris_at(sub, f"{path}.{key}" if path else str(key)))
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            found.update(uris_at(sub, f"{path}[{index}]"))
    return found


def seeds_in(arguments: Any, path: str = "") -> dict[str, Any]:
    """The seeds among the arguments, by path (``seed``, ``control_seeds``, ``intervention.seed``, …)."""
    found: dict[str, Any] = {}
    if isinstance(arguments, dict):
        for key, sub in arguments.items():
            here = f"{path}.{key}" if path else str(key)
            if str(key) in SEED_WORDS or str(key).endswith(tuple(f"_{w}" for w in SEED_WORDS)):
                found[here] = sub
            else:
                found.update(seeds_in(sub, here))
    elif isinstance(arguments, list):
        for index, sub in enumerate(arguments):
            found.update(seeds_in(sub, f"{path}[{index}]"))
    return found


@dataclass
class Handle:
    """A stored URI passed to a call: the earlier call that made it (None: not made by a recorded call) and the
    sha256 of its stored bytes when the call was made (None: no longer stored)."""

    made_by: int | None
    sha256: str | None


@dataclass
class Entry:
    call: int
    tool: str
    arguments: dict[str, Any]
    handles: dict[str, Handle]
    seeds: dict[str, Any]
    started_at: str
    model: dict[str, Any] | None = None  # name, fingerprint, versions (torch, transformer-lens, mcp-interp)
    elapsed_s: float = 0.0
    status: str = "ok"  # ok | error
    error: str | None = None
    key_numbers: dict[str, float] = field(default_factory=dict)
    key_texts: dict[str, str | bool] = field(default_factory=dict)
    result_uri: str | None = None
    made: dict[str, str] = field(default_factory=dict)  # URIs the result names, by JSON path
    job_uri: str | None = None  # a background call: its job; its result's numbers are filled in when it is done
    job_state: str | None = None
    summary: str | None = None  # the result's text summary, as the client got it (cut to MAX_SUMMARY)
    notes: list[str] = field(default_factory=list)  # the result's first MAX_NOTES notes
    verdicts: dict[str, str] = field(default_factory=dict)  # path of the object → its verdict (``verdicts``)
    intervals: dict[str, list[float]] = field(default_factory=dict)  # path → [low, high] (``intervals``)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def ledger_bound() -> int:
    value = os.environ.get(MAX_ENV)
    return max(1, int(value)) if value else DEFAULT_MAX


class Ledger:
    def __init__(self, max_entries: int | None = None) -> None:
        self.max_entries = max_entries or ledger_bound()
        self.entries: deque[Entry] = deque()
        self.dropped = 0  # the oldest entries let go past the bound
        self.made_by: dict[str, int] = {}  # every URI a recorded call's result named → that call
        self._next = 1
        self._lock = threading.Lock()

    def open(self, tool: str, arguments: dict[str, Any], hashes: dict[str, str | None], started_at: str) -> Entry:
        """A new entry for a call that is starting (``hashes``: the sha256 of each handle in the arguments)."""
        with self._lock:
            entry = Entry(
                call=self._next,
                tool=tool,
                arguments=arguments,
                handles={uri: Handle(self.made_by.get(uri), digest) for uri, digest in hashes.items()},
                seeds=seeds_in(arguments),
                started_at=started_at,
            )
            self._next += 1
            self.entries.append(entry)
            while len(self.entries) > self.max_entries:
                self.entries.popleft()
                self.dropped += 1
            return entry

    def close(
        self, entry: Entry, structured: dict[str, Any] | None, error: str | None, summary: str | None = None
    ) -> None:
        """The call's outcome: its result's key numbers, verdicts, notes, summary and URIs, or its error."""
        if error is not None:
            entry.status, entry.error = "error", error
            return
        data = structured or {}
        job = data.get("job")
        if isinstance(job, dict) and isinstance(job.get("job_uri"), str) and entry.job_uri is None:
            entry.job_uri, entry.job_state = job["job_uri"], job.get("state")
            return  # its numbers are the job's result's (``settle``)
        entry.key_numbers = key_numbers(data)
        entry.key_texts = key_texts(data)
        entry.verdicts = verdicts(data)
        entry.intervals = intervals(data)
        notes = data.get("notes")
        entry.notes = [str(note) for note in notes[:MAX_NOTES]] if isinstance(notes, list) else []
        entry.summary = summary[:MAX_SUMMARY] if summary else None
        entry.result_uri = data.get("result_uri") if isinstance(data.get("result_uri"), str) else None
        entry.made = uris_at(data)
        with self._lock:
            for uri in entry.made.values():
                self.made_by.setdefault(uri, entry.call)

    def pending_jobs(self) -> list[Entry]:
        """Background calls whose job has not been seen finished."""
        return [e for e in self.entries if e.job_uri is not None and e.job_state in ("queued", "running")]

    def settle(self, entry: Entry, state: str, result: dict[str, Any] | None, error: str | None) -> None:
        """A background call's job has moved on: done → its result's key numbers and URIs; failed → its error."""
        entry.job_state = state
        if state == "done":
            self.close(entry, result, None)
        elif state in ("failed", "cancelled", "lost"):
            self.close(entry, None, error or f"the job was {state}")

    def get(self, call: int) -> Entry | None:
        return next((e for e in self.entries if e.call == call), None)

    def calls(self) -> list[int]:
        return [e.call for e in self.entries]

    def page(self, number: int, size: int = PAGE_SIZE) -> dict[str, Any]:
        """One page of entries (page 0 holds the oldest kept), what pages exist, and a note when entries were
        dropped."""
        entries = list(self.entries)
        pages = max(1, -(-len(entries) // size))
        notes = []
        if self.dropped:
            notes.append(
                f"The ledger keeps the last {self.max_entries} calls: the {self.dropped} oldest "
                f"(calls 1–{self.dropped}) were dropped (raise {MAX_ENV} to keep more)."
            )
        return {
            "page": number,
            "pages": pages,
            "page_size": size,
            "total_calls": len(entries) + self.dropped,
            "kept_calls": len(entries),
            "dropped_calls": self.dropped,
            "notes": notes,
            "entries": [e.to_json() for e in entries[number * size : (number + 1) * size]],
        }
