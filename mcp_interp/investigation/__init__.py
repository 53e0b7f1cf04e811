"""An investigation anyone can rerun: the session's ledger exported as a Python script (``script``), a Jupyter
notebook (``notebook``) — each reruns every call through the public API and checks every recorded key number
(``rerun``) — or a Markdown report of the claims made from its verdicts (``report``).

``select`` chooses the calls: every successful call, or the ones named plus the calls that made their handles.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from mcp_interp.errors import InputError
from mcp_interp.state.ledger import Entry, Ledger

FORMATS = ("py", "ipynb", "md")
NOT_RERUN = frozenset({"export_investigation", "job_status", "job_cancel"})  # about this session, not the model
ATOL = 1e-5
RTOL = 1e-5


def select(ledger: Ledger, calls: list[int] | None) -> tuple[list[Entry], list[str]]:
    """The entries to rerun, in order, and notes (handles no recorded call made, calls added for their handles)."""
    kept = {entry.call: entry for entry in ledger.entries}
    rerunnable = {
        c for c, e in kept.items() if e.status == "ok" and e.tool not in NOT_RERUN and e.job_state in (None, "done")
    }
    notes: list[str] = []
    if calls is None:
        wanted = set(rerunnable)
    else:
        unknown = sorted(c for c in calls if c not in rerunnable)
        if unknown:
            valid = ", ".join(str(c) for c in sorted(rerunnable)) or "none yet"
            failed = sorted(c for c in unknown if c in kept)
            why = f" ({', '.join(map(str, failed))} failed, are still running or only read jobs)" if failed else ""
            raise InputError(
                f"`calls` names calls {unknown} that cannot be exported{why}: the calls recorded in this session that "
                f"can be rerun are {valid} (read the ledger:// resource for them), or omit `calls` for all of them."
            )
        wanted = set(calls)
    pending = sorted(wanted)
    while pending:  # the calls that made the handles the wanted calls use, transitively
        entry = kept[pending.pop()]
        for uri, handle in entry.handles.items():
            if handle.made_by in rerunnable and handle.made_by not in wanted:
                wanted.add(handle.made_by)
                pending.append(handle.made_by)
                notes.append(f"Call {handle.made_by} ({kept[handle.made_by].tool}) is included: it made {uri}.")
            elif handle.made_by is None or handle.made_by not in kept:
                notes.append(
                    f"Call {entry.call} ({entry.tool}) uses {uri}, which no recorded call made: the script passes it "
                    "as it is, so it reruns only where that entry is still stored."
                )
    return [kept[c] for c in sorted(wanted)], notes


def rerun_calls(entries: list[Entry]) -> list[dict[str, Any]]:
    """What a rerun needs of each entry: its tool, arguments as sent, key numbers recorded and the URIs it made."""
    return [
        {
            "call": e.call,
            "tool": e.tool,
            "arguments": {k: v for k, v in e.arguments.items() if k != "background"},
            "arguments_sha256": arguments_digest({k: v for k, v in e.arguments.items() if k != "background"}),
            "key_numbers": e.key_numbers,
            "key_texts": e.key_texts,
            "made": e.made,
        }
        for e in entries
    ]


def arguments_digest(arguments: dict[str, Any]) -> str:
    """sha256 of a call's arguments as canonical JSON: an exported rerun refuses a call whose arguments were edited."""
    return hashlib.sha256(json.dumps(arguments, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise InputError(
            f"Unknown format {fmt!r}: export_investigation writes 'py' (a Python script), 'ipynb' (a Jupyter "
            "notebook) or 'md' (a Markdown report of the claims and the verdicts behind them)."
        )
