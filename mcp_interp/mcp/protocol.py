"""What the server says at the protocol level beyond tools: the right error codes, completions, the stored entries as
a live ``resources/list``, and ``listChanged`` when that list changes.

* **Error codes.** An unknown resource id is "resource not found" — ``-32002`` on 2025-era connections (what the
  clients in use today speak); the 2026-07-28 revision retired that code for ``-32602``, which those connections get
  — never ``-32603`` (internal error). A ``prompts/get`` for an unknown prompt or with missing or unknown arguments
  is ``-32602`` (invalid params) with what was wrong in ``data``; the SDK answers code 0.
* **Completions** (``completion/complete``): stored ids for every resource template (newest first), and prompt
  arguments: the shipped corpora and tasks, and component names of the loaded model ("L1" → "L1H0", "L1MLP", …).
* **resources/list** lists what the caller's principal stored (newest first, the last ``LISTED`` of each kind), so a
  client sees the figures, reports, results and jobs it made and never another principal's (``mcp.workspace``); every
  tool call that stored something announces it with ``notifications/resources/list_changed`` (and on 2026-07-28
  connections, on the subscription bus). Completions of stored ids are the principal's too.

The SDK has no public hooks for these: each replaces one request handler of the low-level server
(``add_request_handler``, the documented way to serve a method) around the SDK's own handler — reaches that live in
``sdk_internals``.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from mcp.server import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    CompleteRequestParams,
    CompleteResult,
    Completion,
    CompletionArgument,
    CompletionContext,
    GetPromptRequestParams,
    ListResourcesResult,
    PaginatedRequestParams,
    PromptReference,
    ReadResourceRequestParams,
    Resource,
    ResourceTemplateReference,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_interp.corpora import corpora_dir
from mcp_interp.mcp.sdk_internals import advertise_list_changed, sdk_get_prompt, sdk_read_resource, serve_method
from mcp_interp.mcp.toolkit import Toolkit
from mcp_interp.state.store import KINDS, MIME_TYPES

log = logging.getLogger(__name__)

RESOURCE_NOT_FOUND = -32002  # 2025-era MCP; retired by 2026-07-28 (SEP-2164) in favour of -32602
COMPLETION_LIMIT = 100  # the spec's cap on completion values
LISTED = 50  # stored entries of each kind in resources/list


def install(server: MCPServer[Toolkit], toolkit: Toolkit) -> None:
    advertise_list_changed(server)

    async def read_resource(ctx: Any, params: ReadResourceRequestParams) -> Any:
        try:
            return await sdk_read_resource(server, ctx, params)
        except MCPError as exc:  # the SDK raises -32602 exactly for a resource that is not found
            if exc.code == INVALID_PARAMS and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                raise MCPError(code=RESOURCE_NOT_FOUND, message=exc.message, data=exc.data) from exc
            raise

    async def get_prompt(ctx: Any, params: GetPromptRequestParams) -> Any:
        prompts = {p.name: p for p in await server.list_prompts()}
        prompt = prompts.get(params.name)
        if prompt is None:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"Unknown prompt {params.name!r}; the prompts are {sorted(prompts)}.",
                data={"name": params.name},
            )
        given, declared = set(params.arguments or {}), {a.name for a in prompt.arguments or []}
        missing = sorted(a.name for a in prompt.arguments or [] if a.required and a.name not in given)
        unknown = sorted(given - declared)
        if missing or unknown:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"Prompt {params.name!r} takes {sorted(declared)}: missing {missing}, unknown {unknown}.",
                data={"missing": missing, "unknown": unknown},
            )
        try:
            return await sdk_get_prompt(server, ctx, params)
        except ValueError as exc:  # the SDK wraps every render failure in ValueError
            raise MCPError(code=INTERNAL_ERROR, message=str(exc)) from exc

    async def list_resources(ctx: Any, params: PaginatedRequestParams | None) -> ListResourcesResult:
        static = await server.list_resources()
        return ListResourcesResult(resources=[*static, *stored_resources(Toolkit.for_request(ctx))])

    serve_method(server, "resources/read", ReadResourceRequestParams, read_resource)
    serve_method(server, "prompts/get", GetPromptRequestParams, get_prompt)
    serve_method(server, "resources/list", PaginatedRequestParams, list_resources)

    @server.completion()  # advertises the capability; served below with the request's principal
    async def complete(
        ref: PromptReference | ResourceTemplateReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion | None:
        return completion_of(completions(toolkit, ref, argument.name, argument.value))

    async def complete_for(ctx: Any, params: CompleteRequestParams) -> CompleteResult:
        kit = Toolkit.for_request(ctx)
        return CompleteResult(completion=completion_of(completions(kit, params.ref, params.argument.name,
                                                                   params.argument.value)))  # fmt: skip

    serve_method(server, "completion/complete", CompleteRequestParams, complete_for)


def completion_of(values: list[str]) -> Completion:
    return Completion(values=values[:COMPLETION_LIMIT], total=len(values), has_more=len(values) > COMPLETION_LIMIT)


def stored_resources(toolkit: Toolkit) -> list[Resource]:
    """The newest ``LISTED`` stored entries of each kind in the toolkit's principal's store, as concrete resources."""
    store = toolkit.workspace.store
    out = []
    for kind in KINDS:
        for entry_id in reversed(store.ids(kind)[-LISTED:]):
            out.append(Resource(uri=f"{kind}://{entry_id}", name=f"{kind} {entry_id[:8]}", mime_type=MIME_TYPES[kind]))
    return out


PROMPT_CHOICES: dict[tuple[str, str], list[str]] = {
    ("find-circuit", "task"): ["ioi"],
    ("probe-property", "property"): ["subject_number"],
}


def completions(toolkit: Toolkit, ref: PromptReference | ResourceTemplateReference, name: str, value: str) -> list[str]:
    """Completions of one argument: stored ids for a resource template, choices and component names for prompts."""
    if isinstance(ref, ResourceTemplateReference):
        kind = ref.uri.partition("://")[0]
        if kind not in KINDS:
            return []
        return [i for i in reversed(toolkit.workspace.store.ids(kind)) if i.startswith(value)]
    choices = PROMPT_CHOICES.get((ref.name, name))
    if choices is not None:
        shipped = sorted(p.stem for p in corpora_dir().glob("*.json"))
        return [c for c in dict.fromkeys([*choices, *shipped]) if c.startswith(value)]
    return component_completions(toolkit, value)


def component_completions(toolkit: Toolkit, value: str) -> list[str]:
    """The last word of ``value`` completed to the loaded model's component names ('L1' → 'L1H0', …, 'L1MLP')."""
    head, _, word = value.rpartition(" ")
    if not word.upper().startswith("L"):
        return []
    model = None
    with contextlib.suppress(Exception):  # completions never wait for, or fail on, a model still loading
        if toolkit.host.state == "ready":
            model = toolkit.host.wait_loaded(0)
    if model is None:
        return []
    cfg = model.cfg
    names = [
        name
        for layer in range(cfg.n_layers)
        for name in (*(f"L{layer}H{h}" for h in range(cfg.n_heads)), f"L{layer}MLP", f"L{layer}ATTN")
    ]
    prefix = f"{head} " if head else ""
    return [prefix + name for name in names if name.upper().startswith(word.upper())]
