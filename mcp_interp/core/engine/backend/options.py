"""Which backend runs the model, and where its weights sit: the options past one device, all TransformerLens' own.

* ``transformers`` (default) — ``TransformerBridge.boot_transformers`` over a local torch model. With a placement
  (``device_map``, ``max_memory``, ``offload_folder``) the bridge loads the checkpoint itself and accelerate places it
  over GPUs, CPU and disk; TransformerLens' components materialise offloaded weights around each call, so every
  tool runs, gradients included. (A placement needs the bridge to load the model itself, not ``hf_model=``.)
* ``inspect`` — ``RemoteBridge.boot_inspect`` with TransformerLens' HF-backed Inspect provider: the RemoteBridge
  protocol (captures at hook points, ``suppress``/``scale``/``add``/``set`` edits) on any CPU; what CI tests the
  remote path with.
* ``vllm`` — ``RemoteBridge.boot_vllm``: vLLM with tensor and pipeline parallelism (``pip install
  'mcp-interp[vllm]'``). No gradients and no attention patterns.

Both ways of loading read a checkpoint folder (or a hub name) rather than an in-memory model, so ``tiny`` is saved
to a cache folder first, and the weights' fingerprint is read from the checkpoint (``fingerprints``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, get_args

import torch

from mcp_interp.errors import ModelLoadError
from mcp_interp.schemas.common import BackendName

BACKENDS: tuple[BackendName, ...] = get_args(BackendName)

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


@dataclass(frozen=True)
class LoadOptions:
    """How to run the model: the backend and, for ``transformers``, its placement; for ``vllm``, its parallelism."""

    backend: BackendName = "transformers"
    device_map: str | dict[str, Any] | None = None  # a strategy name or {module: device}, as accelerate takes it
    max_memory: dict[Any, str] | None = None  # {"0": "70GiB", "cpu": "100GiB"}, as accelerate takes it
    offload_folder: str | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    extra: dict[str, Any] = field(default_factory=dict)  # passed on to the backend's boot as keyword arguments
    reveal_ground_truth: bool = False  # a compiled RASP program's ground truth in model_info (--reveal-ground-truth)

    @property
    def placed(self) -> bool:
        """Whether accelerate places the model (any placement option given)."""
        return self.device_map is not None or self.max_memory is not None or self.offload_folder is not None

    def check(self) -> None:
        """Refuse contradictory options before anything loads, saying what to pass instead."""
        if self.backend not in BACKENDS:
            raise ModelLoadError(f"Unknown backend {self.backend!r}. Use one of: {', '.join(BACKENDS)}.")
        if self.backend != "transformers" and self.placed:
            raise ModelLoadError(
                f"--device-map, --max-memory and --offload-folder place the model for the transformers backend; the "
                f"{self.backend} backend places it itself (vllm: --tensor-parallel-size, --pipeline-parallel-size)."
            )
        if self.backend != "vllm" and (self.tensor_parallel_size != 1 or self.pipeline_parallel_size != 1):
            raise ModelLoadError("--tensor-parallel-size and --pipeline-parallel-size apply to --backend vllm only.")
        if isinstance(self.device_map, str) and self.device_map not in DEVICE_MAP_STRATEGIES:
            raise ModelLoadError(
                f"--device-map {self.device_map!r} is neither a strategy ({', '.join(DEVICE_MAP_STRATEGIES)}) nor a "
                'JSON object of module → device, e.g. \'{"model.embed_tokens": 0, "model.layers": 1, "lm_head": 1}\'.'
            )
        if self.offload_folder is not None and self.device_map is None:
            raise ModelLoadError("--offload-folder needs --device-map (e.g. auto): accelerate offloads what it places.")
        if self.max_memory is not None and self.device_map is None:
            raise ModelLoadError("--max-memory needs --device-map (e.g. auto): it bounds what each device is given.")

    def describe(self) -> dict[str, Any]:
        """The options a result's provenance states."""
        out: dict[str, Any] = {"backend": self.backend}
        if self.placed:
            out.update(device_map=self.device_map, max_memory=self.max_memory, offload_folder=self.offload_folder)
        if self.backend == "vllm":
            out.update(tensor_parallel_size=self.tensor_parallel_size,
                       pipeline_parallel_size=self.pipeline_parallel_size,
                       gpu_memory_utilization=self.gpu_memory_utilization)  # fmt: skip
        return out


def parse_json_option(flag: str, text: str | None) -> Any:
    """A flag's JSON value (``--max-memory``, ``--device-map`` when not a strategy), or a ModelLoadError."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f'{flag} must be JSON, e.g. \'{{"cpu": "8GiB"}}\': {exc.msg} at {exc.pos}.') from None


def device_map_option(text: str | None) -> str | dict[str, Any] | None:
    """``--device-map``: a strategy name, or a JSON object of module → device."""
    if text is None or text in DEVICE_MAP_STRATEGIES:
        return text
    if not text.lstrip().startswith("{"):
        raise ModelLoadError(
            f"--device-map {text!r} is neither a strategy ({', '.join(DEVICE_MAP_STRATEGIES)}) nor a JSON object of "
            'module → device, e.g. \'{"model.embed_tokens": 0, "model.layers": 1, "lm_head": 1}\'.'
        )
    value: dict[str, Any] = parse_json_option("--device-map", text)  # text starts with "{": an object when valid
    return value


def max_memory_option(text: str | None) -> dict[Any, str] | None:
    """``--max-memory``: a JSON object of device → budget; GPU indices may be written as strings ("0")."""
    value = parse_json_option("--max-memory", text)
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        raise ModelLoadError('--max-memory must be a JSON object, e.g. \'{"0": "70GiB", "cpu": "100GiB"}\'.')
    return {int(k) if isinstance(k, str) and k.isdigit() else k: str(v) for k, v in value.items()}


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def parse_dtype(dtype: str) -> torch.dtype:
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ModelLoadError(f"Unknown dtype {dtype!r}. Use one of: {', '.join(_DTYPES)}.") from None
