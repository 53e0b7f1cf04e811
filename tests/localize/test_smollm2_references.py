"""The localize family on the real embedded model (SmolLM2-135M-Instruct): ``patch`` against TransformerLens'
patching functions on every component (stored references, and one live rerun), sequence answers on the real
tokenizer, ``ablate`` of an MLP, and ``loss``."""

from __future__ import annotations

import pytest
import torch

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.engine.text.answers import resolve_answers
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.localize.ablate import ablate
from mcp_interp.core.localize.loss import text_losses
from mcp_interp.core.localize.patch import PatchJob
from mcp_interp.core.readouts import predictions as readouts
from mcp_interp.schemas.common import Intervention
from mcp_interp.schemas.localize import PatchMeasurement
from tests import smollm2_references as refs
from tests.smollm2_references import CLEAN, CORRECT, INCORRECT

pytestmark = pytest.mark.embedded


def ours(model: LoadedModel, component: str, layers: list[int]) -> PatchMeasurement:
    job = PatchJob(
        model=model,
        clean_prompts=refs.CLEAN,
        corrupt_prompts=refs.CORRUPT,
        correct=refs.CORRECT,
        incorrect=refs.INCORRECT,
        component=component,
        layers=layers,
    )
    drain(job)
    assert job.result is not None and job.sweep is not None and job.sweep.startswith("suffix")
    return job.result


def patched_at(result: PatchMeasurement, row: list[int]) -> float:
    """Our patched value at a reference row (layer, pos) or (layer, pos, head)."""
    if len(row) == 3:
        assert result.head_patched is not None
        layer, pos, head = row
        value = result.head_patched[layer][head][pos]
    else:
        assert result.patched is not None
        value = result.patched[row[0]][row[1]]
    assert value is not None
    return value


@pytest.mark.parametrize(
    "component, layers",
    [
        ("resid_pre", None),
        ("attn_out", None),
        ("mlp_out", None),
        ("heads_by_pos", refs.HEADS_BY_POS_LAYERS),
        ("resid_mid", refs.RESID_MID_LAYERS),
    ],
)
def test_patch_equals_the_stored_transformer_lens_references(
    embedded: LoadedModel, component: str, layers: list[int] | None
) -> None:
    """Every cell from the first differing position on, against TransformerLens' patchers (resid_mid: its generic
    patcher writing attn_out := clean resid_mid − corrupt resid_pre), stored by ``./run golden``."""
    reference = refs.golden(embedded)[component]
    result = ours(embedded, component, layers or list(range(embedded.bridge.cfg.n_layers)))
    got = torch.tensor([patched_at(result, row) for row in reference["index"]], dtype=torch.float64)
    difference = (got - torch.tensor(reference["values"], dtype=torch.float64)).abs().max().item()
    print(f"\npatch {component} vs TransformerLens on SmolLM2 ({len(got)} cells): max |diff| {difference:.2e}")
    assert difference < refs.TOLERANCE


@pytest.mark.live_reference
def test_patch_equals_transformer_lens_run_now(embedded: LoadedModel) -> None:
    """The localize family's live comparison: TransformerLens' get_act_patch_mlp_out rerun on three layers."""
    layers = [0, 14, 29]
    index, values = refs.block_reference(embedded, refs.setting(embedded), "mlp_out", layers)
    result = ours(embedded, "mlp_out", layers)
    got = torch.tensor([patched_at(result, row) for row in index], dtype=torch.float64)
    assert (got - torch.tensor(values, dtype=torch.float64)).abs().max().item() < refs.TOLERANCE


def test_sequence_answers_on_the_real_tokenizer(embedded: LoadedModel) -> None:
    prompt = "The United States is a country in"
    assert len(embedded.tokenizer(" North America", add_special_tokens=False).input_ids) == 2
    result = readouts.logit_diff(embedded, [prompt], " North America", " Europe")
    context = list(embedded.tokenizer(prompt).input_ids)
    expected = 0.0
    for token in embedded.tokenizer(" North America", add_special_tokens=False).input_ids:
        logits = embedded.bridge(torch.tensor([context]))[0, -1]
        expected += float(torch.log_softmax(logits.double(), dim=-1)[token])
        context.append(token)
    assert result.answer_kind == "sequence"
    assert result.examples[0].correct_log_prob == pytest.approx(expected, abs=1e-4)
    print(
        f"\nlog P(' North America' | {prompt!r}) = {expected:.3f}; "
        f"logit_diff vs ' Europe' {result.logit_diff.value:+.3f}"
    )
    # 'Portugal' is 3 tokens, ' Portugal' one: the forgotten space is named in a note.
    spaced = readouts.answer_rank(embedded, ["The capital of Lisbon's country is"], "Portugal")
    assert spaced.answer_kind == "sequence"
    assert any("' Portugal' is one token" in note for note in spaced.notes), spaced.notes


def test_ablate_an_mlp_and_loss_on_smollm2(embedded: LoadedModel) -> None:
    outcome = ablate(embedded, CLEAN, Intervention(ablate=["L28MLP"]), CORRECT, INCORRECT)

    def zero(values: torch.Tensor, hook: object) -> torch.Tensor:
        return torch.zeros_like(values)

    batch = encode(embedded.tokenizer, CLEAN)
    good = torch.tensor(resolve_answers(embedded.tokenizer, CORRECT, 2, "correct"))
    bad = torch.tensor(resolve_answers(embedded.tokenizer, INCORRECT, 2, "incorrect"))
    with embedded.bridge.hooks(fwd_hooks=[("blocks.28.hook_mlp_out", zero)]):
        final = embedded.bridge(batch.input_ids)[torch.arange(2), batch.answer_positions]
    expected = (final.gather(1, good[:, None]) - final.gather(1, bad[:, None])).squeeze(1)
    assert outcome.after.logit_diff is not None and outcome.before.logit_diff is not None
    assert outcome.after.logit_diff.per_example == pytest.approx(expected.tolist(), abs=1e-4)
    print(
        f"\nzero-ablating L28MLP on 2 IOI prompts: logit diff {outcome.before.logit_diff.value:+.3f} → "
        f"{outcome.after.logit_diff.value:+.3f}"
    )
    text = "The quick brown fox jumps over the lazy dog because it wanted to see the other side."
    loss = text_losses(embedded, [text])
    ids = embedded.tokenizer(text, return_tensors="pt").input_ids
    logits = embedded.bridge(ids)[0]
    reference = torch.nn.functional.cross_entropy(logits[:-1].double(), ids[0, 1:])
    assert loss.mean_loss == pytest.approx(float(reference), abs=1e-4)
