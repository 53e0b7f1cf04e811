"""MCP adapters of the causal-swap protocol: ``causal_swap_trial``, ``causal_swap_benchmark``,
``verify_artifact``, ``fit_lens`` and the ``artifact://`` resource. Thin: the science is in
``core/causal_swap.py``, ``core/lenses.py`` and ``core/artifact.py``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Protocol, TypeVar

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.types import CallToolResult, ResourceLink, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from mcp_interp import __version__, figures
from mcp_interp.core import artifact
from mcp_interp.core import causal_swap as swap_core
from mcp_interp.core.lenses import FitLensJob, resolve_lens
from mcp_interp.core.swap_corpus import load_corpus
from mcp_interp.schemas.common import Measurement
from mcp_interp.schemas.swap import (
    FitLensMeasurement,
    FitLensResult,
    FitSettings,
    PositionSetting,
    SwapBenchmarkResult,
    SwapCorpus,
    SwapSettings,
    SwapTrialResult,
    VerifyArtifactResult,
)
from mcp_interp.session import Session
from mcp_interp.store import NotFound

R = TypeVar("R", bound=BaseModel)
READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False, destructive_hint=False)
WRITES_CACHE = ToolAnnotations(
    read_only_hint=False, idempotent_hint=True, open_world_hint=False, destructive_hint=False
)

Lens = Annotated[
    Literal["logit", "jacobian"],
    Field(
        description="logit: J = I (atoms are unembedding columns; no fitting). jacobian: a Jacobian lens fitted with "
        "fit_lens for this model (the newest one, or the file in lens_path)."
    ),
]
LensPath = Annotated[str | None, Field(description="A .pt Jacobian-lens file to use (lens='jacobian').")]
Position = Annotated[
    PositionSetting,
    Field(
        description="Which activation to edit: 'last' (the answer position), 'concept' (the last token of the source "
        "word in the prompt) or a token index."
    ),
]
Alpha = Annotated[float, Field(ge=-10, le=10, description="Edit strength: h += α·c_src·(v_target − v_source).")]
K = Annotated[int, Field(ge=1, le=25, description="Most atoms in the sparse non-negative decomposition.")]
Seeds = Annotated[
    list[int],
    Field(min_length=1, max_length=20, description="One displacement-matched control draw per seed (CPU generator)."),
]
Tolerance = Annotated[
    float,
    Field(ge=0, le=10, description="Control tokens satisfy |‖v_t−v_src‖ − ‖v_tgt−v_src‖| ≤ tol·‖v_tgt−v_src‖."),
]
TargetKnown = Annotated[
    bool,
    Field(description="Exclude trials whose target fact the model does not know (target prompt not strict top-1)."),
]


class WithProvenance(Protocol):
    def __call__(self, result_type: type[R], measurement: Measurement, started: float) -> R: ...


def register_swap_tools(
    server: MCPServer[Session],
    session: Session,
    loaded_model: Callable[[Context], Awaitable[Any]],
    with_provenance: WithProvenance,
    store_figure: Callable[[bytes, str], tuple[str, ResourceLink]],
    guarded: Callable[[Awaitable[Any]], Awaitable[Any]],
) -> None:
    """Register the causal-swap tools, reusing the server's helpers (model wait, provenance, figure store,
    and ``guarded``, which turns core's caller-facing errors into tool errors)."""

    @server.tool(annotations=READ_ONLY)
    async def causal_swap_trial(
        template: Annotated[str, Field(description="Prompt with one '{arg}' slot: 'The capital of {arg} is the'.")],
        source: Annotated[str, Field(description="The concept in the prompt, e.g. 'France' (atom: ' France').")],
        target: Annotated[str, Field(description="The concept to swap in, e.g. 'Canada'.")],
        source_answer: Annotated[str, Field(description="The source prompt's answer word, e.g. 'Paris'.")],
        target_answer: Annotated[str, Field(description="The answer a successful swap gives, e.g. 'Ottawa'.")],
        layer: Annotated[int, Field(ge=0, description="Edit the output of this block.")],
        ctx: Context,
        lens: Lens = "logit",
        lens_path: LensPath = None,
        position: Position = "last",
        alpha: Alpha = 1.0,
        k: K = 25,
        control_seeds: Seeds = [0, 1, 2, 3, 4],  # noqa: B006 - pydantic copies defaults
        control_tolerance: Tolerance = 0.1,
        require_target_known: TargetKnown = True,
    ) -> SwapTrialResult:
        """One controlled causal-swap trial: does editing the source concept's lens coordinate toward the
        target (at one layer and position) make the model give the target's answer? Runs the baseline filter
        (the source answer must be the strict top-1), the real edit (skipped if the source atom is not in the
        activation's active sparse support) and one displacement-matched control edit per seed, all scored on the
        target answer (success = strict top-1; rank 0 = top-1; margin = its logit − best other). Words are
        resolved as the single token of ' ' + word. One trial is an anecdote: use causal_swap_benchmark for rates."""
        model = await loaded_model(ctx)
        started = time.perf_counter()
        settings = SwapSettings(
            lens=lens,
            position=position,
            alpha=alpha,
            k=k,
            control_seeds=control_seeds,
            control_tolerance=control_tolerance,
            require_target_known=require_target_known,
        )

        def work() -> Measurement:
            lens_object, info = resolve_lens(model, lens, lens_path)
            return swap_core.causal_swap_trial(
                model, lens_object, info, template, source, target, source_answer, target_answer, layer, settings
            )

        measurement = await guarded(session.run(work))
        return with_provenance(SwapTrialResult, measurement, started)

    @server.tool(annotations=READ_ONLY)
    async def causal_swap_benchmark(
        ctx: Context,
        corpus: Annotated[
            Literal["countries"] | SwapCorpus,
            Field(
                description="'countries' (shipped: capital, language, continent, currency × France, Canada, China, "
                "Egypt) or your own corpus object of the same shape."
            ),
        ] = "countries",
        layers: Annotated[
            list[int] | None,
            Field(description="Layers to edit, one trial per layer (default: every layer the lens covers)."),
        ] = None,
        lens: Lens = "logit",
        lens_path: LensPath = None,
        position: Position = "last",
        alpha: Alpha = 1.0,
        k: K = 25,
        control_seeds: Seeds = [0, 1, 2, 3, 4],  # noqa: B006 - pydantic copies defaults
        control_tolerance: Tolerance = 0.1,
        require_target_known: TargetKnown = True,
    ) -> Annotated[CallToolResult, SwapBenchmarkResult]:
        """Run the causal-swap protocol over a corpus: every (function, source, target) at every layer. Returns
        trial-status counts, the layers where trials executed, the exclusion ledger (prompts the model cannot answer,
        words that are not one token), real and control success rates with exact Clopper–Pearson 95% intervals and
        n_independent_prompts, the control rate's spread across seeds, a paired sign test (McNemar per seed), a
        figure (rate by layer) and a versioned JSON artifact (artifact://…) with every trial, SHA-256-fingerprinted.
        Progress per trial; cancellable. On the embedded model about 6 s per layer on 2 CPU cores."""
        model = await loaded_model(ctx)
        started = time.perf_counter()
        settings = SwapSettings(
            lens=lens,
            position=position,
            alpha=alpha,
            k=k,
            control_seeds=control_seeds,
            control_tolerance=control_tolerance,
            require_target_known=require_target_known,
        )

        def prepare() -> swap_core.SwapBenchmarkJob:
            corpus_object = load_corpus(corpus) if isinstance(corpus, str) else corpus
            lens_object, info = resolve_lens(model, lens, lens_path)
            chosen = layers if layers is not None else info.source_layers
            return swap_core.SwapBenchmarkJob(model, corpus_object, chosen, lens_object, info, settings)

        job = await guarded(session.run_unlocked(prepare))
        total = job.total_steps()

        async def progress(done: int, message: str) -> None:
            await ctx.report_progress(done, total, message)

        await guarded(session.run_steps(job.steps(), progress))
        assert job.result is not None
        measurement = job.result
        summary = measurement.summary
        title = f"causal swap ({settings.lens} lens, position {settings.position}): {model.name}"

        def rows(attribute: str) -> list[tuple[float | None, float, float, int]]:
            return [
                (r.rate, r.ci_low, r.ci_high, r.n) for r in (getattr(layer, attribute) for layer in summary.by_layer)
            ]

        png = await session.render(figures.swap_rates_figure, summary.layers, rows("real"), rows("control"), title)
        measurement.figure_uri, link = store_figure(png, title)
        manifest = {
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "mcp_interp_version": __version__,
            "model": session.model_ref().model_dump(mode="json"),
            "corpus": job.corpus.model_dump(mode="json"),
            "lens": job.lens_info.model_dump(mode="json"),
            "settings": settings.model_dump(mode="json"),
            "layers": job.layers,
            "mechanism": settings.mechanism,
        }
        results = {
            "summary": summary.model_dump(mode="json"),
            "exclusions": [e.model_dump(mode="json") for e in measurement.exclusions],
            "trials": [t.model_dump(mode="json") for t in job.trials],
        }
        document = artifact.build(manifest, results)
        data = artifact.encode(document)
        stored = session.store.put("artifact", data)
        measurement.artifact_uri = stored.uri
        measurement.artifact_path = str(session.store.path("artifact", stored.id))
        measurement.fingerprints = document["fingerprints"]
        result = with_provenance(SwapBenchmarkResult, measurement, started)
        counts = ", ".join(f"{name} {n}" for name, n in summary.status_counts.items())

        def fmt(r: Any) -> str:
            shown = "n/a" if r.rate is None else f"{r.rate:.3f}"
            return f"{r.successes}/{r.n} = {shown} [{r.ci_low:.3f}, {r.ci_high:.3f}]"

        text = (
            f"causal_swap_benchmark ({settings.lens} lens, position {settings.position}, layers {job.layers}): "
            f"{counts}; "
            f"{len(measurement.exclusions)} exclusions. Real {fmt(summary.real)}, control {fmt(summary.control)}, "
            f"{summary.n_independent_prompts} independent prompts; paired sign test p = {summary.paired.p_value:.3g}. "
            f"Figure: {measurement.figure_uri}; artifact: {stored.uri}"
        )
        artifact_link = ResourceLink(
            type="resource_link",
            uri=stored.uri,
            name="causal swap artifact",
            mime_type="application/json",
            size=len(data),
        )
        return CallToolResult(
            content=[TextContent(type="text", text=text), link, artifact_link],
            structured_content=result.model_dump(mode="json"),
        )

    @server.tool(annotations=READ_ONLY)
    async def verify_artifact(
        artifact_json: Annotated[
            str | dict[str, Any],
            Field(description="A causal-swap artifact: its JSON text (as read from artifact://…) or the object."),
        ],
    ) -> VerifyArtifactResult:
        """Check a causal-swap artifact: schema name and version, and the SHA-256 fingerprint of the manifest, the
        results and each result block (summary, exclusions, trials). Names exactly which block was altered."""
        return artifact.verify(artifact_json)

    @server.tool(annotations=WRITES_CACHE)
    async def fit_lens(
        ctx: Context,
        texts: Annotated[
            list[str] | None,
            Field(description="Texts to fit on (default: the 48 shipped paragraphs, data/corpora/lens_corpus.json)."),
        ] = None,
        corpus_name: Annotated[str | None, Field(description="A name for your texts, recorded in provenance.")] = None,
        max_prompts: Annotated[int, Field(ge=1, le=1000, description="Use at most this many texts.")] = 48,
        max_seq_len: Annotated[int, Field(ge=18, le=512, description="Tokens per text (first 16 not fitted).")] = 64,
        dim_batch: Annotated[int, Field(ge=1, le=1024, description="Output dimensions per backward pass.")] = 32,
        force: Annotated[bool, Field(description="Refit even when an identical fit is cached.")] = False,
    ) -> FitLensResult:
        """Fit a Jacobian lens (TransformerLens JacobianLens.fit: the average Jacobian of the final block's output
        with respect to each earlier block's output) for the loaded model and cache it on disk, keyed by the weight
        fingerprint, the texts' hash and these settings; an identical fit is reused. Needed for lens='jacobian'.
        Costs one forward and ⌈d_model/dim_batch⌉ backward passes per text (about 50 s per 64-token text for the
        embedded model on a 2-core CPU). Progress per text; cancellable (nothing is saved until the end)."""
        model = await loaded_model(ctx)
        started = time.perf_counter()
        settings = FitSettings(max_prompts=max_prompts, max_seq_len=max_seq_len, dim_batch=dim_batch)
        job = await guarded(session.run_unlocked(lambda: FitLensJob(model, settings, texts, corpus_name, force)))
        total = job.total_steps()

        async def progress(done: int, message: str) -> None:
            await ctx.report_progress(done, total, message)

        await guarded(session.run_steps(job.steps(), progress))
        assert job.info is not None
        measurement = FitLensMeasurement(
            lens=job.info,
            from_cache=job.from_cache,
            fit_seconds=round(job.fit_seconds, 3),
            skipped_short_texts=job.skipped_short,
        )
        return with_provenance(FitLensResult, measurement, started)

    @server.resource(
        "artifact://{artifact_id}",
        name="artifact",
        description="A versioned JSON artifact of a causal_swap_benchmark run (manifest, results, SHA-256 prints).",
        mime_type="application/json",
    )
    def artifact_resource(artifact_id: str) -> str:
        try:
            return session.store.get("artifact", artifact_id).decode("utf-8")
        except NotFound as exc:
            raise ResourceError(str(exc)) from exc
