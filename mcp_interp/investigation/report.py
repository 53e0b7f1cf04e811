"""The investigation as a Markdown report: the claims the assistant made, each with the verdict, the numbers (p-value,
interval, effect) and the handles of the call behind it, as the ledger recorded them live.

The assistant writes the claims (``Claim``: a sentence and the call it rests on, optionally the key numbers it
cites); the server writes everything else from the ledger, so a reader sees each claim next to its evidence. A claim
resting on a call that states no verdict (a measurement, not a test against a baseline) is flagged as such, and the
verdicts no claim cites are listed after the claims: what was tested and not said is visible too.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from mcp_interp.errors import InputError
from mcp_interp.state.ledger import Entry

MAX_CLAIMS = 50
MAX_CLAIM = 1000  # characters of one claim
SHOWN_NUMBERS = 8  # a claim's numbers when it names none: its call's verdict numbers, else the first top-level ones


def check_claims(claims: Sequence[Any] | None, entries: list[Entry]) -> list[tuple[str, Entry, list[str]]]:
    """Each claim as (text, the entry it cites, the key numbers it cites), or an InputError saying what is wrong."""
    if not claims:
        return []
    if len(claims) > MAX_CLAIMS:
        raise InputError(f"At most {MAX_CLAIMS} claims per report, got {len(claims)}.")
    by_call = {e.call: e for e in entries}
    checked = []
    for index, claim in enumerate(claims):
        text, call, numbers = _fields(claim, index)
        entry = by_call.get(call)
        if entry is None:
            raise InputError(
                f"Claim {index} cites call {call!r}, which is not among the exported calls "
                f"({', '.join(str(c) for c in by_call)}): cite a successful call of the ledger (ledger://0)."
            )
        unknown = [key for key in numbers if key not in entry.key_numbers]
        if unknown:
            known = ", ".join(_scalars_first(list(entry.key_numbers))[:20])
            raise InputError(
                f"Claim {index} cites {unknown}, which call {call} ({entry.tool}) did not record; its key numbers "
                f"are: {known}{' …' if len(entry.key_numbers) > 20 else ''}."
            )
        checked.append((text, entry, numbers))
    return checked


def _fields(claim: Any, index: int) -> tuple[str, int, list[str]]:
    if not isinstance(claim, dict) or not isinstance(claim.get("claim"), str) or not claim["claim"].strip():
        raise InputError(
            f"Claim {index} must be {{'claim': 'what you conclude', 'call': <ledger call id>, 'numbers'?: "
            f"['key number', …]}}, got {str(claim)[:200]!r}."
        )
    call = claim.get("call")
    if not isinstance(call, int) or isinstance(call, bool):
        raise InputError(f"Claim {index}: `call` must be the ledger call id the claim rests on, got {call!r}.")
    numbers = claim.get("numbers") or []
    if not isinstance(numbers, list) or not all(isinstance(n, str) for n in numbers):
        raise InputError(f"Claim {index}: `numbers` must be a list of key-number names, got {numbers!r}.")
    return claim["claim"].strip()[:MAX_CLAIM], call, numbers


def report(
    entries: list[Entry], claims: list[tuple[str, Entry, list[str]]], model: str, fingerprint: str, notes: list[str]
) -> str:
    exported = datetime.now(UTC).isoformat(timespec="seconds")
    lines = [
        "# Investigation report",
        "",
        f"Model `{model}`, weights fingerprint `{fingerprint}`; {len(entries)} calls, exported {exported}. Every "
        "number below was recorded live in the session's ledger; `export_investigation(format='py')` writes a script "
        "that recomputes each one and fails on any that differs.",
        "",
        "## Claims",
        "",
    ]
    if not claims:
        lines += ["No claims were given (pass `claims` to export_investigation). The verdicts below are what the "
                  "calls tested.", ""]  # fmt: skip
    cited: set[tuple[int, str]] = set()
    for number, (text, entry, keys) in enumerate(claims, start=1):
        lines += [f"### {number}. {text}", "", _evidence(entry), ""]
        if entry.verdicts:
            for path, verdict in entry.verdicts.items():
                cited.add((entry.call, path))
                lines.append(f"- Verdict ({path or 'result'}): {verdict}")
        else:
            lines.append(
                f"- **No verdict backs this claim**: call {entry.call} (`{entry.tool}`) reports measurements without "
                "a test against a baseline; the claim rests on the numbers alone."
            )
        lines += [f"- {line}" for line in _numbers(entry, keys)]
        lines.append("")
    uncited = [(e, path, v) for e in entries for path, v in e.verdicts.items() if (e.call, path) not in cited]
    if uncited:
        lines += ["## Verdicts no claim cites", ""]
        for entry, path, verdict in uncited:
            shown = _numbers(entry, [], only=path)
            lines.append(f"- Call {entry.call} (`{entry.tool}`), {path or 'result'}: {verdict}"
                         + (f" ({'; '.join(shown)})" if shown else ""))  # fmt: skip
        lines.append("")
    lines += ["## Calls", "", "| call | tool | seconds | handles passed in | result |", "|---|---|---|---|---|"]
    for entry in entries:
        handles = ", ".join(
            f"`{uri}` (call {h.made_by})" if h.made_by else f"`{uri}`" for uri, h in entry.handles.items()
        )
        lines.append(
            f"| {entry.call} | `{entry.tool}` | {entry.elapsed_s:.2f} | {handles or '—'} | "
            f"{f'`{entry.result_uri}`' if entry.result_uri else '—'} |"
        )
    if notes:
        lines += ["", *[f"- {note}" for note in notes]]
    return "\n".join(lines) + "\n"


def _evidence(entry: Entry) -> str:
    handles = [f"`{uri}` (made by call {h.made_by})" if h.made_by else f"`{uri}`" for uri, h in entry.handles.items()]
    made = [f"`{uri}`" for uri in entry.made.values()]
    parts = [f"Evidence: call {entry.call}, `{entry.tool}`"]
    if handles:
        parts.append(f"on {', '.join(handles)}")
    if made:
        parts.append(f"which made {', '.join(made)}")
    return ", ".join(parts) + "."


def _scalars_first(keys: list[str]) -> list[str]:
    """Key-number paths with a result's own numbers (``random_baseline.p_value``) before the entries of its lists
    (``random_baseline.draws[4]``), each group in recorded order: what a reader cites comes first."""
    return [k for k in keys if "[" not in k] + [k for k in keys if "[" in k]


def _numbers(entry: Entry, keys: list[str], only: str | None = None) -> list[str]:
    """The numbers a claim cites: the keys named, else its verdicts' p-values, intervals and siblings (a verdict's own
    numbers before its per-draw lists), else the first top-level key numbers."""
    prefixes = [only] if only is not None else list(entry.verdicts)
    under = [k for k in entry.key_numbers if any(_under(k, p) for p in prefixes)]
    chosen = keys or _scalars_first(under)[:SHOWN_NUMBERS]
    if not chosen and only is None:
        chosen = [k for k in entry.key_numbers if "." not in k][:SHOWN_NUMBERS]
    shown = [f"`{key}` = {entry.key_numbers[key]:.6g}" for key in chosen]
    ranges = [k for k in entry.intervals if any(_under(k, p) for p in prefixes)] if not keys else []
    shown += [f"`{key}` = [{entry.intervals[key][0]:.6g}, {entry.intervals[key][1]:.6g}]" for key in ranges]
    return shown


def _under(key: str, path: str) -> bool:
    """Whether ``key`` is a field of the object at ``path`` itself (not of one nested deeper)."""
    if not path:
        return "." not in key and "[" not in key
    return key.startswith(path + ".") and "." not in key[len(path) + 1 :]
