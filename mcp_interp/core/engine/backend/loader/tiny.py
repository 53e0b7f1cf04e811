"""The ``tiny`` model: a seeded, randomly initialised grouped-query Llama with a word-level tokenizer shipped as
package data. For tests and for trying the protocol without weights: its answers mean nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mcp_interp.corpora import DATA_DIR
from mcp_interp.names import TINY_SEED


def build_tiny(kv_heads: int = 2) -> tuple[Any, Any]:
    """The `tiny` model: 3 layers, 4 query heads sharing 2 KV heads, d_model 64, seed 0.

    ``kv_heads=4`` gives the multi-head (not grouped-query) variant tests compare with libraries
    that refuse grouped-query attention.

    ``initializer_range`` is larger than Llama's 0.02 so the random model's logits are
    spread out enough for metrics to differ between prompts; the weights mean nothing.
    """
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir()))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        initializer_range=0.1,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="eager",  # type: ignore[call-arg]  # PretrainedConfig kwarg, untyped
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config)
    return model.eval(), tokenizer


def tiny_tokenizer_dir() -> Path:
    return DATA_DIR / "tiny_tokenizer"
