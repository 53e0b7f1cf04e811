"""Head ablation and head patching on `tiny`: known-answer constructions, hand-written
references, and agreement with TransformerLens' own patching module."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import patching as tl_patching

from mcp_interp.core import readouts
from mcp_interp.core.ablate import ablate_heads
from mcp_interp.core.heads import Head, parse_head, parse_heads, position_mask
from mcp_interp.core.interventions import Ablation, derangement, mean_replacement, prepare_ablation
from mcp_interp.core.jobs import drain
from mcp_interp.core.patch_heads import PatchHeadsJob
from mcp_interp.core.tokens import encode
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel, boot, build_tiny
from mcp_interp.schemas.common import AblationSpec, Intervention

CLEAN = [
    "when mary and john went to the store , john gave a drink to",
    "when tom and james went to the park , james gave a ball to",
    "when dan and sid went to the shop , sid gave an apple to",
]
CORRUPT = [
    "when mary and john went to the store , mary gave a drink to",
    "when tom and james went to the park , tom gave a ball to",
    "when dan and sid went to the shop , dan gave an apple to",
]
CORRECT, INCORRECT = ["mary", "tom", "dan"], ["john", "james", "sid"]
CARRIER = Head(1, 2)


def run(job: PatchHeadsJob):
    result = drain(job)
    assert job.result is not None
    return result


@pytest.fixture(scope="module")
def one_head_model() -> LoadedModel:
    """`tiny` with every attention head's output projection zeroed except CARRIER's.

    Attention is the only way information moves between positions, so in this model the
    difference between a clean and a corrupt prompt reaches the answer position through
    CARRIER alone: patching it restores exactly the clean run; patching any other head (whose
    output is multiplied by zero) changes nothing.
    """
    hf_model, tokenizer = build_tiny()
    d_head = hf_model.config.head_dim
    with torch.no_grad():
        for layer, block in enumerate(hf_model.model.layers):
            weight = block.self_attn.o_proj.weight  # [d_model, n_heads * d_head]
            keep = weight[:, CARRIER.head * d_head : (CARRIER.head + 1) * d_head].clone()
            weight.zero_()
            if layer == CARRIER.layer:  # amplified so the clean−corrupt gap is large
                weight[:, CARRIER.head * d_head : (CARRIER.head + 1) * d_head] = 30 * keep
    return boot("tiny-one-head", "tiny", "tiny-one-head", hf_model, tokenizer)


def test_known_answer_patching_puts_the_carrier_on_top(one_head_model: LoadedModel) -> None:
    result = run(PatchHeadsJob(one_head_model, CLEAN, CORRUPT, CORRECT, INCORRECT))
    assert abs(result.clean_logit_diff.value - result.corrupt_logit_diff.value) > 0.05, "the pair must differ"
    top = result.heads[0]
    assert (top.layer, top.head_index) == CARRIER
    assert top.score == pytest.approx(1.0, abs=1e-4)
    for row in result.heads[1:]:
        assert row.score == pytest.approx(0.0, abs=1e-4), row.head
    # Noising the carrier destroys the whole gap; noising anything else destroys nothing.
    noised = run(PatchHeadsJob(one_head_model, CLEAN, CORRUPT, CORRECT, INCORRECT, direction="noise"))
    assert noised.scores[CARRIER.layer][CARRIER.head] == pytest.approx(1.0, abs=1e-4)
    assert sorted(abs(r.score or 0) for r in noised.heads)[-2] == pytest.approx(0.0, abs=1e-4)


def test_known_answer_ablation_removes_exactly_the_carriers_information(one_head_model: LoadedModel) -> None:
    carrier = ablate_heads(one_head_model, CLEAN, Ablation([CARRIER], "zero"), CORRECT, INCORRECT)
    corrupt_ablated = ablate_heads(one_head_model, CORRUPT, Ablation([CARRIER], "zero"), CORRECT, INCORRECT)
    assert carrier.before.logit_diff is not None and carrier.after.logit_diff is not None
    assert corrupt_ablated.after.logit_diff is not None
    # With the only cross-position path cut, clean and corrupt prompts look identical at the answer.
    assert carrier.after.logit_diff.per_example == pytest.approx(corrupt_ablated.after.logit_diff.per_example, abs=1e-5)
    assert carrier.after.logit_diff.value != pytest.approx(carrier.before.logit_diff.value, abs=1e-3)
    assert carrier.kl.value > 0
    idle = ablate_heads(one_head_model, CLEAN, Ablation([Head(0, 1), Head(2, 3)], "zero"), CORRECT, INCORRECT)
    assert idle.kl.per_example == pytest.approx([0.0] * 3, abs=1e-10)
    assert idle.after == idle.before


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
    result = run(PatchHeadsJob(tiny, CLEAN, CORRUPT, CORRECT, INCORRECT, direction=direction))  # type: ignore[arg-type]
    base, source = (CORRUPT, CLEAN) if direction == "denoise" else (CLEAN, CORRUPT)
    reference = tl_reference(tiny, base, source)
    ours = torch.tensor(result.patched_logit_diff, dtype=torch.float64)
    assert (ours - reference.double()).abs().max().item() < 1e-4


def test_patching_a_subset_and_last_position_matches_a_per_head_loop(tiny: LoadedModel) -> None:
    heads = ["L0H1", "L2H3", {"layer": 1, "head": 0}]
    result = run(PatchHeadsJob(tiny, CLEAN, CORRUPT, CORRECT, INCORRECT, positions="last", heads=heads))
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


def test_attribution_is_labelled_and_verify_top_reports_both(tiny: LoadedModel) -> None:
    result = run(PatchHeadsJob(tiny, CLEAN, CORRUPT, CORRECT, INCORRECT, method="attribution", verify_top=3))
    assert result.approximate and any("first-order" in n for n in result.notes)
    exact = run(PatchHeadsJob(tiny, CLEAN, CORRUPT, CORRECT, INCORRECT))
    assert result.verified is not None and len(result.verified) == 3
    for row in result.verified:
        layer, head = parse_head(row.head, 3, 4)
        assert row.exact_score == pytest.approx(exact.scores[layer][head], abs=1e-6)


def test_attribution_estimates_are_the_directional_derivative_by_finite_differences(tiny: LoadedModel) -> None:
    # Attribution patching estimates patched − corrupt to first order: the derivative of the logit difference
    # along z_clean − z_corrupt for one head. A central finite difference of the real model measures the same.
    result = run(PatchHeadsJob(tiny, CLEAN, CORRUPT, CORRECT, INCORRECT, method="attribution"))
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


def test_unequal_pairs_and_multi_token_answers_are_input_errors(tiny: LoadedModel) -> None:
    with pytest.raises(InputError, match="same number of tokens"):
        run(PatchHeadsJob(tiny, ["a b c"], ["a b"], "mary", "john"))
    with pytest.raises(InputError, match="2 tokens"):
        run(PatchHeadsJob(tiny, CLEAN[:1], CORRUPT[:1], "mary john", "tom"))
    with pytest.raises(InputError, match=r"layers 0\.\.2"):
        run(PatchHeadsJob(tiny, CLEAN, CORRUPT, CORRECT, INCORRECT, heads=["L7H0"]))


def test_derangement_has_no_fixed_points_and_is_seeded() -> None:
    for seed in range(200):
        perm = derangement(5, seed)
        assert sorted(perm) == list(range(5))
        assert all(perm[i] != i for i in range(5))
    assert derangement(7, 3) == derangement(7, 3)
    assert derangement(2, 0) == [1, 0]
    with pytest.raises(InputError, match="at least 2 prompts"):
        derangement(1, 0)


def test_mean_replacement_by_hand() -> None:
    z = torch.arange(2 * 3 * 1 * 2, dtype=torch.float64).reshape(2, 3, 1, 2)
    per_position, how = mean_replacement(z, torch.ones(2, 3, dtype=torch.long))
    assert how == "per_position"
    for pos in range(3):
        assert per_position[0, pos, 0].tolist() == [(z[0, pos, 0, d] + z[1, pos, 0, d]).item() / 2 for d in range(2)]
    # Unequal lengths (3 and 2 tokens, right-padded): positions pair up by distance from each prompt's last token.
    z = torch.tensor([[1.0, 2.0, 3.0], [10.0, 20.0, 0.0]]).reshape(2, 3, 1, 1)
    padded = torch.tensor([[1, 1, 1], [1, 1, 0]])
    aligned, how = mean_replacement(z, padded)
    assert how == "per_position_from_end"
    by_hand = [[1.0, (2.0 + 10.0) / 2, (3.0 + 20.0) / 2], [(2.0 + 10.0) / 2, (3.0 + 20.0) / 2, 0.0]]
    assert aligned[:, :, 0, 0].tolist() == by_hand  # the answer positions get the mean of the answer positions


def test_mean_ablation_at_the_last_position_with_unequal_lengths_uses_the_answer_positions(tiny: LoadedModel) -> None:
    prompts = ["when mary and john went to the store , john gave a drink to", "then tom gave a book to"]
    batch = encode(tiny.tokenizer, prompts)
    assert len(set(batch.lengths)) == 2
    head = Head(1, 3)
    clean_z = {}
    with torch.no_grad():
        for i, text in enumerate(prompts):  # each prompt alone: no padding anywhere
            ids = torch.tensor([tiny.tokenizer(text)["input_ids"]])
            _, cache = tiny.bridge.run_with_cache(ids, names_filter=lambda n: n == "blocks.1.attn.hook_z")
            clean_z[i] = cache["blocks.1.attn.hook_z"][0, -1, head.head].clone()
    mean_answer_z = (clean_z[0] + clean_z[1]) / 2
    prepared = prepare_ablation(tiny.bridge, batch, Ablation([head], "mean", "last"))
    assert prepared.mean_over == "per_position_from_end"
    seen = {}

    def record(z: torch.Tensor, hook: object) -> torch.Tensor:
        seen["z"] = z.clone()
        return z

    with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=[*prepared.hooks, ("blocks.1.attn.hook_z", record)]):
        tiny.bridge(batch.input_ids, attention_mask=batch.attention_mask)
    for row, position in enumerate(batch.answer_positions.tolist()):
        assert torch.allclose(seen["z"][row, position, head.head], mean_answer_z, atol=1e-5)
        # other positions and other heads are untouched
        assert not torch.allclose(seen["z"][row, 0, head.head], mean_answer_z, atol=1e-3)


@pytest.mark.parametrize("method", ["mean", "resample"])
def test_mean_and_resample_ablation_match_a_hand_written_hook(tiny: LoadedModel, method: str) -> None:
    batch = encode(tiny.tokenizer, CLEAN)
    head = Head(1, 3)
    name = f"blocks.{head.layer}.attn.hook_z"
    _, cache = tiny.bridge.run_with_cache(batch.input_ids)
    clean_z = cache[name]
    perm = derangement(3, seed=4)

    def reference(z: torch.Tensor, hook: object) -> torch.Tensor:
        z = z.clone()
        for b in range(3):
            for pos in range(z.shape[1]):
                if method == "mean":
                    z[b, pos, head.head] = sum(clean_z[k, pos, head.head] for k in range(3)) / 3
                else:
                    z[b, pos, head.head] = clean_z[perm[b], pos, head.head]
        return z

    with torch.no_grad():
        expected = tiny.bridge.run_with_hooks(batch.input_ids, fwd_hooks=[(name, reference)])
    prepared = prepare_ablation(tiny.bridge, batch, Ablation([head], method, seed=4))  # type: ignore[arg-type]
    with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=prepared.hooks):
        ours = tiny.bridge(batch.input_ids)
    assert (ours - expected).abs().max().item() < 1e-5
    assert prepared.permutation == (perm if method == "resample" else None)


def test_resample_needs_equal_lengths(tiny: LoadedModel) -> None:
    with pytest.raises(InputError, match="equal token length"):
        ablate_heads(
            tiny, ["when mary went to", "when mary and john went to the store"], Ablation([Head(0, 0)], "resample")
        )


def test_intervention_in_metric_tools_equals_ablate_head(tiny: LoadedModel) -> None:
    spec = AblationSpec(heads=["L1H2", "L2H0"], method="mean")
    ablated = ablate_heads(tiny, CLEAN, Ablation([Head(1, 2), Head(2, 0)], "mean"), CORRECT, INCORRECT)
    via_ld = readouts.logit_diff(tiny, CLEAN, CORRECT, INCORRECT, Intervention(ablate=spec))
    via_kl = readouts.kl(tiny, CLEAN, intervention=Intervention(ablate=spec))
    via_rank = readouts.answer_rank(tiny, CLEAN, CORRECT, Intervention(ablate=spec))
    assert ablated.after.logit_diff is not None
    assert via_ld.logit_diff.per_example == pytest.approx(ablated.after.logit_diff.per_example, abs=1e-9)
    assert via_kl.kl.per_example == pytest.approx(ablated.kl.per_example, abs=1e-9)
    assert via_rank.rank.per_example == ablated.after.rank.per_example
    assert via_ld.intervention and "L1H2" in via_ld.intervention
    with pytest.raises(InputError, match="compare against"):
        readouts.kl(tiny, CLEAN)


def test_head_and_position_parsing_errors() -> None:
    assert parse_heads(["L1H2", {"layer": 1, "head": 2}, "l0h3"], 3, 4) == [Head(1, 2), Head(0, 3)]
    for bad, message in [("L3H0", "layers 0..2"), ("L0H9", "heads 0..3"), ("head 1", "form"), ([], "non-empty")]:
        with pytest.raises(InputError, match=message):
            parse_heads(bad, 3, 4)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    answers = torch.tensor([2, 3])
    assert position_mask("last", mask, answers).nonzero().tolist() == [[0, 2], [1, 3]]
    assert position_mask([0, -1], mask, answers).nonzero().tolist() == [[0, 0], [0, 2], [1, 0], [1, 3]]
    assert not bool(position_mask("all", mask, answers)[0, 3])
    with pytest.raises(InputError, match="outside prompt 0"):
        position_mask([3], mask, answers)


def test_generic_engine_matches_transformer_lens_too(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    from mcp_interp.core import suffix_sweep

    monkeypatch.setattr(suffix_sweep, "SUPPORTED_MODEL_TYPES", frozenset())
    job = PatchHeadsJob(tiny, CLEAN, CORRUPT, CORRECT, INCORRECT)
    result = run(job)
    assert job.engine is not None and job.engine.startswith("generic")
    ours = torch.tensor(result.patched_logit_diff, dtype=torch.float64)
    assert (ours - tl_reference(tiny, CORRUPT, CLEAN).double()).abs().max().item() < 1e-4


def test_suffix_engine_with_padded_pairs_of_different_lengths(tiny: LoadedModel) -> None:
    clean = [CLEAN[0], "when tom and james went to the park , james gave a ball to the"]
    corrupt = [CORRUPT[0], "when tom and james went to the park , tom gave a ball to the"]
    job = PatchHeadsJob(tiny, clean, corrupt, ["mary", "tom"], ["john", "james"])
    result = run(job)
    assert job.engine is not None and job.engine.startswith("suffix")
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
