"""Results sized for a context window: what a tool returns, and where the rest is.

An assistant reads a tool's structured content into a finite context (Claude Code warns above 10k tokens and
truncates above 25k), so every result is cut to fit while nothing is lost:

1. the fields a result stores only (``Measurement.STORED``: the patched-metric grids of ``patch`` and
   ``patch_heads``, which their scores and ranked cells summarise) are null, and its grids (``Measurement.ROUNDED``:
   the layer × position or layer × head score maps) are returned whole, rounded to 3 decimals — a 30-layer map of
   20 positions is about 4 KB;
   Rows a result declares ``Measurement.SIGNIFICANT`` (a probe's per-layer rows) keep every number to 4 significant
   digits (a p-value of 0.0099 stays 0.0099);
2. ranked lists a result declares (``Measurement.RANKED``: heads, edges, cells — ordered best first) keep their
   top ``top`` items (20 unless the call says otherwise);
3. if the structured content (with the note and ``result_uri`` a cut adds) is still over ``BUDGET`` bytes, the
   bulky fields a result declares (``Measurement.BULKY``: grids a figure already shows, per-token arrays) become
   null;
4. if it is *still* over, the longest remaining list of rows anywhere in it is shortened until it fits: to the most
   rows that fit, chosen by the result's own rule (``Measurement.rows_by_importance``: a probe keeps its best and
   its significant layers) and kept in their order, or, without a rule, halved to its first rows.

Whenever anything was cut, the complete result is stored as ``result://{id}`` (JSON, one ``resources/read``
away), the returned one names it in ``result_uri``, and a note says what was cut and where the rest is. The text
block beside it is always a short summary, never a JSON dump (``summary_text``).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

BUDGET = 16_000  # bytes of structured content, as JSON
SUMMARY_LIMIT = 2_000  # characters of the text block
DEFAULT_TOP = 20
SAMPLE_URI = "result://" + "0" * 32  # as long as a stored result's URI


def size(data: Any) -> int:
    return len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())


def compact(result: BaseModel, top: int = DEFAULT_TOP) -> tuple[dict[str, Any], list[str]]:
    """The result as JSON cut to fit (see the module docstring), and what was cut, in words."""
    data = result.model_dump(mode="json")
    cut: list[str] = []
    for name in getattr(type(result), "STORED", ()):
        if data.get(name) is not None:
            data[name] = None
            cut.append(f"`{name}` (null here: the full grid is in the complete result and the figure)")
    for name in getattr(type(result), "ROUNDED", ()):
        if data.get(name) is not None:
            rounded = _rounded(data[name])
            if rounded != data[name]:
                cut.append(f"`{name}` to 3 decimals")
            data[name] = rounded
    for name in getattr(type(result), "SIGNIFICANT", ()):
        if data.get(name) is not None:
            condensed = _significant(data[name])
            if condensed != data[name]:
                cut.append(f"`{name}`'s numbers to 4 significant digits")
            data[name] = condensed
    for name in getattr(type(result), "RANKED", ()):
        rows = data.get(name)
        if isinstance(rows, list) and len(rows) > top:
            data[name] = rows[:top]
            cut.append(f"`{name}`: the top {top} of {len(rows)}")
    if not _fits(data, cut):
        for name in getattr(type(result), "BULKY", ()):
            if data.get(name) is not None:
                data[name] = None
                cut.append(f"`{name}` (null here)")
                if _fits(data, cut):
                    break
    first_rows: dict[str, tuple[int, int]] = {}  # path → (its rows at first, the index of its entry in `cut`)
    while not _fits(data, cut):
        found = _longest_rows(data, "")
        if found is None:
            break
        path, rows = found
        rule = getattr(type(result), "rows_by_importance", None)
        chosen = rule(data, path) if rule is not None and data.get(path) is rows else None
        if chosen is None:
            # One entry per list, saying how many of how many are kept (cut again, it is rewritten, not repeated)
            total, at = first_rows.setdefault(path, (len(rows), len(cut)))
            if at == len(cut):
                cut.append("")
            _most_rows_that_fit(data, rows, cut, at, path, total)
            continue
        order, words = chosen
        cut.append(_fit_rows(data, path, order, words, cut))
    return data, cut


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _significant(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, list):
        return [_significant(v) for v in value]
    if isinstance(value, dict):
        return {k: _significant(v) for k, v in value.items()}
    return value


def _fits(data: dict[str, Any], cut: list[str]) -> bool:
    """Whether ``data`` is within ``BUDGET`` with what ``Toolkit.finish`` adds when anything was cut: its
    ``result_uri`` and the note saying what was cut."""
    if not cut:
        return size(data) <= BUDGET
    return (
        size({**data, "result_uri": SAMPLE_URI, "notes": [*data.get("notes", []), cut_note(cut, SAMPLE_URI)]}) <= BUDGET
    )


def _kept(path: str, keep: int, total: int) -> str:
    return f"`{path}`: the first {keep} of {total}, the rest in the complete result"


def _most_rows_that_fit(data: dict[str, Any], rows: list[Any], cut: list[str], at: int, path: str, total: int) -> int:
    """Cut ``rows`` (a list inside ``data``) to the most leading rows that fit, at least one (bisection), and say so
    in ``cut[at]``; the number kept."""
    full = list(rows)
    low, high = 1, max(1, len(full) - 1)
    while low < high:
        middle = (low + high + 1) // 2
        rows[:] = full[:middle]
        cut[at] = _kept(path, middle, total)
        if _fits(data, cut):
            low = middle
        else:
            high = middle - 1
    rows[:] = full[:low]
    cut[at] = _kept(path, low, total)
    return low


def _fit_rows(data: dict[str, Any], name: str, order: list[int], words: str, cut: list[str]) -> str:
    """Shorten ``data[name]`` to the most rows that fit (at least one), taken from ``order`` (most important first)
    and kept in their original order; what was cut, in words (naming the rows kept by their ``layer``)."""
    rows = list(data[name])
    said = ""
    for keep in range(len(rows) - 1, 0, -1):
        kept = sorted(order[:keep])
        data[name] = [rows[i] for i in kept]
        names = ", ".join(str(rows[i].get("layer", i)) if isinstance(rows[i], dict) else str(i) for i in kept)
        said = f"`{name}`: {keep} of {len(rows)} rows ({names}), {words}"
        if _fits(data, [*cut, said]):
            break
    return said


def _longest_rows(node: Any, path: str) -> tuple[str, list[Any]] | None:
    """The list of two or more objects (or lists) with the most JSON bytes in ``node``, and its path."""
    best: tuple[int, str, list[Any]] | None = None

    def visit(value: Any, where: str) -> None:
        nonlocal best
        if isinstance(value, dict):
            for key, sub in value.items():
                if key not in ("model", "notes"):
                    visit(sub, f"{where}.{key}" if where else key)
        elif isinstance(value, list):
            if len(value) > 1 and all(isinstance(v, dict | list) for v in value):
                weight = size(value)
                if best is None or weight > best[0]:
                    best = (weight, where, value)
            for index, sub in enumerate(value[:1]):
                visit(sub, f"{where}[{index}]")

    visit(node, path)
    return None if best is None else (best[1], best[2])


def cut_note(cut: list[str], uri: str) -> str:
    return f"Cut to fit a context window ({'; '.join(cut)}); the complete result is {uri} (resources/read)."


def summary_text(summary: str) -> str:
    """The text block: the tool's one-paragraph summary, never longer than ``SUMMARY_LIMIT`` characters."""
    if len(summary) <= SUMMARY_LIMIT:
        return summary
    return summary[: SUMMARY_LIMIT - 40].rstrip() + " … (see the structured result)"
