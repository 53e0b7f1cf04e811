"""What an exported investigation runs: each recorded call again through the public API (``mcp_interp.Session``), in
order, its handles recreated, every number and text of its recorded result compared with its recomputation, and its
arguments checked to be the recorded ones.

The script and the notebook ``export_investigation`` writes both import this, so what "matches" means is written
once: a number |recomputed − recorded| ≤ atol + rtol·|recorded|, a text or flag (the method, the component, a verdict)
equal, the arguments' sha256 the recorded one (a call edited in the script is named, not silently rerun). A handle
(direction://, circuit://, …) an earlier call made is recreated by that call's rerun, and its new URI replaces the
recorded one in later arguments.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Any

from mcp_interp.app.api import Session
from mcp_interp.errors import FingerprintMismatch
from mcp_interp.investigation import arguments_digest
from mcp_interp.state.ledger import Entry


def substitute(value: Any, renamed: dict[str, str]) -> Any:
    """``value`` with every recorded URI replaced by the one its rerun made."""
    if isinstance(value, str):
        return renamed.get(value, value)
    if isinstance(value, list):
        return [substitute(item, renamed) for item in value]
    if isinstance(value, dict):
        return {key: substitute(item, renamed) for key, item in value.items()}
    return value


def matches(recorded: float, recomputed: float | None, atol: float, rtol: float) -> bool:
    return recomputed is not None and abs(recomputed - recorded) <= atol + rtol * abs(recorded)


@dataclass(frozen=True)
class Row:
    """One key number of one call: recorded live, recomputed (None: missing, or the rerun failed: ``error``)."""

    call: int
    tool: str
    key: str
    recorded: float | None
    recomputed: float | None
    ok: bool
    error: str | None = None
    checked: str | None = None  # a call's summary row: what was compared

    def line(self) -> str:
        if self.error is not None:
            return f"{self.call:>5}  {self.tool:<24} ERROR {self.error}"
        if self.checked is not None:
            return f"{self.call:>5}  {self.tool:<24} {self.checked:<71}  {'yes' if self.ok else 'NO'}"
        if self.recorded is None:
            return f"{self.call:>5}  {self.tool:<24} {self.key[:70]:<71}  NO"
        shown = "missing" if self.recomputed is None else f"{self.recomputed:.8g}"
        return (
            f"{self.call:>5}  {self.tool:<24} {self.key[:40]:<40} {self.recorded:>14.8g} {shown:>14}  "
            f"{'yes' if self.ok else 'NO'}"
        )


HEADER = f"{'call':>5}  {'tool':<24} {'key number':<40} {'recorded':>14} {'recomputed':>14}  ok"


class Rerun:
    """A fresh session on ``model`` (figures and results in a temporary folder), checked to hold the recorded weights;
    ``check(call)`` reruns one recorded call and compares its key numbers."""

    def __init__(self, model: str, fingerprint: str, atol: float, rtol: float) -> None:
        self.atol, self.rtol = atol, rtol
        self._folder = tempfile.TemporaryDirectory(prefix="mcp-interp-rerun-")
        self.session = Session(model, output_dir=self._folder.name)
        if self.session.fingerprint != fingerprint:
            raise FingerprintMismatch(
                f"MISMATCH model: weights fingerprint {self.session.fingerprint}, recorded {fingerprint}"
            )
        self.renamed: dict[str, str] = {}
        self.failures: list[str] = []
        self.recomputed: dict[str, dict[str, float]] = {}
        self.calls = 0
        self.last: Entry | None = None  # the last rerun call's ledger entry

    def check(self, call: dict[str, Any]) -> list[Row]:
        """Rerun one recorded call (``{call, tool, arguments, arguments_sha256, key_numbers, key_texts, made}``) and
        compare everything it recorded: a summary row, then a row per mismatch."""
        self.calls += 1
        number, tool = call["call"], call["tool"]
        name = f"call {number} ({tool})"
        failures_before = len(self.failures)
        recorded_digest = call.get("arguments_sha256")
        if recorded_digest is not None and arguments_digest(call["arguments"]) != recorded_digest:
            self.failures.append(f"{name}: its arguments are not the recorded ones (they were edited after export)")
        try:
            self.session.call(tool, **substitute(call["arguments"], self.renamed))
        except Exception as exc:
            self.failures.append(f"{name}: the rerun failed: {exc}")
            self.last = None
            return [Row(number, tool, "", None, None, False, error=str(exc))]
        entry = self.last = self.session.ledger.entries[-1]
        self.recomputed[str(number)] = entry.key_numbers
        for path, old in call["made"].items():
            new = entry.made.get(path)
            if new is None:
                self.failures.append(f"{name}: made {old} at {path}; the rerun made nothing there")
            else:
                self.renamed[old] = new
        rows = []
        for key, recorded in call["key_numbers"].items():
            value = entry.key_numbers.get(key)
            if not matches(recorded, value, self.atol, self.rtol):
                self.failures.append(f"{name}: {key} recorded {recorded!r}, recomputed {value!r}")
                rows.append(Row(number, tool, key, recorded, value, False))
        for key, text in call.get("key_texts", {}).items():
            again = entry.key_texts.get(key)
            if again != text:
                self.failures.append(f"{name}: {key} recorded {text!r}, recomputed {again!r}")
                rows.append(Row(number, tool, f"{key}: {text!r} -> {again!r}", None, None, False))
        texts = len(call.get("key_texts", {}))
        checked = f"{len(call['key_numbers'])} numbers, {texts} texts" + (", arguments" if recorded_digest else "")
        ok = len(self.failures) == failures_before
        return [Row(number, tool, "", None, None, ok, checked=checked), *rows]

    def figures(self) -> list[bytes]:
        """The PNG figures the last rerun call made (its ``figure://`` URIs), for the notebook to show."""
        if self.last is None:
            return []
        return [self.session.read(uri) for uri in self.last.made.values() if uri.startswith("figure://")]

    def verdict(self) -> str:
        what = f"{len(self.failures)} mismatches." if self.failures else "every number, text and argument matches."
        return f"{self.calls} calls rerun: {what}"

    def close(self) -> None:
        self.session.close()
        self._folder.cleanup()
