"""`explain` on the real embedded model agrees with the single tools."""

from __future__ import annotations

import pytest

from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.lens.dla import dla
from mcp_interp.corpora import ioi_pairs
from mcp_interp.models import LoadedModel

pytestmark = pytest.mark.embedded


def test_explain_on_smollm2_agrees_with_single_tools(embedded: LoadedModel) -> None:
    from mcp_interp.core.explain.job import ExplainJob
    from mcp_interp.core.heads.patch_heads import PatchHeadsJob

    pair = ioi_pairs()[0]
    job = ExplainJob(
        model=embedded, prompt=pair.clean, answer=pair.correct, baseline=pair.incorrect, corrupt=pair.corrupt
    )
    drain(job)
    assert job.result is not None
    single_dla = dla(embedded, pair.clean, pair.correct, pair.incorrect, top_k=10)
    patch = PatchHeadsJob(
        model=embedded,
        clean_prompts=[pair.clean],
        corrupt_prompts=[pair.corrupt],
        correct=pair.correct,
        incorrect=pair.incorrect,
    )
    drain(patch)
    assert patch.result is not None
    assert job.result.top_dla == single_dla.top[:5]
    assert [c.head for c in job.result.causal_heads or []] == [h.head for h in patch.result.heads[:5]]
    print("\nexplain on SmolLM2 (IOI):\n  " + "\n  ".join(job.result.findings))
    print(f"  stage seconds: {job.result.stage_seconds}")
