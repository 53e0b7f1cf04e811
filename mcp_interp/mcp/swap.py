"""Causal-swap tools: ``causal_swap_trial``, ``causal_swap_benchmark``, ``verify_artifact``, ``fit_lens`` and
the ``artifact://`` resource. The protocol, its statistics and the artifact document are in ``core/swap/``."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ResourceLink
from pydantic import Field

from mcp_interp.core.swap import artifact
from mcp_interp.core.swap import figures as swap_figures
from mcp_interp.core.swap.benchmark import SwapBenchmarkJob, prepare_benchmark
from mcp_interp.core.swap.lenses import FitLensJob, default_fit
from mcp_interp.core.swap.trial import MAX_ALPHA, trial_with_lens
from mcp_interp.mcp.arguments import Background
from mcp_interp.mcp.family import WRITES_CACHE, Family
from mcp_interp.mcp.toolkit import ToolContext, Toolkit, error_boundary
from mcp_interp.schemas.swap import (
    FitLensResult,
    FitSettings,
    PositionSetting,
    SwapBenchmarkMeasurement,
    SwapBenchmarkResult,
    SwapSettings,
    SwapTrialResult,
    VerifyArtifactResult,
)
from mcp_interp.state.store import parse_uri
from mcp_interp.version import __version__

family = Family("swap")

Lens = Annotated[
    Literal["jacobian", "logit"],
    Field(
        description="jacobian: `lens_path`, the newest fitted lens, or a default fit (~4 min, cached); logit: J = I."
    ),
]
LensPath = Annotated[str | None, Field(description="A .pt Jacobian-lens file.")]
Position = Annotated[
    PositionSetting,
    Field(description="Edited token: 'concept' (the source word's last token), 'last' or an index."),
]
Alpha = Annotated[
    float,
    Field(
        ge=-MAX_ALPHA,
        le=MAX_ALPHA,
        description="h += α·c_src·(v_target − v_source); 1 = full substitution, > 1 extrapolates (controls alike).",
    ),
]
K = Annotated[int, Field(ge=1, le=25, description="Atoms in the sparse decomposition.")]
Seeds = Annotated[
    list[int],
    Field(min_length=1, max_length=20, description="One displacement-matched control per seed."),
]
Tolerance = Annotated[
    float,
    Field(ge=0, le=10, description="|‖v_t−v_src‖ − ‖v_tgt−v_src‖| ≤ tol·‖v_tgt−v_src‖ for controls."),
]
TargetKnown = Annotated[
    bool,
    Field(description="Exclude trials whose target fact the model does not know."),
]


@family.tool(annotations=WRITES_CACHE)
async def causal_swap_trial(
    template: Annotated[
        str,
        Field(description="'The capital of {arg} is the'; source 'France', answer 'Paris'; target 'Canada', 'Ottawa'."),
    ],
    source: str,
    target: str,
    source_answer: str,
    target_answer: str,
    layer: Annotated[int, Field(ge=0, description="The block whose output is edited.")],
    ctx: ToolContext,
    lens: Lens = "jacobian",
    lens_path: LensPath = None,
    position: Position = "concept",
    alpha: Alpha = 1.0,
    k: K = 25,
    control_seeds: Seeds = [0, 1, 2, 3, 4],  # noqa: B006 - pydantic copies defaults
    control_tolerance: Tolerance = 0.1,
    require_target_known: TargetKnown = True,
    fit_if_missing: Annotated[
        bool, Field(description="Fit the default Jacobian lens first when none is cached (minutes).")
    ] = False,
) -> Annotated[CallToolResult, SwapTrialResult]:
    """One controlled causal-swap trial: edit the source concept's lens coordinate toward the target at `layer`;
    the real edit and one displacement-matched control per seed, scored on the target answer (strict top-1)."""
    settings = SwapSettings(
        lens=lens,
        position=position,
        alpha=alpha,
        k=k,
        control_seeds=control_seeds,
        control_tolerance=control_tolerance,
        require_target_known=require_target_known,
    )
    kit = Toolkit.of(ctx)
    fit = await kit.call(default_fit, await kit.model(ctx), lens, lens_path, locked=False)
    if fit is not None and not fit_if_missing:
        raise ToolError(
            f"No Jacobian lens is cached for these weights, and fitting the default one costs {fit.cost()}. Fit it "
            "first with fit_lens (background: true lets you follow it with job_status), pass fit_if_missing: true to "
            "fit it here with progress, or use lens='logit' (no fit)."
        )
    if fit is not None:  # asked for: the first Jacobian-lens run on these weights fits the default lens (cached after)
        await kit.run_job(ctx, fit)
    trial = (template, source, target, source_answer, target_answer, layer, settings)
    result = await kit.measure(ctx, SwapTrialResult, trial_with_lens, lens, lens_path, *trial)
    if fit is not None:
        result.notes.append(f"Fitted the default Jacobian lens first ({fit.fit_seconds:.0f} s); cached at {fit.path}.")
    record = result.trial
    summary = f"causal_swap_trial {source} → {target} at layer {layer}: status {record.status}."
    return kit.finish(result, summary, [])


async def layers_figure(kit: Toolkit, measurement: SwapBenchmarkMeasurement, title: str) -> tuple[str, ResourceLink]:
    """Median margin gain and strict success rate by layer, real edits against their controls."""
    m = len(measurement.settings.control_seeds)
    return await kit.figure(title, swap_figures.swap_layers_figure, measurement.summary.by_layer, m, title)


def benchmark_text(result: SwapBenchmarkResult, layers: list[int]) -> str:
    """The one-paragraph summary: statuses, ledger size, the verdict (strict swap and specificity), the URIs."""
    summary, settings = result.summary, result.settings
    counts = ", ".join(f"{name} {n}" for name, n in summary.status_counts.items())
    real = summary.real
    return (
        f"causal_swap_benchmark ({settings.lens} lens, position {settings.position}, layers {layers[0]}–{layers[-1]}): "
        f"{counts}; {len(result.exclusions)} exclusions; {summary.n_independent_prompts} independent prompts; strict "
        f"rate {real.successes}/{real.n} [{real.ci_low:.3f}, {real.ci_high:.3f}]. {summary.verdict} Figure: "
        f"{result.figure_uri}; artifact: {result.artifact_uri}"
    )


async def store_artifact(
    kit: Toolkit, job: SwapBenchmarkJob, measurement: SwapBenchmarkMeasurement, started: float
) -> ResourceLink:
    """The versioned, fingerprinted JSON document of the run, stored and named in the result."""
    timing = {"elapsed_s": round(time.perf_counter() - started, 3)}
    document = artifact.benchmark_document(job, kit.host.model_ref(), __version__, timing)
    uri, link = kit.store("artifact", artifact.encode_artifact(document), "causal swap artifact")
    measurement.artifact_uri = uri
    measurement.artifact_path = str(kit.workspace.store.path("artifact", uri.partition("://")[2]))
    measurement.fingerprints = document["fingerprints"]
    return link


@family.tool(annotations=WRITES_CACHE, background=True)
async def causal_swap_benchmark(
    ctx: ToolContext,
    corpus: Annotated[
        Literal["capitals_languages", "countries"] | dict[str, Any],
        Field(description="A shipped corpus, or your own: {name, concepts, functions: [{name, template, answers}]}."),
    ] = "capitals_languages",
    layers: Annotated[
        list[int] | None,
        Field(description="Default: every layer the lens covers."),
    ] = None,
    lens: Lens = "jacobian",
    lens_path: LensPath = None,
    position: Position = "concept",
    alpha: Alpha = 1.0,
    k: K = 25,
    control_seeds: Seeds = [0, 1, 2, 3, 4],  # noqa: B006 - pydantic copies defaults
    control_tolerance: Tolerance = 0.1,
    require_target_known: TargetKnown = True,
    background: Background = False,
) -> Annotated[CallToolResult, SwapBenchmarkResult]:
    """The causal-swap protocol over a corpus at every layer: real vs control success with exact intervals and
    prompt-level tests, the exclusion ledger, a fingerprinted artifact://. ~6 min embedded (use background)."""
    kit = Toolkit.of(ctx)
    model = await kit.model(ctx)
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
    run = await kit.call(prepare_benchmark, model, corpus, layers, lens, lens_path, settings, locked=False)
    await kit.run_job(ctx, run)
    job = run.benchmark
    assert job is not None and job.result is not None
    title = f"causal swap ({settings.lens} lens, position {settings.position}): {model.name}"
    job.result.figure_uri, figure_link = await layers_figure(kit, job.result, title)
    artifact_link = await store_artifact(kit, job, job.result, started)
    result = kit.with_provenance(SwapBenchmarkResult, job.result, started)
    return kit.finish(result, benchmark_text(result, job.layers), [figure_link, artifact_link])


@family.tool()
async def verify_artifact(
    ctx: ToolContext,
    artifact_uri: Annotated[str | None, Field(description="artifact://… from causal_swap_benchmark.")] = None,
    artifact_json: Annotated[str | dict[str, Any] | None, Field(description="Or the artifact itself.")] = None,
) -> Annotated[CallToolResult, VerifyArtifactResult]:
    """Check a causal-swap artifact's schema, definitions and SHA-256 fingerprints; names an altered block."""
    kit = Toolkit.of(ctx)
    if (artifact_uri is None) == (artifact_json is None):
        raise ToolError("Pass one of `artifact_uri` (artifact://… as a benchmark returned it) or `artifact_json`.")
    if artifact_uri is not None:
        with error_boundary():
            entry = parse_uri(artifact_uri, "artifact")
            artifact_json = kit.read_entry("artifact", entry.id).decode("utf-8")
    assert artifact_json is not None
    result = artifact.verify(artifact_json)
    verdict = "valid" if result.valid else f"NOT valid: {result.message}"
    return kit.finish(result, f"verify_artifact: {verdict}", [])


@family.tool(annotations=WRITES_CACHE, background=True)
async def fit_lens(
    ctx: ToolContext,
    texts: Annotated[
        list[str] | None,
        Field(description="Default: the shipped paragraphs."),
    ] = None,
    corpus_name: Annotated[str | None, Field(description="Recorded in provenance.")] = None,
    max_prompts: Annotated[int, Field(ge=1, le=1000)] = 8,
    max_seq_len: Annotated[int, Field(ge=3, le=512, description="Tokens per text.")] = 32,
    skip_first_positions: Annotated[
        int,
        Field(ge=0, le=256, description="Leading positions left out (attention sinks)."),
    ] = 4,
    dim_batch: Annotated[int, Field(ge=1, le=1024, description="Output dimensions per backward pass.")] = 32,
    force: Annotated[bool, Field(description="Refit even when cached.")] = False,
    background: Background = False,
) -> Annotated[CallToolResult, FitLensResult]:
    """Fit (or reuse) a Jacobian lens for `lens="jacobian"`, cached by weights, texts and settings."""
    kit = Toolkit.of(ctx)
    model = await kit.model(ctx)
    started = time.perf_counter()
    settings = FitSettings(
        max_prompts=max_prompts, max_seq_len=max_seq_len, dim_batch=dim_batch, skip_first_positions=skip_first_positions
    )
    job = await kit.call(
        lambda: FitLensJob(model=model, settings=settings, texts=texts, corpus=corpus_name, force=force), locked=False
    )
    await kit.run_job(ctx, job)
    assert job.result is not None
    result = kit.with_provenance(FitLensResult, job.result, started)
    return kit.finish(result, f"fit_lens: {'reused' if result.from_cache else 'fitted'} {result.lens.path}", [])


@family.resource(
    "artifact://{artifact_id}",
    name="artifact",
    description="A versioned JSON artifact of a causal_swap_benchmark run (protocol, run, results, SHA-256 prints).",
    mime_type="application/json",
)
def artifact_resource(artifact_id: str, ctx: ToolContext) -> str:
    return Toolkit.of(ctx).read("artifact", artifact_id).decode("utf-8")
