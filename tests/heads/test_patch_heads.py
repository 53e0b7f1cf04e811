"""Head patching on `tiny`: known-answer constructions, hand-written references, and agreement with
TransformerLens' own patching module (both engines)."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import patching as tl_patching

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.engine.text.components import parse_head
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.heads.patch_heads import PatchHeadsJob
from mcp_interp.core.readouts import predictions as readouts
from mcp_interp.errors import InputError
from tests.conftest import CARRIER
from tests.helpers import IOI_CLEAN as CLEAN
from tests.helpers import IOI_CORRECT as CORRECT
from tests.helpers import IOI_CORRUPT as CORRUPT
from tests.helpers import IOI_INCORRECT as INCORRECT
from tests.helpers import teacher_forced_reference


def run(job: PatchHeadsJob):
    result = drain(job)
    assert job.result is not None
    return result


def test_known_answer_patching_puts_the_carrier_on_top(one_head_model: LoadedModel) -> None:
    result = run(
        PatchHeadsJob(
            model=one_head_model, clean_prompts=CLEAN, corrupt_prompts=CORRUPT, correct=CORRECT, incorrect=INCORRECT
        )
    )
    assert abs(result.clean_logit_diff.value - result.corrupt_logit_diff.value) > 0.05, "the pair must differ"
    top = result.heads[0]
    assert (top.layer, top.head_index) == CARRIER
    assert top.score == pytest.approx(1.0, abs=1e-4)
    for row in result.heads[1:]:
        assert row.score == pytest.approx(0.0, abs=1e-4), row.head
    # Noising the carrier destroys the whole gap; noising anything else destroys nothing.
    noised = run(
        PatchHeadsJob(
            model=one_head_model,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=INCORRECT,
            direction="noise",
        )
    )
    assert noised.scores[CARRIER.layer][CARRIER.head] == pytest.approx(1.0, abs=1e-4)
    assert sorted(abs(r.score or 0) for r in noised.heads)[-2] == pytest.approx(0.0, abs=1e-4)


def tl_reference(model: LoadedModel, base: list[str], source: list[str]) -> torch.Tensor:
    """TransformerLens' per-head patching of hook_z at all positions: [n_layers, n_heads] mean patched LD."""
    base_batch = encode(model.tokenizer, base)
    source_batch = encode(model.tokenizer, source)
    good = torch.tensor([model.tokenizer.convert_tokens_to_ids(w) for w in CORRECT])
    bad = torch.tensor([model.tokenizer.convert_tokens_to_ids(w) for w in INCORRECT])

    def metric(logits: torch.Tensor) -> torch.Tensor:
        final = logits[torch.arange(len(base)), base_batch.answer_positions]
        return (final.gather(1, good[:, None]) - final.gather(1, bad[:, None])).mean()

    _, source_cache = model.bridge.run_with_cache(source_batch.input_ids)
    return tl_patching.get_act_patch_attn_head_out_all_pos(model.bridge, base_batch.input_ids, source_cache, metric)


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_exact_patching_matches_transformer_lens(tiny: LoadedModel, direction: str) -> None:
    result = run(
        PatchHeadsJob(
            model=tiny,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=INCORRECT,
            direction=direction,
        )
    )  # type: ignore[arg-type]
    base, source = (CORRUPT, CLEAN) if direction == "denoise" else (CLEAN, CORRUPT)
    reference = tl_reference(tiny, base, source)
    ours = torch.tensor(result.patched_logit_diff, dtype=torch.float64)
    assert (ours - reference.double()).abs().max().item() < 1e-4


def test_patching_a_subset_and_last_position_matches_a_per_head_loop(tiny: LoadedModel) -> None:
    heads = ["L0H1", "L2H3", {"layer": 1, "head": 0}]
    result = run(
        PatchHeadsJob(
            model=tiny,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=INCORRECT,
            positions="last",
            heads=heads,
        )
    )
    clean, corrupt = encode(tiny.tokenizer, CLEAN), encode(tiny.tokenizer, CORRUPT)
    _, clean_cache = tiny.bridge.run_with_cache(clean.input_ids)
    good = torch.tensor([tiny.tokenizer.convert_tokens_to_ids(w) for w in CORRECT])
    bad = torch.tensor([tiny.tokenizer.convert_tokens_to_ids(w) for w in INCORRECT])
    last = corrupt.answer_positions
    evaluated = 0
    for layer, row in enumerate(result.patched_logit_diff):
        for head, value in enumerate(row):
            if value is None:
                continue
            evaluated += 1
            name = f"blocks.{layer}.attn.hook_z"

            def hook(z: torch.Tensor, hook: object, head: int = head, name: str = name) -> torch.Tensor:
                z = z.clone()
                z[torch.arange(3), last, head] = clean_cache[name][torch.arange(3), last, head]
                return z

            with torch.no_grad():
                logits = tiny.bridge.run_with_hooks(corrupt.input_ids, fwd_hooks=[(name, hook)])
            final = logits[torch.arange(3), last]
            expected = (final.gather(1, good[:, None]) - final.gather(1, bad[:, None])).mean()
            assert value == pytest.approx(float(expected), abs=1e-5)
    assert evaluated == 3


def test_per_pair_scores_of_the_top_heads_and_the_aggregate_ratio_of_means_by_hand(tiny: LoadedModel) -> None:
    """Each of the top 10 heads' per_example_score is that pair's (patched − corrupt) / (clean − corrupt), each run
    written here with its own hook on hook_z (clean z at every position); its score is the ratio of the means, which
    on these pairs is not the mean of the ratios; heads below the top 10 carry no per-pair values."""
    result = run(
        PatchHeadsJob(model=tiny, clean_prompts=CLEAN, corrupt_prompts=CORRUPT, correct=CORRECT, incorrect=INCORRECT)
    )
    clean, corrupt = encode(tiny.tokenizer, CLEAN), encode(tiny.tokenizer, CORRUPT)
    good = torch.tensor([tiny.tokenizer.convert_tokens_to_ids(w) for w in CORRECT])
    bad = torch.tensor([tiny.tokenizer.convert_tokens_to_ids(w) for w in INCORRECT])

    def logit_diffs(logits: torch.Tensor) -> torch.Tensor:
        final = logits[torch.arange(3), corrupt.answer_positions].double()
        return (final.gather(1, good[:, None]) - final.gather(1, bad[:, None]))[:, 0]

    with torch.no_grad():
        clean_logits, clean_cache = tiny.bridge.run_with_cache(clean.input_ids)
        clean_ld, corrupt_ld = logit_diffs(clean_logits), logit_diffs(tiny.bridge(corrupt.input_ids))
    assert result.heads[9].per_example_score is not None and result.heads[10].per_example_score is None
    differs = 0
    for row in result.heads[:10]:
        name = f"blocks.{row.layer}.attn.hook_z"

        def hook(z: torch.Tensor, hook: object, head: int = row.head_index, name: str = name) -> torch.Tensor:
            z = z.clone()
            z[:, :, head] = clean_cache[name][:, :, head]
            return z

        with torch.no_grad():
            patched = logit_diffs(tiny.bridge.run_with_hooks(corrupt.input_ids, fwd_hooks=[(name, hook)]))
        per_pair = ((patched - corrupt_ld) / (clean_ld - corrupt_ld)).tolist()
        ratio_of_means = float((patched.mean() - corrupt_ld.mean()) / (clean_ld.mean() - corrupt_ld.mean()))
        assert row.per_example_score == pytest.approx(per_pair, abs=1e-4), row.head
        assert row.score == pytest.approx(ratio_of_means, abs=1e-5), row.head
        differs += abs(ratio_of_means - sum(per_pair) / 3) > 1e-3
    assert differs > 0  # the two aggregates differ here, so the test tells them apart


def test_attribution_is_labelled_and_verify_top_reports_both(tiny: LoadedModel) -> None:
    result = run(
        PatchHeadsJob(
            model=tiny,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=INCORRECT,
            method="attribution",
            verify_top=3,
        )
    )
    assert result.approximate and any("first-order" in n for n in result.notes)
    exact = run(
        PatchHeadsJob(model=tiny, clean_prompts=CLEAN, corrupt_prompts=CORRUPT, correct=CORRECT, incorrect=INCORRECT)
    )
    assert result.verified is not None and len(result.verified) == 3
    for row in result.verified:
        layer, head = parse_head(row.head, 3, 4)
        assert row.exact_score == pytest.approx(exact.scores[layer][head], abs=1e-6)


def test_attribution_estimates_are_the_directional_derivative_by_finite_differences(tiny: LoadedModel) -> None:
    # Attribution patching estimates patched − corrupt to first order: the derivative of the logit difference
    # along z_clean − z_corrupt for one head. A central finite difference of the real model measures the same.
    result = run(
        PatchHeadsJob(
            model=tiny,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=INCORRECT,
            method="attribution",
        )
    )
    clean, corrupt = encode(tiny.tokenizer, CLEAN), encode(tiny.tokenizer, CORRUPT)
    good = torch.tensor([tiny.tokenizer(w, add_special_tokens=False)["input_ids"][0] for w in CORRECT])
    bad = torch.tensor([tiny.tokenizer(w, add_special_tokens=False)["input_ids"][0] for w in INCORRECT])
    rows = torch.arange(3)
    last = corrupt.answer_positions
    with torch.no_grad():
        _, clean_cache = tiny.bridge.run_with_cache(clean.input_ids)
        _, corrupt_cache = tiny.bridge.run_with_cache(corrupt.input_ids)

    def logit_diff_with(layer: int, head: int, epsilon: float) -> float:
        name = f"blocks.{layer}.attn.hook_z"
        step = clean_cache[name][:, :, head] - corrupt_cache[name][:, :, head]

        def hook(z: torch.Tensor, hook: object) -> torch.Tensor:
            z = z.clone()
            z[:, :, head] = corrupt_cache[name][:, :, head] + epsilon * step
            return z

        with torch.no_grad():
            final = tiny.bridge.run_with_hooks(corrupt.input_ids, fwd_hooks=[(name, hook)])[rows, last].double()
        return float((final[rows, good] - final[rows, bad]).mean())

    corrupt_ld = result.corrupt_logit_diff.value
    epsilon = 1e-2
    for layer, head in [(0, 0), (1, 2), (2, 3)]:
        derivative = (logit_diff_with(layer, head, epsilon) - logit_diff_with(layer, head, -epsilon)) / (2 * epsilon)
        estimate = result.patched_logit_diff[layer][head] - corrupt_ld
        assert estimate == pytest.approx(derivative, rel=2e-2, abs=2e-3)


def test_unequal_pairs_and_unknown_heads_are_input_errors(tiny: LoadedModel) -> None:
    with pytest.raises(InputError, match="same number of tokens"):
        run(
            PatchHeadsJob(
                model=tiny, clean_prompts=["a b c"], corrupt_prompts=["a b"], correct="mary", incorrect="john"
            )
        )
    with pytest.raises(InputError, match=r"layers 0\.\.2"):
        run(
            PatchHeadsJob(
                model=tiny,
                clean_prompts=CLEAN,
                corrupt_prompts=CORRUPT,
                correct=CORRECT,
                incorrect=INCORRECT,
                heads=["L7H0"],
            )
        )


def test_generic_engine_matches_transformer_lens_too(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    from mcp_interp.core.engine.backend import llama_suffix

    monkeypatch.setattr(llama_suffix, "SUPPORTED_MODEL_TYPES", frozenset())
    job = PatchHeadsJob(model=tiny, clean_prompts=CLEAN, corrupt_prompts=CORRUPT, correct=CORRECT, incorrect=INCORRECT)
    result = run(job)
    assert job.sweep is not None and job.sweep.startswith("generic")
    ours = torch.tensor(result.patched_logit_diff, dtype=torch.float64)
    assert (ours - tl_reference(tiny, CORRUPT, CLEAN).double()).abs().max().item() < 1e-4


def test_suffix_engine_with_padded_pairs_of_different_lengths(tiny: LoadedModel) -> None:
    clean = [CLEAN[0], "when tom and james went to the park , james gave a ball to the"]
    corrupt = [CORRUPT[0], "when tom and james went to the park , tom gave a ball to the"]
    job = PatchHeadsJob(
        model=tiny, clean_prompts=clean, corrupt_prompts=corrupt, correct=["mary", "tom"], incorrect=["john", "james"]
    )
    result = run(job)
    assert job.sweep is not None and job.sweep.startswith("suffix")
    batch = encode(tiny.tokenizer, corrupt)
    assert len(set(batch.lengths)) == 2, "the batch must be padded"
    source = encode(tiny.tokenizer, clean)
    good = torch.tensor([tiny.tokenizer.convert_tokens_to_ids(w) for w in ("mary", "tom")])
    bad = torch.tensor([tiny.tokenizer.convert_tokens_to_ids(w) for w in ("john", "james")])

    def metric(logits: torch.Tensor) -> torch.Tensor:
        final = logits[torch.arange(2), batch.answer_positions]
        return (final.gather(1, good[:, None]) - final.gather(1, bad[:, None])).mean()

    _, cache = tiny.bridge.run_with_cache(source.input_ids)
    reference = tl_patching.get_act_patch_attn_head_out_all_pos(tiny.bridge, batch.input_ids, cache, metric)
    ours = torch.tensor(result.patched_logit_diff, dtype=torch.float64)
    assert (ours - reference.double()).abs().max().item() < 1e-4


PAIR_CLEAN = [
    "when mary and john went to the store , john gave a drink",
    "when tom and james went to the park , james gave a ball",
]
PAIR_CORRUPT = [
    "when mary and john went to the store , mary gave a drink",
    "when tom and james went to the park , tom gave a ball",
]
GOOD_SEQ, BAD_SEQ = ["to mary", "to tom"], ["to john", "to james"]


def test_sequence_answers_match_transformer_lens_on_teacher_forced_rows(tiny: LoadedModel) -> None:
    """patch_heads takes answers of several tokens like patch: each pair becomes one row per answer token
    (prompt, prompt + 'to'), teacher-forced. Reference: TransformerLens' get_act_patch_attn_head_out_all_pos on a
    batch holding those rows, with the metric written here — mean over pairs of Σ log P(correct tokens) − Σ log
    P(incorrect tokens)."""
    result = run(
        PatchHeadsJob(
            model=tiny,
            clean_prompts=PAIR_CLEAN,
            corrupt_prompts=PAIR_CORRUPT,
            correct=GOOD_SEQ,
            incorrect=BAD_SEQ,
        )
    )
    assert any("teacher-forced" in note for note in result.notes)
    reference = teacher_forced_reference(
        tiny, PAIR_CLEAN, PAIR_CORRUPT, GOOD_SEQ, BAD_SEQ, tl_patching.get_act_patch_attn_head_out_all_pos
    )
    ours = torch.tensor(result.patched_logit_diff, dtype=torch.float64)
    assert (ours - reference).abs().max().item() < 1e-4
    assert result.clean_logit_diff.per_example == pytest.approx(
        readouts.logit_diff(tiny, PAIR_CLEAN, GOOD_SEQ, BAD_SEQ).logit_diff.per_example, abs=1e-5
    )
