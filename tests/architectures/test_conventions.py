"""Each model's conventions, surfaced: whether the tokenizer prepends BOS, where the attention sink sits, and
``induction`` → ``loss`` measuring the same tokens at the same positions.

Every expected number is computed here from the bridge's own logits and patterns.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from tokenizers.processors import TemplateProcessing

from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.conventions import FirstKeyAttention, attention_sink_note
from mcp_interp.core.lens.attention import attention
from mcp_interp.core.lens.induction import induction
from mcp_interp.core.localize.loss import text_losses
from mcp_interp.core.readouts.info import model_info
from mcp_interp.errors import InputError
from tests.architectures.builders import save_arch


def hand_losses(model: LoadedModel, ids: list[list[int]], positions: list[int]) -> float:
    """Mean over sequences and ``positions`` k of −log P(t_k | t_<k), from the bridge's logits."""
    tokens = torch.tensor(ids)
    with torch.no_grad():
        log_probs = torch.log_softmax(model.bridge(tokens).double(), dim=-1)
    k = torch.tensor(positions)
    return float(-log_probs[:, k - 1].gather(2, tokens[:, k].unsqueeze(-1)).mean())


def hand_scores(model: LoadedModel, ids: list[list[int]], offset: int, seq_len: int) -> torch.Tensor:
    """[layers, heads]: mean attention from query q of the second copy to q − seq_len + 1."""
    _, cache = model.bridge.run_with_cache(torch.tensor(ids))
    q = torch.arange(offset + seq_len, offset + 2 * seq_len)
    layers = range(model.bridge.cfg.n_layers)
    return torch.stack(
        [
            cache[f"blocks.{layer}.attn.hook_pattern"][:, :, q, q - seq_len + 1].double().mean(dim=(0, 2))
            for layer in layers
        ]
    )


def test_induction_returns_what_loss_then_measures_exactly(tiny: LoadedModel) -> None:
    result = induction(tiny, seq_len=6, n_seqs=3, seed=4)
    sequences = result.sequences
    assert len(sequences) == 3 and all(len(s) == 12 and s[:6] == s[6:] for s in sequences)  # tiny adds no BOS
    assert result.predicted_positions == list(range(7, 12))
    assert torch.allclose(torch.tensor(result.scores, dtype=torch.float64), hand_scores(tiny, sequences, 0, 6))
    measured = text_losses(tiny, token_ids=sequences, positions=result.predicted_positions)
    assert measured.mean_loss == pytest.approx(hand_losses(tiny, sequences, result.predicted_positions), abs=1e-9)
    assert [t.scored_positions for t in measured.texts] == [list(range(7, 12))] * 3
    first = measured.texts[0]
    assert first.mean_loss == pytest.approx(sum(first.loss[6:11]) / 5, abs=1e-12)  # loss[k − 1] is token k's
    whole = text_losses(tiny, token_ids=sequences)
    assert whole.mean_loss == pytest.approx(hand_losses(tiny, sequences, list(range(1, 12))), abs=1e-9)


def test_a_prefix_starts_every_sequence_and_shifts_the_measured_positions(tiny: LoadedModel) -> None:
    prefix_ids = tiny.tokenizer("words :")["input_ids"]
    result = induction(tiny, seq_len=5, n_seqs=2, seed=1, prefix="words :")
    plain = induction(tiny, seq_len=5, n_seqs=2, seed=1)
    offset = len(prefix_ids)
    assert offset == 2 and result.prefix == "words :"
    assert result.sequences == [prefix_ids + s for s in plain.sequences]  # the same random tokens behind it
    assert result.predicted_positions == [p + offset for p in plain.predicted_positions]
    scores = torch.tensor(result.scores, dtype=torch.float64)
    assert torch.allclose(scores, hand_scores(tiny, result.sequences, offset, 5))
    assert not torch.allclose(scores, torch.tensor(plain.scores, dtype=torch.float64))


def test_bad_token_ids_and_positions_say_what_to_pass(tiny: LoadedModel) -> None:
    with pytest.raises(InputError, match="not both"):
        text_losses(tiny, texts=["a b"], token_ids=[[1, 2]])
    with pytest.raises(InputError, match="not both"):
        text_losses(tiny)
    with pytest.raises(InputError, match=r"holds 99999, not a token id of this model \(integers 0\.\.195\)"):
        text_losses(tiny, token_ids=[[1, 99999]])
    with pytest.raises(InputError, match=r"1 ≤ k < 3 \(the shortest text has 3 tokens"):
        text_losses(tiny, token_ids=[[5, 6, 7], [5, 6, 7, 8]], positions=[3])
    with pytest.raises(InputError, match=r"1 ≤ k < 3"):
        text_losses(tiny, token_ids=[[5, 6, 7]], positions=[0])
    with pytest.raises(InputError, match="`prefix` must be a non-empty text"):
        induction(tiny, seq_len=4, n_seqs=1, prefix="  ")


def patterns(first: float, n: int = 6) -> torch.Tensor:
    """A causal pattern [1, 1, n, n] putting ``first`` on key 0 (all of it at query 0) and the rest uniformly."""
    p = torch.zeros(1, 1, n, n, dtype=torch.float64)
    p[0, 0, 0, 0] = 1.0
    for q in range(1, n):
        p[0, 0, q, 0] = first
        p[0, 0, q, 1 : q + 1] = (1 - first) / q
    return p


def test_the_sink_share_and_when_it_is_noted(tiny: LoadedModel) -> None:
    sink = FirstKeyAttention(2)
    sink.add(patterns(0.8, n=20))
    sink.add(patterns(0.6, n=20))
    share, uniform = sink.share([20])
    assert share == pytest.approx(0.7) and uniform == pytest.approx(sum(1 / (q + 1) for q in range(1, 20)) / 19)
    note = attention_sink_note(tiny.tokenizer, share, uniform, "when", "Do this.")
    assert note is not None and "'when'" in note and "70%" in note and note.endswith("Do this.")
    assert attention_sink_note(tiny.tokenizer, uniform, uniform, "when", "") is None  # uniform attention: no sink
    assert attention_sink_note(tiny.tokenizer, 0.35, 0.2, "when", "") is None  # < 3 × uniform
    truncated = FirstKeyAttention(1)
    truncated.add(patterns(0.9))
    assert truncated.share([3])[0] == pytest.approx(0.9)  # only real queries of the row count


@pytest.fixture(scope="module")
def bos_model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """The tiny GPT-NeoX with a tokenizer that prepends [BOS], as GPT-2-style and Llama tokenizers do."""
    folder = save_arch("neox", tmp_path_factory.mktemp("bos") / "neox")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    bos = tokenizer.bos_token
    tokenizer._tokenizer.post_processor = TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tokenizer.bos_token_id)]
    )
    tokenizer.save_pretrained(str(folder))
    return load_model(str(folder))


def test_a_bos_tokenizer_is_said_and_starts_every_induction_sequence(bos_model: LoadedModel, tiny: LoadedModel) -> None:
    bos = bos_model.tokenizer.bos_token_id
    assert model_info(bos_model).prepends_bos is True and model_info(tiny).prepends_bos is False
    result = induction(bos_model, seq_len=4, n_seqs=2, seed=0)
    assert [s[0] for s in result.sequences] == [bos, bos] and all(len(s) == 9 for s in result.sequences)
    assert result.predicted_positions == [6, 7, 8]
    assert torch.allclose(
        torch.tensor(result.scores, dtype=torch.float64), hand_scores(bos_model, result.sequences, 1, 4)
    )
    # A BOS model's sink is its BOS: never noted, whatever the share.
    assert attention_sink_note(bos_model.tokenizer, 0.9, 0.1, "[BOS]", "") is None


@pytest.mark.embedded
def test_smollm2_sinks_on_the_first_token_and_a_prefix_moves_it(embedded: LoadedModel) -> None:
    """SmolLM2 adds no BOS: on repeated random tokens the first random token is the sink (noted), the prefix
    'Words:' takes it instead (not noted), and the second copy's loss — measured through `loss` on exactly the
    tokens `induction` ran — drops."""
    plain = induction(embedded, seq_len=50, n_seqs=8, seed=0)
    prefixed = induction(embedded, seq_len=50, n_seqs=8, seed=0, prefix="Words:")
    assert any("attention sink" in n and "`prefix`" in n for n in plain.notes)
    assert not any("attention sink" in n for n in prefixed.notes)
    losses = []
    for result in (plain, prefixed):
        measured = text_losses(embedded, token_ids=result.sequences, positions=result.predicted_positions)
        assert measured.mean_loss == pytest.approx(
            hand_losses(embedded, result.sequences, result.predicted_positions), abs=1e-6
        )
        losses.append(measured.mean_loss)
    assert losses[0] > losses[1] + 0.5, losses  # measured: 2.25 nats without a prefix, 1.49 with "Words:"
    text = attention(embedded, "The quick brown fox jumps over the lazy dog.", 5, 0)
    assert any("attention sink" in n and "'The'" in n for n in text.notes)


def test_a_random_model_has_no_sink_to_note(arch_model: Callable[[str], LoadedModel]) -> None:
    model = arch_model("qwen3")
    result = induction(model, seq_len=8, n_seqs=2, seed=0)
    sink = FirstKeyAttention(model.bridge.cfg.n_layers)
    _, cache = model.bridge.run_with_cache(torch.tensor(result.sequences))
    for layer in range(model.bridge.cfg.n_layers):
        sink.add(cache[f"blocks.{layer}.attn.hook_pattern"])
    share, uniform = sink.share([16, 16])
    assert share < 3 * uniform  # random weights attend almost uniformly
    assert not any("attention sink" in n for n in result.notes)
