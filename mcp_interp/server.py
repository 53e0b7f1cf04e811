"""The MCP server: thin adapters from tool calls to ``core`` measurements.

Each tool validates nothing itself beyond types (the core raises ``InputError`` with a message
for the caller), waits for the model, runs the measurement in a worker thread under the model
lock, and wraps it with provenance. Science lives in ``core/``.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal, TypeVar

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.types import CallToolResult, ImageContent, ResourceLink, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from mcp_interp import __version__, figures
from mcp_interp.core import lens, readouts
from mcp_interp.core.ablate import ablate_heads
from mcp_interp.core.explain import ExplainJob, report_markdown
from mcp_interp.core.interventions import ablation_from_spec
from mcp_interp.core.patch_heads import PatchHeadsJob
from mcp_interp.core.steer import steer as steer_core
from mcp_interp.errors import InterpError
from mcp_interp.prompts import register_prompts
from mcp_interp.schemas.common import (
    AblationSpec,
    FigureInfo,
    HeadSpec,
    Intervention,
    Measurement,
    PositionsSpec,
    Provenance,
)
from mcp_interp.schemas.explain import ExplainResult
from mcp_interp.schemas.heads import AblateHeadResult, PatchHeadsResult
from mcp_interp.schemas.lens import AttentionResult, DLAResult, InductionResult, LogitLensResult, SteerResult
from mcp_interp.schemas.readouts import AnswerRankResult, KLResult, LogitDiffResult, ModelInfoResult, TokenizeResult
from mcp_interp.session import Session
from mcp_interp.store import NotFound
from mcp_interp.swap_server import register_swap_tools

R = TypeVar("R", bound=BaseModel)
T = TypeVar("T")

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

    async def guarded(awaitable: Awaitable[T]) -> T:
        """Await core work, turning its caller-facing errors into tool errors."""
        try:
            return await awaitable
        except InterpError as exc:
            raise ToolError(str(exc)) from exc

    def structured_result(result: BaseModel, summary: str, links: list[ResourceLink]) -> CallToolResult:
        return CallToolResult(
            content=[TextContent(type="text", text=summary), *links],
            structured_content=result.model_dump(mode="json"),
        )

    def stored_bytes(kind: str, entry_id: str) -> bytes:
        try:
            return session.store.get(kind, entry_id)
        except NotFound as exc:
            raise ResourceError(str(exc)) from exc

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
        png = await session.render(
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

    @server.tool(annotations=READ_ONLY)
    async def logit_lens(
        prompt: Annotated[str, Field(description="One prompt; read at its last token.")],
        ctx: Context,
        target: Annotated[str | None, Field(description="Token to track (default: the model's top-1).")] = None,
        top_k: Annotated[int, Field(ge=1, le=50, description="Top tokens listed per layer.")] = 5,
    ) -> Annotated[CallToolResult, LogitLensResult]:
        """Logit lens: the final norm + unembedding applied to the residual after every layer at the
        answer position — top-k tokens per layer, the target's probability and rank per layer, and the
        first layer from which it stays top-1. Figure: probability and rank across layers."""
        model = await loaded_model(ctx)
        started = time.perf_counter()
        measurement = await guarded(session.run(lens.logit_lens, model, prompt, target, top_k))
        png = await session.render(
            lambda: figures.logit_lens_figure(
                [r.layer for r in measurement.layers],
                [r.target_prob for r in measurement.layers],
                [r.target_rank for r in measurement.layers],
                measurement.target,
            )
        )
        measurement.figure_uri, link = store_figure(png, f"logit lens {measurement.target!r}")
        result = with_provenance(LogitLensResult, measurement, started)
        summary = (
            f"logit lens for {result.target!r}: final P = {result.final_prob:.3f}, top-1 from layer "
            f"{result.first_top1_layer}. Figure: {result.figure_uri}"
        )
        return structured_result(result, summary, [link])

    @server.tool(annotations=READ_ONLY)
    async def dla(
        prompt: Annotated[str, Field(description="One prompt; read at its last token.")],
        answer: Annotated[str, Field(description="Single-token answer, e.g. ' Mary'.")],
        ctx: Context,
        baseline: Annotated[
            str | None, Field(description="Single-token baseline; decomposes logit(answer) − logit(baseline).")
        ] = None,
        top_k: Annotated[int, Field(ge=1, le=100, description="Components listed in `top`.")] = 10,
    ) -> Annotated[CallToolResult, DLAResult]:
        """Direct logit attribution: what every attention head, every MLP and the embeddings write
        directly to logit(answer) − logit(baseline) (or logit(answer)), with the final norm's scale
        frozen from the real run. The parts sum to the measured value (see residual_error).
        Correlational, not causal. Figure: layer × head heatmap plus MLP bars."""
        model = await loaded_model(ctx)
        started = time.perf_counter()
        measurement = await guarded(session.run(lens.dla, model, prompt, answer, baseline, top_k))
        png = await session.render(figures.dla_figure, measurement.heads, measurement.mlps, measurement.quantity)
        measurement.figure_uri, link = store_figure(png, f"DLA {measurement.quantity}")
        result = with_provenance(DLAResult, measurement, started)
        tops = ", ".join(f"{c.component} {c.value:+.3f}" for c in result.top[:5])
        summary = f"DLA of {result.quantity} = {result.measured:+.3f}: {tops}. Figure: {result.figure_uri}"
        return structured_result(result, summary, [link])

    @server.tool(annotations=READ_ONLY)
    async def attention(
        prompt: Annotated[str, Field(description="One prompt.")],
        layer: Annotated[int, Field(description="Layer index, 0-based.")],
        head: Annotated[int, Field(description="Query-head index, 0-based.")],
        ctx: Context,
    ) -> Annotated[CallToolResult, AttentionResult]:
        """Attention pattern of one head (query × key, token labels) and the tokens the answer
        position attends to most, with weights."""
        model = await loaded_model(ctx)
        started = time.perf_counter()
        measurement = await guarded(session.run(lens.attention, model, prompt, layer, head))
        title = f"L{layer}H{head} attention"
        png = await session.render(figures.attention_figure, measurement.pattern, measurement.tokens, title)
        measurement.figure_uri, link = store_figure(png, title)
        result = with_provenance(AttentionResult, measurement, started)
        tops = ", ".join(f"{t.token!r}@{t.position} {t.weight:.2f}" for t in result.top_attended)
        return structured_result(result, f"L{layer}H{head} at the answer position attends to: {tops}", [link])

    @server.tool(annotations=READ_ONLY)
    async def induction(
        ctx: Context,
        seq_len: Annotated[int, Field(ge=2, le=512, description="Length of the random sequence (repeated once).")] = 50,
        n_seqs: Annotated[int, Field(ge=1, le=64, description="Number of random sequences.")] = 8,
        seed: Annotated[int, Field(description="Seed of the random tokens (CPU generator).")] = 0,
    ) -> Annotated[CallToolResult, InductionResult]:
        """Induction score of every head: on random tokens repeated twice, the mean attention from each
        token of the second copy to the token after its earlier occurrence. Heatmap; heads sorted."""
        model = await loaded_model(ctx)
        started = time.perf_counter()
        measurement = await guarded(session.run(lens.induction, model, seq_len, n_seqs, seed))
        png = await session.render(figures.layer_head_heatmap, measurement.scores, "induction score", "score", 0.0)
        measurement.figure_uri, link = store_figure(png, "induction scores")
        result = with_provenance(InductionResult, measurement, started)
        tops = ", ".join(f"{c.component} {c.value:.3f}" for c in result.heads[:5])
        return structured_result(result, f"top induction heads: {tops}. Figure: {result.figure_uri}", [link])

    @server.tool(annotations=READ_ONLY)
    async def steer(
        prompt: Annotated[str, Field(description="Prompt to continue.")],
        positive: Annotated[str, Field(description="Text whose direction to add, e.g. 'Love'.")],
        negative: Annotated[str, Field(description="Text whose direction to subtract, e.g. 'Hate'.")],
        layer: Annotated[int, Field(description="Block whose input residual is steered.")],
        coefficient: Annotated[float, Field(description="Multiplier of the steering vector.")],
        ctx: Context,
        max_new_tokens: Annotated[int, Field(ge=1, description="Tokens to generate (server limit applies).")] = 20,
        seed: Annotated[int, Field(description="Recorded; greedy decoding is deterministic.")] = 0,
    ) -> SteerResult:
        """Activation addition: add coefficient × (resid(positive) − resid(negative)) at `layer` and
        compare greedy continuations with and without it. `notes` say when the steered text only
        degenerates (repetition) rather than shifting meaning."""
        return await run(
            ctx, SteerResult, steer_core, prompt, positive, negative, layer, coefficient, max_new_tokens, seed
        )

    @server.tool(annotations=READ_ONLY)
    async def explain(
        prompt: Annotated[str, Field(description="The prompt whose prediction to explain.")],
        answer: Annotated[str, Field(description="The predicted token to explain, e.g. ' Mary'.")],
        baseline: Annotated[str, Field(description="The alternative it beat, e.g. ' John'.")],
        ctx: Context,
        corrupt: Annotated[
            str | None,
            Field(
                description="A minimal-pair prompt (same token length) where the answer should change; "
                "enables exact head patching."
            ),
        ] = None,
        top_k: Annotated[int, Field(ge=1, le=20, description="Components and heads reported.")] = 5,
    ) -> Annotated[CallToolResult, ExplainResult]:
        """Why did the model predict `answer` over `baseline`? Runs the logit lens, DLA, exact head
        patching (with `corrupt`) and the attention of the top heads; returns findings that cite their
        numbers, caveats, time per stage, and a Markdown report (report://…) linking every figure.
        The numbers equal those of the single tools. Progress per stage; cancellable."""
        model = await loaded_model(ctx)
        job = ExplainJob(model, prompt, answer, baseline, corrupt, top_k)
        started = time.perf_counter()
        total = job.total_steps()

        async def progress(done: int, message: str) -> None:
            await ctx.report_progress(done, total, message)

        await guarded(session.run_steps(job.steps(), progress))
        assert job.result is not None and job.lens is not None and job.attribution is not None
        figure_started = time.perf_counter()
        uris: dict[str, str] = {}
        links = []

        def add(name: str, png: bytes) -> None:
            uri, link = store_figure(png, name)
            uris[name] = uri
            links.append(link)

        rows = job.lens.layers
        add(
            "logit lens",
            await session.render(
                figures.logit_lens_figure,
                [r.layer for r in rows],
                [r.target_prob for r in rows],
                [r.target_rank for r in rows],
                job.lens.target,
            ),
        )
        add(
            "direct logit attribution",
            await session.render(
                figures.dla_figure, job.attribution.heads, job.attribution.mlps, job.attribution.quantity
            ),
        )
        if job.patching is not None:
            add(
                "head patching (recovered fraction)",
                await session.render(
                    figures.layer_head_heatmap, job.patching.scores, "patch_heads denoise (exact)", "recovered fraction"
                ),
            )
        for att in job.attentions:
            name = f"L{att.layer}H{att.head} attention"
            add(name, await session.render(figures.attention_figure, att.pattern, att.tokens, name))
        job.result.stage_seconds["figures"] = round(time.perf_counter() - figure_started, 3)
        job.result.figure_uris = list(uris.values())
        report = report_markdown(job.result, session.model_ref(), uris)
        stored = session.store.put("report", report.encode())
        job.result.report_uri = stored.uri
        links.append(
            ResourceLink(
                type="resource_link",
                uri=stored.uri,
                name="explain report",
                mime_type="text/markdown",
                size=len(report.encode()),
            )
        )
        result = with_provenance(ExplainResult, job.result, started)
        summary = "\n".join(["explain: " + result.findings[0], *result.findings[1:], f"Report: {stored.uri}"])
        return structured_result(result, summary, links)

    @server.resource(
        "figure://{figure_id}",
        name="figure",
        description="A PNG figure produced by a tool; its URI is in that tool's result.",
        mime_type="image/png",
    )
    def figure(figure_id: str) -> bytes:
        return stored_bytes("figure", figure_id)

    @server.resource(
        "report://{report_id}",
        name="report",
        description="A Markdown report written by `explain`; it cites every number and links every figure.",
        mime_type="text/markdown",
    )
    def report(report_id: str) -> str:
        return stored_bytes("report", report_id).decode("utf-8")

    register_swap_tools(server, session, loaded_model, with_provenance, store_figure, guarded)
    register_prompts(server)
    return server
