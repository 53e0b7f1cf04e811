"""``patch``: activation patching of one component at every layer × position — a preset of the engine's
patching job (``engine.patching``).

A *cell* is a component at one layer and one token position (one head too for ``heads_by_pos``; one
MLP neuron over every position for ``mlp_neurons``); its score is the fraction of the clean−corrupt
gap of the metric it restores (denoise) or destroys (noise), ``engine.scores``. Without ``neurons``,
``mlp_neurons`` patches the ``top_neurons`` neurons of each layer with the largest attribution
estimate, exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.sites import Site
from mcp_interp.core.engine.patching.job import CellContext, PatchingJob, PatchOutcome
from mcp_interp.core.engine.patching.sweep import Unit
from mcp_interp.core.engine.text.tokens import token_strings
from mcp_interp.core.localize.report import PatchReport
from mcp_interp.errors import InputError, require_choice
from mcp_interp.schemas.localize import Component, PatchMeasurement

COMPONENTS: dict[Component, Site] = {
    "resid_pre": "resid_pre",
    "resid_mid": "resid_mid",
    "resid_post": "resid_post",
    "attn_out": "attn_out",
    "mlp_out": "mlp_out",
    "heads_by_pos": "z",
    "mlp_neurons": "mlp_post",
}
TOP_NEURONS_DEFAULT = 10
# Components some architectures lack (``engine.capabilities``): no resid_mid in a parallel block, no neurons in an MoE.
# Components some architectures or engines lack (``engine.backend.capabilities``).
ARCHITECTURE_DEPENDENT = {
    "resid_mid": "patch_resid_mid",
    "mlp_neurons": "patch_mlp_neurons",
    "heads_by_pos": "patch_heads_by_pos",
    "resid_pre": "patch_resid_pre",
}


@dataclass(kw_only=True)
class PatchJob(PatchingJob[PatchMeasurement]):
    """Patching scores of one component per cell (see the module docstring)."""

    component: Component
    layers: Sequence[int] | None = None
    positions: Sequence[int] | None = None
    neurons: Sequence[int] | None = None
    top_neurons: int = TOP_NEURONS_DEFAULT

    def check(self) -> None:
        require_choice("component", self.component, Component)
        if self.neurons is not None and self.component != "mlp_neurons":
            raise InputError("`neurons` applies only to component 'mlp_neurons'.")
        if self.component in ARCHITECTURE_DEPENDENT:
            require(self.model.backend, ARCHITECTURE_DEPENDENT[self.component])
        self._neurons()

    def site(self) -> Site:
        return COMPONENTS[self.component]

    def patched_layers(self) -> list[int]:
        n_layers = self.model.cfg.n_layers
        if self.layers is None:
            return list(range(n_layers))
        layers = sorted(set(self.layers))
        bad = [layer for layer in layers if not isinstance(layer, int) or not 0 <= layer < n_layers]
        if not layers or bad:
            raise InputError(
                f"`layers` must be a non-empty list of layers in 0..{n_layers - 1}; got {list(self.layers)}."
            )
        return layers

    def cells_need_attribution(self) -> bool:
        return self.component == "mlp_neurons" and self.neurons is None

    def cells(self, context: CellContext) -> list[Unit]:
        layers = self.patched_layers()
        if self.component == "mlp_neurons":
            neurons = self._neurons()
            if neurons is None:
                return self._top_neurons(context, layers)
            return [Unit(layer, n) for layer in layers for n in neurons]
        positions = self._positions(context.width)
        if self.component == "heads_by_pos":
            n_heads = self.model.cfg.n_heads
            return [Unit(layer, h, p) for layer in layers for h in range(n_heads) for p in positions]
        return [Unit(layer, None, p) for layer in layers for p in positions]

    def report(self, outcome: PatchOutcome) -> PatchMeasurement:
        cfg = self.model.cfg
        clean_tokens = token_strings(self.model.tokenizer, outcome.clean_batch.ids(0))
        report = PatchReport(
            component=self.component,
            direction=self.direction,
            method=self.method,
            metric=self.metric,
            answer_kind=self.scored_answer_kind(),
            n_layers=cfg.n_layers,
            n_heads=cfg.n_heads,
            tokenizer=self.model.tokenizer,
            clean_tokens=clean_tokens,
        )
        positions = self._positions(outcome.clean_batch.input_ids.shape[1])
        return report.measurement(outcome, self.patched_layers(), positions)

    # --- arguments ----------------------------------------------------------------------------

    def _positions(self, width: int) -> list[int]:
        if self.positions is None:
            return list(range(width))
        positions = sorted(set(self.positions))
        bad = [p for p in positions if not isinstance(p, int) or not 0 <= p < width]
        if not positions or bad:
            raise InputError(
                f"`positions` must be token indices in 0..{width - 1} (the pairs have {width} tokens at most); "
                f"got {list(self.positions)}. Omit it to patch every position."
            )
        return positions

    def _neurons(self) -> list[int] | None:
        if self.neurons is None:
            return None
        d_mlp = int(self.model.cfg.d_mlp)
        neurons = sorted(set(self.neurons))
        bad = [n for n in neurons if not isinstance(n, int) or not 0 <= n < d_mlp]
        if not neurons or bad:
            raise InputError(
                f"Neuron index {bad[0] if bad else 'list'} is out of range: this model's MLPs have neurons "
                f"0..{d_mlp - 1}; pass `neurons` as a non-empty list of such indices, or omit it to patch the "
                f"top {self.top_neurons} neurons of each layer by attribution."
            )
        return neurons

    def _top_neurons(self, context: CellContext, layers: list[int]) -> list[Unit]:
        """The ``top_neurons`` neurons of each layer with the largest |attribution estimate| (mean over pairs)."""
        assert context.attribution is not None
        cells = []
        for layer in layers:
            per_row = (context.attribution.terms[layer] * context.mask.unsqueeze(-1)).sum(dim=1)  # [rows, d_mlp]
            per_neuron = self.plan.to_pairs(per_row.T).mean(dim=-1)  # [d_mlp]
            top = per_neuron.abs().topk(min(self.top_neurons, per_neuron.numel())).indices
            cells += [Unit(layer, int(n)) for n in sorted(top.tolist())]
        return cells
