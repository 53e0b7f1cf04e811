"""Serving over stdio with a protocol channel nothing else can write to.

stdout is the JSON-RPC channel. The SDK diverts file descriptor 1 to stderr while it serves,
but only once serving starts — after torch, transformers and TransformerLens have been
imported and the model has started loading, any of which may print. So the CLI claims stdout
first thing: the real stdout is duplicated for the protocol and descriptor 1 (and Python's
``sys.stdout``) are pointed at stderr, so a stray print or progress bar anywhere in the
process — at import time, during loading, inside a tool — lands in the log, never on the wire.
"""

from __future__ import annotations

import io
import os
import sys
from typing import Any, BinaryIO

import anyio
from mcp.server.stdio import stdio_server


def claim_stdout() -> BinaryIO:
    """Reserve the real stdout for the protocol; from now on fd 1 writes go to stderr."""
    sys.stdout.flush()
    protocol = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), encoding="utf-8", line_buffering=True)
    return protocol


async def serve_stdio(server: Any, protocol: BinaryIO) -> None:
    """Run ``server`` (an MCPServer) over stdin and the claimed protocol stream."""
    stdout = anyio.wrap_file(io.TextIOWrapper(protocol, encoding="utf-8", line_buffering=True))
    lowlevel = server._lowlevel_server  # MCPServer exposes no public handle; mcp.Client uses the same attribute
    async with stdio_server(stdout=stdout) as (read_stream, write_stream):
        await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
