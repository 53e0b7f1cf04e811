"""Serving over stdio: a protocol channel nothing else can write to, and every line a client sends answered.

stdout is the JSON-RPC channel. The SDK diverts file descriptor 1 to stderr while it serves, but only once
serving starts — after torch, transformers and TransformerLens have been imported and the model has started
loading, any of which may print. So the CLI claims stdout first thing (``claim_stdout``): the real stdout is
duplicated for the protocol and descriptor 1 (and ``sys.stdout``) point at stderr, so a stray print anywhere in
the process lands in the log, never on the wire. stdin is claimed the same way (``claim_stdin``).

Why our own transport (``answering_stdio``) rather than the SDK's ``stdio_server``: the SDK's reader turns a line
that is not a JSON-RPC message into an exception item its dispatcher drops with a debug log, so a client that sent
invalid JSON, a batch, or a string with a lone surrogate waits until its timeout for nothing (and its writer dies
on an outgoing lone surrogate, taking the server down). This one has the same ``(read_stream, write_stream)``
contract and parses valid traffic with the SDK's own adapter, but answers what it rejects, as JSON-RPC says:

* not JSON (``NaN`` and ``Infinity`` included, which the SDK's parser takes) → ``-32700`` (parse error), ``id: null``;
  a JSON array (a batch: none since 2025-06-18), or JSON that is not a request → ``-32600`` (invalid request), with
  the request's id when it has one, else null;
* a lone UTF-16 surrogate (``"\\ud800"``) in a ``tools/call``'s arguments → a tool error saying which argument;
  elsewhere → ``-32700`` with the request's id (the stdlib can read the id where the SDK's parser cannot);
* malformed notifications and responses are logged and dropped (nothing may answer them);
* an outgoing message that cannot be encoded has its lone surrogates replaced by U+FFFD instead of crashing.
Every rejected line is logged to stderr.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, BinaryIO

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError, JSONRPCResponse
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

log = logging.getLogger(__name__)
_SURROGATE = re.compile(r"[\ud800-\udfff]")
Streams = tuple[Any, Any]


def claim_stdout() -> BinaryIO:
    """Reserve the real stdout for the protocol; from now on fd 1 writes go to stderr."""
    sys.stdout.flush()
    protocol = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), encoding="utf-8", line_buffering=True)
    return protocol


def claim_stdin() -> BinaryIO:
    """Reserve the real stdin for the protocol (as the SDK does): fd 0 now reads /dev/null, so a child process or a
    stray ``input()`` cannot eat protocol bytes."""
    wire = os.fdopen(os.dup(0), "rb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return wire


async def serve_stdio(server: Any, protocol: BinaryIO, stdin: BinaryIO | None = None) -> None:
    """Run ``server`` (an MCPServer) over stdin and the claimed protocol stream; resources and tools advertise
    ``listChanged`` (stored entries appear as tools run)."""
    from mcp_interp.mcp.sdk_internals import lowlevel_server  # here: claim_stdout's import stays light

    lowlevel = lowlevel_server(server)
    options = lowlevel.create_initialization_options()  # listChanged set where the server is built (protocol.install)
    async with answering_stdio(stdin if stdin is not None else claim_stdin(), protocol) as (read, write):
        await lowlevel.run(read, write, options)


def _error(code: int, message: str, request_id: Any = None) -> JSONRPCError:
    return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=code, message=message))


def _request_id(obj: dict[str, Any]) -> str | int | None:
    value = obj.get("id")
    return value if isinstance(value, str | int) and not isinstance(value, bool) else None


def _surrogate_at(value: Any, path: str) -> str | None:
    """The path of the first string (key or value) holding a lone surrogate, or None."""
    if isinstance(value, str):
        return path if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, sub in value.items():
            found = path if _SURROGATE.search(str(key)) else _surrogate_at(sub, f"{path}.{key}" if path else key)
            if found is not None:
                return found
    if isinstance(value, list):
        for index, sub in enumerate(value):
            found = _surrogate_at(sub, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _strict_json(line: str) -> bool:
    """False for a line that uses NaN or Infinity: not JSON (RFC 8259), though the SDK's parser accepts them."""
    if "NaN" not in line and "Infinity" not in line:
        return True
    try:
        json.loads(line, parse_constant=_no_constants)
    except ValueError:
        return False
    return True


def answer_to(line: str) -> JSONRPCError | JSONRPCResponse | None:
    """What to send back for a line the SDK's parser rejected; None when nothing may answer it."""
    try:
        obj = json.loads(line, parse_constant=_no_constants)
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity
        return _error(PARSE_ERROR, f"Parse error: {exc}")
    if isinstance(obj, list):
        return _error(INVALID_REQUEST, "Invalid Request: JSON-RPC batches are not supported; send one message a line")
    if not isinstance(obj, dict):
        return _error(INVALID_REQUEST, "Invalid Request: a JSON-RPC message is a JSON object")
    request_id = _request_id(obj)
    where = _surrogate_at(obj, "")
    if where is not None:
        params: dict[str, Any] = obj["params"] if isinstance(obj.get("params"), dict) else {}
        if obj.get("method") == "tools/call" and request_id is not None and where.startswith("params.arguments"):
            argument = where.removeprefix("params.arguments.")
            text = (
                f"Argument `{argument}` holds a lone UTF-16 surrogate (e.g. '\\ud800'), which is not valid Unicode "
                f"text; send it as valid UTF-8 (tool {params.get('name')!r})."
            )
            result = types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
            return JSONRPCResponse(
                jsonrpc="2.0", id=request_id, result=result.model_dump(by_alias=True, exclude_none=True)
            )
        return _error(PARSE_ERROR, f"Parse error: `{where}` holds a lone UTF-16 surrogate", request_id)
    if "method" not in obj and ("result" in obj or "error" in obj):
        return None  # a malformed response: nothing answers a response
    if "id" not in obj and isinstance(obj.get("method"), str):
        return None  # a malformed notification: nothing answers a notification
    return _error(INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 request", request_id)


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_scrub(k): _scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


def encode(message: Any) -> str:
    """One outgoing message as JSON; lone surrogates (unencodable) become U+FFFD rather than a dead writer."""
    try:
        return str(message.model_dump_json(by_alias=True, exclude_unset=True))
    except (PydanticSerializationError, UnicodeEncodeError):
        log.warning("an outgoing message held lone surrogates; they were replaced by U+FFFD")
        data = _scrub(message.model_dump(by_alias=True, exclude_unset=True, mode="json"))
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _write(stream: BinaryIO, data: bytes) -> None:
    stream.write(data)
    stream.flush()


@asynccontextmanager
async def answering_stdio(stdin: BinaryIO, stdout: BinaryIO) -> AsyncIterator[Streams]:
    """The SDK's stdio transport contract over binary ``stdin``/``stdout``, answering every line it rejects."""
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)
    replies = write_send.clone()  # the reader answers bad lines itself, through its own clone of the write side
    writer_done = anyio.Event()

    async def reader() -> None:
        async with read_send, replies:
            while True:
                raw = await anyio.to_thread.run_sync(stdin.readline, abandon_on_cancel=True)
                if not raw:
                    return  # EOF
                line = raw.decode("utf-8", errors="replace").strip()  # the SDK's own decoding
                if not line:
                    continue
                try:
                    message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                except ValidationError:
                    message = None
                if message is None or not _strict_json(line):
                    answer = answer_to(line)
                    code = getattr(getattr(answer, "error", None), "code", "tool error" if answer else "dropped")
                    log.warning("rejected an input line (%s): %.200r", code, line)
                    if answer is not None:
                        try:
                            await replies.send(SessionMessage(answer))
                        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                            return
                    continue
                try:
                    await read_send.send(SessionMessage(message))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return

    async def writer() -> None:
        try:
            async with write_recv:
                async for item in write_recv:
                    await anyio.to_thread.run_sync(_write, stdout, (encode(item.message) + "\n").encode("utf-8"))
        except (BrokenPipeError, ConnectionResetError):
            log.info("the client closed stdout")
        finally:
            writer_done.set()

    async with anyio.create_task_group() as group:
        group.start_soon(reader)
        group.start_soon(writer)
        try:
            yield read_recv, write_send
        finally:
            await write_send.aclose()
            replies.close()  # the reader may still be parked on stdin; it answers nothing more
            with anyio.move_on_after(5, shield=True):
                await writer_done.wait()  # what is already answered reaches the client
            group.cancel_scope.cancel()
