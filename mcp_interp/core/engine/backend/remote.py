"""The remote backends: TransformerLens' ``RemoteBridge`` over vLLM or an Inspect provider.

A RemoteBridge has no local ``nn.Module``: a forward is one request that names the points to capture and carries
declarative edits — ``suppress``, ``scale``, ``add``, ``set``, each at every position or at ``pos`` — keyed by the
point (TransformerLens' canonical hook name). ``RemoteBackend`` serves the seam's requests on it:

* captures come back as arrays (float32 on the wire) and are stacked into the batch the caller sent;
* an edit that is one of the four operations is sent as it is (a per-row mask of positions becomes each row's
  ``pos`` list, a value with a batch dimension each row's own value, a head-split value is flattened to the
  wire's ``heads · d_head`` width);
* an edit whose new value depends on the value itself — a channel slice, a projection, a pure rewrite (an
  ablation's prepared parts, an SAE splice) — or several edits at one point are *materialised*: the point is
  captured for every row under the edits upstream of it (points are taken in forward order), the edits are applied
  to that batch exactly as a local model would, and the result is sent as a ``set``. Each materialised point costs
  one forward per row; the numbers are those of the local model.
* the Inspect driver takes one row per request (vLLM's batched path several): rows are sent one at a time.

What it cannot serve — gradients, block calls, the weights, edits that build autograd graphs or carry values from
one point to another — it refuses by name (``base.Unsupported``), before any model work when tools check first.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from mcp_interp.core.engine.backend.base import LOCAL_FIX, Backend, BackendFeature
from mcp_interp.core.engine.backend.edits import Add, Edit, Observe, Scale, Set, Suppress
from mcp_interp.core.engine.backend.forward import Mode, Output, Run
from mcp_interp.core.engine.backend.points import hook_out
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import BackendName

# Where a point sits within its block, for processing materialised edits in forward order.
_ORDER = {
    "hook_in": 0,
    "attn.hook_q": 1,
    "attn.hook_k": 1,
    "attn.hook_v": 1,
    "attn.hook_pattern": 2,
    "attn.hook_z": 3,
    "attn.hook_out": 4,
    "ln2.hook_in": 5,
    "mlp.hook_out": 6,
    "hook_out": 7,
}
_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
_HEAD_SPLIT = ("attn.hook_z", "attn.hook_q", "attn.hook_k", "attn.hook_v")


def forward_order(point: str) -> tuple[int, int]:
    match = _BLOCK.match(point)
    if match is None:
        return (-1, 0)
    return (int(match.group(1)), _ORDER.get(match.group(2), 8))


class RemoteBackend(Backend):
    """A ``RemoteBridge`` (``boot_inspect`` / ``boot_vllm``) behind the seam; ``name`` is the backend's."""

    features: frozenset[BackendFeature] = frozenset()

    def __init__(self, bridge: Any, name: BackendName, hf_config: Any, batched: bool = False) -> None:
        from transformer_lens.model_bridge.bridge_core import build_alias_to_canonical_map

        self.bridge = bridge
        self.name = name
        self._hf_config = hf_config
        self.batched = batched  # whether one request may carry several rows
        self._aliases: dict[str, str] = build_alias_to_canonical_map(bridge.hook_dict)
        self._supported: frozenset[str] = frozenset(bridge._driver.supported_hook_points)

    # --- what the model is ------------------------------------------------------------------------------------

    @property
    def cfg(self) -> Any:
        return self.bridge.cfg

    def canonical(self, point: str) -> str:
        """The driver's name for ``point`` (the bridge's aliases, e.g. ``blocks.3.hook_attn_out``, resolved). A block's
        input its driver does not serve (vLLM fuses it away) is the previous block's output, which it does: the
        residual stream passes between blocks unchanged."""
        name = point if point in self._supported else self._aliases.get(point, point)
        match = _BLOCK.match(name)
        if name not in self._supported and match is not None and match.group(2) == "hook_in":
            layer = int(match.group(1))
            if layer > 0 and hook_out(layer - 1) in self._supported:
                return hook_out(layer - 1)
            if layer == 0 and "embed.hook_out" in self._supported and not self._learned_positions():
                return "embed.hook_out"  # block 0 reads the token embedding itself when positions are rotary
        return name

    def _learned_positions(self) -> bool:
        """Whether a learned positional embedding is added to the token embedding before block 0 (GPT-2's)."""
        return getattr(self.bridge.cfg, "positional_embedding_type", "standard") == "standard"

    def has_point(self, name: str) -> bool:
        return self.canonical(name) in self._supported

    def can_write(self, name: str) -> bool:
        """Whether edits may be sent at ``name`` (the driver's capture-only points — a derived resid_mid, attention
        patterns — may not)."""
        canonical = self.canonical(name)
        match = _BLOCK.match(canonical)
        read_only = ("ln2.hook_in", "attn.hook_pattern")
        return canonical in self._supported and match is not None and match.group(2) not in read_only

    def hf_config(self) -> Any:
        return self._hf_config

    def attention_write_norm(self, layer: int) -> str | None:
        """The post-attention norm of Gemma-2/3 and OLMo-2 (``ln1_post``), read from the architecture's name."""
        model_type = getattr(self._hf_config, "model_type", "")
        return "ln1_post" if model_type in ("gemma2", "gemma3", "gemma3_text", "olmo2") else None

    def mixture_of_experts(self, layer: int) -> bool:
        config = self._hf_config
        return bool(getattr(config, "num_local_experts", 0) or getattr(config, "num_experts", 0))

    def close(self) -> None:
        self.bridge.close()

    # --- forward passes ---------------------------------------------------------------------------------------

    def run(
        self,
        input_ids: torch.Tensor,
        *,
        capture: Sequence[str] = (),
        edits: Sequence[Edit] = (),
        output: Output = "logits",
        stop_at: str | None = None,
        trace: bool = False,
        mode: Mode = "inference",
        attention_mask: torch.Tensor | None = None,
    ) -> Run:
        """The seam's forward on the remote backend (module docstring). ``stop_at`` only saves work locally: here the
        whole forward runs; ``output="final"`` is the last block's output, captured."""
        if mode == "grad":
            raise self.refuse("gradients")
        if trace:
            raise self.refuse("block_calls")
        observers = [edit for edit in edits if isinstance(edit, Observe)]
        edits = [edit for edit in edits if not isinstance(edit, Observe)]
        for edit in edits:
            if not edit.pure:
                raise self.refuse(
                    "local_edits", "An edit that builds an autograd graph or carries a value between points"
                )
            if not self.can_write(edit.point):
                raise self.refuse(
                    "local_edits", f"Writing {edit.point} (a point this backend only reads, or does not serve)"
                )
        names = list(dict.fromkeys([*capture, *([stop_at] if stop_at is not None else [])]))
        final_point = hook_out(self.n_layers - 1)
        observed = [edit.point for edit in observers]
        wanted = list(dict.fromkeys([*names, *observed, *([final_point] if output == "final" else [])]))
        missing = [name for name in wanted if not self.has_point(name)]
        if missing:
            raise self.refuse("local_edits", f"Reading {missing[0]} (a point this backend does not serve)")
        specs = self._specs(input_ids, edits)
        logits, acts = self._forward_rows(input_ids, specs, wanted)
        for observer in observers:
            observer.apply(acts[observer.point])
        return Run(
            logits=logits,
            final=acts[final_point] if output == "final" else None,
            acts={name: acts[name] for name in names},
        )

    # --- how edits reach the backend ---------------------------------------------------------------------------

    def _specs(self, input_ids: torch.Tensor, edits: Sequence[Edit]) -> list[dict[str, dict[str, Any]]]:
        """Each row's ``intervene`` mapping (canonical point → spec), materialising what is not one operation."""
        rows = int(input_ids.shape[0])
        groups: dict[str, list[Edit]] = {}
        for edit in edits:
            groups.setdefault(self.canonical(edit.point), []).append(edit)
        specs: list[dict[str, dict[str, Any]]] = [{} for _ in range(rows)]
        later: list[str] = []
        for point, group in groups.items():
            if len(group) == 1 and group[0].remote_op is not None:
                for r in range(rows):
                    spec = self._spec(group[0], point, r, rows)
                    if spec is not None:
                        specs[r][point] = spec
            else:
                later.append(point)
        for point in sorted(later, key=forward_order):
            upstream = [{k: v for k, v in row.items() if forward_order(k) < forward_order(point)} for row in specs]
            _, acts = self._forward_rows(input_ids, upstream, [point], logits=False)
            value = acts[point]
            for edit in groups[point]:
                new = edit.apply(value)
                value = value if new is None else new
            for r in range(rows):
                specs[r][point] = {"op": "set", "value": self._one_value_per_point(self._wire(value[r], point), point)}
        return specs

    def _spec(self, edit: Edit, point: str, row: int, rows: int) -> dict[str, Any] | None:
        """One operation for one row; None when its positions leave this row untouched."""
        pos: Any = getattr(edit, "pos", None)
        value = getattr(edit, "value", None)
        if isinstance(pos, torch.Tensor) and pos.dtype == torch.bool:
            chosen = [int(i) for i in torch.nonzero(pos[row]).flatten()]
            if not chosen:
                return None
            if isinstance(value, torch.Tensor) and value.ndim >= 3 and value.shape[0] == rows:
                value = value[row, chosen]  # [len(pos), *width]
            pos = chosen
        elif isinstance(value, torch.Tensor) and value.ndim >= 3 and value.shape[0] == rows and rows > 1:
            value = value[row]
        elif isinstance(value, torch.Tensor) and value.ndim >= 3 and value.shape[0] == 1:
            value = value[0]
        spec: dict[str, Any] = {"op": edit.remote_op}
        if isinstance(edit, Scale):
            spec["factor"] = float(edit.factor)
        if isinstance(edit, Add | Set):
            spec["value"] = self._one_value_per_point(self._wire(torch.as_tensor(value), point), point)
        if pos is not None:
            spec["pos"] = [int(pos)] if isinstance(pos, int) else [int(p) for p in pos]
        assert isinstance(edit, Suppress | Scale | Add | Set)
        return spec

    def _one_value_per_point(self, value: np.ndarray, point: str) -> np.ndarray:
        """vLLM's driver takes one width-shaped value per point and request, applied at every position of ``pos``
        (its affine buffers); Inspect's takes one per position. A value that differs between positions cannot be
        sent to vLLM: refused by name rather than broadcast wrongly."""
        if self.name != "vllm" or value.ndim < 2:
            return value
        rows = value.reshape(value.shape[0], -1)
        if not np.array_equal(rows, np.broadcast_to(rows[:1], rows.shape)):
            raise InputError(
                f"This edit sets a different value at each position of {point}; vLLM's driver takes one value per "
                "point and request (applied at every position it names). Patch one position per cell, ablate with "
                f"'zero' or 'mean', or run the server with {LOCAL_FIX} (or --backend inspect) for edits that vary by "
                "position."
            )
        return value[0]

    def _wire(self, value: torch.Tensor, point: str) -> np.ndarray:
        """A value as the wire takes it: float32 numpy, a head-split value flattened to ``heads · d_head``."""
        value = value.detach().to("cpu", torch.float32)
        match = _BLOCK.match(point)
        if match is not None and match.group(2) in _HEAD_SPLIT and value.ndim >= 2:
            value = value.flatten(-2)
        return value.numpy()

    def _forward_rows(
        self, input_ids: torch.Tensor, specs: list[dict[str, dict[str, Any]]], names: list[str], logits: bool = True
    ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """Every row through the backend (one request per row: the Inspect driver takes one), stacked back."""
        per_row_logits: list[torch.Tensor] = []
        per_row_acts: list[dict[str, torch.Tensor]] = []
        canonical = {name: self.canonical(name) for name in names}
        for r in range(int(input_ids.shape[0])):
            ids = input_ids[r : r + 1].to("cpu")
            kwargs: dict[str, Any] = {"intervene": specs[r]} if specs[r] else {}
            if not logits:
                kwargs["return_logits"] = False
            out, cache = self.bridge.run_with_cache(ids, names_filter=sorted(set(canonical.values())), **kwargs)
            if logits:
                per_row_logits.append(torch.as_tensor(out)[0])
            per_row_acts.append({name: torch.as_tensor(cache[c])[0] for name, c in canonical.items()})
        acts = {name: torch.stack([row[name] for row in per_row_acts]) for name in names}
        return (torch.stack(per_row_logits) if logits else None), acts
