"""The localize family on the real embedded model (SmolLM2-135M-Instruct): ``patch`` against
TransformerLens' patching functions on every component, sequence answers on the real tokenizer,
``ablate`` of an MLP, and ``loss``."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from transformer_lens import patching

from mcp_interp.core import readouts
from mcp_interp.core.ablate import ablate
from mcp_interp.core.jobs import drain
from mcp_interp.core.localize.loss import text_losses
from mcp_interp.core.localize.patch import PatchJob
from mcp_interp.core.tokens import encode, resolve_answers
from mcp_interp.corpora import ioi_pairs
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.common import AblationSpec

pytestmark = pytest.mark.embedded

PAIRS = ioi_pairs()[:2]
CLEAN, CORRUPT = [p.clean for p in PAIRS], [p.corrupt for p in PAIRS]
CORRECT, INCORRECT = [p.correct for p in PAIRS], [p.incorrect for p in PAIRS]


@pytest.fixture(scope="module")
def setting(embedded: LoadedModel) -> dict:  # type: ignore[type-arg]
    clean, corrupt = encode(embedded.tokenizer, CLEAN), encode(embedded.tokenizer, CORRUPT)
    good = torch.tensor(resolve_answers(embedded.tokenizer, CORRECT, 2, "correct"))
    bad = torch.tensor(resolve_answers(embedded.tokenizer, INCORRECT, 2, "incorrect"))

    def metric(logits: torch.Tensor) -> torch.Tensor:
        final = logits[torch.arange(2), corrupt.answer_positions]
        return (final.gather(1, good[:, None]) - final.gather(1, bad[:, None])).mean()

    _, clean_cache = embedded.bridge.run_with_cache(clean.input_ids)
    _, corrupt_cache = embedded.bridge.run_with_cache(corrupt.input_ids)
    first = int((clean.input_ids != corrupt.input_ids).any(dim=0).nonzero().min())
    return {"corrupt": corrupt, "metric": metric, "clean_cache": clean_cache, "corrupt_cache": corrupt_cache,
            "first": first, "width": clean.input_ids.shape[1]}  # fmt: skip


def cells(setting: dict, layers: range, heads: int = 0) -> pd.DataFrame:  # type: ignore[type-arg]
    """(layer, pos[, head]) rows from the first differing position on: the only cells patch runs
    (earlier ones are no-ops, scored 0 without a run; checked on `tiny` against all positions)."""
    rows = [
        (layer, pos, *((head,) if heads else ()))
        for layer in layers
        for pos in range(setting["first"], setting["width"])
        for head in (range(heads) if heads else [None])
    ]
    return pd.DataFrame(rows, columns=["layer", "pos", "head"] if heads else ["layer", "pos"])


@pytest.mark.parametrize(
    "component, function",
    [
        ("resid_pre", patching.get_act_patch_resid_pre),
        ("attn_out", patching.get_act_patch_attn_out),
        ("mlp_out", patching.get_act_patch_mlp_out),
    ],
)
def test_patch_matches_transformer_lens_on_smollm2(
    embedded: LoadedModel, setting: dict, component: str, function
) -> None:  # type: ignore[no-untyped-def,type-arg]
    job = PatchJob(embedded, CLEAN, CORRUPT, CORRECT, INCORRECT, component)
    drain(job)
    assert job.result is not None and job.result.patched is not None
    assert job.engine is not None and job.engine.startswith("suffix")
    index = cells(setting, range(embedded.bridge.cfg.n_layers))
    reference = function(
        embedded.bridge,
        setting["corrupt"].input_ids,
        setting["clean_cache"],
        setting["metric"],
        index_axis_names=None,
        index_df=index,
    ).double()
    ours = torch.tensor([job.result.patched[r.layer][r.pos] for r in index.itertuples()], dtype=torch.float64)
    difference = (ours - reference).abs().max().item()
    print(f"\npatch {component} vs TransformerLens on SmolLM2 ({len(index)} cells): max |diff| {difference:.2e}")
    assert difference < 1e-4


def test_heads_by_position_and_resid_mid_match_references_on_smollm2(embedded: LoadedModel, setting: dict) -> None:  # type: ignore[type-arg]
    layers = [0, 14, 29]
    job = PatchJob(embedded, CLEAN, CORRUPT, CORRECT, INCORRECT, "heads_by_pos", layers=layers)
    drain(job)
    assert job.result is not None and job.result.head_patched is not None
    index = pd.concat([cells(setting, range(layer, layer + 1), embedded.bridge.cfg.n_heads) for layer in layers])
    reference = patching.get_act_patch_attn_head_out_by_pos(
        embedded.bridge,
        setting["corrupt"].input_ids,
        setting["clean_cache"],
        setting["metric"],
        index_axis_names=None,
        index_df=index,
    ).double()
    ours = torch.tensor([job.result.head_patched[r.layer][r.head][r.pos] for r in index.itertuples()])
    assert (ours.double() - reference).abs().max().item() < 1e-4

    mid = PatchJob(embedded, CLEAN, CORRUPT, CORRECT, INCORRECT, "resid_mid", layers=[3, 20])
    drain(mid)
    assert mid.result is not None and mid.result.patched is not None
    # resid_mid carried on: attn_out := clean resid_mid − corrupt resid_pre, through TransformerLens' patcher.
    wanted = {
        f"blocks.{layer}.hook_attn_out": setting["clean_cache"][f"blocks.{layer}.hook_resid_mid"]
        - setting["corrupt_cache"][f"blocks.{layer}.hook_resid_pre"]
        for layer in (3, 20)
    }
    index = cells(setting, range(3, 4))
    index = pd.concat([index, cells(setting, range(20, 21))])
    reference = patching.generic_activation_patch(
        embedded.bridge, setting["corrupt"].input_ids, wanted, setting["metric"],  # type: ignore[arg-type]
        patch_setter=patching.layer_pos_patch_setter, activation_name="attn_out", index_df=index,
    ).double()  # fmt: skip
    ours = torch.tensor([mid.result.patched[r.layer][r.pos] for r in index.itertuples()], dtype=torch.float64)
    assert (ours - reference).abs().max().item() < 1e-4


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
    outcome = ablate(embedded, CLEAN, AblationSpec(targets=["L28MLP"]), CORRECT, INCORRECT)

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
