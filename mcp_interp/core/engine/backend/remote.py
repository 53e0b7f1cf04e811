"""The remote backends: TransformerLens' ``RemoteBridge`` over vLLM or an Inspect provider.

A RemoteBridge has no local ``nn.Module``: a forward is one request that names the points to capture and carries
declarative edits — ``suppress``, ``scale``, ``add``, ``set``, each at every position or at ``pos`` — keyed by the
point (TransformerLens' canonical hook name). ``RemoteBackend`` serves the seam's requests on it:

* captures come back as arrays (float32 on the wire) and are stacked into the batch the caller sent;
* an edit that is one of the four operations is sent position-wise (``Write``): a per-row mask of positions becomes
  each row's ``pos`` list, a value with a batch dimension each row's own value, a head-split value is flattened to
  the wire's ``heads · d_head`` width, and a value that is the same at every position it names is one vector;
* an edit whose new value depends on the value itself — a channel slice, a projection, a pure rewrite (an
  ablation's prepared parts, an SAE splice) — or several edits at one point are *materialised*: the point is
  captured for every row under the edits upstream of it (points are taken in forward order), the edits are applied
  to that batch exactly as a local model would, and the new value is sent as a ``set`` at the positions it changed.
  Each materialised point costs one more pass over the rows; the numbers are those of the local model.
* a value that differs between positions goes to Inspect's provider as it is (it takes one value per position); to
  vLLM, whose driver takes one vector per point, as token rows of its own per-position buffers (``vllm_rows``);
* rows: vLLM on one worker takes several per request (``vllm_rows.forward_batch``); Inspect's driver one, and so
  does vLLM's with tensor or pipeline parallelism (``_forward`` says why). ``requests`` counts what was sent.

What it cannot serve — gradients, block calls, the weights, edits that build autograd graphs or carry values from
one point to another — it refuses by name (``base.Unsupported``), before any model work when tools check first.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mcp_interp.core.engine.backend import vllm_rows
from mcp_interp.core.engine.backend.base import Backend, BackendFeature
from mcp_interp.core.engine.backend.edits import Add, Edit, Observe, Scale, Set, Suppress
from mcp_interp.core.engine.backend.forward import Mode, Output, Run
from mcp_interp.core.engine.backend.points import EMBED_OUT, hook_out
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
ROWS_PER_REQUEST = 64  # rows one request carries at most where the engine takes several (memory of its logits)


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
        self.batched = batched  # whether one request may carry several rows (vLLM on one worker)
        self.requests = 0  # requests sent to the engine so far (a sweep reports the difference)
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
            if layer == 0 and EMBED_OUT in self._supported and self._embedding_enters_block_0():
                return EMBED_OUT  # block 0 reads the token embedding itself
        return name

    def _embedding_enters_block_0(self) -> bool:
        """Whether block 0 reads the token embedding as it is: not with a learned positional embedding added (GPT-2)
        nor scaled by √d_model first (Gemma)."""
        learned = getattr(self.bridge.cfg, "positional_embedding_type", "standard") == "standard"
        return not learned and not str(getattr(self._hf_config, "model_type", "")).startswith("gemma")

    def has_point(self, name: str) -> bool:
        return self.canonical(name) in self._supported

    def can_write(self, name: str) -> bool:
        """Whether edits may be sent at ``name`` (the driver's capture-only points — a derived resid_mid, attention
        patterns — may not)."""
        canonical = self.canonical(name)
        if canonical == EMBED_OUT:  # vLLM's embedding output: an affine hook like every block's
            return canonical in self._supported
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
        return self._run(input_ids, capture, edits, output, stop_at, trace, mode)

    def answer_logits(
        self, input_ids: torch.Tensor, positions: torch.Tensor, edits: Sequence[Edit] = ()
    ) -> torch.Tensor:
        """``[rows, vocab]`` logits at one position per row; on vLLM's batched path only those rows of the final norm
        are projected onto the vocabulary."""
        logits = self._run(input_ids, edits=edits, logits_at=positions.to("cpu")).logits
        assert logits is not None
        return logits

    def _run(
        self,
        input_ids: torch.Tensor,
        capture: Sequence[str] = (),
        edits: Sequence[Edit] = (),
        output: Output = "logits",
        stop_at: str | None = None,
        trace: bool = False,
        mode: Mode = "inference",
        logits_at: torch.Tensor | None = None,
    ) -> Run:
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
        writes = self._writes(input_ids, edits)
        logits, acts = self._forward(input_ids, writes, wanted, "all" if logits_at is None else logits_at)
        for observer in observers:
            observer.apply(acts[observer.point])
        return Run(
            logits=logits,
            final=acts[final_point] if output == "final" else None,
            acts={name: acts[name] for name in names},
        )

    # --- how edits reach the backend ---------------------------------------------------------------------------

    def _writes(self, input_ids: torch.Tensor, edits: Sequence[Edit]) -> list[dict[str, Write]]:
        """Each row's writes (canonical point → ``Write``), materialising what is not one operation."""
        rows = int(input_ids.shape[0])
        groups: dict[str, list[Edit]] = {}
        for edit in edits:
            groups.setdefault(self.canonical(edit.point), []).append(edit)
        writes: list[dict[str, Write]] = [{} for _ in range(rows)]
        later: list[str] = []
        for point, group in groups.items():
            if len(group) == 1 and group[0].remote_op is not None:
                for r in range(rows):
                    write = self._write(group[0], point, r, rows, int(input_ids.shape[1]))
                    if write is not None:
                        writes[r][point] = write
            else:
                later.append(point)
        for point in sorted(later, key=forward_order):
            upstream = [{k: v for k, v in row.items() if forward_order(k) < forward_order(point)} for row in writes]
            _, acts = self._forward(input_ids, upstream, [point], logits_at=None)
            before = acts[point]
            value = before
            for edit in groups[point]:
                new = edit.apply(value)
                value = value if new is None else new
            for r in range(rows):
                changed = (value[r] != before[r]).reshape(value.shape[1], -1).any(dim=1)
                positions = [int(p) for p in torch.nonzero(changed).flatten()]
                if positions:
                    writes[r][point] = Write("set", positions, self._wire(value[r, positions], point))
        return writes

    def _write(self, edit: Edit, point: str, row: int, rows: int, seq: int) -> Write | None:
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
        positions = None if pos is None else ([int(pos)] if isinstance(pos, int) else [int(p) for p in pos])
        assert isinstance(edit, Suppress | Scale | Add | Set)
        if isinstance(edit, Scale):
            return Write("scale", positions, factor=float(edit.factor))
        if isinstance(edit, Suppress):
            return Write("suppress", positions)
        wired = self._wire(torch.as_tensor(value), point)
        if wired.ndim >= 2 and positions is None:  # a value per position of the whole sequence
            positions = list(range(min(wired.shape[0], seq)))
            wired = wired[: len(positions)]
        return Write(edit.remote_op, positions, wired)

    def _wire(self, value: torch.Tensor, point: str) -> np.ndarray:
        """A value as the wire takes it: float32 numpy, a head-split value flattened to ``heads · d_head``, one
        vector where every position's is the same."""
        value = value.detach().to("cpu", torch.float32)
        match = _BLOCK.match(point)
        if match is not None and match.group(2) in _HEAD_SPLIT and value.ndim >= 2:
            value = value.flatten(-2)
        array = value.numpy()
        if array.ndim == 2 and np.array_equal(array, np.broadcast_to(array[:1], array.shape)):
            return array[0]
        return array

    # --- requests ----------------------------------------------------------------------------------------------

    def _forward(
        self, input_ids: torch.Tensor, writes: list[dict[str, Write]], names: list[str], logits_at: Any = "all"
    ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """Every row through the engine, stacked back: logits at every position (``logits_at="all"``), at one
        position per row (a ``[rows]`` tensor: the rest is never built) or none (None), and the values at ``names``.

        Rows go several to a request only on vLLM without parallelism (``vllm_rows``). The Inspect driver takes one
        prompt per request (``InspectDriver`` refuses a batch), and TransformerLens' vLLM driver too on the path with
        position edits (``boot_vllm`` refuses ``enable_batching`` with ``enable_position_interventions``; its batched
        path has no per-position buffers and no tensor or pipeline parallelism): there, one request per row."""
        canonical = {name: self.canonical(name) for name in names}
        rows, seq = int(input_ids.shape[0]), int(input_ids.shape[1])
        lengths = [seq] * rows
        if isinstance(logits_at, torch.Tensor) and not names:  # causal: nothing after a row's answer is needed
            lengths = [int(p) + 1 for p in logits_at]
            writes = [_cut(row, n) for row, n in zip(writes, lengths, strict=True)]
        if self._batches():
            return self._forward_batched(input_ids, lengths, writes, canonical, logits_at)
        per_row_logits: list[torch.Tensor] = []
        per_row_acts: list[dict[str, torch.Tensor]] = []
        for r in range(rows):
            ids = input_ids[r : r + 1, : lengths[r]].to("cpu")
            specs, staged = self._specs(writes[r])
            kwargs: dict[str, Any] = {"intervene": specs} if specs else {}
            if logits_at is None:
                kwargs["return_logits"] = False
            if self.name == "vllm":
                vllm_rows.stage(self.bridge._driver, staged)
            out, cache = self.bridge.run_with_cache(ids, names_filter=sorted(set(canonical.values())), **kwargs)
            self.requests += 1
            if logits_at is not None:
                logits = torch.as_tensor(out)[0]
                per_row_logits.append(logits if isinstance(logits_at, str) else logits[int(logits_at[r])])
            per_row_acts.append({name: torch.as_tensor(cache[c])[0] for name, c in canonical.items()})
        acts = {name: torch.stack([row[name] for row in per_row_acts]) for name in names}
        return (torch.stack(per_row_logits) if logits_at is not None else None), acts

    def _specs(self, writes: dict[str, Write]) -> tuple[dict[str, dict[str, Any]], vllm_rows.Staged]:
        """One row's ``intervene`` specs, and — on vLLM, whose driver takes one vector per point — the values that
        differ between positions as staged token rows (a lone prompt's rows are its positions)."""
        specs: dict[str, dict[str, Any]] = {}
        staged: vllm_rows.Staged = {}
        for point, write in writes.items():
            if self.name == "vllm" and write.value is not None and write.value.ndim == 2:
                assert write.positions is not None
                staged[point] = [vllm_rows.RowWrite(write.op, write.positions, write.value)]
                continue
            spec: dict[str, Any] = {"op": write.op}
            if write.op == "scale":
                spec["factor"] = write.factor
            if write.value is not None:
                spec["value"] = float(write.value) if write.value.ndim == 0 else write.value
            if write.positions is not None:
                spec["pos"] = write.positions
            specs[point] = spec
        return specs, staged

    def _batches(self) -> bool:
        """Whether rows go several to a request (vLLM on one worker: ``vllm_rows``)."""
        return self.name == "vllm" and self.batched

    def _forward_batched(
        self,
        input_ids: torch.Tensor,
        lengths: list[int],
        writes: list[dict[str, Write]],
        canonical: dict[str, str],
        logits_at: Any,
    ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """Rows (each its first ``lengths[r]`` tokens) in as few requests as the engine's step holds
        (``vllm_rows.forward_batch``)."""
        driver = self.bridge._driver
        max_tokens, max_prompts = vllm_rows.batch_limits(driver)
        points = sorted(set(canonical.values()))
        logits: list[torch.Tensor] = []
        acts: dict[str, list[torch.Tensor]] = {point: [] for point in points}
        for chunk in _chunks(lengths, min(max_prompts, ROWS_PER_REQUEST), max_tokens):
            staged: vllm_rows.Staged = {}
            offset = 0
            for r in chunk:
                for point, write in writes[r].items():
                    where = range(lengths[r]) if write.positions is None else write.positions
                    staged.setdefault(point, []).append(
                        vllm_rows.RowWrite(write.op, [offset + p for p in where], write.value, write.factor)
                    )
                offset += lengths[r]
            at = None
            if logits_at is not None:
                at = [None if isinstance(logits_at, str) else [int(logits_at[r])] for r in chunk]
            prompts = [input_ids[r, : lengths[r]].tolist() for r in chunk]
            chunk_logits, chunk_acts = vllm_rows.forward_batch(driver, prompts, staged, points, at)
            self.requests += 1
            if chunk_logits is not None:
                logits += [row if isinstance(logits_at, str) else row[0] for row in chunk_logits]
            for point in points:
                acts[point] += chunk_acts[point]
        stacked = {name: torch.stack(acts[point]) for name, point in canonical.items()}
        return (torch.stack(logits) if logits_at is not None else None), stacked


@dataclass(frozen=True)
class Write:
    """One row's edit at one point as the wire carries it: an operation, its positions (None: every one) and its
    value — ``[width]`` for every position it names, or ``[len(positions), width]`` one per position."""

    op: str
    positions: list[int] | None = None
    value: np.ndarray | None = None
    factor: float = 1.0

    def cut(self, length: int) -> Write | None:
        """This write on a row cut to its first ``length`` tokens (None: nothing of it is left)."""
        if self.positions is None:
            return self
        kept = [i for i, p in enumerate(self.positions) if p < length]
        if not kept:
            return None
        if len(kept) == len(self.positions):
            return self
        value = self.value[kept] if self.value is not None and self.value.ndim == 2 else self.value
        return Write(self.op, [self.positions[i] for i in kept], value, self.factor)


def _cut(writes: dict[str, Write], length: int) -> dict[str, Write]:
    cut = {point: write.cut(length) for point, write in writes.items()}
    return {point: write for point, write in cut.items() if write is not None}


def _chunks(lengths: list[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Consecutive rows grouped so that each group has at most ``max_rows`` rows and ``max_tokens`` tokens."""
    chunks: list[list[int]] = []
    tokens = 0
    for r, n in enumerate(lengths):
        if not chunks or len(chunks[-1]) >= max_rows or tokens + n > max_tokens:
            chunks.append([])
            tokens = 0
        chunks[-1].append(r)
        tokens += n
    return chunks
