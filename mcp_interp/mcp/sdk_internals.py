"""The one place that reaches into the MCP SDK's internals.

``MCPServer`` keeps its tool records and its low-level server private and offers no public way to change a
published schema, to serve a method around its own handler, or to advertise ``listChanged``. Each reach is one small
function here, saying why it is needed, so an SDK upgrade that moves an internal breaks this module only
(``tests/test_layout.py`` holds that no other module touches an SDK internal; ``tests/server/test_surface.py`` fails
if a reach stops taking effect).
"""

from __future__ import annotations

import functools
from typing import Any

from mcp.server import MCPServer, NotificationOptions
from mcp.server.lowlevel.server import Server as LowLevelServer
from mcp.server.mcpserver.tools import Tool
from pydantic import ConfigDict

# --- a registered tool's record ----------------------------------------------------------------------------------


def _tool(server: MCPServer[Any], name: str) -> Tool | None:
    """The SDK's record of the tool ``name`` (None if there is none). ``MCPServer`` keeps the records in its private
    ``_tool_manager`` and has no public lookup: ``list_tools`` gives the wire form, without the function's metadata
    whose schemas and output model are changed below."""
    return server._tool_manager.get_tool(name)


def _registered(server: MCPServer[Any], name: str) -> Tool:
    tool = _tool(server, name)
    assert tool is not None, name
    return tool


def input_schema(server: MCPServer[Any], name: str) -> dict[str, Any]:
    """The input schema the tool ``name`` publishes (and its arguments are described by); ``{}`` for no such tool."""
    tool = _tool(server, name)
    return tool.parameters if tool is not None else {}


def parsed_arguments(server: MCPServer[Any], name: str, arguments: dict[str, Any]) -> Any:
    """``arguments`` as the SDK validated them: it first parses arguments sent as JSON text
    (``fn_metadata.pre_parse_json``, no public equivalent), and a validation error's locations refer to those values.
    ``arguments`` unchanged for no such tool."""
    tool = _tool(server, name)
    return tool.fn_metadata.pre_parse_json(arguments) if tool is not None else arguments


def refuse_unknown_arguments(server: MCPServer[Any], name: str) -> None:
    """Make the tool ``name`` refuse an argument it does not take. The SDK validates a call's arguments with a model
    built from the function's signature (``fn_metadata.arg_model``) whose pydantic default ignores extra keys, so a
    misspelt or invented argument would be dropped and the call run with the default; the record's model is replaced
    by a subclass that forbids them (no public option sets it), and the refusal is worded by ``argument_errors``."""
    metadata = _registered(server, name).fn_metadata
    loose = metadata.arg_model
    if loose.model_config.get("extra") != "forbid":
        namespace = {"__module__": loose.__module__, "model_config": ConfigDict(extra="forbid")}
        metadata.arg_model = type(loose.__name__, (loose,), namespace)


def publish_input_schema(server: MCPServer[Any], name: str, schema: dict[str, Any]) -> None:
    """Publish ``schema`` as the tool's input schema. The SDK builds it from the signature and reads the record's
    ``parameters`` live in ``tools/list``; there is no public setter."""
    _registered(server, name).parameters = schema


def output_schema(server: MCPServer[Any], name: str) -> dict[str, Any] | None:
    """The output schema the tool ``name`` publishes (None for a tool without structured output). It lives in the
    record's ``fn_metadata``, the SDK's private description of the function."""
    return _registered(server, name).fn_metadata.output_schema


def publish_output_schema(server: MCPServer[Any], name: str, schema: dict[str, Any]) -> None:
    """Publish ``schema`` as the tool's output schema. No public setter: it is ``fn_metadata.output_schema``, and the
    record caches the schema it first read (a ``cached_property`` in its ``__dict__``), so the cached copy goes too."""
    tool = _registered(server, name)
    tool.fn_metadata.output_schema = schema
    tool.__dict__.pop("output_schema", None)


def output_model(server: MCPServer[Any], name: str) -> Any:
    """The type the tool's results are validated against (``fn_metadata.output_model``; None without one)."""
    return _registered(server, name).fn_metadata.output_model


def validate_output_with(server: MCPServer[Any], name: str, model: Any) -> None:
    """Validate the tool's results against ``model`` from now on. No public setter: the SDK validates each result
    against ``fn_metadata.output_model`` (and rebuilds its validator when that field is reassigned)."""
    _registered(server, name).fn_metadata.output_model = model


# --- the low-level server ----------------------------------------------------------------------------------------


def lowlevel_server(server: MCPServer[Any]) -> LowLevelServer[Any]:
    """The low-level server that speaks the protocol (run over a transport, its request handlers). ``MCPServer``
    exposes no public handle to it; ``mcp.Client`` uses the same private attribute."""
    return server._lowlevel_server


def advertise_list_changed(server: MCPServer[Any]) -> None:
    """Advertise ``listChanged`` for resources and tools at initialization. ``MCPServer`` builds its initialization
    options with the default ``NotificationOptions`` (no ``listChanged``) and takes no option for it, so the low-level
    server's ``create_initialization_options`` gets them bound (every transport calls it)."""
    low = lowlevel_server(server)
    low.create_initialization_options = functools.partial(  # type: ignore[method-assign]
        low.create_initialization_options, NotificationOptions(resources_changed=True, tools_changed=True)
    )


def serve_method(server: MCPServer[Any], method: str, params_type: type[Any], handler: Any) -> None:
    """Serve ``method`` with ``handler`` in place of the SDK's own. ``add_request_handler`` is the low-level server's
    documented way to serve a method; ``MCPServer`` does not pass it on, so it is reached through the low-level
    server."""
    lowlevel_server(server).add_request_handler(method, params_type, handler)


async def sdk_read_resource(server: MCPServer[Any], ctx: Any, params: Any) -> Any:
    """The SDK's own ``resources/read`` handler (private), which our handler wraps to correct its error code."""
    return await server._handle_read_resource(ctx, params)


async def sdk_get_prompt(server: MCPServer[Any], ctx: Any, params: Any) -> Any:
    """The SDK's own ``prompts/get`` handler (private), which our handler wraps to check arguments and error codes."""
    return await server._handle_get_prompt(ctx, params)
