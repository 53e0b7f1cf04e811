"""Logit lens, DLA, attention, induction, steering on `tiny` (and constructed models)."""

from __future__ import annotations

import math

import pytest
import torch

from mcp_interp.core.engine.backend.loader.load import boot
from mcp_interp.core.engine.backend.loader.tiny import tiny_tokenizer_dir
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.lens.attention import attention
from mcp_interp.core.lens.dla import dla
from mcp_interp.core.lens.induction import induction, induction_tokens
from mcp_interp.core.lens.logit_lens import logit_lens
from mcp_interp.core.lens.steer import repetition, steer
from mcp_interp.core.readouts import predictions as readouts
from mcp_interp.errors import InputError

PROMPT = "when mary and john went to the store , john gave a drink to"


def test_dla_sums_to_the_measured_logit_difference(tiny: LoadedModel) -> None:
    result = dla(tiny, PROMPT, "mary", "john")
    measured = readouts.logit_diff(tiny, [PROMPT], "mary", "john").logit_diff.value
    assert result.measured == pytest.approx(measured, abs=1e-6)
    parts = result.embed + sum(map(sum, result.heads)) + sum(result.mlps) + sum(result.attn_biases) + result.bias_term
    assert parts == pytest.approx(result.total, abs=1e-9)
    assert abs(result.measured - result.total) < 1e-4
    assert len(result.heads) == 3 and len(result.heads[0]) == 4
    assert abs(result.top[0].value) == max(abs(c.value) for c in result.top)
    assert any("correlational" in n for n in result.notes)


def test_each_heads_dla_is_its_w_o_slice_read_through_the_frozen_final_norm(tiny: LoadedModel) -> None:
    result = dla(tiny, PROMPT, "mary", "john")
    tok, bridge = tiny.tokenizer, tiny.bridge
    mary, john = (tok(w, add_special_tokens=False)["input_ids"][0] for w in ("mary", "john"))
    w_u = bridge.unembed.original_component.weight.detach().double()
    gain = bridge.ln_final.original_component.weight.detach().double()  # tiny is a Llama: RMSNorm, no centering
    with torch.no_grad():
        _, cache = bridge.run_with_cache(torch.tensor([tok(PROMPT)["input_ids"]]))
    scale = float(cache["ln_final.hook_scale"][0, -1].reshape(-1)[0])
    read = (w_u[mary] - w_u[john]) * gain / scale
    d_head = bridge.cfg.d_head
    for layer in range(bridge.cfg.n_layers):
        w_o = bridge.blocks[layer].attn.o.original_component.weight.detach().double()
        z = cache[f"blocks.{layer}.attn.hook_z"][0, -1].double()
        for head in range(bridge.cfg.n_heads):
            written = w_o[:, head * d_head : (head + 1) * d_head] @ z[head]
            assert result.heads[layer][head] == pytest.approx(float(written @ read), abs=1e-5)
        mlp = cache[f"blocks.{layer}.hook_mlp_out"][0, -1].double()
        assert result.mlps[layer] == pytest.approx(float(mlp @ read), abs=1e-5)


def test_dla_of_a_single_logit_also_sums(tiny: LoadedModel) -> None:
    result = dla(tiny, PROMPT, "mary")
    assert result.baseline is None and result.quantity == "logit(answer)"
    assert abs(result.measured - result.total) < 1e-4


def test_dla_with_layernorm_centering_sums_on_a_gpt2_architecture() -> None:
    """GPT-2 has LayerNorm (centering + bias) and biases everywhere: the bias term must close the sum."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir()))
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(1)
    hf = GPT2LMHeadModel(config)
    with torch.no_grad():  # non-zero biases so the bias term is exercised
        for name, param in hf.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.5)
    model = boot("tiny-gpt2", "tiny", "gpt2", hf, tokenizer)
    result = dla(model, PROMPT, "mary", "john")
    assert result.bias_term != 0.0
    assert abs(result.measured - result.total) < 1e-4, (result.measured, result.total)
    assert any(v != 0 for v in result.attn_biases)


def test_logit_lens_last_layer_is_the_models_own_output(tiny: LoadedModel) -> None:
    result = logit_lens(tiny, PROMPT, top_k=3)
    ranked = readouts.answer_rank(tiny, [PROMPT], result.target)
    assert ranked.examples[0].top1_id == result.layers[-1].top[0].id == result.target_id
    assert result.layers[-1].target_prob == pytest.approx(result.final_prob, abs=1e-6)
    assert result.final_prob == pytest.approx(ranked.examples[0].prob, abs=1e-6)
    assert [row.layer for row in result.layers] == [-1, 0, 1, 2]
    assert [row.site for row in result.layers] == ["embed", "resid_post", "resid_post", "resid_post"]
    assert isinstance(result.first_top1_layer, int)  # the default target is the final top-1
    first = [row.layer for row in result.layers].index(result.first_top1_layer)
    assert all(row.target_rank == 0 for row in result.layers[first:])
    assert first == 0 or result.layers[first - 1].target_rank > 0


def test_attention_rows_are_distributions_and_causal(tiny: LoadedModel) -> None:
    result = attention(tiny, PROMPT, 1, 2)
    n = len(result.tokens)
    assert len(result.pattern) == n
    for q, row in enumerate(result.pattern):
        assert sum(row) == pytest.approx(1.0, abs=1e-4)
        assert all(w == 0 for w in row[q + 1 :])
    top = result.top_attended[0]
    assert top.weight == pytest.approx(max(result.pattern[result.answer_position]), abs=1e-6)
    with pytest.raises(InputError, match=r"layers 0\.\.2"):
        attention(tiny, PROMPT, 5, 0)


def induction_circuit() -> LoadedModel:
    """A 2-layer Llama built by hand: L0H0 attends to the previous token and copies it into a
    subspace; L1H2 matches the current token against that subspace — an induction head.

    Rotary frequencies are spread with rope_theta = 1e8: the previous-token head uses the fast
    pairs (a sharp peak at offset −1), the induction head the slow pairs (position-blind matching).
    """
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir()))
    d_model, d_head, const = 128, 32, 32
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=d_model,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=d_head,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 1e8},
        tie_word_embeddings=False,
    )
    hf = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(0)
    theta = [1e8 ** (-k / 16) for k in range(16)]
    with torch.no_grad():
        for param in hf.parameters():
            param.zero_()
        for block in hf.model.layers:
            block.input_layernorm.weight.fill_(1.0)
            block.post_attention_layernorm.weight.fill_(1.0)
        hf.model.norm.weight.fill_(1.0)
        tokens = torch.randn(len(tokenizer), 16, generator=generator)
        embed = hf.model.embed_tokens.weight
        embed[:, :16] = 4 * tokens / tokens.norm(dim=1, keepdim=True)
        embed[:, const] = 4.0
        # Layer 0, head 0 (KV head 0): previous-token attention from the constant direction.
        a0 = hf.model.layers[0].self_attn
        alpha, normalised_const = 14.0, 8.0
        for k in range(4):
            a0.q_proj.weight[k, const] = alpha / normalised_const
            a0.k_proj.weight[k, const] = alpha * math.cos(theta[k]) / normalised_const
            a0.k_proj.weight[k + 16, const] = alpha * math.sin(theta[k]) / normalised_const
        for r in range(16):
            a0.v_proj.weight[r, r] = 1.0
            a0.o_proj.weight[64 + r, r] = 0.5  # previous token's embedding → subspace 64..79
        # Layer 1, head 2 (KV head 1): current token (dims 0..15) against the copied one (64..79).
        a1 = hf.model.layers[1].self_attn
        slow = [8 + r if r < 8 else 24 + r - 8 for r in range(16)]
        for r in range(16):
            a1.q_proj.weight[2 * d_head + slow[r], r] = 2.0
            a1.k_proj.weight[d_head + slow[r], 64 + r] = 2.0
    return boot("induction-circuit", "tiny", "induction-circuit", hf, tokenizer)


def test_hand_built_induction_head_scores_highest() -> None:
    model = induction_circuit()
    result = induction(model, seq_len=20, n_seqs=8, seed=0)
    assert result.heads[0].component == "L1H2"
    assert result.heads[0].value > 0.8
    assert all(c.value < 0.3 for c in result.heads[1:])
    # The previous-token head really is one: it attends to position i-1.
    tokens = induction_tokens(model, 20, 1, 0)
    with torch.no_grad():
        _, cache = model.bridge.run_with_cache(tokens)
    pattern = cache["blocks.0.attn.hook_pattern"][0, 0]
    assert float(pattern[torch.arange(1, 40), torch.arange(0, 39)].mean()) > 0.9


def test_induction_tokens_are_seeded_and_repeat() -> None:
    model = induction_circuit()
    a, b = induction_tokens(model, 10, 3, 7), induction_tokens(model, 10, 3, 7)
    assert torch.equal(a, b) and torch.equal(a[:, :10], a[:, 10:])
    assert not set(a.flatten().tolist()) & set(model.tokenizer.all_special_ids)


def test_steering_adds_the_vector_to_the_input_of_the_named_block(tiny: LoadedModel) -> None:
    tok, bridge = tiny.tokenizer, tiny.bridge
    layer, coefficient = 1, 3.0

    def resid_in(text: str) -> torch.Tensor:
        with torch.no_grad():
            _, cache = bridge.run_with_cache(torch.tensor([tok(text)["input_ids"]]))
        return cache[f"blocks.{layer}.hook_in"][0, -1]

    vector = resid_in("good") - resid_in("bad")
    ids = tok(PROMPT)["input_ids"]

    def add(resid: torch.Tensor, hook: object) -> torch.Tensor:
        return resid + coefficient * vector

    generated = []
    with torch.no_grad(), bridge.hooks(fwd_hooks=[(f"blocks.{layer}.hook_in", add)]):
        for _ in range(6):
            logits = bridge(torch.tensor([ids + generated]), return_type="logits")
            generated.append(int(logits[0, -1].argmax()))
    result = steer(tiny, PROMPT, "good", "bad", layer, coefficient, max_new_tokens=6)
    assert result.vector_norm == pytest.approx(float(vector.norm()), rel=1e-5)
    assert result.steered_text == tok.decode(generated)


def test_added_norm_is_the_norm_of_what_the_steering_changes_in_the_residual(tiny: LoadedModel) -> None:
    """At coefficient −4 the stream entering layer 1's first norm differs from the unsteered one by a vector of norm
    |−4| × vector_norm at every position, and each random direction changes it by random_norm: both read from a
    capture hook on the residual the steering writes to, not from the tool's own arithmetic."""
    captured: list[torch.Tensor] = []

    def capture(resid: torch.Tensor, hook: object) -> None:
        captured.append(resid.detach().clone())

    handle_name = "blocks.1.ln1.hook_in"  # the residual after blocks.1.hook_in, where ActAdd adds its vector
    tiny.bridge.add_hook(handle_name, capture)
    try:
        result = steer(tiny, PROMPT, "good", "bad", 1, -4.0, max_new_tokens=1, random_draws=19)
    finally:
        tiny.bridge.reset_hooks()
    # Forwards over the prompt alone: its residual (for scale) and the unsteered ones come first, the steered
    # next-token readout last of the single ones; the 19 random directions are one stacked forward.
    n = len(tiny.tokenizer(PROMPT)["input_ids"])
    single = [c for c in captured if c.shape[:2] == (1, n)]
    (randoms,) = [c for c in captured if c.shape[0] == 19]
    unsteered, steered = single[0], single[-1]
    moved = (steered - unsteered)[0].norm(dim=-1)  # one norm per position
    assert result.added_norm == pytest.approx(4 * result.vector_norm, rel=1e-6)
    assert moved.tolist() == pytest.approx([result.added_norm] * moved.numel(), rel=1e-4)
    assert result.added_norm > 1.0  # a real displacement, not 0 = 0
    random_moved = (randoms - unsteered)[:, -1].norm(dim=-1)
    assert random_moved.tolist() == pytest.approx([result.random_norm] * 19, rel=1e-4)
    assert result.random_norm == pytest.approx(result.added_norm, rel=1e-6)


def test_repetition_by_hand() -> None:
    assert repetition([1, 2, 3, 4]) == 0.0
    assert repetition([1, 2, 3, 1, 2, 3]) == pytest.approx(1 / 4)
    assert repetition([5] * 6) == pytest.approx(3 / 4)
    assert repetition([1, 2]) == 0.0


def test_steer_with_zero_coefficient_changes_nothing_and_degeneration_is_flagged(tiny: LoadedModel) -> None:
    same = steer(tiny, PROMPT, "good", "bad", 1, 0.0, max_new_tokens=8)
    assert same.steered_text == same.baseline_text
    assert any("identical" in n for n in same.notes)
    strong = steer(tiny, PROMPT, "good", "bad", 1, 50.0, max_new_tokens=12)
    assert (strong.repetition_steered >= 0.5) == any("degenerates" in n for n in strong.notes)
    assert any("dominates" in n for n in strong.notes)
    with pytest.raises(InputError, match=r"layers 0\.\.2"):
        steer(tiny, PROMPT, "good", "bad", 9, 1.0)
