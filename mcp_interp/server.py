"""The MCP server: thin adapters from tool calls to ``core`` measurements.

Each tool validates nothing itself beyond types (the core raises ``InputError`` with a message
for the caller), waits for the model, runs the measurement in a worker thread under the model
lock, and wraps it with provenance. Science lives in ``core/``.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal, TypeVar

import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.types import CallToolResult, ImageContent, ResourceLink, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from mcp_interp import __version__, figures
from mcp_interp.core import readouts
from mcp_interp.core.ablate import ablate_heads
from mcp_interp.core.interventions import ablation_from_spec
from mcp_interp.core.patch_heads import PatchHeadsJob
from mcp_interp.errors import InterpError
from mcp_interp.schemas import (
    AblateHeadResult,
    AblationSpec,
    AnswerRankResult,
    FigureInfo,
    HeadSpec,
    Intervention,
    KLResult,
    LogitDiffResult,
    Measurement,
    ModelInfoResult,
    PatchHeadsResult,
    PositionsSpec,
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
OptionalIntervention = Annotated[
    Intervention | None,
    Field(
        description='Optional intervention on the measured run, e.g. {"ablate": {"heads": ["L9H3"], "method": "mean"}}.'
    ),
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

    async def loaded_model(ctx: Context) -> Any:
        async def report_wait(seconds: float) -> None:
            await ctx.report_progress(
                0, None, f"waiting for model {session.model_name} to finish loading ({seconds:.0f} s so far)"
            )

        try:
            return await session.model(on_wait=report_wait)
        except InterpError as exc:
            raise ToolError(str(exc)) from exc

    def with_provenance(result_type: type[R], measurement: Measurement, started: float) -> R:
        provenance = Provenance(
            model=session.model_ref(), run_id=uuid.uuid4().hex, elapsed_s=round(time.perf_counter() - started, 6)
        )
        return result_type(**dict(measurement), **dict(provenance))

    async def run(
        ctx: Context, result_type: type[R], fn: Callable[..., Measurement], *args: Any, locked: bool = True
    ) -> R:
        model = await loaded_model(ctx)
        started = time.perf_counter()
        try:
            runner = session.run if locked else session.run_unlocked
            measurement = await runner(fn, model, *args)
        except InterpError as exc:
            raise ToolError(str(exc)) from exc
        return with_provenance(result_type, measurement, started)

    def store_figure(png: bytes, title: str) -> tuple[str, ResourceLink]:
        stored = session.store.put("figure", png)
        link = ResourceLink(type="resource_link", uri=stored.uri, name=title, mime_type="image/png", size=len(png))
        return stored.uri, link

    @server.tool(annotations=READ_ONLY)
    async def model_info(ctx: Context) -> ModelInfoResult:
        """The loaded model: name, source, layer/head counts, sizes, dtype, device, weight fingerprint,
        load time, and the tokenization rule every tool uses. Call this first."""
        return await run(ctx, ModelInfoResult, readouts.model_info, locked=False)

    @server.tool(annotations=READ_ONLY)
    async def tokenize(
        texts: Annotated[list[str], Field(description="Texts to tokenize exactly as every tool will.")],
        ctx: Context,
    ) -> TokenizeResult:
        """Token strings and ids of each text, by the same rule every tool uses. Use it to check that
        an answer is one token and that a minimal pair tokenizes to equal length before experimenting."""
        return await run(ctx, TokenizeResult, readouts.tokenize, texts, locked=False)

    @server.tool(annotations=READ_ONLY)
    async def logit_diff(
        prompts: Prompts, correct: Answers, incorrect: Answers, ctx: Context, intervention: OptionalIntervention = None
    ) -> LogitDiffResult:
        """logit(correct) − logit(incorrect) at each prompt's answer position (its last token), per
        example and mean, with the model's top-1 token. Positive = the model prefers `correct`.
        With `intervention`, the numbers are read from the intervened run."""
        return await run(ctx, LogitDiffResult, readouts.logit_diff, prompts, correct, incorrect, intervention)

    @server.tool(annotations=READ_ONLY)
    async def kl(
        prompts: Prompts,
        ctx: Context,
        compare_prompts: Annotated[
            list[str] | None,
            Field(
                description="One prompt per entry of `prompts`, each with the same token length as its partner; "
                "default: `prompts` themselves (then give an `intervention`)."
            ),
        ] = None,
        intervention: OptionalIntervention = None,
    ) -> KLResult:
        """KL(P‖Q) in nats between next-token distributions at the answer position: P = clean run on
        `prompts`; Q = run on `compare_prompts` (default `prompts`) under `intervention` (default none).
        `kl(prompts, intervention=...)` is KL(clean‖intervened). 0 = identical; ≥ 0."""
        return await run(ctx, KLResult, readouts.kl, prompts, compare_prompts, intervention)

    @server.tool(annotations=READ_ONLY)
    async def answer_rank(
        prompts: Prompts, correct: Answers, ctx: Context, intervention: OptionalIntervention = None
    ) -> AnswerRankResult:
        """Rank (tokens with a strictly higher logit; 0 = top-1) and log-probability of the correct
        answer at each prompt's answer position. Rank saturates at 0: see `notes`."""
        return await run(ctx, AnswerRankResult, readouts.answer_rank, prompts, correct, intervention)

    @server.tool(annotations=READ_ONLY)
    async def ablate_head(
        prompts: Prompts,
        heads: Annotated[
            HeadSpec | list[HeadSpec],
            Field(description="Heads to ablate together in one forward pass: 'L9H3' or {layer, head}, or a list."),
        ],
        ctx: Context,
        method: Annotated[
            Literal["zero", "mean", "resample"],
            Field(
                description="zero: z = 0; mean: batch mean (per position when prompts share a length); "
                "resample: another prompt's z (seeded permutation without fixed points; equal lengths)."
            ),
        ] = "zero",
        correct: Annotated[
            Answers | None, Field(description="Correct answer(s); enables the logit difference.")
        ] = None,
        incorrect: Annotated[Answers | None, Field(description="Incorrect answer(s) for the logit difference.")] = None,
        positions: Annotated[
            PositionsSpec, Field(description="'all' (default), 'last' (answer position) or token indices.")
        ] = "all",
        seed: Annotated[int, Field(description="Seed of the resample permutation.")] = 0,
    ) -> AblateHeadResult:
        """Ablate attention heads (on hook_z, so grouped-query attention works) and report, before and
        after: logit difference (with answers), KL(clean‖ablated), answer log-prob and rank, per example
        and mean. `notes` flags metrics that disagree (e.g. rank stuck at 0 while the logit difference
        moved) — read them before concluding a head does or does not matter."""
        model = await loaded_model(ctx)
        spec = AblationSpec(heads=heads, method=method, positions=positions, seed=seed)
        started = time.perf_counter()
        try:
            ablation = ablation_from_spec(spec, model.bridge.cfg.n_layers, model.bridge.cfg.n_heads)
            assert ablation is not None
            measurement = await session.run(ablate_heads, model, prompts, ablation, correct, incorrect)
        except InterpError as exc:
            raise ToolError(str(exc)) from exc
        return with_provenance(AblateHeadResult, measurement, started)

    @server.tool(annotations=READ_ONLY)
    async def patch_heads(
        clean_prompts: Annotated[list[str], Field(description="Prompts where the model shows the behaviour.")],
        corrupt_prompts: Annotated[
            list[str], Field(description="Minimal-pair partners, one per clean prompt, same token length.")
        ],
        correct: Answers,
        incorrect: Answers,
        ctx: Context,
        direction: Annotated[
            Literal["denoise", "noise"],
            Field(
                description="denoise: run corrupt, patch in clean (which heads restore it?); "
                "noise: run clean, patch in corrupt (which heads break it?)."
            ),
        ] = "denoise",
        method: Annotated[
            Literal["exact", "attribution"],
            Field(description="exact: real patched runs; attribution: first-order gradient estimate (fast)."),
        ] = "exact",
        positions: Annotated[
            PositionsSpec, Field(description="'all' (default), 'last' or token indices to patch at.")
        ] = "all",
        heads: Annotated[
            list[HeadSpec] | None, Field(description="Subset of heads to patch; default every (layer, head).")
        ] = None,
        verify_top: Annotated[
            int, Field(ge=0, le=64, description="With attribution: re-run this many top heads exactly.")
        ] = 0,
    ) -> Annotated[CallToolResult, PatchHeadsResult]:
        """Activation patching of each attention head's output (hook_z) on minimal pairs. Score per
        head = fraction of the clean−corrupt logit-difference gap it restores (denoise) or destroys
        (noise): 1 = carries the whole effect, 0 = none. Returns a [layer][head] grid, heads sorted by
        |score| with per-example values for the top 10, and a heatmap (figure:// resource). Reports
        progress per layer and stops at the next layer when cancelled."""
        model = await loaded_model(ctx)
        job = PatchHeadsJob(
            model,
            clean_prompts,
            corrupt_prompts,
            correct,
            incorrect,
            direction,
            method,
            positions,
            heads,
            verify_top,
        )
        started = time.perf_counter()
        try:
            total = job.total_steps()

            async def progress(done: int, message: str) -> None:
                await ctx.report_progress(done, total, message)

            await session.run_steps(job.steps(), progress)
        except InterpError as exc:
            raise ToolError(str(exc)) from exc
        assert job.result is not None
        title = f"patch_heads {direction} ({method}) score: {model.name}"
        png = await anyio.to_thread.run_sync(
            figures.layer_head_heatmap,
            job.result.scores,
            title,
            "recovered fraction" if direction == "denoise" else "destroyed fraction",
        )
        uri, link = store_figure(png, title)
        job.result.figure_uri = uri
        result = with_provenance(PatchHeadsResult, job.result, started)
        top = ", ".join(f"{h.head} {h.score:+.3f}" for h in result.heads[:5] if h.score is not None)
        summary = (
            f"patch_heads ({method}, {direction}): clean logit diff {result.clean_logit_diff.value:+.3f}, corrupt "
            f"{result.corrupt_logit_diff.value:+.3f}; top heads by |score|: {top}. Heatmap: {uri}"
        )
        return CallToolResult(
            content=[TextContent(type="text", text=summary), link],
            structured_content=result.model_dump(mode="json"),
        )

    @server.tool(annotations=READ_ONLY)
    async def get_figure(
        uri: Annotated[str, Field(description="A figure URI from a result, e.g. figure://0123…")],
    ) -> Annotated[CallToolResult, FigureInfo]:
        """Return a stored figure as image content, for clients that do not read resources."""
        kind, _, figure_id = uri.partition("://")
        try:
            if kind != "figure":
                raise NotFound(f"{uri[:100]!r} is not a figure URI; figure URIs look like figure://<32 hex>.")
            png = session.store.get("figure", figure_id)
            width, height = figures.png_size(png)
        except (NotFound, ValueError) as exc:
            raise ToolError(str(exc)) from exc
        info = FigureInfo(uri=uri, mime_type="image/png", bytes=len(png), width=width, height=height)
        return CallToolResult(
            content=[ImageContent(type="image", data=base64.b64encode(png).decode(), mime_type="image/png")],
            structured_content=info.model_dump(mode="json"),
        )

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
