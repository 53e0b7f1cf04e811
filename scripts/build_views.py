"""Build the MCP Apps views (``ui://mcp-interp/<view>``) from ``web/src`` into ``mcp_interp/data/views/``.

Each view is one self-contained HTML file: its JavaScript bundled and minified by esbuild (pinned in
``web/package.json`` / ``package-lock.json``, installed with ``npm ci``) and its CSS inlined, so a host
renders it with no network access. The output is committed; ``--check`` rebuilds in memory and fails
when a committed file differs from its sources (CI runs it through the tests). ``--host OUT`` also
bundles the browser tests' host page script (the official ``AppBridge``) to ``OUT``.

Usage: ``python scripts/build_views.py [--check] [--host OUT.js]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "web"
OUT = ROOT / "mcp_interp" / "data" / "views"
VIEWS = {
    "heads-heatmap": "Heads heatmap",
    "layer-position": "Layer × position map",
    "attention": "Attention pattern",
    "logit-lens": "Logit lens",
    "circuit-graph": "Circuit graph",
    "attribution-graph": "Attribution graph",
}
MAX_BYTES = 300_000

TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>mcp-interp: {title}</title>
<style>{css}</style>
</head>
<body>
<div id="app"><p class="status">Waiting for the tool result…</p></div>
<div id="tip" role="tooltip" hidden></div>
<script>{js}</script>
</body>
</html>
"""


def ensure_node_modules() -> None:
    """``npm ci`` when the pinned packages are not installed (or the lock file is newer)."""
    marker = WEB / "node_modules" / ".package-lock.json"
    if not marker.is_file() or marker.stat().st_mtime < (WEB / "package-lock.json").stat().st_mtime:
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--silent"], cwd=WEB, check=True)


def esbuild(entry: Path, *options: str) -> str:
    binary = WEB / "node_modules" / "esbuild" / "bin" / "esbuild"
    command = [str(binary), str(entry), "--bundle", "--minify", "--target=es2020", "--legal-comments=none", *options]
    return subprocess.run(command, cwd=WEB, check=True, capture_output=True, text=True).stdout


def build_view(name: str) -> str:
    js = esbuild(WEB / "src" / f"{name}.js", "--format=iife")
    css = esbuild(WEB / "src" / "common.css")
    if "</script" in js.lower():
        raise SystemExit(f"{name}: the bundle contains '</script', which would end the inline script early")
    return TEMPLATE.format(title=VIEWS[name], css=css.strip(), js=js.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a committed view differs from its sources")
    parser.add_argument("--host", type=Path, help="also bundle the test host script (AppBridge) to this file")
    args = parser.parse_args()
    ensure_node_modules()
    stale = []
    for name in VIEWS:
        html = build_view(name)
        size = len(html.encode("utf-8"))
        if size > MAX_BYTES:
            raise SystemExit(f"{name}: {size} bytes, over the {MAX_BYTES}-byte budget of a view")
        target = OUT / f"{name}.html"
        if args.check:
            if not target.is_file() or target.read_text(encoding="utf-8") != html:
                stale.append(name)
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            target.write_text(html, encoding="utf-8")
            print(f"{target.relative_to(ROOT)}: {size} bytes")
    if args.host is not None:
        args.host.write_text(esbuild(WEB / "src" / "test-host.js", "--format=iife"), encoding="utf-8")
    if stale:
        print(f"out of date: {', '.join(stale)} — run python scripts/build_views.py and commit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
