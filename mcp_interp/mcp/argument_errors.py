"""Arguments that fail a tool's input schema, told as what to pass.

The SDK validates a ``tools/call``'s arguments with pydantic before the tool runs, and a failure would reach the
client as pydantic's report (its wording of the whole model, its errors.pydantic.dev links). ``Server`` catches it
where every call passes and ``argument_error`` says instead, per argument: the value given, what is accepted (a
Literal's values, a union's branches together, a bound, our own validator's message) and the argument's description.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import re
from typing import Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.types import CallToolResult, InputRequiredResult, TextContent
from pydantic import ValidationError

from mcp_interp.mcp.recording import recorded
from mcp_interp.mcp.sdk_internals import input_schema, parsed_arguments
from mcp_interp.mcp.toolkit import Toolkit

log = logging.getLogger(__name__)


class Server(MCPServer[Any]):
    """The SDK's server, with one change: a call whose arguments fail the input schema gets ``argument_error``'s
    words (field, value given, what is accepted) instead of pydantic's report and its errors.pydantic.dev links.
    ``call_tool`` is where every tools/call passes and the only place that still sees the ``ValidationError``; it is
    also where every call is recorded in its principal's ledger (``recording_toolkit``, the server's lifespan toolkit,
    set by ``build_server``; a call's own context names its principal). With ``json_text`` a result's structured
    content is also its last text block (see ``with_json_text``)."""

    recording_toolkit: Toolkit | None = None
    json_text: bool = False

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        if self.recording_toolkit is None:
            result = await self._call_tool(name, arguments, context)
        else:
            kit = Toolkit.of(context) if context is not None else self.recording_toolkit
            result = await recorded(kit, name, arguments, lambda: self._call_tool(name, arguments, context))
        return with_json_text(result) if self.json_text else result

    async def _call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None
    ) -> CallToolResult | InputRequiredResult:
        try:
            return await super().call_tool(name, arguments, context)
        except UnexpectedToolError as exc:
            # A crash the tool's own boundary did not catch (outside it, or the result failing its own schema): the
            # SDK would send only "Error executing tool X". Named here, with what failed; the traceback to stderr.
            crash: BaseException = exc.__cause__ or exc
            log.error("internal error in tool %s", name, exc_info=crash)
            raise ToolError(internal_error(name, crash)) from exc
        except ToolError as exc:
            cause = exc.__cause__
            if not isinstance(cause, ValidationError):
                raise
            given: Any = arguments
            with contextlib.suppress(Exception):  # what was validated: arguments sent as JSON text are parsed first
                given = parsed_arguments(self, name, arguments)
            raise ToolError(argument_error(name, cause, input_schema(self, name), given)) from cause


def with_json_text(result: CallToolResult | InputRequiredResult) -> CallToolResult | InputRequiredResult:
    """``result`` with its structured content serialized as a last text block: the MCP specification's
    backward-compatible form, for clients that give a model only the text content (Inspect's MCP tools; Claude Code
    gives only the structured content, so the default leaves the text a short summary)."""
    if not isinstance(result, CallToolResult) or result.is_error or result.structured_content is None:
        return result
    block = TextContent(type="text", text=json.dumps(result.structured_content, ensure_ascii=False))
    return result.model_copy(update={"content": [*result.content, block]})


def internal_error(tool: str, cause: BaseException) -> str:
    """What a client reads about a crash inside ``tool``: which tool, the exception's type and, for a result that
    broke its own output schema, where; never the exception's text (it may hold server paths)."""
    what = type(cause).__name__
    if isinstance(cause, ValidationError):
        places = sorted({".".join(str(part) for part in item["loc"]) for item in cause.errors(include_url=False)})
        what = f"its result broke its own output schema at {', '.join(places[:5]) or 'the root'}"
    return (
        f"Internal error in mcp-interp while running `{tool}` ({what}). This is a bug in mcp-interp, not in your "
        "arguments; the server's log (stderr) has the traceback. The server is still running and no stored result "
        "was lost."
    )


# pydantic error types → what is accepted, in words (a union's branches are listed together).
ACCEPTED = {
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "none_required": "null",
}


BOUNDS = {"greater_than_equal": ("ge", "≥"), "greater_than": ("gt", ">"), "less_than_equal": ("le", "≤")}
BOUNDS |= {"less_than": ("lt", "<"), "too_short": ("min_length", "at least"), "too_long": ("max_length", "at most")}


def argument_error(tool: str, error: ValidationError, parameters: dict[str, Any], arguments: Any) -> str:
    """Arguments that failed ``tool``'s input schema, in what to pass: per argument (or nested field) the value given
    there (read from ``arguments``, the values that were validated) and what is accepted — a Literal's values listed,
    a union's branches together (a branch that failed inside the value named with where: "a list of strings (item [1]
    is not a string)"), a bound or our own validator's message — and the argument's description. Never pydantic's
    wording of the whole report nor its URLs."""
    groups: dict[str, list[Any]] = {}
    lines = []
    for item in error.errors(include_url=False):
        if item["type"] == "extra_forbidden" and item["loc"] and not any(map(_is_tag, item["loc"])):
            lines.append(_unknown(tool, item["loc"], parameters))
            continue
        groups.setdefault(str(item["loc"][0]) if item["loc"] else "arguments", []).append(item)
    properties = parameters.get("properties", {})
    for argument, items in groups.items():
        walks = [_walk(arguments, item) for item in items]
        common = _common_length([item["loc"] for item in items])
        steps, values = walks[0]
        path = _path([part for part, step in zip(items[0]["loc"][:common], steps, strict=False) if step]) or argument
        described = str(properties.get(argument, {}).get("description") or "").rstrip(".")
        about = f" — {described}" if described else ""
        if all(item["type"] == "missing" for item in items):
            lines.append(f"`{path}` is required{about}.")
            continue
        value = values[common]
        if value is _UNKNOWN:  # not found in the arguments: an error's own input at that place, if one has it
            value = next((item["input"] for item in items if len(item["loc"]) == common), items[0].get("input"))
        accepted = _accepted_all(items, walks, common, value)
        literal_only = len(accepted) == 1 and items[0]["type"] in ("literal_error", "enum")
        what = ("one of " if literal_only else "") + _joined(accepted)
        lines.append(f"`{path}`: got {_shown(value)}; accepted: {what}{about}.")
    return f"Error executing tool {tool}: invalid arguments.\n" + "\n".join(f"- {line}" for line in lines)


def _unknown(tool: str, loc: tuple[Any, ...], parameters: dict[str, Any]) -> str:
    """An argument (or a field of one) the tool does not take, named with the nearest one it does take and all of
    them: nothing is accepted and ignored, and the fix is one rename away."""
    name, parents = str(loc[-1]), [part for part in loc[:-1] if not _is_tag(part)]
    accepted = _fields_at(parameters, parents)
    near = difflib.get_close_matches(name, accepted, n=1, cutoff=0.6)
    hint = f"; did you mean `{near[0]}`?" if near else "."
    if not parents:
        taken = f"Its arguments: {', '.join(accepted)}." if accepted else "It takes no arguments."
        return f"`{name}` is not an argument of `{tool}`{hint} {taken}"
    where = _path(parents)
    listed = f" Its fields: {', '.join(accepted)}." if accepted else ""
    return f"`{where}.{name}` is not a field of `{where}`{hint}{listed}"


def _is_tag(part: Any) -> bool:
    """Whether a location part is a union's branch tag (``Intervention``, ``list[...]``, ``function-after[...]``)
    rather than a field name or an index (field names here are lower-case identifiers)."""
    return isinstance(part, str) and not re.fullmatch(r"[a-z_][a-z0-9_]*", part)


def _fields_at(schema: dict[str, Any], path: list[Any]) -> list[str]:
    """The property names of the object ``path`` leads to in a published input schema (its ``$ref``s resolved, a
    union's object branches together); [] where the schema does not say."""
    defs = schema.get("$defs", {})
    nodes = [schema]
    for part in path:
        step = []
        for node in _branches(nodes, defs):
            if isinstance(part, int) and isinstance(node.get("items"), dict):
                step.append(node["items"])
            elif isinstance(part, str) and part in node.get("properties", {}):
                step.append(node["properties"][part])
        nodes = step
    names: dict[str, None] = {}
    for node in _branches(nodes, defs):
        names.update(dict.fromkeys(node.get("properties", {})))
    return list(names)


def _branches(nodes: list[Any], defs: dict[str, Any]) -> list[dict[str, Any]]:
    """Each node with its ``$ref`` resolved and its ``anyOf`` / ``oneOf`` branches spread out (a list's items kept)."""
    out: list[dict[str, Any]] = []
    for node in nodes:
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            out += _branches([defs.get(ref.removeprefix("#/$defs/"))], defs)
            continue
        out.append(node)
        for key in ("anyOf", "oneOf"):
            out += _branches(list(node.get(key) or []), defs)
    return out


_UNKNOWN = object()  # a place in the arguments that the arguments do not hold (a missing field)


def _walk(arguments: Any, item: Any) -> tuple[list[bool], list[Any]]:
    """Along one error's location through ``arguments``: whether each part is a step into the value (a field, an
    index) rather than a union's branch tag (which pydantic puts in the location, the value staying the same), and
    the value after each part (``values[0]`` is ``arguments`` itself; ``_UNKNOWN`` where the arguments hold none)."""
    loc, value = item["loc"], arguments
    steps: list[bool] = []
    values = [value]
    for n, part in enumerate(loc):
        step = True
        if isinstance(part, int):
            value = value[part] if isinstance(value, list) and -len(value) <= part < len(value) else _UNKNOWN
        elif isinstance(value, dict) and part in value:
            value = value[part]
        elif n == 0 or value is _UNKNOWN or (n == len(loc) - 1 and item["type"] == "missing"):
            value = _UNKNOWN
        else:
            step = False
        steps.append(step)
        values.append(value)
    return steps, values


def _accepted_all(items: list[Any], walks: list[tuple[list[bool], list[Any]]], common: int, value: Any) -> list[str]:
    """What one argument's errors say is accepted at their common location, in words, each once. An error located
    further in (an element, a field) describes its branch — named by the union tag that follows the common location,
    or else by the value's shape — with where it failed."""
    entries: dict[tuple[str, str | None], None] = {}  # ("word", words) or ("branch", tag), in the errors' order
    branches: dict[str | None, dict[tuple[Any, ...], list[Any]]] = {}
    for item, (steps, _) in zip(items, walks, strict=True):
        rest = list(zip(item["loc"][common:], steps[common:], strict=True))
        tag = str(rest[0][0]) if rest and not rest[0][1] else None
        where = tuple(part for part, step in rest[0 if tag is None else 1 :] if step)
        if where:
            entries.setdefault(("branch", tag), None)
            branches.setdefault(tag, {}).setdefault(where, []).append(item)
        else:
            entries.setdefault(("word", _accepted(item)), None)
    shape = "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else ""
    accepted = []
    for kind, key in entries:
        if kind == "word":
            accepted.append(str(key))
            continue
        head = shape if key is None else _branch(key)
        inside = _inside(branches[key])
        accepted.append(f"{head} ({inside})" if head else inside)
    return list(dict.fromkeys(accepted))


def _inside(places: dict[tuple[Any, ...], list[Any]]) -> str:
    """Where in a value errors were, and what each place accepts: "item [1] is not a string", "items [0], [1] are
    not integers", "field ablate is required"; places with the same fault told together."""
    faults: dict[tuple[str, str, str], list[tuple[Any, ...]]] = {}
    for where, items in places.items():
        told = [item for item in items if item["type"] != "missing"]
        if not told:
            fault = ("required", "", "")
        else:
            one = _joined(list(dict.fromkeys(_accepted(item) for item in told)))
            many = _joined(list(dict.fromkeys(_plural(_accepted(item)) for item in told)))
            fault = ("not" if all(_typed(item) for item in told) else "says", one, many)
        faults.setdefault(fault, []).append(where)
    told_faults = []
    for (mode, one, many), wheres in faults.items():
        several = len(wheres) > 1
        noun = ("item" if isinstance(wheres[0][0], int) else "field") + ("s" if several else "")
        label = f"{noun} " + ", ".join(_path(list(where)) for where in wheres[:5])
        label += f" and {len(wheres) - 5} more" if len(wheres) > 5 else ""
        if mode == "required":
            told_faults.append(f"{label} {'are' if several else 'is'} required")
        elif mode == "not":
            told_faults.append(f"{label} are not {many}" if several else f"{label} is not {one}")
        else:
            told_faults.append(f"{label}: {one}")
    return "; ".join(told_faults)


def _accepted(item: Any) -> str:
    """What one pydantic error (one branch of a union) accepts, in words."""
    kind, ctx = item["type"], item.get("ctx") or {}
    if kind == "extra_forbidden":  # an unknown key inside one branch of a union
        return "no such field"
    if kind in ("literal_error", "enum"):
        return str(ctx["expected"])
    if kind in ACCEPTED:
        return ACCEPTED[kind]
    if kind in BOUNDS and BOUNDS[kind][0] in ctx:
        key, word = BOUNDS[kind]
        return f"{word} {ctx[key]}" + (" items" if key.endswith("length") else "")
    return str(item["msg"]).removeprefix("Value error, ")  # our own validators say what to pass


def _typed(item: Any) -> bool:
    """Whether ``_accepted`` words a type, values or a bound (so "is not …" reads), not a validator's sentence."""
    kind, ctx = item["type"], item.get("ctx") or {}
    return kind in ACCEPTED or kind in ("literal_error", "enum") or (kind in BOUNDS and BOUNDS[kind][0] in ctx)


# pydantic's names of a union's branches (its location tags) → what the branch accepts, in words.
BRANCHES = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false", "none": "null"}
BRANCHES |= {"constrained-str": "a string", "constrained-int": "an integer", "constrained-float": "a number"}


def _branch(tag: str) -> str:
    """A union branch's tag (``str``, ``list[str]``, ``literal['all','last']``, ``list[union[str,AnyOf]]``, a model's
    class name, …) in words; a tag of another form is given as it is."""
    name, bracket, inner = tag.partition("[")
    args = _split(inner[:-1]) if bracket and inner.endswith("]") else []
    if not bracket and name in BRANCHES:
        return BRANCHES[name]
    if name in ("list", "set", "frozenset") and len(args) == 1:
        of = _branch(args[0])
        return "a list of " + (of if args[0].startswith("literal[") else _plural(of))
    if name in ("list", "set", "frozenset", "tuple"):
        return "a list"
    if name == "dict" or (not bracket and name[:1].isupper()):  # a mapping, a model or a dataclass
        return "an object"
    if name == "literal" and args:
        return _joined(args)
    if name == "union" and args:
        return _joined(list(dict.fromkeys(_branch(arg) for arg in args)))
    if name == "nullable" and len(args) == 1:
        return _branch(args[0]) + " or null"
    if name in ("function-after", "function-before", "function-wrap") and args:
        return _branch(args[-1])
    return tag


def _split(text: str) -> list[str]:
    """``text``'s comma-separated parts, commas inside brackets or quotes not counting."""
    parts, depth, quote, start = [], 0, "", 0
    for n, char in enumerate(text):
        if quote:
            quote = "" if char == quote and text[n - 1] != "\\" else quote
        elif char in "'\"":
            quote = char
        elif char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:n].strip())
            start = n + 1
    return [*parts, text[start:].strip()] if text.strip() else parts


def _plural(words: str) -> str:
    """``a string or an object`` → ``strings or objects``; values and bounds are unchanged."""
    return re.sub(r"\ban? ([a-z]+)\b", r"\1s", words) if re.match(r"an? [a-z]", words) else words


def _joined(words: list[str]) -> str:
    return ", ".join(words[:-1]) + (" or " if words[:-1] else "") + (words[-1] if words else "")


def _common_length(locs: list[tuple[Any, ...]]) -> int:
    """How many leading parts every error of one argument shares (a union's branch tags, where they differ, not)."""
    common = len(locs[0])
    for loc in locs[1:]:
        n = 0
        while n < min(common, len(loc)) and locs[0][n] == loc[n]:
            n += 1
        common = n
    return common


def _path(parts: list[Any]) -> str:
    return ".".join(f"[{part}]" if isinstance(part, int) else str(part) for part in parts).replace(".[", "[")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
