"""Model names the CLI and the loader agree on (no heavy imports: the CLI reads these first)."""

from __future__ import annotations

EMBEDDED_NAME = "smollm2-135m"
EMBEDDED_HF_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_NAME = "tiny"
TINY_SEED = 0


def describe_model_names() -> str:
    """One line per accepted kind of model name, for help texts and error messages."""
    return (
        f"'{EMBEDDED_NAME}' (default, embedded, offline), '{TINY_NAME}' (random weights, for tests), "
        "a local HF model folder or .gguf file, or a Hugging Face hub name such as 'gpt2' "
        "(needs network access to the hub)"
    )
