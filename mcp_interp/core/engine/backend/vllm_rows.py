"""vLLM's token rows: values that differ by position, and several prompts in one request — written into the buffers
TransformerLens' vLLM driver already has.

Booted with ``enable_position_interventions=True``, TransformerLens installs at every hooked point an affine
``out = x · scale + bias`` whose ``scale`` and ``bias`` are buffers of ``max_num_batched_tokens`` rows: one per token
row of the step vLLM runs (the prompts of a step are laid end to end). Its driver fills them from one spec per point
and request — one operation, one width-long vector, at the positions ``pos`` — and sends one prompt per request
(``boot_vllm`` refuses ``enable_batching`` together with position interventions: the batched path is eager and has
no affine buffers). Two things the seam needs fall outside that:

* a value that differs between positions (a mean or resample ablation, a projection, an SAE splice, a whole-sequence
  patch: anything materialised per position), and
* several prompts, each with its own edits, in one request (a patching sweep's rows).

Both are rows of those same buffers. ``RowsExtension`` — vLLM's ``worker_extension_cls``, a subclass of
TransformerLens' ``TLWorkerExtension`` — takes the rows staged just before a request (``mcp_stage_rows``) and writes
them after TransformerLens' own reset and specs, inside the ``tl_set_interventions`` call that precedes every forward,
so they live for exactly one request. ``forward_batch`` sends several prompts as one ``generate``: vLLM schedules
them in one step, in order (``check_one_step`` holds it to that: the hooks must fire exactly once), so prompt k's
position p is token row ``offset_k + p``. It runs on one worker only (``tensor_parallel_size`` and
``pipeline_parallel_size`` 1, as TransformerLens' own batched path); with parallelism each prompt goes through the
driver alone, varying values staged at its positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformer_lens.model_bridge.sources.vllm.worker_extension import (
    TLWorkerExtension,
    decode_tensor,
    encode_tensor,
)

from mcp_interp.core.engine.backend.points import FINAL_NORM_NORMALIZED

WORKER_EXTENSION = f"{__name__}.RowsExtension"
LN_FINAL = FINAL_NORM_NORMALIZED  # the post-weight final norm vLLM's logits are rebuilt from


@dataclass(frozen=True)
class RowWrite:
    """One operation on some token rows of one point: ``set``/``add`` with ``values`` (``[width]`` for every row, or
    ``[len(rows), width]`` one per row), ``scale`` by ``factor``, or ``suppress``."""

    op: str
    rows: list[int]
    values: np.ndarray | None = None
    factor: float = 1.0

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "rows": self.rows, "factor": self.factor}
        if self.values is not None:
            out["values"] = encode_tensor(torch.from_numpy(np.ascontiguousarray(self.values, dtype=np.float32)))
        return out


Staged = dict[str, list[RowWrite]]


class RowsExtension(TLWorkerExtension):
    """TransformerLens' worker extension plus rows staged for the next request (module docstring)."""

    _mcp_rows: dict[str, list[dict[str, Any]]]

    def mcp_stage_rows(self, rows: dict[str, list[dict[str, Any]]]) -> None:
        """Rows for the next ``tl_set_interventions`` only (every request stages, so nothing outlives it)."""
        self._mcp_rows = rows

    def mcp_step_order(self) -> list[str]:
        """The requests of the last step in the order their token rows were laid out (finished requests keep their
        slots until the next step begins)."""
        return [str(req_id) for req_id in self.model_runner.input_batch.req_ids]

    def tl_set_interventions(self, specs: dict[str, dict[str, Any]]) -> None:
        super().tl_set_interventions(specs)
        staged, self._mcp_rows = getattr(self, "_mcp_rows", {}), {}
        absent: set[str] = getattr(self, "_tl_absent_hooks", set())
        for name, writes in staged.items():
            if name in absent:  # another pipeline stage owns this point and writes it
                continue
            scale, bias = self._tl_scale_buffers[name], self._tl_bias_buffers[name]
            if scale.ndim != 2:
                raise ValueError("Rows need the per-position buffers: boot with enable_position_interventions=True.")
            for write in writes:
                index = torch.as_tensor(write["rows"], dtype=torch.long, device=bias.device)
                if int(index.max()) >= scale.shape[0]:
                    raise ValueError(f"Token row {int(index.max())} is beyond the {scale.shape[0]} rows of {name}.")
                op = write["op"]
                values: torch.Tensor | float = 0.0
                if "values" in write:
                    values = decode_tensor(write["values"]).to(device=bias.device, dtype=bias.dtype)
                if op == "suppress":
                    scale[index], bias[index] = 0.0, 0.0
                elif op == "scale":
                    scale[index], bias[index] = float(write["factor"]), 0.0
                elif op in ("set", "add"):
                    scale[index], bias[index] = (0.0 if op == "set" else 1.0), values
                else:
                    raise ValueError(f"Unknown row operation {op!r}.")


def stage(driver: Any, staged: Staged) -> None:
    """Stage ``staged`` for the driver's next request (an empty mapping clears what an earlier failure left)."""
    driver._llm.collective_rpc("mcp_stage_rows", args=({k: [w.wire() for w in v] for k, v in staged.items()},))


def batch_limits(driver: Any) -> tuple[int, int]:
    """(token rows, prompts) one step of this engine takes: the capture buffers' rows and the scheduler's sequences."""
    config = driver._llm.llm_engine.vllm_config.scheduler_config
    return int(driver._max_num_batched_tokens), int(config.max_num_seqs)


def forward_batch(
    driver: Any, prompts: Sequence[Sequence[int]], staged: Staged, names: Sequence[str], logits_at: Any
) -> tuple[list[torch.Tensor] | None, dict[str, list[torch.Tensor]]]:
    """Several prompts in one request (module docstring): ``staged`` rows are token rows of the whole step. Returns
    each prompt's logits at its positions ``logits_at[k]`` (None: every position; ``logits_at`` None: no logits) and
    each prompt's captures ``[len(prompt), width]`` at ``names`` (canonical points)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = driver._llm
    fires_per_step(driver)
    lengths = [len(p) for p in prompts]
    total = sum(lengths)
    stage(driver, staged)
    llm.collective_rpc("tl_set_interventions", args=({},))  # TransformerLens' reset, then the staged rows
    llm.collective_rpc("tl_reset_capture_flags")
    llm.collective_rpc("tl_reset_counter")
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
        SamplingParams(max_tokens=1, temperature=0.0),
        use_tqdm=False,
    )
    check_one_step(driver, int(llm.collective_rpc("tl_read_counter")[0]))
    check_order([str(o.request_id) for o in outputs], llm.collective_rpc("mcp_step_order")[0])
    wanted = list(dict.fromkeys([*names, *([LN_FINAL] if logits_at is not None else [])]))
    raw = llm.collective_rpc("tl_read_captures", args=([total], wanted))[0]
    captured = driver._rpc_captures(raw)
    starts = np.cumsum([0, *lengths[:-1]]).tolist()
    acts = {name: [captured[name][s : s + n] for s, n in zip(starts, lengths, strict=True)] for name in names}
    if LN_FINAL in acts:  # as TransformerLens' driver exposes it: the pre-weight value the name promises
        acts[LN_FINAL] = [driver._unfold_ln_final(t) for t in acts[LN_FINAL]]
    if logits_at is None:
        return None, acts
    final = captured[LN_FINAL]
    logits = []
    for k, (s, n) in enumerate(zip(starts, lengths, strict=True)):
        where = torch.arange(n) if logits_at[k] is None else torch.as_tensor(logits_at[k], dtype=torch.long)
        logits.append(driver._reconstruct_logits(final[s + where]))
    return logits, acts


def check_one_step(driver: Any, fires: int) -> None:
    """The hooks fired once each (one step of vLLM held every prompt), so token rows were where they were written."""
    expected = fires_per_step(driver)
    if fires != expected:
        raise RuntimeError(
            f"vLLM ran the batch in {fires / expected:g} steps ({fires} hook calls, {expected} per step): its token "
            "rows were not laid out as written. Lower the rows per request."
        )


def check_order(sent: list[str], laid_out: list[str]) -> None:
    """The step laid the prompts' token rows out in the order they were sent (engine ids extend the public ones)."""
    same = len(laid_out) == len(sent)
    if not same or not all(e == s or e.startswith(f"{s}-") for s, e in zip(sent, laid_out, strict=True)):
        raise RuntimeError(f"vLLM laid out the requests {laid_out} for {sent}: token rows would be misassigned.")


def fires_per_step(driver: Any) -> int:
    """How many hook calls one step of vLLM makes, counted once on a two-token prompt (always one step)."""
    found = getattr(driver, "_mcp_fires_per_step", None)
    if found is None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        llm = driver._llm
        stage(driver, {})
        llm.collective_rpc("tl_set_interventions", args=({},))
        llm.collective_rpc("tl_reset_counter")
        llm.generate([TokensPrompt(prompt_token_ids=[0, 1])], SamplingParams(max_tokens=1), use_tqdm=False)
        found = driver._mcp_fires_per_step = int(llm.collective_rpc("tl_read_counter")[0])
    return int(found)
