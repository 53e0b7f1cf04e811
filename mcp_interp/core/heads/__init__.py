"""Attention heads as units: ``ablate_head`` and ``patch_heads``, presets of the engine's ablation and patching."""
