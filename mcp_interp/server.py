"""The MCP server: thin adapters from tool calls to ``core`` measurements.

Each tool validates nothing itself beyond types (the core raises ``InputError`` with a message
for the caller), waits for the model, runs the measurement in a worker thread under the model
lock, and wraps it with provenance. Science lives in ``core/``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from mcp_interp import __version__
from mcp_interp.core import readouts
from mcp_interp.errors import InterpError
from mcp_interp.schemas import (
    AnswerRankResult,
    KLResult,
    LogitDiffResult,
    Measurement,
    ModelInfoResult,
    Provenance,
    TokenizeResult,
)
from mcp_interp.session import Session
from mcp_interp.store import NotFound

R = TypeVar("R", bound=BaseModel)

INSTRUCTIONS = """\
mcp-interp runs mechanistic-interpretability measurements on a transformer loaded in this
server. Start with `model_info` (which model, how text is tokenized) and `tokenize` (check that
answers are single tokens — GPT-2-style tokenizers want the leading space, ' Mary' — and that
minimal pairs have equal token length). Every result has the mean and per-example values,
provenance (`model`, `run_id`), and `notes`: read the notes before citing a number.
"""

READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False, destructive_hint=False)

Prompts = Annotated[
    list[str],
    Field(description="Prompts to run, one forward pass for all; the prediction is read after the last token."),
]
Answers = Annotated[
    str | list[str],
    Field(
        description="One single-token answer for every prompt, or a list with one per prompt. "
        "Mind the leading space: ' Mary', not 'Mary', for GPT-2-style tokenizers."
    ),
]


def build_server(session: Session) -> MCPServer[Session]:
    @asynccontextmanager
    async def lifespan(_: MCPServer[Session]) -> AsyncIterator[Session]:
        session.start_loading()
        yield session

    server: MCPServer[Session] = MCPServer(
        "mcp-interp", version=__version__, instructions=INSTRUCTIONS, lifespan=lifespan
    )

    async def run(ctx: Context, result_type: type[R], fn: Callable[..., Measurement], *args: Any) -> R:
        async def report_wait(seconds: float) -> None:
            await ctx.report_progress(
                0, None, f"waiting for model {session.model_name} to finish loading ({seconds:.0f} s so far)"
            )

        try:
            model = await session.model(on_wait=report_wait)
            started = time.perf_counter()
            measurement = await session.run(fn, model, *args)
        except InterpError as exc:
            raise ToolError(str(exc)) from exc
        provenance = Provenance(
            model=session.model_ref(), run_id=uuid.uuid4().hex, elapsed_s=round(time.perf_counter() - started, 6)
        )
        return result_type(**dict(measurement), **dict(provenance))

    @server.tool(annotations=READ_ONLY)
    async def model_info(ctx: Context) -> ModelInfoResult:
        """The loaded model: name, source, layer/head counts, sizes, dtype, device, weight fingerprint,
        load time, and the tokenization rule every tool uses. Call this first."""
        return await run(ctx, ModelInfoResult, readouts.model_info)

    @server.tool(annotations=READ_ONLY)
    async def tokenize(
        texts: Annotated[list[str], Field(description="Texts to tokenize exactly as every tool will.")],
        ctx: Context,
    ) -> TokenizeResult:
        """Token strings and ids of each text, by the same rule every tool uses. Use it to check that
        an answer is one token and that a minimal pair tokenizes to equal length before experimenting."""
        return await run(ctx, TokenizeResult, readouts.tokenize, texts)

    @server.tool(annotations=READ_ONLY)
    async def logit_diff(prompts: Prompts, correct: Answers, incorrect: Answers, ctx: Context) -> LogitDiffResult:
        """logit(correct) − logit(incorrect) at each prompt's answer position (its last token), per
        example and mean, with the model's top-1 token. Positive = the model prefers `correct`."""
        return await run(ctx, LogitDiffResult, readouts.logit_diff, prompts, correct, incorrect)

    @server.tool(annotations=READ_ONLY)
    async def kl(
        prompts: Prompts,
        compare_prompts: Annotated[
            list[str],
            Field(description="One prompt per entry of `prompts`, each with the same token length as its partner."),
        ],
        ctx: Context,
    ) -> KLResult:
        """KL(P‖Q) in nats between next-token distributions at the answer position: P from `prompts`,
        Q from `compare_prompts` (pairwise; equal token lengths required). 0 = identical; ≥ 0."""
        return await run(ctx, KLResult, readouts.kl, prompts, compare_prompts)

    @server.tool(annotations=READ_ONLY)
    async def answer_rank(prompts: Prompts, correct: Answers, ctx: Context) -> AnswerRankResult:
        """Rank (tokens with a strictly higher logit; 0 = top-1) and log-probability of the correct
        answer at each prompt's answer position. Rank saturates at 0: see `notes`."""
        return await run(ctx, AnswerRankResult, readouts.answer_rank, prompts, correct)

    @server.resource(
        "figure://{figure_id}",
        name="figure",
        description="A PNG figure produced by a tool; its URI is in that tool's result.",
        mime_type="image/png",
    )
    def figure(figure_id: str) -> bytes:
        try:
            return session.store.get("figure", figure_id)
        except NotFound as exc:
            raise ResourceError(str(exc)) from exc

    return server
