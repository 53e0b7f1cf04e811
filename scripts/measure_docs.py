"""The sizes and times the README and docs/ state, measured here and written into them (``./run measure``).

A figure a page states by hand goes stale (the README said "931 tests, 26–51 min" two rounds after the suite ran in
18 min; docs/performance.md kept a budget of 135 000 B after it was cut back to 120 000). So each such figure sits
between markers, ``<!-- measured:NAME -->…<!-- /measured:NAME -->``, and this script writes it from one measurement
kept in ``docs/measured.json``:

* ``listing``: the whole ``tools/list`` and its model-facing part (everything but output schemas), compact JSON bytes,
  read in-process from a server on ``tiny`` (the listing does not depend on the model);
* ``suite``: the test count and wall time of the last full run, read from its JUnit report (``./run test`` writes
  ``.suite-report.xml``); pass ``--suite-report FILE``.

    python scripts/measure_docs.py                      measure the listing, keep the suite's figures, render the pages
    python scripts/measure_docs.py --suite-report X     also record the suite from a JUnit report
    python scripts/measure_docs.py --check              exit 1 naming every marker whose text is not what it measured

``tests/test_docs.py`` fails on a stale marker and ``tests/server/test_surface.py`` when the listing differs from what
``docs/measured.json`` holds.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ROOT / "docs" / "measured.json"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"<!-- measured:(?P<name>[a-z_]+) -->(?P<text>.*?)<!-- /measured:(?P=name) -->", re.DOTALL)


def compact(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def listing_sizes(tools: list[dict[str, Any]]) -> dict[str, int]:
    """The whole listing and its model-facing part (all but output schemas), compact JSON bytes, as test_surface."""
    facing = sum(compact({k: v for k, v in t.items() if k != "outputSchema"}) for t in tools)
    return {"tools": len(tools), "total_bytes": compact(tools), "model_facing_bytes": facing}


def measure_listing() -> dict[str, int]:
    import anyio
    from mcp import Client

    from mcp_interp.host import ModelHost
    from mcp_interp.mcp.server import build_server

    async def listed() -> list[dict[str, Any]]:
        host = ModelHost("tiny", Path("/tmp/mcp-interp-measure"))
        async with Client(build_server(host)) as client:
            tools = (await client.list_tools()).tools
        return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]

    return listing_sizes(anyio.run(listed))


def suite_figures(report: Path) -> dict[str, Any]:
    """Count and wall time of a full pytest run from its JUnit XML (pytest's ``time`` is the session's wall time)."""
    root = ET.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root[0]
    count = int(suite.get("tests", 0))
    return {
        "tests": count,
        "skipped": int(suite.get("skipped", 0)),
        "failures": int(suite.get("failures", 0)) + int(suite.get("errors", 0)),
        "seconds": round(float(suite.get("time", 0.0)), 1),
        "measured": (suite.get("timestamp") or datetime.now(UTC).isoformat())[:10],
    }


def number(value: int) -> str:
    """Thousands apart by a space, as the docs write them (119 416)."""
    return f"{value:,}".replace(",", " ")


def render(name: str, measured: dict[str, Any]) -> str:
    """The text of the marker ``name`` from the measurements."""
    listing, suite = measured["listing"], measured.get("suite")
    if name == "listing":
        return (
            f"{number(listing['total_bytes'])} B of compact JSON for {listing['tools']} tools, "
            f"{number(listing['model_facing_bytes'])} B of it model-facing"
        )
    if name == "model_facing_kb":
        return f"{listing['model_facing_bytes'] / 1000:.1f} KB"
    if name == "suite":
        if suite is None:
            return "not measured yet (run `./run test`, then `./run measure`)"
        return (
            f"{suite['tests']} tests in {suite['seconds'] / 60:.1f} min on a 2-core machine "
            f"(3 workers; measured {suite['measured']})"
        )
    raise KeyError(f"no measurement renders the marker {name!r}")


def stale_markers(pages: list[Path], measured: dict[str, Any]) -> list[str]:
    """Every marker whose text differs from its rendering, as ``page: name``."""
    stale = []
    for page in pages:
        for match in MARKER.finditer(page.read_text(encoding="utf-8")):
            if match["text"] != render(match["name"], measured):
                shown = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
                stale.append(f"{shown}: {match['name']}")
    return stale


def rewrite(pages: list[Path], measured: dict[str, Any]) -> list[Path]:
    changed = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        new = MARKER.sub(
            lambda m: f"<!-- measured:{m['name']} -->{render(m['name'], measured)}<!-- /measured:{m['name']} -->", text
        )
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite-report", type=Path, help="A full run's JUnit XML (./run test writes it).")
    parser.add_argument("--check", action="store_true", help="Only check the pages against docs/measured.json.")
    args = parser.parse_args(argv)
    measured = json.loads(MEASURED.read_text(encoding="utf-8")) if MEASURED.is_file() else {}
    if args.check:
        stale = stale_markers(PAGES, measured)
        print("\n".join(stale) or "every measured figure is current", file=sys.stderr)
        return 1 if stale else 0
    measured["listing"] = measure_listing()
    if args.suite_report is not None:
        measured["suite"] = suite_figures(args.suite_report)
    MEASURED.write_text(json.dumps(measured, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for page in rewrite(PAGES, measured):
        print(f"rewrote {page.relative_to(ROOT)}", file=sys.stderr)
    print(json.dumps(measured, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
