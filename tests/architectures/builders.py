"""Tiny random Hugging Face causal LMs of many architectures, saved as local model folders (no download).

Every builder: 2 layers, d_model 64 (4 query heads of d_head 16, 2 key/value heads where the architecture
has grouped-query attention), d_mlp 128, the project's word-level tiny tokenizer (196 tokens, BOS prepended),
eager attention, seeded weights with initializer_range 0.1 (so logits of a random model are spread enough
for metrics to differ between prompts), untied unembedding except GPT-2 (whose checkpoints tie it).
``save_arch(name, folder)`` writes config.json + model.safetensors + tokenizer files, which is what a user's
``--model <folder>`` reads; ``mcp_interp.models.load_model(folder)`` boots it.

What each exercises: GPT-2 (learned positions, Conv1D, tied), GPT-NeoX (parallel block with two norms,
joint QKV, Pythia's partial rotary), GPT-J (parallel block with one shared norm, attention TransformerLens
runs as one opaque module), Phi-1/2 (parallel block with one shared norm), Gemma-2 (post-norms, sliding
window, attention and final logit soft-capping), Gemma-3 (post-norms, q/k norms, mixed sliding/full
layers), Qwen3 (q/k norms), Mistral, Phi-3 (joint QKV and gate/up), OLMo-2 (post-norms only, q/k norms),
Qwen3-MoE (mixture-of-experts MLPs whose experts are narrower than ``intermediate_size``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SEED = 0
# Mistral without a sliding window is Llama's architecture: another seed keeps it from being the same weights.
SEEDS = {"mistral": 1}
# Gemma's sliding window: shorter than the 15-token test prompts (so the mask is exercised) but long enough
# that layer 0 sees the token where the minimal pairs differ from the answer position.
WINDOW = 8
D_MODEL, N_LAYERS, N_HEADS, D_HEAD, D_MLP = 64, 2, 4, 16, 128


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    from mcp_interp.core.engine.backend.loader.tiny import tiny_tokenizer_dir

    return AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir()))


def _common(tok: Any) -> dict[str, Any]:
    """Config kwargs every architecture takes (under its own names where noted per builder)."""
    return dict(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        initializer_range=0.1,
        tie_word_embeddings=False,
    )


def _llama_like(tok: Any, kv_heads: int = 2) -> dict[str, Any]:
    return dict(
        **_common(tok),
        hidden_size=D_MODEL,
        intermediate_size=D_MLP,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
    )


def gpt2_config(tok: Any) -> Any:
    from transformers import GPT2Config

    c = _common(tok)
    c.pop("tie_word_embeddings")  # GPT-2 ties its unembedding (the real checkpoints do)
    return GPT2Config(**c, n_embd=D_MODEL, n_layer=N_LAYERS, n_head=N_HEADS, n_inner=D_MLP, n_positions=256)


def neox_config(tok: Any) -> Any:
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        **_common(tok),
        hidden_size=D_MODEL,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        intermediate_size=D_MLP,
        rotary_pct=0.25,  # Pythia's partial rotary (d_head 16 → 4 rotary dims)
        use_parallel_residual=True,
        max_position_embeddings=256,
    )


def gptj_config(tok: Any) -> Any:
    from transformers import GPTJConfig

    c = _common(tok)
    return GPTJConfig(
        **c, n_embd=D_MODEL, n_layer=N_LAYERS, n_head=N_HEADS, n_inner=D_MLP, rotary_dim=8, n_positions=256
    )


def phi_config(tok: Any) -> Any:
    from transformers import PhiConfig

    return PhiConfig(
        **_common(tok),
        hidden_size=D_MODEL,
        intermediate_size=D_MLP,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        partial_rotary_factor=0.5,
        max_position_embeddings=256,
    )


def gemma2_config(tok: Any) -> Any:
    from transformers import Gemma2Config

    return Gemma2Config(**_llama_like(tok), head_dim=D_HEAD, sliding_window=WINDOW, query_pre_attn_scalar=D_HEAD)


def gemma3_config(tok: Any) -> Any:
    from transformers import Gemma3TextConfig

    # layer_types: one sliding, one full layer (real Gemma-3 is 5 sliding : 1 full).
    return Gemma3TextConfig(
        **_llama_like(tok),
        head_dim=D_HEAD,
        sliding_window=WINDOW,
        query_pre_attn_scalar=D_HEAD,
        layer_types=["sliding_attention", "full_attention"],
    )


def qwen3_config(tok: Any) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(**_llama_like(tok), head_dim=D_HEAD)


def mistral_config(tok: Any) -> Any:
    from transformers import MistralConfig

    return MistralConfig(**_llama_like(tok), head_dim=D_HEAD, sliding_window=None)


def phi3_config(tok: Any) -> Any:
    from transformers import Phi3Config

    return Phi3Config(**_llama_like(tok))


def olmo2_config(tok: Any) -> Any:
    from transformers import Olmo2Config

    return Olmo2Config(**_llama_like(tok))


def qwen3_moe_config(tok: Any) -> Any:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        **_llama_like(tok),
        head_dim=D_HEAD,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def olmoe_config(tok: Any) -> Any:
    from transformers import OlmoeConfig

    return OlmoeConfig(**_llama_like(tok), num_experts=4, num_experts_per_tok=2)


def mixtral_config(tok: Any) -> Any:
    from transformers import MixtralConfig

    return MixtralConfig(
        **_llama_like(tok), head_dim=D_HEAD, num_local_experts=4, num_experts_per_tok=2, sliding_window=None
    )


def llama_config(tok: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**_llama_like(tok))


CONFIGS: dict[str, Callable[[Any], Any]] = {
    "gpt2": gpt2_config,
    "neox": neox_config,
    "gptj": gptj_config,
    "phi": phi_config,
    "gemma2": gemma2_config,
    "gemma3": gemma3_config,
    "qwen3": qwen3_config,
    "mistral": mistral_config,
    "phi3": phi3_config,
    "olmo2": olmo2_config,
    "qwen3_moe": qwen3_moe_config,
    "olmoe": olmoe_config,
    "mixtral": mixtral_config,
    "llama": llama_config,
}
# The matrix the tests run: every architecture family once (Llama is `tiny`, tested everywhere else; one MoE).
MATRIX = ("gpt2", "neox", "gptj", "phi", "gemma2", "gemma3", "qwen3", "mistral", "phi3", "olmo2", "qwen3_moe")
PARALLEL = frozenset({"neox", "gptj", "phi"})
POST_NORM = frozenset({"gemma2", "gemma3", "olmo2"})


def build_arch(name: str) -> tuple[Any, Any]:
    """(HF model in eval mode, tokenizer) of architecture ``name``: seeded, random, eager attention."""
    from transformers import AutoModelForCausalLM

    tok = _tokenizer()
    config = CONFIGS[name](tok)
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEEDS.get(name, SEED))
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.eval(), tok


def save_arch(name: str, folder: str | Path) -> Path:
    """Write architecture ``name`` as an HF model folder (config, safetensors, tokenizer); return it."""
    folder = Path(folder)
    model, tok = build_arch(name)
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder
