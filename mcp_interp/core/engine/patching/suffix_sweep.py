"""A faster exact head-patching sweep for Llama-family models: recompute only the suffix.

In a minimal pair, every position before the first token where clean and corrupt differ (the
*prefix*) has identical activations in both runs, so patching a head changes nothing there and
nothing there depends on later positions (attention is causal). A patched run therefore only
needs the *suffix* positions, attending to the prefix's keys and values, which are shared by
every patched run and computed once. On the IOI pairs that is 5 of 14 positions. The blocks that
run those positions by hand with the model's own weights are the backend's
(``backend.llama_suffix.LlamaSuffixBlocks``); this module is the sweep that drives them.

Why this is safe to use: ``SuffixHeadPatchSweep.check`` first replays the unpatched base batch
through these blocks at every position and compares each layer's residual and the final logits
with the real forward; any mismatch beyond ``CHECK_TOLERANCE`` (or an architecture this module
does not know) makes the caller fall back to the generic sweep in ``sweep``. The tests
compare both against TransformerLens' patching module.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from mcp_interp.core.engine.backend.forward import BlockTrace
from mcp_interp.core.engine.backend.sites import Site
from mcp_interp.core.engine.numbers.row_readouts import RowMetric
from mcp_interp.core.engine.patching.sweep import BridgePatchSweep, PatchSweep, SitePatch, Unit

CHECK_TOLERANCE = 1e-3  # max |logit| difference between this replay and the real forward


@dataclass(kw_only=True)
class SuffixPatchSweep(PatchSweep):
    """The Llama sweep of ``sweep.PatchSweep``: recomputes only positions ``start..``,
    attending to the base run's keys/values before ``start``, and at the last layer only the
    answer position. Same contract and numbers as ``sweep.BridgePatchSweep``."""

    start: int
    # Rows per block call, as a token budget: ~1k tokens keep the MLP's intermediate activations
    # (rows × positions × d_mlp floats) a few MB, which measured fastest here (bigger calls spill
    # out of cache and into fresh pages; smaller ones under-use the matmul kernels).
    tokens_per_call: int = 1080
    check_error: float | None = field(default=None, init=False)

    ANSWER_ONLY_AT_LAST: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self.blocks = self.backend.suffix_blocks(self.base)
        assert self.blocks is not None, "the suffix sweep runs only where backend.suffix_blocks applies"
        self.prefix: list[tuple[torch.Tensor, torch.Tensor]] = []

    def check(self) -> float:
        """Replay the base batch through these blocks; return the max |difference| from the real run.

        Also keeps every layer's prefix keys/values for the sweep.
        """
        batch = self.base.batch_size
        with torch.inference_mode():
            residual = self.base.inputs[0]
            worst = 0.0
            for layer in range(len(self.blocks.layers)):
                if layer > 0:
                    worst = max(worst, float((residual - self.base.inputs[layer]).abs().max()))
                residual, (k, v) = self.blocks.run(layer, residual, 0, None)
                self.prefix.append((k[:, :, : self.start], v[:, :, : self.start]))
            final = residual[torch.arange(batch), self.answer_positions]
            ours = self.backend.logits_from_residual(final)
            real = self._real_answer_logits()
            worst = max(worst, float((ours - real).abs().max()))
        self.check_error = worst
        return worst

    def _real_answer_logits(self) -> torch.Tensor:
        final = self.base.final[torch.arange(self.base.batch_size), self.answer_positions]
        return self.backend.logits_from_residual(final)

    def first_position(self) -> int:
        return self.start

    def rows_per_call(self) -> int:
        return max(8, self.tokens_per_call // max(1, self.base.inputs[0].shape[1] - self.start))

    def steps(self) -> Iterator[int]:
        if not self.prefix:
            self.check()
        yield from super().steps()

    def run_block(
        self,
        layer: int,
        residual: torch.Tensor,
        rows_prompt: torch.Tensor,
        patch: SitePatch | None,
        query: torch.Tensor | None,
    ) -> torch.Tensor:
        keys, values = self.prefix[layer]
        prefix_kv = (keys.index_select(0, rows_prompt), values.index_select(0, rows_prompt))
        # Every patched tensor is a fresh one of this call: patched in place.
        return self.blocks.run(layer, residual, self.start, prefix_kv, patch, self.site, query)[0]


@dataclass
class ChosenSweep:
    """The sweep an exact patching run uses, and why (for the result's ``sweep`` and notes)."""

    sweep: PatchSweep
    label: str
    note: str | None


def best_sweep(
    backend: Any,
    trace: BlockTrace,
    site: Site,
    source: dict[int, torch.Tensor],
    units: list[Unit],
    mask: torch.Tensor,
    answer_positions: torch.Tensor,
    metric: RowMetric,
    first_diff: int,
) -> ChosenSweep:
    """The suffix sweep when it applies to this model and replays its forward within
    ``CHECK_TOLERANCE``; otherwise the generic one (same numbers, slower), with a note saying why."""
    args: dict[str, Any] = dict(backend=backend, base=trace, site=site, source=source, units=units, patch_mask=mask,
                                answer_positions=answer_positions, metric=metric)  # fmt: skip
    generic = ChosenSweep(
        BridgePatchSweep(**args), "generic: each block called through the TransformerBridge on every position", None
    )
    if not backend.supports_suffix_blocks():
        return generic
    start = min(first_diff, int(answer_positions.min()))
    if any(u.position is not None and u.position < start for u in units):
        return generic
    fast = SuffixPatchSweep(**args, start=start)
    error = fast.check()
    if error > CHECK_TOLERANCE:
        generic.note = (
            f"The fast suffix sweep did not reproduce this model's forward (max |Δ| {error:.2e}); "
            "used the generic sweep instead (same numbers, slower)."
        )
        return generic
    label = (
        f"suffix: positions {start}.. recomputed with the model's own weights (replay of the "
        f"unpatched run matches the real forward to {error:.1e})"
    )
    return ChosenSweep(fast, label, None)
