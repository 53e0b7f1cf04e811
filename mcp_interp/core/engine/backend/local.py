"""The local backend: TransformerLens' ``TransformerBridge`` over a torch model in this process.

``LocalBackend`` is the only code in the package that installs a hook, calls the model or one of its components,
or takes a gradient through it. Families ask it for what they need — a forward with captures at named points and
edits (``edits``), a backward, greedy generation under edits, one block re-run (the patching sweep), a few parts of
the model by hand (the final norm and unembedding of chosen rows, one layer's output projection per head) and
weights — so that another backend can serve the same requests (``capabilities`` says what each one runs).

Hooks are installed per call through the bridge's ``hooks`` context and removed when it ends, also on error.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from mcp_interp.core.engine.backend import bridge as tl
from mcp_interp.core.engine.backend import llama_suffix
from mcp_interp.core.engine.backend.base import Backend, BackendFeature
from mcp_interp.core.engine.backend.edits import Edit
from mcp_interp.core.engine.backend.forward import BlockTrace, Mode, Output, Run
from mcp_interp.core.engine.backend.points import FINAL_NORM_SCALE
from mcp_interp.errors import StopForward
from mcp_interp.schemas.common import BackendName

# The bridge warns when a hook edits a norm's scale (it then rebuilds the output from the hooked values, which
# differs from HF's fused kernel at float-rounding scale); the replacement model freezes scales on purpose.
_NORM_EDIT_WARNING = ".*hook_scale/hook_normalized.*"


def _mode(mode: Mode) -> contextlib.AbstractContextManager[Any]:
    if mode == "grad":
        return torch.enable_grad()
    return torch.no_grad() if mode == "no_grad" else torch.inference_mode()


def _hook(edit: Edit) -> tuple[str, Callable[[torch.Tensor, Any], torch.Tensor | None]]:
    def apply(values: torch.Tensor, hook: Any) -> torch.Tensor | None:
        new = edit.apply(values)
        return None if new is None else new.to(values.dtype)

    return edit.point, apply


class LocalBackend(Backend):
    """``TransformerBridge`` in this process: every edit, captures, gradients, generation, block calls, weights."""

    name: BackendName = "transformers"
    features: frozenset[BackendFeature] = frozenset(
        {"gradients", "weights", "block_calls", "local_edits", "edge_points", "jacobian_lens"}
    )

    def __init__(self, bridge: Any, device: str = "cpu") -> None:
        self.bridge = bridge
        self.device = device  # where inputs go
        # Before every block of every forward: stop there when the caller of the work in flight was cancelled
        # (``interrupt``). A plain torch pre-hook, not a TransformerLens hook: no reset of the bridge's hooks removes
        # it, and it costs one Python call per block.
        for block in getattr(bridge, "blocks", []):
            block.register_forward_pre_hook(self.interrupt.check)

    # --- what the model is ------------------------------------------------------------------------------------

    @property
    def cfg(self) -> Any:
        """TransformerLens' config of the model (``n_layers``, ``n_heads``, ``d_model``, ``d_mlp``, ``d_vocab``…)."""
        return self.bridge.cfg

    @property
    def n_layers(self) -> int:
        return int(self.bridge.cfg.n_layers)

    def has_point(self, name: str) -> bool:
        """Whether the model exposes a hook point of this name (aliases included)."""
        return tl.has_hook(self.bridge, name)

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
        """One forward of ``input_ids`` under ``edits`` (applied in order at their points), recording ``capture``
        (each point's value after its edits, detached). ``output`` says what comes back besides the captures;
        ``stop_at`` ends the forward once that point has been computed (its edits and captures done); ``trace``
        records each block's residual input and call arguments (``BlockTrace``). ``mode``: see ``Mode``."""
        n_layers = len(self.bridge.blocks)
        acts: dict[str, torch.Tensor] = {}
        final: list[torch.Tensor] = []
        inputs: list[torch.Tensor | None] = [None] * n_layers
        kwargs: list[dict[str, Any] | None] = [None] * n_layers

        def keep(name: str) -> Callable[[torch.Tensor, Any], None]:
            def hook(value: torch.Tensor, hook: Any) -> None:
                acts[name] = value.detach().clone()
                if name == stop_at:
                    raise StopForward

            return hook

        def recorder(layer: int) -> Callable[..., None]:
            def record(module: Any, args: tuple[Any, ...], call_kwargs: dict[str, Any]) -> None:
                hidden = args[0] if args else call_kwargs["hidden_states"]
                inputs[layer] = hidden.detach()
                kwargs[layer] = {k: v for k, v in call_kwargs.items() if k != "hidden_states"}

            return record

        def stop(module: Any, args: Any, out: Any) -> None:
            final.append(tl.block_output(out))
            raise StopForward

        fwd_hooks = [_hook(edit) for edit in edits]
        names = list(dict.fromkeys([*capture, *([stop_at] if stop_at is not None else [])]))
        fwd_hooks += [(name, keep(name)) for name in names]
        handles = []
        if trace:
            handles = [
                block.register_forward_pre_hook(recorder(i), with_kwargs=True)
                for i, block in enumerate(self.bridge.blocks)
            ]
        if output == "final":
            handles.append(self.bridge.blocks[n_layers - 1].register_forward_hook(stop))
        logits = None
        extra = {} if attention_mask is None else {"attention_mask": attention_mask}
        try:
            with (
                _mode(mode),
                self._quiet(edits),
                tl.live_attention_edits(self.bridge, [edit.point for edit in edits]),
                self.bridge.hooks(fwd_hooks=fwd_hooks),
                contextlib.suppress(StopForward),
            ):
                logits = self.bridge(input_ids, return_type="logits" if output == "logits" else None, **extra)
        finally:
            for handle in handles:
                handle.remove()
        if len(acts) != len(names) or (output == "final" and not final):
            raise RuntimeError("the forward pass did not reach every requested point of this model")
        block_trace = None
        if trace:
            if any(x is None for x in inputs) or any(k is None for k in kwargs):
                raise RuntimeError("could not trace every transformer block of this model")
            last = final[0].detach() if final else None
            if last is None:
                raise RuntimeError("a traced forward needs output='final'")
            block_trace = BlockTrace([x for x in inputs if x is not None], [k for k in kwargs if k is not None],
                                     last, int(input_ids.shape[0]))  # fmt: skip
        return Run(
            logits=logits if output == "logits" and stop_at is None else None,
            final=final[0].detach() if final and mode != "grad" else (final[0] if final else None),
            acts=acts,
            trace=block_trace,
        )

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
        """Gradients of ``outputs`` (a scalar, or tensors seeded with ``grad_outputs``) with respect to ``inputs``,
        tensors of a ``mode="grad"`` run (values its edits kept)."""
        return torch.autograd.grad(
            outputs,
            list(inputs),
            grad_outputs,
            retain_graph=retain_graph,
            allow_unused=allow_unused,
            materialize_grads=materialize_grads,
        )

    @contextlib.contextmanager
    def weights_frozen(self) -> Iterator[None]:
        """Parameters without gradients for the duration (gradients are taken with respect to activations only, so
        a backward never builds weight gradients), restored afterwards."""
        saved = [(p, p.requires_grad) for p in self.bridge.parameters()]
        try:
            for p, _ in saved:
                p.requires_grad_(False)
            with self.mode_entered():
                yield
        finally:
            for p, flag in saved:
                # accelerate may have swapped an offloaded weight for an inference tensor read from disk while
                # frozen; such a tensor cannot take requires_grad, and the next read from disk replaces it anyway.
                if p.requires_grad != flag and not p.is_inference():
                    p.requires_grad_(flag)

    @contextlib.contextmanager
    def edge_points(self) -> Iterator[None]:
        """Each head's own write (``bridge.hook_result``) and each reader's own input (``hook_qkv_input``,
        ``hook_mlp_in``) exist as points for the duration (``bridge.edge_hooks``)."""
        with tl.edge_hooks(self.bridge), self.mode_entered():
            yield

    # --- one block at a time (the patching sweep) -------------------------------------------------------------

    def run_block(
        self, layer: int, residual: torch.Tensor, call_kwargs: dict[str, Any], edits: Sequence[Edit] = ()
    ) -> torch.Tensor:
        """Block ``layer`` on ``residual`` ``[rows, seq, d_model]`` with the keyword arguments a real forward called
        it with (``BlockTrace.kwargs``, selected for these rows), under ``edits`` at points inside the block."""
        with (
            tl.live_attention_edits(self.bridge, [edit.point for edit in edits]),
            self.bridge.hooks(fwd_hooks=[_hook(edit) for edit in edits]),
        ):
            return tl.run_block(self.bridge, layer, residual, call_kwargs)

    def supports_suffix_blocks(self) -> bool:
        """Whether this model is one the suffix sweep (``llama_suffix``) knows how to run by hand."""
        return llama_suffix.supports(self.bridge)

    def suffix_blocks(self, trace: BlockTrace) -> llama_suffix.LlamaSuffixBlocks | None:
        """Llama blocks run on the positions after a shared prefix (``llama_suffix.LlamaSuffixBlocks``), or None
        when this model is not one the suffix sweep knows."""
        return llama_suffix.LlamaSuffixBlocks(self, trace) if self.supports_suffix_blocks() else None

    # --- parts of the model by hand ---------------------------------------------------------------------------

    def final_norm(self, residual_rows: torch.Tensor) -> torch.Tensor:
        """The model's final norm on residual vectors ``[rows, d_model]``."""
        return tl.final_norm(self.bridge, residual_rows)

    def logits_from_residual(self, residual_rows: torch.Tensor) -> torch.Tensor:
        """Final norm, unembedding and soft-cap of residual vectors ``[rows, d_model]`` → ``[rows, vocab]``."""
        return tl.logits_from_residual(self.bridge, residual_rows)

    def logits_from_normed(self, normed_rows: torch.Tensor) -> torch.Tensor:
        """The unembedding of final-norm outputs ``[rows, d_model]`` → ``[rows, vocab]`` (no soft-cap)."""
        return tl.final_norm_logits(self.bridge, normed_rows)

    def head_writes(self, layer: int, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What each head of ``layer`` writes at one position and the output projection's bias.

        ``z`` is ``[n_heads, d_head]``. Uses the model's own output projection (Linear or GPT-2's Conv1D alike): head
        h's output is o(z with only head h kept) − o(0), and o(0) is the bias. Returns ([n_heads, d_model],
        [d_model]).
        """
        n_heads, d_head = z.shape
        inputs = torch.zeros(n_heads + 1, n_heads, d_head, dtype=z.dtype, device=z.device)
        inputs[torch.arange(n_heads), torch.arange(n_heads)] = z
        o_proj = tl.attn_output_projection(self.bridge, layer)
        with torch.inference_mode():
            out = o_proj(inputs.reshape(n_heads + 1, n_heads * d_head))
        bias = out[-1]
        return out[:-1] - bias, bias

    def mlp_writes(self, layer: int, neurons: torch.Tensor) -> torch.Tensor | None:
        """What block ``layer``'s MLP writes to the residual stream for neuron activations ``neurons`` ``[rows,
        d_mlp]`` (the down projection's input), its bias excluded: out(a) − out(0), with the model's own module
        (Linear or Conv1D alike). A one-hot row gives that neuron's output weights. None when the block has no down
        projection of its own (mixture of experts)."""
        projection = tl.mlp_output_projection(self.bridge, layer)
        if projection is None:
            return None
        rows = torch.cat([neurons, torch.zeros_like(neurons[:1])])
        with torch.inference_mode():
            out = projection(rows.to(next(projection.parameters()).dtype))
        return (out[:-1] - out[-1]).detach()

    # --- weights and the block's structure --------------------------------------------------------------------

    def unembedding(self) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The unembedding's weight ``[vocab, d_model]`` and bias (or None), or None when it is not a plain linear
        layer."""
        linear = tl.unembed_linear(self.bridge)
        if linear is None:
            return None
        return linear.weight.detach(), None if linear.bias is None else linear.bias.detach()

    def token_embeddings(self) -> torch.Tensor:
        return tl.token_embedding_matrix(self.bridge)

    def norm(self, layer: int | None = None, name: str = "ln_final") -> tuple[str, torch.Tensor, torch.Tensor | None]:
        """('rms' | 'layer', gain γ, bias β or None) of the final norm (``layer`` None) or block ``layer``'s norm
        ``name`` (e.g. ``ln1_post``): y = γ ⊙ centred?(x) / scale + β, in float64."""
        module = tl.final_norm_module(self.bridge) if layer is None else tl.block_norm_module(self.bridge, layer, name)
        kind = "layer" if isinstance(module, torch.nn.LayerNorm) else "rms"
        bias = getattr(module, "bias", None) if kind == "layer" else None
        gain = tl.norm_gain(module, int(self.cfg.d_model), self.device).to(torch.float64)
        return kind, gain, None if bias is None else bias.detach().to(torch.float64)

    def final_norm_scale_point(self) -> str | None:
        """The point holding the scale the final norm divides by; None when the model has no final norm (a compiled
        program: its scale is 1)."""
        return FINAL_NORM_SCALE if self.has_point(FINAL_NORM_SCALE) else None

    def attention_write_norm(self, layer: int) -> str | None:
        """The norm between block ``layer``'s head sum and the residual stream (``ln1_post``), or None."""
        return tl.attention_write_norm(self.bridge, layer)

    def attention_write_map(self, layer: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The exact function from block ``layer``'s heads' sum (``hook_heads_sum``, ``[..., d_model]``) to what it
        adds to the residual stream (``hook_attn_out``): the post-attention norm on Gemma-2/3 and OLMo-2, None where
        the sum is added as it is. Exact circuits recompute a layer's write through it from a mix of heads."""
        return tl.attention_write_function(self.bridge, layer)

    def norm_scale_point(self, layer: int, norm: str) -> str:
        """The point holding the scale block ``layer``'s norm ``norm`` divides by."""
        return tl.norm_scale_hook(self.bridge, layer, norm)

    def final_logit_softcap(self) -> float | None:
        """The model's final logit soft-cap c (logits = c · tanh(x / c)), or None."""
        return tl.final_logit_softcap(self.bridge)

    def soft_cap(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's final soft-cap applied to logits (the identity for a model without one)."""
        return tl.soft_cap(logits, self.final_logit_softcap())

    def mixture_of_experts(self, layer: int) -> bool:
        return tl.mixture_of_experts(self.bridge, layer)

    def opaque_attention(self) -> list[str]:
        return [] if tl.per_head_attention_hooks(self.bridge) else tl.attention_classes(self.bridge)

    def attention_output_scale(self, layer: int) -> float:
        return tl.attention_output_scale(self.bridge, layer)

    def frozen_points(self) -> list[str]:
        """Every attention pattern and norm scale: what the local replacement model freezes."""
        return tl.frozen_hooks(self.bridge)

    def placement(self) -> dict[str, str] | None:
        """accelerate's placement (module → device, 'disk' included) when the model was placed, else None."""
        device_map = getattr(tl.hf_model(self.bridge), "hf_device_map", None)
        return None if not device_map else {str(k): str(v) for k, v in device_map.items()}

    def lens_bridge(self) -> Any:
        return self.bridge

    def hf_config(self) -> Any:
        """The Hugging Face config of the model (``model_type``, ``num_key_value_heads``, ``architectures``…)."""
        return tl.hf_config(self.bridge)

    def architecture(self) -> str:
        """The model's Hugging Face class name (``LlamaForCausalLM``…), as its config names it."""
        config = tl.hf_config(self.bridge)
        return str((getattr(config, "architectures", None) or [type(tl.hf_model(self.bridge)).__name__])[0])

    # --- helpers ----------------------------------------------------------------------------------------------

    @staticmethod
    def _quiet(edits: Sequence[Edit]) -> contextlib.AbstractContextManager[Any]:
        if not any(edit.point.endswith(".hook_scale") for edit in edits):
            return contextlib.nullcontext()
        catcher = warnings.catch_warnings()

        @contextlib.contextmanager
        def quiet() -> Iterator[None]:
            with catcher:
                warnings.filterwarnings("ignore", message=_NORM_EDIT_WARNING)
                yield

        return quiet()
