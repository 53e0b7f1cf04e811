"""Readouts on the `tiny` model against an independent reference: the HF model run directly,
one prompt at a time with no padding, and metrics computed by hand from its logits."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from mcp_interp.core.engine.backend.loader.tiny import build_tiny
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.answers import resolve_answer
from mcp_interp.core.engine.text.tokens import encode, validate_pairs
from mcp_interp.core.readouts import predictions as readouts
from mcp_interp.errors import InputError

# Deliberately different lengths, so the batch is right-padded.
PROMPTS = [
    "When Mary and John went to the store, John gave a drink to",
    "Then Tom gave a ball to",
    "The capital of France is",
]


@functools.cache
def plain_hf_tiny() -> torch.nn.Module:
    """The same seeded weights as a plain HF model that no bridge has wrapped."""
    return build_tiny()[0]


def reference_next_logits(model: LoadedModel, text: str) -> torch.Tensor:
    """Next-token logits of one unpadded prompt from the plain HF model (no bridge, no padding)."""
    ids = model.tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        return plain_hf_tiny()(ids).logits[0, -1].to(torch.float64)


def test_batch_is_right_padded_and_answer_position_is_last_real_token(tiny: LoadedModel) -> None:
    batch = encode(tiny.tokenizer, PROMPTS)
    lengths = [len(tiny.tokenizer(p).input_ids) for p in PROMPTS]
    assert batch.lengths == lengths
    assert batch.answer_positions.tolist() == [n - 1 for n in lengths]
    assert len(set(lengths)) > 1, "the test needs padding to mean something"


def test_logit_diff_matches_unpadded_hf_reference(tiny: LoadedModel) -> None:
    result = readouts.logit_diff(tiny, PROMPTS, " mary", [" john", " tom", " paris"])
    mary = tiny.tokenizer.convert_tokens_to_ids("mary")
    others = [tiny.tokenizer.convert_tokens_to_ids(w) for w in ("john", "tom", "paris")]
    for i, prompt in enumerate(PROMPTS):
        ref = reference_next_logits(tiny, prompt)
        assert result.examples[i].logit_diff == pytest.approx(float(ref[mary] - ref[others[i]]), abs=1e-5)
        assert result.examples[i].top1_id == int(ref.argmax())
    assert result.logit_diff.value == pytest.approx(sum(result.logit_diff.per_example) / 3)


def test_answer_rank_and_logprob_match_reference(tiny: LoadedModel) -> None:
    result = readouts.answer_rank(tiny, PROMPTS, ["mary", "ball", "paris"])
    for i, (prompt, word) in enumerate(zip(PROMPTS, ["mary", "ball", "paris"], strict=True)):
        ref = reference_next_logits(tiny, prompt)
        target = tiny.tokenizer.convert_tokens_to_ids(word)
        assert result.examples[i].rank == int((ref > ref[target]).sum())
        assert result.examples[i].log_prob == pytest.approx(float(torch.log_softmax(ref, -1)[target]), abs=1e-5)
        assert result.examples[i].prob == pytest.approx(math.exp(result.examples[i].log_prob))


def test_rank_saturation_note_only_when_every_rank_is_zero(tiny: LoadedModel) -> None:
    top1 = [tiny.tokenizer.decode([int(reference_next_logits(tiny, p).argmax())]) for p in PROMPTS]
    saturated = readouts.answer_rank(tiny, PROMPTS, top1)
    assert saturated.rank.per_example == [0.0, 0.0, 0.0]
    assert any("saturated" in n for n in saturated.notes)
    mixed = readouts.answer_rank(tiny, PROMPTS, "mary")
    assert any(r > 0 for r in mixed.rank.per_example), "precondition: 'mary' is not top-1 everywhere"
    assert not any("saturated" in n for n in mixed.notes)


def test_kl_matches_reference_and_is_zero_on_identical_prompts(tiny: LoadedModel) -> None:
    p = ["When Mary and John went to the store, John gave a drink to"]
    q = ["When Mary and John went to the store, Mary gave a drink to"]
    result = readouts.kl(tiny, p, q)
    ref_p, ref_q = reference_next_logits(tiny, p[0]), reference_next_logits(tiny, q[0])
    log_p, log_q = torch.log_softmax(ref_p, -1), torch.log_softmax(ref_q, -1)
    expected = float((log_p.exp() * (log_p - log_q)).sum())
    assert result.kl.value == pytest.approx(expected, rel=1e-4, abs=1e-7)
    assert result.examples[0].differing_positions == [9]
    same = readouts.kl(tiny, p, p)
    assert same.kl.value == 0.0
    assert any("identical" in n for n in same.notes)


def test_multi_token_answer_error_shows_tokens() -> None:
    from transformers import AutoTokenizer

    from mcp_interp.core.engine.backend.loader.tiny import tiny_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir()))
    with pytest.raises(InputError) as err:
        resolve_answer(tok, "mary john")
    text = str(err.value)
    assert "2 tokens" in text and "'mary'" in text and "'john'" in text
    with pytest.raises(InputError, match="non-empty"):
        resolve_answer(tok, "")


def test_unequal_pair_lengths_error_names_the_pair_and_tokens(tiny: LoadedModel) -> None:
    with pytest.raises(InputError) as err:
        validate_pairs(tiny.tokenizer, ["a b c", "a b"], ["a b c", "a b c"], ("prompts", "compare_prompts"))
    assert "pair 1: 2 tokens" in str(err.value) and "3 tokens" in str(err.value)
    with pytest.raises(InputError, match="same number"):
        validate_pairs(tiny.tokenizer, ["a"], ["a", "b"], ("prompts", "compare_prompts"))


def test_answer_list_length_must_match_prompts(tiny: LoadedModel) -> None:
    with pytest.raises(InputError, match="one answer per prompt"):
        readouts.logit_diff(tiny, PROMPTS, ["mary", "john"], "tom")


def test_empty_prompts_are_an_input_error(tiny: LoadedModel) -> None:
    with pytest.raises(InputError, match="No prompts"):
        readouts.logit_diff(tiny, [], "mary", "john")
