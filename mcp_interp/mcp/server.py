"""The MCP server: one ``MCPServer`` with every tool family, resource and prompt registered.

Adding a family is one import and one entry in ``FAMILIES``; adding a tool touches only its family's
module (plus its schema and core modules).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from mcp.server import MCPServer

from mcp_interp import __version__
from mcp_interp.mcp import (
    circuits,
    explain,
    features,
    graphs,
    heads,
    lens,
    localize,
    prompts,
    readouts,
    stored,
    swap,
    views,
)
from mcp_interp.mcp.toolkit import Family, Toolkit
from mcp_interp.session import Session

INSTRUCTIONS = """\
mcp-interp runs mechanistic-interpretability measurements on a transformer loaded in this
server. Start with `model_info` (which model, how text is tokenized) and `tokenize` (check that
answers are single tokens — GPT-2-style tokenizers want the leading space, ' Mary' — and that
minimal pairs have equal token length). Every result has the mean and per-example values,
provenance (`model`, `run_id`), and `notes`: read the notes before citing a number.
"""

FAMILIES: tuple[Family, ...] = (
    readouts.family,
    heads.family,
    localize.family,
    circuits.family,
    features.family,
    graphs.family,
    lens.family,
    explain.family,
    swap.family,
    stored.family,
    views.family,
    prompts.family,
)


def build_server(session: Session) -> MCPServer[Toolkit]:
    """A server over ``session``; the model starts loading when the server starts (its lifespan), so
    ``initialize`` and ``tools/list`` answer at once while the weights load."""
    toolkit = Toolkit(session)

    @asynccontextmanager
    async def lifespan(_: MCPServer[Toolkit]) -> AsyncIterator[Toolkit]:
        session.start_loading()
        yield toolkit

    server: MCPServer[Toolkit] = MCPServer(
        "mcp-interp", version=__version__, instructions=INSTRUCTIONS, lifespan=lifespan
    )
    for family in FAMILIES:
        family.register(server)
    return server
