"""Which weights a number came from: a short hash of every parameter, the same whether the model is in memory
(``weights_fingerprint``) or read tensor by tensor from its checkpoint (``checkpoint_fingerprint``, for the placed
and remote backends, whose model may be on disk or in another process).
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import torch

from mcp_interp.errors import ModelLoadError


def weights_fingerprint(module: torch.nn.Module) -> str:
    """A short hash of every parameter's bytes, so two results can be tied to the same weights.

    Shared (tied) parameters are hashed once, in ``named_parameters`` order; names are
    hashed too so a permutation of layers changes the fingerprint.
    """
    digest = hashlib.blake2b(digest_size=8)
    for param_name, param in module.named_parameters():
        digest.update(param_name.encode())
        digest.update(param.detach().to("cpu").contiguous().view(torch.uint8).numpy().data)
    return digest.hexdigest()


def checkpoint_fingerprint(folder: Path, dtype: torch.dtype) -> str:
    """``models.weights_fingerprint`` of the model in ``folder`` as ``from_pretrained`` would load it in ``dtype``, read
    tensor by tensor from its safetensors files (the model itself may be on disk or on another machine).

    The parameters are named and ordered as the HF model names them (a skeleton built on the meta device, tied
    parameters once) and each is read from the checkpoint under that name. A checkpoint that stores a parameter under
    another name (legacy key renames) cannot be matched this way: its files' bytes are hashed instead, and the
    fingerprint then differs from the in-memory model's (said in the error of any check that compares them)."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} has no .safetensors weights: the placed and remote backends read safetensors.")
    where: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            where.update(dict.fromkeys(handle.keys(), file))
    config = AutoConfig.from_pretrained(str(folder))
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    skeleton.tie_weights()
    names = [name for name, _ in skeleton.named_parameters()]
    if any(name not in where for name in names):
        return _files_digest(files)
    digest = hashlib.blake2b(digest_size=8)
    with contextlib.ExitStack() as stack:
        handles = {file: stack.enter_context(safe_open(str(file), framework="pt")) for file in files}
        for name in names:
            tensor = handles[where[name]].get_tensor(name).to(dtype).contiguous()
            digest.update(name.encode())
            digest.update(tensor.view(torch.uint8).numpy().data)
    return digest.hexdigest()


def _files_digest(files: list[Path]) -> str:
    digest = hashlib.blake2b(digest_size=8)
    for file in files:
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
