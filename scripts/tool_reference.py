"""Write ``docs/reference.md``: every tool, prompt and resource template the server lists, from its own ``tools/list``.

The reference is generated, not written, so it cannot drift from the schemas a client receives: the server is built
in-process on the ``tiny`` model (as ``tests/conftest.py`` builds it) and an in-process MCP client lists what it
serves. Per tool: its name, its description, its input parameters (type, default or "required", description) and the
top-level fields of its structured output. Tools are grouped by family (``mcp_interp.mcp.server.FAMILIES``) and linked
to the family's page under ``docs/tools/`` when there is one. The text depends only on the schemas and on which
family pages exist (no time, no path, no model number), so two runs write the same bytes; ``tests/test_docs.py``
regenerates it in memory and fails when the committed file differs.

Usage: ``./run reference`` (write it) or ``./run reference --check`` (exit 1 when it is out of date).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference.md"


@dataclass(frozen=True)
class Surface:
    """What the server lists: tool definitions (as JSON), its instructions, prompts and resource templates."""

    tools: list[dict[str, Any]]
    instructions: str
    prompts: list[dict[str, Any]]
    templates: list[dict[str, Any]]
    families: dict[str, str]  # tool name → family name


async def _listed(list_page: Any, field: str) -> list[dict[str, Any]]:
    """Every item of a paginated list request, page after page."""
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = await list_page(cursor=cursor)
        items += [item.model_dump(mode="json", by_alias=True, exclude_none=True) for item in getattr(page, field)]
        cursor = page.next_cursor
        if cursor is None:
            return items


async def _read_surface() -> Surface:
    from mcp import Client

    from mcp_interp.host import ModelHost
    from mcp_interp.mcp.server import FAMILIES, build_server

    families = {tool.__name__: family.name for family in FAMILIES for tool in family.tools}
    with tempfile.TemporaryDirectory() as out:
        host = ModelHost("tiny", Path(out))
        async with Client(build_server(host)) as client:
            surface = Surface(
                tools=await _listed(client.list_tools, "tools"),
                instructions=client.instructions or "",
                prompts=await _listed(client.list_prompts, "prompts"),
                templates=await _listed(client.list_resource_templates, "resource_templates"),
                families=families,
            )
        # The server starts loading its model at once; let that finish here rather than leave a thread importing
        # transformers behind (a test process that imports it next raced that thread and failed to import it).
        host.wait_loaded(300)
        return surface


def read_surface() -> Surface:
    """Build the server on ``tiny`` in this process and list everything it serves."""
    import anyio

    return anyio.run(_read_surface)


# --- rendering ----------------------------------------------------------------------------------------------------


def one_line(text: str) -> str:
    """A description as one table cell: whitespace runs collapsed, pipes escaped."""
    return re.sub(r"\s+", " ", text).strip().replace("|", "\\|")


def type_of(schema: dict[str, Any]) -> str:
    """A JSON schema as a short type: ``string``, ``integer (1–256)``, ``array of string``, ``one of `a`, `b```,
    ``Score`` (a named definition), alternatives joined with "or"."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "enum" in schema:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    for union in ("anyOf", "oneOf"):
        if union in schema:
            return " or ".join(dict.fromkeys(type_of(option) for option in schema[union]))
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind else []
    words = []
    for k in kinds:
        if k == "array" and isinstance(schema.get("items"), dict) and schema["items"]:
            inner = type_of(schema["items"])
            words.append(f"array of ({inner})" if " or " in inner else f"array of {inner}")
        else:
            words.append(str(k))
    text = " or ".join(words) if words else "any"
    low, high = schema.get("minimum", schema.get("exclusiveMinimum")), schema.get("maximum")
    if low is not None or high is not None:
        text += f" ({'' if low is None else low}–{'' if high is None else high})"
    return text


def default_of(name: str, schema: dict[str, Any], required: set[str]) -> str:
    if name in required:
        return "required"
    if "default" in schema:
        return f"`{json.dumps(schema['default'], ensure_ascii=False)}`"
    return "—"


def family_page(family: str) -> str | None:
    """The page that explains a family's tools: ``docs/tools/<family>.md``, else the conventions page (the tools that
    follow handles: figures, jobs), when it exists."""
    for page in (f"tools/{family}.md", "conventions.md"):
        if (DOCS / page).is_file():
            return page
    return None


def family_link(family: str) -> str:
    page = family_page(family)
    return f"[{family}]({page})" if page else family


def render_tool(tool: dict[str, Any]) -> list[str]:
    lines = [f"### `{tool['name']}`", "", one_line(tool.get("description", "")).replace("\\|", "|"), ""]
    facts = []
    meta = tool.get("_meta") or {}
    view = (meta.get("ui") or {}).get("resourceUri")
    if view:
        facts.append(f"view `{view}`")
    inputs = tool.get("inputSchema") or {}
    properties: dict[str, Any] = inputs.get("properties") or {}
    if "background" in properties:
        facts.append("takes `background: true` (a `job://` at once)")
    annotations = tool.get("annotations") or {}
    if annotations.get("readOnlyHint") is False:
        facts.append("writes to the server's cache or store")
    if facts:
        lines += ["*" + "; ".join(facts) + ".*", ""]
    required = set(inputs.get("required") or [])
    if properties:
        lines += ["| parameter | type | default | description |", "| --- | --- | --- | --- |"]
        for name, schema in properties.items():
            lines.append(
                f"| `{name}` | {one_line(type_of(schema))} | {one_line(default_of(name, schema, required))} "
                f"| {one_line(schema.get('description', ''))} |"
            )
    else:
        lines.append("No parameters.")
    lines.append("")
    output = tool.get("outputSchema") or {}
    fields: dict[str, Any] = output.get("properties") or {}
    if fields:
        must = set(output.get("required") or [])
        lines += ["Output (top-level fields; `?`: may be absent):", "", "| field | type | description |"]
        lines.append("| --- | --- | --- |")
        for name, schema in fields.items():
            mark = "" if name in must else "?"
            described = one_line(schema.get("description", ""))
            lines.append(f"| `{name}`{mark} | {one_line(type_of(schema))} | {described} |")
        lines.append("")
    return lines


def render(surface: Surface) -> str:
    """The reference page's text (Markdown, ending in one newline)."""
    order: dict[str, list[dict[str, Any]]] = {}
    for tool in surface.tools:
        order.setdefault(surface.families.get(tool["name"], "other"), []).append(tool)
    lines = [
        "# Tool reference",
        "",
        "<!-- Generated by scripts/tool_reference.py (`./run reference`) from the server's tools/list. Do not edit:",
        "     tests/test_docs.py fails when this file differs from what the script writes. -->",
        "",
        f"Every tool the server lists ({len(surface.tools)}), its prompts and resource templates, as a client receives "
        "them over MCP (the server built on `tiny`; the definitions do not depend on the model). Descriptions are the "
        "model-facing ones, kept short on purpose; the family pages linked below explain the methods and their "
        "measured behaviour. Types: `A or B` is a union, `(1–256)` a range, a capitalised name a nested object "
        "(its fields are in the complete output schema, `tools/list`).",
        "",
        "| family | tools |",
        "| --- | --- |",
    ]
    for family, tools in order.items():
        names = ", ".join(f"[`{t['name']}`](#{t['name'].lower()})" for t in tools)  # the headings' anchors
        lines.append(f"| {family_link(family)} | {names} |")
    lines += [
        "",
        "## Conventions (the server's instructions)",
        "",
        "Sent to every client at `initialize`:",
        "",
        "```text",
        surface.instructions.rstrip("\n"),
        "```",
        "",
    ]
    for family, tools in order.items():
        lines += [f"## {family}", ""]
        page = family_page(family)
        if page:
            lines += [f"How these work and what was measured: [{page}]({page}).", ""]
        for tool in tools:
            lines += render_tool(tool)
    lines += ["## Prompts", "", "| prompt | arguments | description |", "| --- | --- | --- |"]
    for prompt in surface.prompts:
        arguments = ", ".join(
            f"`{a['name']}`" + ("" if a.get("required") else "?") for a in prompt.get("arguments") or []
        )
        lines.append(f"| `{prompt['name']}` | {arguments or '—'} | {one_line(prompt.get('description', ''))} |")
    lines += ["", "## Resource templates", "", "| URI template | name | description |", "| --- | --- | --- |"]
    for template in sorted(surface.templates, key=lambda t: t["uriTemplate"]):
        lines.append(
            f"| `{template['uriTemplate']}` | {one_line(template.get('name', ''))} "
            f"| {one_line(template.get('description', ''))} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="Exit 1 when docs/reference.md is out of date.")
    args = parser.parse_args(argv)
    text = render(read_surface())
    if args.check:
        current = REFERENCE.read_text(encoding="utf-8") if REFERENCE.is_file() else ""
        if current != text:
            print(f"{REFERENCE.relative_to(ROOT)} is out of date: run ./run reference", file=sys.stderr)
            return 1
        print(f"{REFERENCE.relative_to(ROOT)} is up to date", file=sys.stderr)
        return 0
    REFERENCE.write_text(text, encoding="utf-8")
    size = len(text.encode())
    print(f"wrote {REFERENCE.relative_to(ROOT)} ({size} B, {len(read_tools(text))} tools)", file=sys.stderr)
    return 0


def read_tools(text: str) -> list[str]:
    """The tool names a reference page documents (its ``### `name` `` headings)."""
    return re.findall(r"^### `([^`]+)`$", text, flags=re.MULTILINE)


if __name__ == "__main__":
    sys.exit(main())
