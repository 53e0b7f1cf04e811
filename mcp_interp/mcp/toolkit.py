"""What every tool family's adapter uses: the model, its thread, progress, figures, results, errors.

One ``Toolkit`` lives as long as the server (it is the lifespan context, so a tool reaches it
with ``Toolkit.of(ctx)``). Each method is a step every tool would otherwise write again:

* ``model`` — wait for the model while it loads, telling the client how long so far;
* ``call`` / ``run`` / ``run_job`` — core work on the model thread under the model lock (``run``
  adds provenance; ``run_job`` drives a long job step by step with MCP progress, so a cancelled
  request stops at the next step boundary);
* ``figure`` / ``store`` — render on the figure thread, store, and link as a resource;
* ``finish`` — summary text plus structured content (clients such as Claude Code read only the
  structured part, so the summary repeats nothing the JSON lacks).

It is also the one error boundary: ``InterpError`` (core's caller-facing errors) becomes a tool
error with its text verbatim; any other exception is a bug in mcp-interp and becomes a tool error
with a short message while its traceback goes to the server log (stderr). Arguments that fail the
input schema (the SDK's pydantic validation, before a tool runs) are translated by ``Server`` into
what to pass: each field, the value given and what is accepted (``argument_error``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError, UnexpectedToolError
from mcp.types import CallToolResult, InputRequiredResult, ResourceLink, TextContent, ToolAnnotations
from pydantic import BaseModel, Field, ValidationError, create_model

from mcp_interp.core.engine.jobs import Job
from mcp_interp.core.features.directions import resolve_direction_refs
from mcp_interp.errors import InputError, InterpError, NumericalError
from mcp_interp.mcp.queue import JobQueue, current_job
from mcp_interp.mcp.results import DEFAULT_TOP, compact, cut_note, summary_text
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.common import Measurement, Provenance
from mcp_interp.session import Session
from mcp_interp.store import MIME_TYPES, URI_PATTERN, NotFound

log = logging.getLogger(__name__)

R = TypeVar("R", bound=BaseModel)
T = TypeVar("T")
J = TypeVar("J", bound="Job[Any]")
F = TypeVar("F", bound=Callable[..., Any])

READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False, destructive_hint=False)
WRITES_CACHE = ToolAnnotations(
    read_only_hint=False, idempotent_hint=True, open_world_hint=False, destructive_hint=False
)


@contextmanager
def error_boundary() -> Iterator[None]:
    """Core's caller-facing errors → tool errors verbatim; anything else → a short tool error, traceback logged."""
    try:
        yield
    except (ToolError, ResourceError):
        raise
    except InterpError as exc:
        raise ToolError(str(exc)) from exc
    except Exception as exc:
        log.exception("internal error in mcp-interp")
        raise ToolError(
            f"Internal error in mcp-interp ({type(exc).__name__}); the server's log (stderr) has the traceback. "
            "The server is still running and no stored result was lost."
        ) from exc


class Server(MCPServer[Any]):
    """The SDK's server, with one change: a call whose arguments fail the input schema gets ``argument_error``'s
    words (field, value given, what is accepted) instead of pydantic's report and its errors.pydantic.dev links.
    ``call_tool`` is where every tools/call passes and the only place that still sees the ``ValidationError``."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(exc, UnexpectedToolError) or not isinstance(cause, ValidationError):
                raise
            tool = self._tool_manager.get_tool(name)
            given = arguments
            if tool is not None:  # what was validated: the SDK first parses arguments sent as JSON text
                with contextlib.suppress(Exception):
                    given = tool.fn_metadata.pre_parse_json(arguments)
            raise ToolError(argument_error(name, cause, tool.parameters if tool else {}, given)) from cause


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
    for item in error.errors(include_url=False):
        groups.setdefault(str(item["loc"][0]) if item["loc"] else "arguments", []).append(item)
    lines = []
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


class Toolkit:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.jobs = JobQueue(session.store)

    @staticmethod
    def of(ctx: ToolContext) -> Toolkit:
        """The server's toolkit, from any tool's or resource's context (the server's typed lifespan context)."""
        return ctx.request_context.lifespan_context

    # --- the model and its thread ---------------------------------------------------------------

    async def model(self, ctx: ToolContext) -> LoadedModel:
        """The loaded model; while it loads, report progress about once a second instead of failing."""

        async def report_wait(seconds: float) -> None:
            message = f"waiting for model {self.session.model_name} to finish loading ({seconds:.0f} s so far)"
            await self.report(ctx, 0, None, message)

        with error_boundary():
            return await self.session.model(on_wait=report_wait)

    async def call(self, fn: Callable[..., T], *args: Any, locked: bool = True) -> T:
        """``fn(*args)`` on the model thread under the model lock (``locked=False``: a worker thread, for work
        that runs no forward pass, so it never waits behind a long scan)."""
        runner = self.session.run if locked else self.session.run_unlocked
        with error_boundary():
            return await runner(fn, *args)

    async def report(self, ctx: ToolContext, done: float, total: float | None, message: str | None) -> None:
        """Progress: to the request as notifications/progress, or — inside a background job — to the job's record."""
        record = current_job.get()
        if record is not None:
            self.jobs.report(record, done, total, message)
        else:
            await ctx.report_progress(done, total, message)

    async def measure(
        self, ctx: ToolContext, result_type: type[R], fn: Callable[..., Measurement], *args: Any, locked: bool = True
    ) -> R:
        """``fn(model, *args)`` → a measurement, with provenance.

        Interventions naming a stored direction (``direction://…``) get its vector here, on the model thread,
        so every tool that takes an ``intervention`` accepts one."""
        model = await self.model(ctx)
        started = time.perf_counter()

        def measure(model: LoadedModel, *args: Any) -> Measurement:
            return fn(model, *(resolve_direction_refs(arg, self.direction_lookup, model) for arg in args))

        measurement = await self.call(measure, model, *args, locked=locked)
        return self.with_provenance(result_type, measurement, started)

    async def run(
        self,
        ctx: ToolContext,
        result_type: type[R],
        fn: Callable[..., Measurement],
        *args: Any,
        summary: Callable[[R], str],
        locked: bool = True,
        top: int = DEFAULT_TOP,
    ) -> CallToolResult:
        """The common tool body: ``measure``, then ``finish`` with the tool's one-line ``summary`` of the result."""
        result = await self.measure(ctx, result_type, fn, *args, locked=locked)
        return self.finish(result, summary(result), [], top=top)

    def direction_lookup(self, direction_id: str) -> bytes:
        """A stored direction's JSON by id (``NotFound``, a ``LookupError``, for an unknown one)."""
        return self.session.store.get("direction", direction_id)

    async def run_job(self, ctx: ToolContext, job: Job[Any]) -> None:
        """Drive a long job one step per model-thread hop, reporting MCP progress after each step.

        A cancelled request stops at the next step boundary; the job is closed on the model thread.
        """
        with error_boundary():
            total = job.total_steps()

            async def progress(done: int, message: str) -> None:
                await self.report(ctx, done, total, message)

            await self.session.run_steps(job.steps(), progress)

    async def measured_job(self, ctx: ToolContext, make_job: Callable[[LoadedModel], J]) -> tuple[J, float]:
        """The common body of a long tool: the job built on the loaded model, run with progress and cancellation;
        returns the finished job and when it started (for ``with_provenance``)."""
        model = await self.model(ctx)
        started = time.perf_counter()
        with error_boundary():
            job = make_job(model)
        await self.run_job(ctx, job)
        return job, started

    def with_provenance(self, result_type: type[R], measurement: Measurement, started: float) -> R:
        """The measurement plus which weights produced it, a fresh run id and the wall time since ``started``."""
        provenance = Provenance(
            model=self.session.model_ref(), run_id=uuid.uuid4().hex, elapsed_s=round(time.perf_counter() - started, 6)
        )
        return result_type(**dict(measurement), **dict(provenance))

    # --- stored outputs -------------------------------------------------------------------------

    async def figure(self, title: str, render: Callable[..., bytes], *args: Any) -> tuple[str, ResourceLink]:
        """Render a PNG on the figure thread, store it, and return its ``figure://`` URI and a link."""
        with error_boundary():
            png = await self.session.render(render, *args)
        return self.store("figure", png, title)

    def store(self, kind: str, data: bytes, name: str, references: list[str] | None = None) -> tuple[str, ResourceLink]:
        """Store ``data`` as a new entry of ``kind`` (figure, report, artifact, …) that keeps the stored entries it
        ``references`` alive; its URI and a resource link."""
        stored = self.session.store.put(kind, data, references or ())
        link = ResourceLink(type="resource_link", uri=stored.uri, name=name, mime_type=MIME_TYPES[kind], size=len(data))
        return stored.uri, link

    def read(self, kind: str, entry_id: str) -> bytes:
        """A stored entry's bytes for a resource read; an unknown, evicted or malformed id is a resource error."""
        try:
            return self.session.store.get(kind, entry_id)
        except NotFound as exc:
            raise ResourceNotFoundError(str(exc)) from exc

    def read_entry(self, kind: str, entry_id: str) -> bytes:
        """A stored entry's bytes for a tool (a handle passed back in); unknown or evicted ids are input errors."""
        try:
            return self.session.store.get(kind, entry_id)
        except NotFound as exc:
            raise InputError(str(exc)) from None

    def finish(
        self, result: BaseModel, summary: str, links: list[ResourceLink], top: int = DEFAULT_TOP
    ) -> CallToolResult:
        """A result sized for a context window (``results.compact``: when anything is cut, the complete result is
        stored as ``result://`` and named), with a short summary and resource links as content. A result holding a
        non-finite number would violate its own schema: that is a tool error naming where, never a result."""
        with error_boundary():
            require_finite_result(result.model_dump(mode="python"), "")
        data, cut = compact(result, top)
        if cut:
            full = result.model_copy(update={"notes": [*getattr(result, "notes", [])]})
            uri, link = self.store("result", full.model_dump_json().encode(), "complete result",
                                   [u for u in iter_uris(data) if u != data.get("result_uri")])  # fmt: skip
            data["result_uri"] = uri
            data.setdefault("notes", []).append(cut_note(cut, uri))
            links = [*links, link]
        return CallToolResult(
            content=[TextContent(type="text", text=summary_text(summary)), *links], structured_content=data
        )


def require_finite_result(value: Any, path: str) -> None:
    """Raise ``NumericalError`` at the first NaN or infinity in a result (a JSON number cannot be either, and null
    would break the result's own schema)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise NumericalError(
            f"The measurement produced a non-finite number ({value}) at `{path or 'result'}`: the inputs are "
            "degenerate for it (e.g. identical clean and corrupt prompts, a zero gap, or a constant label). Change the "
            "inputs; the message of the measurement's own check, where it has one, says which."
        )
    if isinstance(value, dict):
        for key, sub in value.items():
            require_finite_result(sub, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list | tuple):
        for index, sub in enumerate(value):
            require_finite_result(sub, f"{path}[{index}]")


def iter_uris(value: Any) -> list[str]:
    """Every stored-entry URI a result names (its figures, directions, artifacts), so its stored copy keeps them."""
    if isinstance(value, str):
        return [value] if URI_PATTERN.fullmatch(value) else []
    if isinstance(value, dict):
        return [uri for sub in value.values() for uri in iter_uris(sub)]
    if isinstance(value, list):
        return [uri for sub in value for uri in iter_uris(sub)]
    return []


ToolContext = Context[Toolkit, Any]
"""What a tool or resource function here receives: the SDK context, typed with its lifespan (the Toolkit)."""


def tool_arguments(values: dict[str, Any]) -> dict[str, Any]:
    """A tool's own arguments from its ``locals()`` at its first line (all but the context and the result-shaping
    ``top`` and ``background``): the tools whose parameters are their job's fields pass them on as
    ``Job(model=model, **arguments)``."""
    return {name: value for name, value in values.items() if name not in ("ctx", "top", "background")}


def view_uri(view: str) -> str:
    """The URI of an MCP Apps view shipped in ``mcp_interp/data/views/``."""
    return f"ui://mcp-interp/{view}"


class Family:
    """One tool family's tools and resources, declared where they are written and registered by ``server.py``.

    Tools stay plain decorated functions at module level (their signatures are the input schemas, their return
    annotations the output schemas); ``register`` hands them to the server, so adding a tool touches only its
    family's module.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.tools: list[Callable[..., Any]] = []
        self._registrations: list[Callable[[MCPServer[Any]], object]] = []

    def tool(
        self, annotations: ToolAnnotations = READ_ONLY, view: str | None = None, background: bool = False
    ) -> Callable[[F], F]:
        """Declare a tool; ``view`` names the MCP Apps view (``ui://mcp-interp/<view>``) hosts may render its
        result in (``_meta.ui.resourceUri``, and the older flat key ``ui/resourceUri`` for hosts that read it).
        ``background``: the tool takes ``background: true`` to run as a job (``queue``) and return its handle at
        once; its published output schema then admits that handle (``background_output``)."""
        meta = None if view is None else {"ui": {"resourceUri": view_uri(view)}, "ui/resourceUri": view_uri(view)}

        def declare(fn: F) -> F:
            self.tools.append(fn)
            target = announcing(in_background(fn) if background else fn)

            def add(server: MCPServer[Any]) -> None:
                server.add_tool(target, annotations=annotations, meta=meta)
                if background:
                    admit_job_handles(server, fn.__name__)
                compact_tool_schemas(server, fn.__name__)

            self._registrations.append(add)
            return fn

        return declare

    def resource(self, uri: str, **options: Any) -> Callable[[F], F]:
        def declare(fn: F) -> F:
            self._registrations.append(lambda server: server.resource(uri, **options)(fn))
            return fn

        return declare

    def prompt(self, **options: Any) -> Callable[[F], F]:
        def declare(fn: F) -> F:
            self._registrations.append(lambda server: server.prompt(**options)(fn))
            return fn

        return declare

    def register(self, server: MCPServer[Any]) -> None:
        for add in self._registrations:
            add(server)


def compact_schema(schema: Any, shared: frozenset[str] = frozenset(), output: bool = False) -> Any:
    """A JSON schema, equivalent for validation, in fewer bytes: without pydantic's ``title`` keywords (they restate
    the property names); ``anyOf`` of plain types as one ``type`` list (``{"type": ["number", "null"]}``); in an
    output schema without ``default`` (a result states every value) and, inside the definitions named in ``shared``,
    without descriptions (shared output types are described once, in the server's instructions and the README).
    Property *names* are kept whatever they are called, "title" included."""
    if isinstance(schema, list):
        return [compact_schema(item, shared, output) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if (key == "title" and not isinstance(value, dict)) or (output and key == "default"):
            continue
        if key == "properties":
            out[key] = {name: compact_schema(sub, shared, output) for name, sub in value.items()}
        elif key == "$defs":
            out[key] = {
                name: compact_schema(_undescribed(sub) if name in shared else sub, shared, output)
                for name, sub in value.items()
            }
        else:
            out[key] = compact_schema(value, shared, output)
    branches = out.get("anyOf")
    if isinstance(branches, list) and branches and all(isinstance(b, dict) and set(b) == {"type"} for b in branches):
        types: list[Any] = []
        for branch in branches:
            types += branch["type"] if isinstance(branch["type"], list) else [branch["type"]]
        out.pop("anyOf")
        out["type"] = types
    return out


def optional_by_absence(schema: dict[str, Any]) -> dict[str, Any]:
    """An input schema whose optional arguments (``default: null``) are optional by being absent: the ``null``
    branch and the default go (an argument left out is None; the server still accepts an explicit null)."""
    properties = {}
    for name, sub in schema.get("properties", {}).items():
        if isinstance(sub, dict) and "default" in sub and sub["default"] is None and "anyOf" in sub:
            branches = [b for b in sub["anyOf"] if b != {"type": "null"}]
            sub = {k: v for k, v in sub.items() if k not in ("anyOf", "default")}
            sub = {**branches[0], **sub} if len(branches) == 1 else {"anyOf": branches, **sub}
        properties[name] = sub
    return {**schema, "properties": properties}


def _undescribed(schema: Any) -> Any:
    """``schema`` without its ``description`` keywords (property names are kept, whatever they are called)."""
    if isinstance(schema, list):
        return [_undescribed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        key: {name: _undescribed(sub) for name, sub in value.items()}
        if key in ("properties", "$defs")
        else _undescribed(value)
        for key, value in schema.items()
        if key != "description"
    }


SHARED_OUTPUT_TYPES = frozenset({"Score", "FigureInfo", "DirectionProjection", "SearchStep"})
# Fields every result has, described once in the server's instructions, not in each tool's output schema.
COMMON_RESULT_FIELDS = frozenset({"notes", "result_uri", "run_id", "elapsed_s", "figure_uri"})
# Every result carries the ModelRef of the weights that produced it; its shape is published once, in model_info's
# schema (and in the README), and elsewhere as an object.
MODEL_REF = {"type": "object", "description": "Which weights produced this (name, source, fingerprint, dtype, "
             "device, versions), as in model_info."}  # fmt: skip


def compact_tool_schemas(server: MCPServer[Any], name: str) -> None:
    """Publish ``name``'s input and output schemas compacted (``compact_schema``). The SDK keeps both on its tool
    record and reads them live; there is no public setter, hence the one reach into ``_tool_manager`` —
    ``tests/server/test_surface.py`` fails if it stops taking effect."""
    tool = server._tool_manager.get_tool(name)
    assert tool is not None, name
    tool.parameters = compact_schema(optional_by_absence(tool.parameters))
    if tool.fn_metadata.output_schema is not None:
        schema = compact_schema(tool.fn_metadata.output_schema, SHARED_OUTPUT_TYPES, output=True)
        if name != "model_info" and "ModelRef" in schema.get("$defs", {}):
            schema["$defs"]["ModelRef"] = MODEL_REF
        for field_name in COMMON_RESULT_FIELDS & set(schema.get("properties", {})):
            schema["properties"][field_name].pop("description", None)
        # A result's own fields keep their descriptions; the nested types (rows, cells, nodes) are published by shape
        # only: they were half of tools/list, and their meanings are in mcp_interp/schemas and the README.
        defs = schema.get("$defs", {})
        for def_name in defs:
            if not (name == "model_info" and def_name == "ModelRef"):
                defs[def_name] = _undescribed(defs[def_name])
        tool.fn_metadata.output_schema = schema
        tool.__dict__.pop("output_schema", None)  # the record caches the schema it first read


def announcing(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``fn`` that, when its call stored something (a figure, a result, …), tells the client the resources list
    changed — on 2025-era connections as ``notifications/resources/list_changed``, on 2026-07-28 ones on the
    subscription bus; each is a no-op where it does not apply, and a client that cannot take it costs nothing."""

    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> Any:
        ctx = kwargs.get("ctx")
        store = Toolkit.of(ctx).session.store if ctx is not None else None
        before = store.version if store is not None else 0
        result = await fn(*args, **kwargs)
        if ctx is not None and store is not None and store.version != before:
            for notify in (ctx.session.send_resource_list_changed, ctx.notify_resources_changed):
                with contextlib.suppress(Exception):
                    await notify()
        return result

    return run


def in_background(fn: Callable[..., Awaitable[CallToolResult]]) -> Callable[..., Awaitable[CallToolResult]]:
    """``fn`` that, called with ``background=True``, queues its own foreground run as a job and returns the job's
    status at once (the same arguments, the same code path, the result kept for ``job_status``)."""

    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> CallToolResult:
        if not kwargs.get("background"):
            return await fn(*args, **kwargs)
        kit = Toolkit.of(kwargs["ctx"])
        status = kit.jobs.start(fn.__name__, lambda: fn(*args, **{**kwargs, "background": False}))
        estimate = f" The last run of {fn.__name__} here took {status.estimate_s:.0f} s." if status.estimate_s else ""
        text = f"{fn.__name__} queued as {status.job_uri} (position {status.queue_position}).{estimate}"
        data = {"job": status.model_dump(mode="json"), "notes": [f"Follow it with job_status('{status.job_uri}')."]}
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)

    return run


def admit_job_handles(server: MCPServer[Any], name: str) -> None:
    """Let the tool's result be a job handle too: a background call returns only ``job`` and ``notes``, a foreground
    one the full result. The published schema is the result's own with nothing required at its root and a ``job``
    object; results are validated against the result's model with every field optional (the fields' own types are
    unchanged, so a foreground result is still checked field by field)."""
    tool = server._tool_manager.get_tool(name)
    assert tool is not None and tool.fn_metadata.output_model is not None, name
    model = tool.fn_metadata.output_model
    schema = dict(tool.fn_metadata.output_schema or {})
    schema.pop("required", None)
    schema["properties"] = {**schema.get("properties", {}), "job": {"type": "object", "description": JOB_DESCRIPTION}}
    fields: dict[str, Any] = {
        field_name: (info.annotation | None, Field(default=None)) for field_name, info in model.model_fields.items()
    }
    fields["job"] = (dict[str, Any] | None, Field(default=None))
    tool.fn_metadata.output_model = create_model(f"{model.__name__}OrJob", **fields)
    tool.fn_metadata.output_schema = schema
    tool.__dict__.pop("output_schema", None)


JOB_DESCRIPTION = "Only with background: true — the job's status (job_status); the result's fields are then absent."
