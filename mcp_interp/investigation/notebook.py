"""The investigation as a Jupyter notebook: one Markdown cell per call with what the assistant saw live (its
summary, verdicts and notes, recorded in the ledger), one code cell rerunning it through the public API and comparing
every number, text and argument (``rerun.Rerun``) and showing its figures, and a last cell that fails, naming each call
that does not match — so ``jupyter execute`` (nbclient) fails exactly where the script exits 1.

Built with ``nbformat`` (the notebook format's own library), not written as JSON by hand.
"""

from __future__ import annotations

import json
import pprint
from datetime import UTC, datetime
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from mcp_interp.investigation import ATOL, RTOL, rerun_calls
from mcp_interp.state.ledger import Entry

MAX_ARGUMENTS = 1500  # characters of a call's arguments shown in its Markdown cell (the code cell has them all)

SETUP = """from IPython.display import Image, display

from mcp_interp.app.rerun import HEADER, Rerun

MODEL = {model!r}
FINGERPRINT = {fingerprint!r}
ATOL, RTOL = {atol!r}, {rtol!r}
rerun = Rerun(MODEL, FINGERPRINT, ATOL, RTOL)  # FingerprintMismatch when these are not the recorded weights


def check(call):
    \"\"\"Rerun one recorded call, print what it compared and every mismatch, show its figures.\"\"\"
    print(HEADER)
    for row in rerun.check(call):
        print(row.line())
    for png in rerun.figures():
        display(Image(png))"""

FINISH = """rerun.close()
print(rerun.verdict())
for failure in rerun.failures:
    print("MISMATCH", failure)
assert not rerun.failures, "MISMATCH " + "; ".join(rerun.failures)"""


def notebook(entries: list[Entry], model: str, fingerprint: str, versions: dict[str, str], notes: list[str]) -> str:
    exported = datetime.now(UTC).isoformat(timespec="seconds")
    header = [
        "# Rerun of an mcp-interp investigation",
        f"{len(entries)} calls on model `{model}` (weights fingerprint `{fingerprint}`), exported {exported}; "
        f"recorded with {', '.join(f'{k} {v}' for k, v in sorted(versions.items()))}.",
        "Run every cell (`jupyter execute this.ipynb`): each call is rerun through `mcp_interp.Session` in the order "
        "it was made, a handle an earlier call made is recreated by that call's rerun, and every number recorded "
        f"live is compared with its recomputation (|recomputed − recorded| ≤ {ATOL:g} + {RTOL:g}·|recorded|). The "
        "last cell fails, naming each call that does not match.",
        *[f"- {note}" for note in notes],
    ]
    cells = [
        new_markdown_cell("\n\n".join(header)),
        new_code_cell(SETUP.format(model=model, fingerprint=fingerprint, atol=ATOL, rtol=RTOL)),
    ]
    for entry, call in zip(entries, rerun_calls(entries), strict=True):
        cells.append(new_markdown_cell(findings(entry, call["arguments"])))
        cells.append(new_code_cell(f"CALL_{entry.call} = {pprint.pformat(call, width=110, sort_dicts=False)}\n"
                                   f"check(CALL_{entry.call})"))  # fmt: skip
    cells.append(new_code_cell(FINISH))
    book = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    nbformat.validate(book)
    return str(nbformat.writes(book))


def findings(entry: Entry, arguments: dict[str, Any]) -> str:
    """A call's Markdown cell: its tool and arguments, and the summary, verdicts and notes it returned live."""
    shown = json.dumps(arguments, ensure_ascii=False)
    if len(shown) > MAX_ARGUMENTS:
        shown = shown[:MAX_ARGUMENTS] + " …"
    parts = [f"## Call {entry.call}: `{entry.tool}`", f"Arguments: `{shown}`"]
    if entry.summary:
        parts.append(f"Live summary: {entry.summary}")
    if entry.verdicts:
        parts.append("Verdicts:\n" + "\n".join(f"- `{path}`: {text}" for path, text in entry.verdicts.items()))
    if entry.notes:
        parts.append("Notes:\n" + "\n".join(f"- {note}" for note in entry.notes))
    if entry.result_uri:
        parts.append(f"Complete live result: `{entry.result_uri}`.")
    return "\n\n".join(parts)
