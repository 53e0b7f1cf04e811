"""Figures of ``explain``: each stage drawn as its single tool draws it (the lens, heads and localize families'
plots), so explain's pictures are theirs."""

from __future__ import annotations

from mcp_interp.core.explain.job import ExplainJob
from mcp_interp.core.heads.figures import heads_plot
from mcp_interp.core.lens.figures import attention_plot, dla_plot, logit_lens_plot
from mcp_interp.core.localize.figures import patch_plot
from mcp_interp.figures import Plot


def stage_plots(job: ExplainJob, model_name: str) -> list[Plot]:
    """Every stage's figure of a finished job; each plot's name is what the report cites it under."""
    assert job.lens is not None and job.attribution is not None
    plots = [logit_lens_plot(job.lens, "logit lens"), dla_plot(job.attribution, "direct logit attribution")]
    if job.patching is not None:
        plots.append(heads_plot(job.patching, model_name, "head patching (recovered fraction)"))
    plots += [patch_plot(patched, model_name) for patched in job.maps.values()]
    plots += [attention_plot(attention) for attention in job.attentions]
    return plots
