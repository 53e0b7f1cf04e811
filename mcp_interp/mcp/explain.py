"""``explain``: one call that runs the logit lens, DLA, exact head patching, the layer × position maps and the top
heads' attention, then writes a Markdown report (``report://``) citing every number. The stages' figures are the
single tools' own plots (``core/explain/figures``), so explain's pictures are theirs."""

from __future__ import annotations

import time
from typing import Annotated

from mcp.types import CallToolResult
from pydantic import Field

from mcp_interp.core.explain.figures import stage_plots
from mcp_interp.core.explain.job import ExplainJob
from mcp_interp.core.explain.report import report_markdown
from mcp_interp.mcp.family import Family
from mcp_interp.mcp.toolkit import ToolContext, Toolkit
from mcp_interp.schemas.explain import ExplainResult

family = Family("explain")


@family.tool()
async def explain(
    prompt: str,
    answer: Annotated[str, Field(description="The predicted token, e.g. ' Mary'.")],
    baseline: Annotated[str, Field(description="The alternative it beat, e.g. ' John'.")],
    ctx: ToolContext,
    corrupt: Annotated[
        str | None, Field(description="A minimal-pair prompt (same token length): enables exact patching.")
    ] = None,
    top_k: Annotated[int, Field(ge=1, le=20, description="Components and heads reported.")] = 5,
) -> Annotated[CallToolResult, ExplainResult]:
    """Why `answer` over `baseline`? Logit lens, DLA, top heads' attention; with `corrupt` also exact head and
    layer × position patching (carrying positions, moves, MLPs). Findings citing numbers, figures, report://."""
    kit = Toolkit.of(ctx)
    model = await kit.model(ctx)
    job = ExplainJob(model=model, prompt=prompt, answer=answer, baseline=baseline, corrupt=corrupt, top_k=top_k)
    started = time.perf_counter()
    await kit.run_job(ctx, job)
    assert job.result is not None
    figure_started = time.perf_counter()
    drawn = [await kit.draw(plot) for plot in stage_plots(job, model.name)]
    uris, links = {link.name: uri for uri, link in drawn}, [link for _, link in drawn]
    job.result.stage_seconds["figures"] = round(time.perf_counter() - figure_started, 3)
    job.result.figure_uris = list(uris.values())
    report = report_markdown(job.result, kit.host.model_ref(), uris)
    job.result.report_uri, report_link = kit.store("report", report.encode(), "explain report")
    result = kit.with_provenance(ExplainResult, job.result, started)
    summary = "\n".join(["explain: " + result.findings[0], *result.findings[1:], f"Report: {result.report_uri}"])
    return kit.finish(result, summary, [*links, report_link])
