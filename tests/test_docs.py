"""The documentation holds together: the README is a front page (≤ 300 lines) over ≥ 4 pages in ``docs/``; every
relative link in ``README.md`` and ``docs/**/*.md`` resolves — the file, and the ``#anchor`` as GitHub slugs its
headings; every ``./run`` command and ``scripts/`` file the docs name exists; and ``docs/reference.md`` is what
``scripts/tool_reference.py`` writes from the live server now (regenerated in memory, compared).

Each check is a function over text or a folder, so the tests below also plant a violation of each and see it caught.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300
MIN_PAGES = 4

FENCE = re.compile(r"^\s{0,3}(```|~~~)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); the text may hold one level of brackets (an image inside a link).
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
RUN_COMMAND = re.compile(r"\./run\s+([a-z_]+)(?:\s+([a-z_]+))?")
SCRIPT_PATH = re.compile(r"\bscripts/([a-z0-9_.-]+\.(?:py|sh))\b")  # lower case: `scripts/bench_NAME.py` is a pattern


def markdown_pages(root: Path) -> list[Path]:
    """``README.md``, every Markdown page under ``docs/`` and the folder notes (``mcp_interp/**/AGENTS.md``), sorted."""
    pages = sorted((root / "docs").rglob("*.md")) if (root / "docs").is_dir() else []
    pages += sorted((root / "mcp_interp").rglob("AGENTS.md")) if (root / "mcp_interp").is_dir() else []
    readme = root / "README.md"
    return ([readme] if readme.is_file() else []) + pages


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks, with inline code spans blanked out."""
    lines: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)))
    return lines


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text (links to their text, code and emphasis markers
    dropped), lower-cased, every character but letters, digits, ``_``, ``-`` and spaces removed, spaces to ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "")
    text = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in "_- ")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page defines: its headings' slugs (a repeated slug gets -1, -2, … as on GitHub) and explicit
    ``<a name|id="…">`` anchors."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        heading = HEADING.match(line)
        if heading:
            slug = github_slug(heading.group(2))
            n = counts.get(slug, 0)
            counts[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
        found.update(HTML_ANCHOR.findall(line))
    return found


def link_targets(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline link, image and reference definition outside code."""
    targets: list[tuple[int, str]] = []
    for number, line in prose_lines(text):
        targets += [(number, m.group(1)) for m in LINK.finditer(line)]
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            targets.append((number, definition.group(1)))
    return targets


def is_external(target: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)) or target.startswith("//")


def broken_links(page: Path, root: Path) -> list[str]:
    """Each relative link of ``page`` that does not resolve, as ``page:line: target (why)``: a file or folder that
    does not exist, a link that leaves ``root``, or an ``#anchor`` that the target Markdown page does not define."""
    text = page.read_text(encoding="utf-8")
    problems: list[str] = []
    for number, target in link_targets(text):
        if is_external(target):
            continue
        path_part, _, anchor = target.partition("#")
        where = f"{page.relative_to(root)}:{number}: {target}"
        resolved = (page.parent / unquote(path_part)).resolve() if path_part else page.resolve()
        if root.resolve() not in (resolved, *resolved.parents):
            problems.append(f"{where} (outside the repository)")
            continue
        if not resolved.exists():
            problems.append(f"{where} (no such file)")
            continue
        if anchor:
            if resolved.is_dir() or resolved.suffix != ".md":
                problems.append(f"{where} (an anchor into something that is not a Markdown page)")
            elif unquote(anchor).lower() not in anchors(resolved.read_text(encoding="utf-8")):
                problems.append(f"{where} (no heading with this anchor)")
    return problems


def run_commands(run_script: Path) -> set[str]:
    """The commands the ``run`` script's ``case`` dispatches (its ``name)`` labels)."""
    return set(re.findall(r"^\s+([a-z_|]+)\)", run_script.read_text(encoding="utf-8"), flags=re.MULTILINE))


def unknown_commands(text: str, root: Path) -> list[str]:
    """Each ``./run X`` the text names that the run script lacks, and each ``./run bench NAME`` or ``scripts/FILE``
    with no such file under ``scripts/``."""
    commands = {name for label in run_commands(root / "run") for name in label.split("|")}
    problems = []
    for command, argument in RUN_COMMAND.findall(text):
        if command not in commands:
            problems.append(f"./run {command}")
        elif command == "bench" and argument and not (root / "scripts" / f"bench_{argument}.py").is_file():
            problems.append(f"./run bench {argument}")
    problems += [f"scripts/{name}" for name in SCRIPT_PATH.findall(text) if not (root / "scripts" / name).is_file()]
    return problems


def front_page_problems(readme: str) -> list[str]:
    """What keeps the README from being the front page: too long, or missing the two commands CI runs."""
    problems = []
    lines = len(readme.splitlines())
    if lines > README_MAX_LINES:
        problems.append(f"README.md has {lines} lines > {README_MAX_LINES}: move detail to docs/")
    problems += [f"README.md does not show `{c}`" for c in ("./run demo", "./run test") if c not in readme]
    return problems


@functools.cache
def tool_reference() -> ModuleType:
    """``scripts/tool_reference.py`` (``scripts/`` is not a package), loaded once."""
    spec = importlib.util.spec_from_file_location("tool_reference", ROOT / "scripts" / "tool_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tool_reference"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@functools.cache
def measure_docs() -> ModuleType:
    """``scripts/measure_docs.py``: the figures the pages state between ``measured`` markers, loaded once."""
    spec = importlib.util.spec_from_file_location("measure_docs", ROOT / "scripts" / "measure_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the checks on this repository ----------------------------------------------------------------------------------


def test_every_measured_figure_in_the_docs_is_what_was_measured() -> None:
    """Sizes and times the README and docs/ state come from docs/measured.json, rendered by the script that measured
    them; a figure edited by hand, or a measurement not written into the pages, is stale (./run measure)."""
    script = measure_docs()
    measured = json.loads((ROOT / "docs" / "measured.json").read_text(encoding="utf-8"))
    assert script.stale_markers(script.PAGES, measured) == []
    named = {m["name"] for page in script.PAGES for m in script.MARKER.finditer(page.read_text(encoding="utf-8"))}
    assert {"suite", "listing"} <= named
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"{measured['suite']['tests']} tests in" in readme and "931 tests" not in readme


def test_a_figure_edited_by_hand_is_caught(tmp_path: Path) -> None:
    script = measure_docs()
    measured = {"listing": {"tools": 35, "total_bytes": 119_691, "model_facing_bytes": 39_708},
                "suite": {"tests": 951, "seconds": 912.2, "measured": "2026-12-07"}}  # fmt: skip
    page = tmp_path / "page.md"
    page.write_text(f"<!-- measured:suite -->{script.render('suite', measured)}<!-- /measured:suite -->", "utf-8")
    assert script.stale_markers([page], measured) == [] and "951 tests in 15.2 min" in page.read_text()
    page.write_text("The suite: <!-- measured:suite -->931 tests, 26–51 min<!-- /measured:suite -->.", "utf-8")
    assert script.stale_markers([page], measured) == [f"{page}: suite"]
    script.rewrite([page], measured)
    assert script.stale_markers([page], measured) == [] and "951 tests in 15.2 min" in page.read_text()


def test_readme_is_a_front_page() -> None:
    assert front_page_problems((ROOT / "README.md").read_text(encoding="utf-8")) == []


def test_docs_have_at_least_four_pages() -> None:
    pages = [p for p in markdown_pages(ROOT) if p.name != "README.md" or p.parent != ROOT]
    assert len(pages) >= MIN_PAGES, [str(p) for p in pages]


def test_every_relative_link_resolves() -> None:
    problems = [problem for page in markdown_pages(ROOT) for problem in broken_links(page, ROOT)]
    assert problems == [], "\n".join(problems)


def test_every_command_and_script_named_exists() -> None:
    problems = {
        f"{page.relative_to(ROOT)}: {problem}"
        for page in markdown_pages(ROOT)
        for problem in unknown_commands(page.read_text(encoding="utf-8"), ROOT)
    }
    assert problems == set(), "\n".join(sorted(problems))


@pytest.fixture(scope="module")
def surface() -> Any:
    return tool_reference().read_surface()


def test_the_reference_is_up_to_date(surface: Any) -> None:
    generated = tool_reference().render(surface)
    committed = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    assert committed == generated, "docs/reference.md is out of date: run ./run reference"


def test_the_reference_documents_every_tool_listed(surface: Any) -> None:
    module = tool_reference()
    names = [tool["name"] for tool in surface.tools]
    assert sorted(module.read_tools(module.render(surface))) == sorted(names)
    assert len(names) == len(set(names)) >= 30


# --- each check can fail ---------------------------------------------------------------------------------------------


def test_github_slugs_match_known_anchors() -> None:
    """Slugs GitHub gives these headings (read off rendered pages: punctuation dropped, each space a hyphen, so a
    removed symbol between two spaces leaves two hyphens)."""
    assert github_slug("Install as a tool (uvx or pip)") == "install-as-a-tool-uvx-or-pip"
    assert github_slug("`model_info`") == "model_info"
    assert (
        github_slug("Scale: bigger models, several GPUs, other engines")
        == "scale-bigger-models-several-gpus-other-engines"
    )
    assert github_slug("GPT-J's heads") == "gpt-js-heads"
    assert github_slug("Layer × position") == "layer--position"
    assert github_slug("Transcoders: none shipped — measured") == "transcoders-none-shipped--measured"
    assert github_slug("**Bold** and [a link](x.md)") == "bold-and-a-link"
    assert github_slug("From a checkout: `./run`") == "from-a-checkout-run"
    text = '# Notes\n\n## Notes\n\n```\n# not a heading\n```\n<a id="custom"></a>\n'
    assert anchors(text) == {"notes", "notes-1", "custom"}


def test_planted_broken_links_are_caught(tmp_path: Path) -> None:
    (tmp_path / "docs" / "views").mkdir(parents=True)
    (tmp_path / "docs" / "views" / "a.png").write_bytes(b"png")
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## A section\n", encoding="utf-8")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Page\n\n"
        "[fine](other.md) [fine anchor](other.md#a-section) [self](#page) ![img](views/a.png) [dir](views/)\n"
        "[web](https://example.com/missing.md) [mail](mailto:a@b.c)\n"
        "`[in code](missing-in-code.md)`\n"
        "```\n[in a fence](missing-in-fence.md)\n```\n"
        "[gone](missing.md)\n"
        "[bad anchor](other.md#no-such-section)\n"
        "![gone image](views/b.png)\n"
        "[bad self anchor](#nowhere)\n"
        "[escape](../../outside.md)\n"
        "[anchor into an image](views/a.png#x)\n"
        "[ref]: ./also-missing.md\n",
        encoding="utf-8",
    )
    problems = broken_links(page, tmp_path)
    assert [p.split(": ", 1)[1].split(" (")[0] for p in problems] == [
        "missing.md",
        "other.md#no-such-section",
        "views/b.png",
        "#nowhere",
        "../../outside.md",
        "views/a.png#x",
        "./also-missing.md",
    ]
    assert problems[0].startswith("docs/page.md:9: ")


def test_planted_unknown_commands_are_caught(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "bench_spine.py").write_text("", encoding="utf-8")
    (tmp_path / "scripts" / "demo.py").write_text("", encoding="utf-8")
    (tmp_path / "run").write_text('case "$cmd" in\n  demo) x ;;\n  bench) y ;;\n  a|b) z ;;\nesac\n', encoding="utf-8")
    text = (
        "`./run demo`, `./run a`, `./run bench spine`, scripts/demo.py; ./run nonsense, ./run bench gone, scripts/x.py"
    )
    assert unknown_commands(text, tmp_path) == ["./run nonsense", "./run bench gone", "scripts/x.py"]


def test_a_long_readme_or_one_without_the_commands_is_caught() -> None:
    ok = "./run demo\n./run test\n" + "line\n" * (README_MAX_LINES - 2)
    assert front_page_problems(ok) == []
    assert len(front_page_problems(ok + "one more\n")) == 1
    assert front_page_problems("./run test\n") == ["README.md does not show `./run demo`"]


def test_too_few_pages_are_caught(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    for name in ("a", "b", "c"):
        (tmp_path / "docs" / f"{name}.md").write_text("# x\n", encoding="utf-8")
    (tmp_path / "README.md").write_text("# r\n", encoding="utf-8")
    pages = [p for p in markdown_pages(tmp_path) if p.parent != tmp_path]
    assert len(pages) == 3 < MIN_PAGES


def test_a_schema_change_makes_the_reference_stale(surface: Any) -> None:
    """The reference reflects the schemas: changing one parameter's description changes the page, so a committed
    page no longer equals it and the up-to-date test would fail."""
    module = tool_reference()
    tools = [dict(tool) for tool in surface.tools]
    first = next(t for t in tools if t["inputSchema"].get("properties"))
    name, schema = next(iter(first["inputSchema"]["properties"].items()))
    changed = {
        **first,
        "inputSchema": {
            **first["inputSchema"],
            "properties": {
                **first["inputSchema"]["properties"],
                name: {**schema, "description": "A planted description."},
            },
        },
    }
    tools[tools.index(first)] = changed
    planted = dataclasses.replace(surface, tools=tools)
    rendered = module.render(planted)
    assert "A planted description." in rendered
    assert rendered != (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
