"""The causal-swap benchmark on the real embedded model."""

from __future__ import annotations

import pytest
import torch

from mcp_interp.core.engine.backend.model import LoadedModel

pytestmark = pytest.mark.embedded


def test_causal_swap_benchmark_on_the_country_corpus(embedded: LoadedModel) -> None:
    """Structure only (no success-rate claims): every slot accounted for, the two-token ' Pound' scored
    teacher-forced against a hand computation, baselines checked against a direct forward, summary
    consistent with the trials."""
    from mcp_interp.core.swap.benchmark import SwapBenchmarkJob
    from mcp_interp.core.swap.corpus import load_corpus
    from mcp_interp.core.swap.lenses import identity_lens
    from mcp_interp.schemas.swap import SwapSettings

    corpus = load_corpus("countries")
    lens, info = identity_lens(embedded)
    settings = SwapSettings(
        lens="logit",
        position="concept",
        alpha=1.0,
        k=25,
        control_seeds=[0, 1, 2, 3, 4],
        control_tolerance=0.1,
        require_target_known=True,
    )
    job = SwapBenchmarkJob(model=embedded, corpus=corpus, layers=[3, 15], lens=lens, lens_info=info, settings=settings)
    steps = list(job.steps())
    assert len(steps) == job.total_steps() == 1 + 48 * 2
    result = job.result
    assert result is not None
    pound = [e for e in result.exclusions if e.kind == "prompt" and e.concept == "Egypt" and e.function == "currency"]
    assert len(pound) == 1 and "not capable" in pound[0].reason and "' Pound'" in pound[0].reason
    # ' Pound' = ' P' + 'ound': its margin is the smaller of the two teacher-forced steps' margins.
    text = "The single-word name for the currency now used in Egypt is the"
    prompt = embedded.tokenizer(text, return_tensors="pt").input_ids[0].tolist()
    pieces = embedded.tokenizer(" Pound", add_special_tokens=False).input_ids
    assert len(pieces) == 2 and pound[0].prompt == text
    with torch.no_grad():
        steps = embedded.bridge(torch.tensor([prompt + pieces[:1]]), return_type="logits")[0, -2:].double()
    margins = [float(steps[k, t] - torch.cat([steps[k, :t], steps[k, t + 1 :]]).max()) for k, t in enumerate(pieces)]
    assert pound[0].margin == pytest.approx(min(margins), abs=1e-4)
    egypt_currency = [
        e
        for e in result.exclusions
        if e.kind == "trial" and e.function == "currency" and "Egypt" in (e.source, e.target)
    ]
    assert len(egypt_currency) == 6  # Egypt as source (3 targets) or target (3 sources)
    assert len(job.trials) + result.summary.excluded_trials == 48 * 2
    assert sum(result.summary.status_counts.values()) == len(job.trials)
    # Each trial's baseline equals a direct unpadded forward of its prompt.
    trial = job.trials[0]
    ids = embedded.tokenizer(trial.prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = embedded.bridge(ids, return_type="logits")[0, -1]
    assert trial.baseline is not None and trial.baseline.source_answer.top1
    assert float(logits[trial.baseline.source_answer.token_id]) == pytest.approx(
        trial.baseline.source_answer.logit, abs=1e-4
    )
    assert embedded.tokenizer.decode([ids[0, trial.position]]).strip() == trial.source == trial.position_token.strip()
    for record in job.trials:
        assert record.status in ("executed", "skipped_source_inactive", "skipped_no_control_token")
        inactive = record.status == "skipped_source_inactive"
        assert inactive == ("not in the active support" in (record.detail or ""))
        assert bool(record.support)
        executed = record.status == "executed"
        assert (len(record.controls) == 5 and record.real is not None) == executed
    executed = [t for t in job.trials if t.status == "executed"]
    assert result.summary.real.n == len(executed)
    assert result.summary.control.n == 5 * len(executed)
