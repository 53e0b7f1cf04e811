"""The investigation as a self-contained Python script: it loads the same model and checks the weights'
fingerprint, reruns each call through the public API in order (``rerun.Rerun``: handles recreated, every number and
text of each result recorded live — embedded verbatim — compared, numbers within ``ATOL + RTOL·|recorded|``, and each
call's arguments checked against the recorded ones), prints a table (``--json``: one JSON object of the recomputed
numbers) and exits 1 naming every call that does not match."""

from __future__ import annotations

import pprint
from datetime import UTC, datetime

from mcp_interp.investigation import ATOL, RTOL, rerun_calls
from mcp_interp.state.ledger import Entry


def script(entries: list[Entry], model: str, fingerprint: str, versions: dict[str, str], notes: list[str]) -> str:
    header = "\n".join(f"# {note}" for note in notes)
    return TEMPLATE.format(
        n=len(entries),
        model=model,
        fingerprint=fingerprint,
        exported=datetime.now(UTC).isoformat(timespec="seconds"),
        versions=pprint.pformat(versions, width=110, sort_dicts=True),
        notes=header + "\n" if header else "",
        atol=repr(ATOL),
        rtol=repr(RTOL),
        calls=pprint.pformat(rerun_calls(entries), width=110, sort_dicts=False),
    )


TEMPLATE = '''#!/usr/bin/env python3
"""Rerun of an mcp-interp investigation: {n} calls on model {model!r} (weights fingerprint {fingerprint}),
exported {exported}.

    python this_script.py            a table: each call, what it compared, and every mismatch
    python this_script.py --json     one JSON object: the recomputed numbers, by call
    python this_script.py --model M  load the model from M instead (a folder moved, or a compiled program that was
                                     served with its ground truth hidden, under a name that names no folder)

Each call is rerun through the public API (`mcp_interp.Session`) in the order it was made. A handle (direction://,
circuit://, …) made by an earlier call is recreated by rerunning that call, and its new URI replaces the old one in
later arguments. Every number and text of each result recorded live is compared with its recomputation (a number
matches when |recomputed - recorded| <= ATOL + RTOL * |recorded|, a text when equal), and each call's arguments
with the recorded ones (sha256), so an edited call is named. Sampled baselines are drawn again from their recorded
seeds, to the same tolerance. Exits 0 when every call matches, 1 naming each call that does not.
The comparison is `mcp_interp.app.rerun`.
"""
{notes}
import json
import sys

MODEL = {model!r}
FINGERPRINT = {fingerprint!r}
RECORDED_VERSIONS = {versions}
ATOL = {atol}
RTOL = {rtol}
CALLS = {calls}


def main(argv):
    as_json = "--json" in argv
    model = argv[argv.index("--model") + 1] if "--model" in argv[:-1] else MODEL
    say = (lambda text: print(text, file=sys.stderr)) if as_json else print
    from mcp_interp.app.rerun import HEADER, Rerun
    from mcp_interp.errors import FingerprintMismatch

    try:
        rerun = Rerun(model, FINGERPRINT, ATOL, RTOL)
    except FingerprintMismatch as exc:
        say(str(exc))
        return 1
    try:
        say(HEADER)
        for call in CALLS:
            for row in rerun.check(call):
                say(row.line())
    finally:
        rerun.close()
    if as_json:
        print(json.dumps(rerun.recomputed, sort_keys=True))
    for failure in rerun.failures:
        say(f"MISMATCH {{failure}}")
    say(rerun.verdict())
    return 1 if rerun.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''
