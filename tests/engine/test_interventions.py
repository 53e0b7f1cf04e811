"""Interventions in the engine: derangements, mean replacement by hand, mean/resample ablation against
hand-written hooks, and component/position parsing."""

from __future__ import annotations

import pytest
import torch

from mcp_interp.core.engine.ablation.targets import Ablation, derangement, mean_replacement, prepare_ablation
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.components import Head, parse_heads, position_mask
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.heads.ablate_head import ablate_heads
from mcp_interp.errors import InputError
from tests.helpers import IOI_CLEAN as CLEAN


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
    prepared = prepare_ablation(tiny, batch, Ablation([head], "mean", "last"))
    assert prepared.mean_over == "per_position_from_end"
    seen = {}

    def record(z: torch.Tensor, hook: object) -> torch.Tensor:
        seen["z"] = z.clone()
        return z

    observed = tiny.backend.run(
        batch.input_ids, edits=prepared.edits, capture=["blocks.1.attn.hook_z"], attention_mask=batch.attention_mask
    )
    record(observed.acts["blocks.1.attn.hook_z"], None)
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
    prepared = prepare_ablation(tiny, batch, Ablation([head], method, seed=4))  # type: ignore[arg-type]
    ours = tiny.backend.logits(batch.input_ids, prepared.edits)
    assert (ours - expected).abs().max().item() < 1e-5
    assert prepared.permutation == (perm if method == "resample" else None)


def test_resample_needs_equal_lengths(tiny: LoadedModel) -> None:
    with pytest.raises(InputError, match="equal token length"):
        ablate_heads(
            tiny, ["when mary went to", "when mary and john went to the store"], Ablation([Head(0, 0)], "resample")
        )


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
