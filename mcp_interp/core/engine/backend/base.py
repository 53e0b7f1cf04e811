"""What every backend behind the seam offers, and the refusal when one lacks a feature a measurement needs.

``Backend`` is the interface families program against (``model.backend``): forwards with captures and edits, greedy
generation, and — where the backend has them — gradients, block calls, the model's weights and parts of it run by
hand. A backend declares its ``features``; a method it cannot serve raises ``Unsupported``, an ``InputError`` (a
tool error) that names the backend, the missing feature and how to get it. Tools check ``capabilities.require``
first, so a refusal comes before any model work and agrees with what ``model_info`` lists.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal

import torch

from mcp_interp.core.engine.backend.edits import Edit
from mcp_interp.core.engine.backend.forward import BlockTrace, Capture, Mode, Output, Run
from mcp_interp.core.engine.backend.interrupt import Interrupt
from mcp_interp.errors import Unsupported
from mcp_interp.schemas.common import BackendName

BackendFeature = Literal[
    "gradients",  # a backward pass through the model
    "weights",  # the model's parameters: unembedding, norms, projections, parts of the model run by hand
    "block_calls",  # one block re-run on a residual (the fast exact-patching sweeps)
    "local_edits",  # edits that build autograd graphs or carry values between points (edge ablation, graphs)
    "edge_points",  # each head's own write and each reader's own input (hook_result, split q/k/v inputs)
    "jacobian_lens",  # TransformerLens' Jacobian-lens tools, which need the local bridge
]

FEATURE_WORDS: dict[BackendFeature, str] = {
    "gradients": "gradients (a backward pass)",
    "weights": "the model's weights (unembedding, norms, projections)",
    "block_calls": "single block calls",
    "local_edits": "edits that only a local model runs in one pass",
    "edge_points": "per-head writes and per-reader inputs (hook_result, split q/k/v inputs)",
    "jacobian_lens": "TransformerLens' Jacobian-lens tools (they run the local bridge)",
}

LOCAL_FIX = "--backend transformers (with --device-map auto to spread a large model over GPUs, CPU and disk)"


class Backend:
    """The seam's interface; see ``local.LocalBackend`` for what each method does. Unserved methods refuse."""

    name: BackendName = "transformers"
    features: frozenset[BackendFeature] = frozenset()
    device: str = "cpu"
    bridge: Any  # TransformerLens' bridge (TransformerBridge or RemoteBridge), for the seam's own modules and tests
    program: Any = None  # a compiled RASP program's facts (loader.program.CompiledProgram); None for a language model
    # Whether a position reads only itself and earlier ones (a language model). A compiled program's attention is
    # bidirectional: a change at one position reaches every position, before it too (patching's skip rule reads this).
    causal: bool = True

    def supports(self, feature: BackendFeature) -> bool:
        return feature in self.features

    @property
    def interrupt(self) -> Interrupt:
        """The stop signal of the work in flight (``interrupt``); a backend that runs blocks here checks it per
        block, so a cancelled caller frees the model within one block."""
        found = self.__dict__.get("_interrupt")
        if found is None:
            found = self.__dict__["_interrupt"] = Interrupt()
        return found

    def at_rest(self) -> bool:
        """Whether the model is in its ordinary state on this thread: no mode a job step entered (``edge_points``,
        ``weights_frozen``) still on, autograd on and inference mode off. Only then may another caller's work run
        between two steps of a job (``host.run_steps``): a step that returns inside a mode keeps the model."""
        return not self.__dict__.get("_modes") and torch.is_grad_enabled() and not torch.is_inference_mode_enabled()

    @contextlib.contextmanager
    def mode_entered(self) -> Iterator[None]:
        """Count a mode that changes how the model runs as on for the duration (``at_rest`` is False inside)."""
        self.__dict__["_modes"] = self.__dict__.get("_modes", 0) + 1
        try:
            yield
        finally:
            self.__dict__["_modes"] -= 1

    def refuse(self, feature: BackendFeature, what: str = "This measurement") -> Unsupported:
        return Unsupported(
            f"{what} needs {FEATURE_WORDS[feature]}, which the {self.name} backend does not provide. Run the server "
            f"with {LOCAL_FIX} for it. (model_info lists under `capabilities` what runs on this backend.)",
            self.name,
            feature,
        )

    # --- what every backend serves -----------------------------------------------------------------------------

    @property
    def cfg(self) -> Any:
        raise NotImplementedError

    @property
    def n_layers(self) -> int:
        return int(self.cfg.n_layers)

    def has_point(self, name: str) -> bool:
        raise NotImplementedError

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
        raise NotImplementedError

    def capture(
        self, input_ids: torch.Tensor, names: Sequence[str] = (), edits: Sequence[Edit] = (), trace: bool = False
    ) -> Capture:
        """``run`` stopped after the last block: the final residual plus the values at ``names``."""
        run = self.run(input_ids, capture=names, edits=edits, output="final", trace=trace)
        assert run.final is not None
        return Capture(run.final, run.acts, run.trace, run.logits)

    def trace(self, input_ids: torch.Tensor) -> BlockTrace:
        run = self.capture(input_ids, trace=True)
        assert run.trace is not None
        return run.trace

    def logits(self, input_ids: torch.Tensor, edits: Sequence[Edit] = (), mode: Mode = "inference") -> torch.Tensor:
        """The logits of every position ``[batch, seq, vocab]`` under ``edits``."""
        logits = self.run(input_ids, edits=edits, mode=mode).logits
        assert logits is not None
        return logits

    def answer_logits(
        self, input_ids: torch.Tensor, positions: torch.Tensor, edits: Sequence[Edit] = ()
    ) -> torch.Tensor:
        """``[rows, vocab]`` logits at one position per row (the row's answer): where the backend has the weights,
        from the final residual at those positions only (the vocabulary projection of every other position is
        skipped); otherwise read from the backend's logits."""
        rows = torch.arange(input_ids.shape[0])
        if self.supports("weights"):
            final = self.capture(input_ids, edits=edits).final
            return self.logits_from_residual(final[rows, positions.to(final.device)])
        return self.logits(input_ids, edits)[rows, positions]

    def logits_at(self, run: Capture, positions: torch.Tensor) -> torch.Tensor:
        """``[rows, vocab]`` logits of ``run`` at one position per row: the backend's own logits where it returned
        them (a remote backend always does), else the final residual's at those rows only."""
        rows = torch.arange(run.final.shape[0], device=run.final.device)
        if run.logits is not None:
            return run.logits[rows.to(run.logits.device), positions.to(run.logits.device)]
        with torch.inference_mode():
            return self.logits_from_residual(run.final[rows, positions.to(run.final.device)])

    def generate(
        self, ids: Sequence[int], max_new_tokens: int, edits: Sequence[Edit] = (), eos: int | None = None
    ) -> Iterator[int]:
        """Greedy continuation of ``ids`` under ``edits`` (every position of every step), one token per ``next``;
        one full forward per token, so a caller can stop between tokens. Stops after ``eos`` when generated."""
        out: list[int] = []
        for _ in range(max_new_tokens):
            logits = self.logits(torch.tensor([[*ids, *out]], device=self.device), edits)
            token = int(logits[0, -1].argmax())
            out.append(token)
            yield token
            if token == eos:
                return

    def hf_config(self) -> Any:
        raise NotImplementedError

    def architecture(self) -> str:
        config = self.hf_config()
        return str((getattr(config, "architectures", None) or [getattr(config, "model_type", "unknown")])[0])

    def attention_write_norm(self, layer: int) -> str | None:
        raise NotImplementedError

    def attention_write_map(self, layer: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
        raise NotImplementedError

    def final_logit_softcap(self) -> float | None:
        cap = getattr(self.hf_config(), "final_logit_softcapping", None)
        return float(cap) if cap else None

    def soft_cap(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's final soft-cap applied to logits (the identity for a model without one)."""
        cap = self.final_logit_softcap()
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def mixture_of_experts(self, layer: int) -> bool:
        raise NotImplementedError

    def opaque_attention(self) -> list[str]:
        """The attention classes TransformerLens runs as one opaque module that the backend cannot run per head either
        (no per-head hooks); empty when every block has per-head hooks (GPT-J's locally: ``gptj_heads``), or when the
        backend cannot tell (a remote one: its edge tools are refused anyway)."""
        return []

    def attention_output_scale(self, layer: int) -> float:
        """The factor block ``layer`` multiplies its attention output by before the residual add (Granite); 1 else."""
        return float(getattr(self.hf_config(), "residual_multiplier", 1.0) or 1.0)

    def placement(self) -> dict[str, str] | None:
        """Where each module's weights sit (module → device, 'disk' included) when accelerate placed the model."""
        return None

    # --- what only some backends serve -------------------------------------------------------------------------

    def backward(
        self,
        outputs: torch.Tensor | Sequence[torch.Tensor],
        inputs: Sequence[torch.Tensor],
        grad_outputs: Sequence[torch.Tensor] | None = None,
        *,
        retain_graph: bool = False,
        allow_unused: bool = False,
        materialize_grads: bool = False,
    ) -> tuple[torch.Tensor | None, ...]:
        raise self.refuse("gradients")

    def weights_frozen(self) -> AbstractContextManager[None]:
        raise self.refuse("gradients")

    def edge_points(self) -> AbstractContextManager[None]:
        raise self.refuse("edge_points")

    def run_block(
        self, layer: int, residual: torch.Tensor, call_kwargs: dict[str, Any], edits: Sequence[Edit] = ()
    ) -> torch.Tensor:
        raise self.refuse("block_calls")

    def supports_suffix_blocks(self) -> bool:
        return False

    def suffix_blocks(self, trace: BlockTrace) -> Any:
        return None

    def final_norm(self, residual_rows: torch.Tensor) -> torch.Tensor:
        raise self.refuse("weights")

    def logits_from_residual(self, residual_rows: torch.Tensor) -> torch.Tensor:
        raise self.refuse("weights")

    def logits_from_normed(self, normed_rows: torch.Tensor) -> torch.Tensor:
        raise self.refuse("weights")

    def head_writes(self, layer: int, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise self.refuse("weights")

    def unembedding(self) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        raise self.refuse("weights")

    def token_embeddings(self) -> torch.Tensor:
        """The token embedding matrix ``[vocab, d_model]``."""
        raise self.refuse("weights")

    def mlp_writes(self, layer: int, neurons: torch.Tensor) -> torch.Tensor | None:
        raise self.refuse("weights")

    def norm(self, layer: int | None = None, name: str = "ln_final") -> tuple[str, torch.Tensor, torch.Tensor | None]:
        raise self.refuse("weights")

    def norm_scale_point(self, layer: int, norm: str) -> str:
        return f"blocks.{layer}.{norm}.hook_scale"

    def final_norm_scale_point(self) -> str | None:
        """The point holding the scale the final norm divides by (None: no final norm, scale 1)."""
        return "ln_final.hook_scale"

    def frozen_points(self) -> list[str]:
        raise self.refuse("local_edits")

    def lens_bridge(self) -> Any:
        """The bridge TransformerLens' analysis tools take (the Jacobian lens)."""
        raise self.refuse("jacobian_lens")

    def close(self) -> None:
        """Release the backend (a remote one's workers); a local model needs nothing."""
