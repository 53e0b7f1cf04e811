"""``explain``: one call that runs the logit lens, DLA, exact head patching, the layer × position maps and the top
heads' attention,
then writes a Markdown report (``report://``) citing every number. The stages' figures are drawn by the
same helpers as the single tools, so explain's pictures are theirs."""

from __future__ import annotations

import time
from typing import Annotated

from mcp.types import CallToolResult, ResourceLink
from pydantic import Field

from mcp_interp.core.explain.job import ExplainJob
from mcp_interp.core.explain.report import report_markdown
from mcp_interp.mcp.family import Family
from mcp_interp.mcp.heads import heads_heatmap
from mcp_interp.mcp.lens import attention_figure, dla_figure, logit_lens_figure
from mcp_interp.mcp.localize import patch_figure
from mcp_interp.mcp.toolkit import ToolContext, Toolkit
from mcp_interp.schemas.explain import ExplainResult

family = Family("explain")


async def stage_figures(kit: Toolkit, job: ExplainJob, model_name: str) -> tuple[dict[str, str], list[ResourceLink]]:
    """Every stage's figure, by the name the report cites it under."""
    assert job.lens is not None and job.attribution is not None
    drawn = [
        await logit_lens_figure(kit, job.lens, "logit lens"),
        await dla_figure(kit, job.attribution, "direct logit attribution"),
    ]
    if job.patching is not None:
        drawn.append(await heads_heatmap(kit, job.patching, model_name, "head patching (recovered fraction)"))
    drawn += [await patch_figure(kit, patched, model_name) for patched in job.maps.values()]
    drawn += [await attention_figure(kit, attention) for attention in job.attentions]
    return {link.name: uri for uri, link in drawn}, [link for _, link in drawn]


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
    uris, links = await stage_figures(kit, job, model.name)
    job.result.stage_seconds["figures"] = round(time.perf_counter() - figure_started, 3)
    job.result.figure_uris = list(uris.values())
    report = report_markdown(job.result, kit.session.model_ref(), uris)
    job.result.report_uri, report_link = kit.store("report", report.encode(), "explain report")
    result = kit.with_provenance(ExplainResult, job.result, started)
    summary = "\n".join(["explain: " + result.findings[0], *result.findings[1:], f"Report: {result.report_uri}"])
    return kit.finish(result, summary, [*links, report_link])
