"""An investigation anyone can rerun: the ledger's calls as a self-contained Python script.

``select`` chooses the calls (every successful call, or the ones named plus the calls that made their handles);
``script`` writes the program: it loads the same model and checks the weights' fingerprint, reruns each call through
the public API (``mcp_interp.Session``) in order — a handle made by an earlier call is recreated by rerunning that call
and its new URI substituted into later arguments — and compares every key number recorded live (``ledger.key_numbers``,
embedded verbatim) with its recomputation within ``ATOL + RTOL·|recorded|``. It prints a table (``--json``: one JSON
object of the recomputed numbers) and exits 1 naming every call that does not match.
"""

from __future__ import annotations

import pprint
from datetime import UTC, datetime

from mcp_interp.errors import InputError
from mcp_interp.ledger import Entry, Ledger

FORMATS = ("py",)
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


def script(entries: list[Entry], model: str, fingerprint: str, versions: dict[str, str], notes: list[str]) -> str:
    calls = [
        {
            "call": e.call,
            "tool": e.tool,
            "arguments": {k: v for k, v in e.arguments.items() if k != "background"},
            "key_numbers": e.key_numbers,
            "made": e.made,
        }
        for e in entries
    ]
    header = "\n".join(f"# {note}" for note in notes)
    return TEMPLATE.format(
        n=len(calls),
        model=model,
        fingerprint=fingerprint,
        exported=datetime.now(UTC).isoformat(timespec="seconds"),
        versions=pprint.pformat(versions, width=110, sort_dicts=True),
        notes=header + "\n" if header else "",
        atol=repr(ATOL),
        rtol=repr(RTOL),
        calls=pprint.pformat(calls, width=110, sort_dicts=False),
    )


TEMPLATE = '''#!/usr/bin/env python3
"""Rerun of an mcp-interp investigation: {n} calls on model {model!r} (weights fingerprint {fingerprint}),
exported {exported}.

    python this_script.py            a table: each call, its key numbers recorded and recomputed
    python this_script.py --json     one JSON object: the recomputed key numbers, by call

Each call is rerun through the public API (`mcp_interp.Session`) in the order it was made. A handle (direction://,
circuit://, …) made by an earlier call is recreated by rerunning that call, and its new URI replaces the old one in
later arguments. Every key number recorded live is compared with its recomputation: a match is
|recomputed - recorded| <= ATOL + RTOL * |recorded| (exact tools; sampled baselines are drawn again from their
recorded seeds, to the same tolerance). Exits 0 when every call matches, 1 naming each call that does not.
"""
{notes}
import json
import sys
import tempfile

MODEL = {model!r}
FINGERPRINT = {fingerprint!r}
RECORDED_VERSIONS = {versions}
ATOL = {atol}
RTOL = {rtol}
CALLS = {calls}


def substitute(value, renamed):
    if isinstance(value, str):
        return renamed.get(value, value)
    if isinstance(value, list):
        return [substitute(item, renamed) for item in value]
    if isinstance(value, dict):
        return {{key: substitute(item, renamed) for key, item in value.items()}}
    return value


def matches(recorded, recomputed):
    return recomputed is not None and abs(recomputed - recorded) <= ATOL + RTOL * abs(recorded)


def main(argv):
    as_json = "--json" in argv
    say = (lambda text: print(text, file=sys.stderr)) if as_json else print
    from mcp_interp import Session

    failures, recomputed = [], {{}}
    with tempfile.TemporaryDirectory(prefix="mcp-interp-rerun-") as output:
        session = Session(MODEL, output_dir=output)
        if session.fingerprint != FINGERPRINT:
            say(f"MISMATCH model: weights fingerprint {{session.fingerprint}}, recorded {{FINGERPRINT}}")
            return 1
        renamed = {{}}
        say(f"{{'call':>5}}  {{'tool':<24}} {{'key number':<40}} {{'recorded':>14}} {{'recomputed':>14}}  ok")
        for call in CALLS:
            name = f"call {{call['call']}} ({{call['tool']}})"
            try:
                session.call(call["tool"], **substitute(call["arguments"], renamed))
            except Exception as exc:
                failures.append(f"{{name}}: the rerun failed: {{exc}}")
                say(f"{{call['call']:>5}}  {{call['tool']:<24}} ERROR {{exc}}")
                continue
            entry = session.ledger.entries[-1]
            recomputed[str(call["call"])] = entry.key_numbers
            for path, old in call["made"].items():
                new = entry.made.get(path)
                if new is None:
                    failures.append(f"{{name}}: made {{old}} at {{path}}; the rerun made nothing there")
                else:
                    renamed[old] = new
            for key, recorded in call["key_numbers"].items():
                value = entry.key_numbers.get(key)
                ok = matches(recorded, value)
                if not ok:
                    failures.append(f"{{name}}: {{key}} recorded {{recorded!r}}, recomputed {{value!r}}")
                shown = "missing" if value is None else f"{{value:.8g}}"
                say(f"{{call['call']:>5}}  {{call['tool']:<24}} {{key[:40]:<40}} {{recorded:>14.8g}} {{shown:>14}}  "
                    f"{{'yes' if ok else 'NO'}}")
    if as_json:
        print(json.dumps(recomputed, sort_keys=True))
    for failure in failures:
        say(f"MISMATCH {{failure}}")
    verdict = f"{{len(failures)}} mismatches." if failures else "every key number matches."
    say(f"{{len(CALLS)}} calls rerun: {{verdict}}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise InputError(f"Unknown format {fmt!r}: export_investigation writes {', '.join(FORMATS)} (a Python script).")
