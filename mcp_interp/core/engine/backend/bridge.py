"""Every place core meets TransformerLens' ``TransformerBridge``: hook names and bridge internals.

Why one module: hook-name strings and reaches into the bridge's private attributes are what
breaks when TransformerLens moves; kept here, a TransformerLens upgrade is checked and mended in
one file. The rest of ``core/`` calls these functions and never spells a hook name itself.

The bridge's documented surface (``bridge(...)``, ``bridge.hooks``, ``bridge.run_with_cache``,
``bridge.cfg``, ``bridge.blocks``) is used directly elsewhere; what is here is everything
beyond it: the Hugging Face modules the bridge wraps, and calling its components by hand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from mcp_interp.core.engine.backend import gptj_heads, native_heads
from mcp_interp.errors import InputError


@contextmanager
def edge_hooks(bridge: Any) -> Iterator[None]:
    """Turn on the bridge's per-head write and per-reader input hooks (``hook_result``, split q/k/v
    inputs, ``hook_mlp_in``) and restore the caller's flags afterwards, also on error.

    Why: an edge (writer → reader) needs each head's own write and each reader's own input, which the
    bridge only materialises with these flags (they cost memory: per-head tensors of d_model). The
    logits change by float rounding only (measured 1.4e-6 on `tiny`, ≤ 1.9e-6 on every architecture of
    the test matrix). On a parallel block whose MLP reads the attention's norm (GPT-J, Phi) the bridge's
    ``hook_mlp_in`` never fires; ``_parallel_mlp_in`` makes it fire (see there). GPT-J's attention, which
    TransformerLens runs as one opaque module without either hook (its flags raise), is run per head here instead
    (``gptj_heads``: the HF module's own projections and rotary, TransformerLens' per-head fork). Any other
    attention without them: ``NotImplementedError`` from the bridge becomes an ``InputError`` naming the missing
    feature (the tools check ``capabilities`` first).
    """
    cfg = bridge.cfg
    saved = (
        cfg.use_attn_result,
        cfg.use_split_qkv_input,
        cfg.use_hook_mlp_in,
        bool(getattr(cfg, "use_attn_in", False)),
    )
    ours = _attentions_run_per_head(bridge)
    native = _native_attentions(bridge)
    try:
        if saved[3]:
            bridge.set_use_attn_in(False)  # exclusive with split q/k/v inputs
        if len(ours) + len(native) == len(bridge.blocks):
            _ungate_attention_points(bridge)
        else:
            try:
                bridge.set_use_attn_result(True)
                bridge.set_use_split_qkv_input(True)
            except NotImplementedError as exc:
                raise InputError(
                    f"This model's attention ({', '.join(attention_classes(bridge))} in TransformerLens) has no "
                    f"per-head write (hook_result) or per-head query/key/value input, which edge tools need: {exc}"
                ) from None
        bridge.set_use_hook_mlp_in(True)
        with (
            _parallel_mlp_in(bridge),
            _offloaded_attention_weights(bridge),
            gptj_heads.exposed(ours, split=True),
            native_heads.heads_split(native),
        ):
            yield
    finally:
        bridge.set_use_attn_result(saved[0])
        bridge.set_use_split_qkv_input(saved[1])
        bridge.set_use_hook_mlp_in(saved[2])
        if saved[3]:
            bridge.set_use_attn_in(True)


@contextmanager
def _offloaded_attention_weights(bridge: Any) -> Iterator[None]:
    """Each attention's offloaded weights read from disk for the whole of its call, then released.

    Why: with split q/k/v inputs the bridge projects each head's copy with the projection's weight itself
    (``_project_per_head_qkv``), outside the projection's own forward, where accelerate materialises an offloaded
    weight; on a model placed with disk offload the weight would still be on the meta device. accelerate's
    ``align_module_device`` loads it for the duration of the attention module's call (one layer's attention at a
    time, as accelerate does for an ordinary forward), so memory stays bounded by one layer."""
    from accelerate.utils import align_module_device, has_offloaded_params

    handles = []
    for block in bridge.blocks:
        attention: Any = getattr(block, "attn", None)
        original = getattr(attention, "original_component", None)
        if attention is None or original is None:
            continue
        offloaded = [m for m in original.modules() if has_offloaded_params(m)]
        if not offloaded:
            continue
        stack = contextlib.ExitStack()

        def enter(_module: Any, _args: Any, stack: contextlib.ExitStack = stack, parts: list = offloaded) -> None:
            for part in parts:
                stack.enter_context(align_module_device(part))

        def leave(_module: Any, _args: Any, _out: Any, stack: contextlib.ExitStack = stack) -> None:
            stack.close()

        handles.append(attention.register_forward_pre_hook(enter))
        handles.append(attention.register_forward_hook(leave, always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _ungate_attention_points(bridge: Any) -> None:
    """Set the bridge's ``use_attn_result`` and ``use_split_qkv_input`` flags without its setters' check.

    Why: the flags are what let ``bridge.hooks`` attach to ``hook_result`` and the q/k/v inputs (TransformerLens
    refuses a hook on a point they gate off). Its setters also check that the attention can fire those points and
    raise for GPT-J's; when every block's attention is run by ``gptj_heads``, which fires them, the flags are set
    the way the setters set them after that check (on the config, then on each attention's config). The caller
    restores them through the setters, which check nothing when turning a flag off."""
    for flag in ("use_attn_result", "use_split_qkv_input"):
        bridge.cfg._set_bridge_managed_hook_flag(flag, True)
        bridge._propagate_attention_flag(flag, True)


def _attentions_run_per_head(bridge: Any) -> list[Any]:
    """The blocks' attention components that ``gptj_heads`` runs per head (GPT-J's)."""
    attentions = [block._modules.get("attn") for block in bridge.blocks]
    return [attention for attention in attentions if gptj_heads.runs_per_head(attention)]


def _native_attentions(bridge: Any) -> list[Any]:
    """The blocks' attention components that ``native_heads`` runs per head (TransformerLens' native attention:
    compiled tracr programs)."""
    attentions = [block._modules.get("attn") for block in bridge.blocks]
    return [attention for attention in attentions if native_heads.is_native_attention(attention)]


# Points TransformerLens' plain AttentionBridge fires after the HF module has used the value (an edit is discarded).
_CONSUMED_POINTS = (".attn.hook_pattern", ".attn.hook_attn_scores")


def live_attention_edits(bridge: Any, points: Sequence[str]) -> contextlib.AbstractContextManager[Any]:
    """GPT-J's attention run by ``gptj_heads`` (heads not split) for the duration when an edit is made at one of
    its pattern's points, so that the edit reaches the output; otherwise nothing changes.

    Why: the replacement model of attribution graphs freezes every attention pattern (``frozen_hooks``); on the
    module TransformerLens calls whole, the pattern hook fires after the fact and the frozen pattern is not the one
    the module applies (measured on the tiny GPT-J: the graph mispredicted its own frozen run by 2.1e-2; with the
    pattern live, by 2.6e-7). Only for such edits, so every other forward stays the HF module's own.
    """
    if not any(point.endswith(_CONSUMED_POINTS) for point in points):
        return contextlib.nullcontext()
    ours = _attentions_run_per_head(bridge)
    return gptj_heads.exposed(ours, split=False) if ours else contextlib.nullcontext()


def mlp_shares_attention_norm(bridge: Any, layer: int) -> bool:
    """True when block ``layer`` is a parallel block with one norm feeding attention and MLP (GPT-J's
    ``ln_1``, Phi's ``input_layernorm``): the MLP reads ``ln1(resid_pre)`` and there is no ``ln2``, on whose
    input the bridge's ``hook_mlp_in`` fires."""
    subs = block_submodules(bridge, layer)
    return bool(getattr(bridge.cfg, "parallel_attn_mlp", False)) and "ln2" not in subs and "ln1" in subs


@contextmanager
def _parallel_mlp_in(bridge: Any) -> Iterator[None]:
    """Make ``blocks.L.hook_mlp_in`` fire on blocks whose MLP reads the attention's norm.

    The MLP's input is recomputed as ``ln1(hook_mlp_in(resid_pre))`` with the bare HF norm module (so no
    ln1 hook fires twice, and without hooks the numbers are the model's: Phi's logits are bit-identical).
    ``hook_mlp_in`` is then the MLP's own pre-norm copy of the residual, as on every other block: writable
    and differentiable without touching what attention reads. ``resid_pre`` is taken at the output of
    ``hook_in``, i.e. after any patch there.
    """
    handles = []
    for layer, block in enumerate(bridge.blocks):
        if not mlp_shares_attention_norm(bridge, layer):
            continue
        ln1 = hf_module(block.ln1)
        seen: dict[str, torch.Tensor] = {}

        def keep_resid(module: Any, args: Any, output: torch.Tensor, seen: dict[str, torch.Tensor] = seen) -> None:
            seen["resid"] = output

        def mlp_input(
            module: Any, args: tuple[Any, ...], seen: dict[str, torch.Tensor] = seen, ln1: Any = ln1, block: Any = block
        ) -> tuple[Any, ...] | None:
            if not block._read_use_hook_mlp_in() or "resid" not in seen:
                return None
            return (ln1(block.hook_mlp_in(seen.pop("resid"))), *args[1:])

        handles.append(block.hook_in.register_forward_hook(keep_resid))
        handles.append(block.mlp.register_forward_pre_hook(mlp_input))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


# --- what kind of block this is (read by ``capabilities``) -----------------------------------------


def block_submodules(bridge: Any, layer: int) -> set[str]:
    """The names of block ``layer``'s bridge components (``ln1``, ``ln1_post``, ``attn``, ``ln2``, ``mlp``, ...)."""
    return set(getattr(bridge.blocks[layer], "submodules", None) or {})


def attention_classes(bridge: Any) -> list[str]:
    """The TransformerLens attention bridge classes of the model's blocks, e.g. ['AttentionBridge']."""
    return sorted({type(block._modules.get("attn")).__name__ for block in bridge.blocks})


def per_head_attention_hooks(bridge: Any) -> bool:
    """Whether every block's attention can give each head's write (``hook_result``) and each head's
    query/key/value input (the split q/k/v fork): TransformerLens' own forking bridges, and GPT-J's attention, which
    TransformerLens runs as one module and ``gptj_heads`` runs per head. False for any other attention behind
    TransformerLens' generic ``AttentionBridge``."""
    from transformer_lens.model_bridge.generalized_components.joint_qkv_attention import JointQKVAttentionBridge
    from transformer_lens.model_bridge.generalized_components.position_embeddings_attention import (
        PositionEmbeddingsAttentionBridge,
    )

    for block in bridge.blocks:
        attn = block._modules.get("attn")
        if gptj_heads.runs_per_head(attn) or native_heads.is_native_attention(attn):
            continue
        forks = isinstance(attn, JointQKVAttentionBridge | PositionEmbeddingsAttentionBridge)
        if not forks or not getattr(attn, "supports_attn_result", False):
            return False
    return True


def attention_output_scale(bridge: Any, layer: int) -> float:
    """The factor block ``layer`` multiplies its attention output by before the residual add (Granite's
    ``residual_multiplier``); 1 for every other architecture."""
    return float(getattr(bridge.blocks[layer], "residual_contribution_scale", 1.0))


def attention_write_norm(bridge: Any, layer: int) -> str | None:
    """The norm component between block ``layer``'s head sum and the residual stream, if any (``ln1_post``
    on Gemma-2/3 and OLMo-2, whose ``hook_attn_out`` is the post-attention norm of the heads' sum); None
    when the heads' outputs add to the stream as they are."""
    block = bridge.blocks[layer]
    aliases = getattr(block, "hook_aliases", None) or {}
    target = aliases.get("hook_attn_out")
    for candidate in [target] if isinstance(target, str) else list(target or []):
        owner = candidate.split(".", 1)[0]
        if owner in block_submodules(bridge, layer):
            return None if owner == "attn" else owner
    return None


def attention_write_function(bridge: Any, layer: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The post-attention norm of block ``layer`` as a function of the heads' sum (``attn.hook_out``) to the
    block's attention write (``hook_attn_out``), or None where the heads' sum is added as it is.

    Why the bare HF module: it is the very function the block applies (measured equal to ``hook_attn_out`` to 0.0 on
    tiny Gemma-2, Gemma-3 and OLMo-2), and calling it runs none of the bridge's hooks, so it can be called from inside
    a hook during a forward. Weights accelerate offloaded to disk are brought in for each call
    (``align_module_device``).
    """
    name = attention_write_norm(bridge, layer)
    if name is None:
        return None
    module = block_norm_module(bridge, layer, name)
    if module is None:
        raise RuntimeError(f"blocks.{layer}.{name} wraps no Hugging Face module to recompute the attention's write")

    def apply(heads_sum: torch.Tensor) -> torch.Tensor:
        from accelerate.utils import align_module_device

        with align_module_device(module):
            return module(heads_sum)

    return apply


def mixture_of_experts(bridge: Any, layer: int) -> bool:
    """Whether block ``layer``'s MLP is a mixture of experts (TransformerLens' ``MoEBridge``): its
    ``mlp.hook_post`` is then the experts' combined output, d_model wide, not neurons."""
    return type(bridge.blocks[layer]._modules.get("mlp")).__name__ == "MoEBridge"


def final_logit_softcap(bridge: Any) -> float | None:
    """The model's final logit soft-cap c (logits = c · tanh(x / c); Gemma-2: 30), or None.

    HF applies it in the model's forward after the unembedding, which TransformerLens' ``unembed``
    component does not include: every logit rebuilt from the residual stream must apply it too.
    """
    cap = getattr(hf_config(bridge), "final_logit_softcapping", None)
    return float(cap) if cap else None


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap · tanh(logits / cap)`` (the identity when ``cap`` is None)."""
    return logits if cap is None else cap * torch.tanh(logits / cap)


# --- the Hugging Face model inside the bridge ---------------------------------------------------


def hf_model(bridge: Any) -> Any:
    """The Hugging Face model the bridge wraps (``bridge.original_model``).

    Needed for what TransformerLens' config does not carry: the HF class name (the model's
    architecture) and the HF config below.
    """
    return bridge.original_model


def hf_config(bridge: Any) -> Any:
    """The wrapped HF model's own ``PretrainedConfig``, or None if the model has none.

    Needed for facts the bridge's ``cfg`` does not state the HF way: ``model_type`` and
    ``_attn_implementation`` (which decide whether the Llama suffix sweep applies),
    ``num_key_value_heads``, ``head_dim``, ``architectures``.
    """
    return getattr(hf_model(bridge), "config", None)


def hf_module(component: Any) -> Any:
    """The HF module a bridge component wraps (its ``original_component``), or None.

    Needed to read a component's weights and settings (a Linear's weight, a norm's epsilon) or
    to call the bare HF module without the bridge's hooks around it.
    """
    return getattr(component, "original_component", None)


def hf_attention(bridge: Any, layer: int) -> Any:
    """Block ``layer``'s HF attention module (e.g. ``LlamaAttention``).

    Needed for its ``scaling`` (the factor on q·k), which the bridge does not expose.
    """
    return hf_module(bridge.blocks[layer].attn)


def attn_output_projection(bridge: Any, layer: int) -> Any:
    """Block ``layer``'s attention output projection as the bare HF module (Linear, or GPT-2's Conv1D).

    Needed to apply W_O (+ b_O) to hand-made per-head inputs — one head kept, the others zero —
    without firing the bridge's hooks: what each head writes to the residual stream.
    """
    return hf_module(bridge.blocks[layer].attn.o)


def mlp_output_projection(bridge: Any, layer: int) -> Any:
    """Block ``layer``'s MLP down projection (``mlp.out``) as the bare HF module (Linear, or GPT-2's Conv1D), or None
    when the block has none (a mixture of experts).

    Needed to apply W_out to hand-made neuron activations without firing the bridge's hooks: what one neuron, or an
    SAE decoder row in neuron space, writes to the residual stream.
    """
    out = getattr(bridge.blocks[layer].mlp, "out", None)
    return None if out is None else hf_module(out)


def token_embedding_matrix(bridge: Any) -> torch.Tensor:
    """The HF model's input embedding weight ``[vocab, d_model]`` (detached): what ``hook_embed`` rows are."""
    return bridge.original_model.get_input_embeddings().weight.detach()


def unembed_linear(bridge: Any) -> torch.nn.Linear | None:
    """The unembedding as a plain ``torch.nn.Linear`` (weight ``[vocab, d_model]``), or None.

    Needed to read single rows of W_U (logit differences of a few tokens without projecting on
    the whole vocabulary; direct logit attribution). None when the model's unembedding is not
    a plain linear layer: callers then fall back to ``logits_from_residual`` or refuse.
    """
    linear = hf_module(bridge.unembed)
    return linear if isinstance(linear, torch.nn.Linear) else None


def norm_scale_hook(bridge: Any, layer: int, norm: str) -> str:
    """The hook of the scale (the RMS or standard deviation, eps included) that block ``layer``'s norm
    component ``norm`` (e.g. ``ln1_post``) divides by."""
    return f"blocks.{layer}.{norm}.hook_scale"


def block_norm_module(bridge: Any, layer: int, norm: str) -> Any:
    """Block ``layer``'s norm component ``norm`` (e.g. ``ln1_post``) as the bare HF module."""
    return hf_module(getattr(bridge.blocks[layer], norm))


def norm_gain(module: Any, width: int, device: str = "cpu") -> torch.Tensor:
    """The elementwise gain γ of a norm module (y = γ ⊙ x / scale + β), whatever its weight convention
    (Llama's ``weight``, Gemma's ``1 + weight``): an RMSNorm applied to a large constant vector c·1, whose
    RMS is c to float precision, returns γ. A LayerNorm centres, so it is probed with x = c·(±1 alternating)
    (mean 0, standard deviation c) and −x: γ = (f(x) − f(−x)) / (2·sign(x)), β cancelling. Needed to freeze a
    norm's scale and keep what follows linear (direct logit attribution). The module is called rather than its
    weight read, so a norm whose weight accelerate offloaded (on the meta device until called) works too: it is
    called on ``device``, where the model's inputs go, and its offload hook brings the weight in for the call.
    """
    if module is None or isinstance(module, torch.nn.Identity):  # no norm (TransformerLens' native model without one)
        return torch.ones(width)
    weight = next(iter(module.parameters()), None)
    if isinstance(module, torch.nn.LayerNorm):
        if module.weight is None:
            return torch.ones(width)
        if module.weight.device.type != "meta":
            return module.weight.detach()
    dtype = weight.dtype if weight is not None else torch.float32
    on = weight.device if weight is not None and weight.device.type != "meta" else torch.device(device)
    constant = 100.0  # c² = 1e4 ≫ any eps (error eps/2c² ≈ 1e-10), and c² is finite even in float16
    with torch.inference_mode():
        if isinstance(module, torch.nn.LayerNorm):  # offloaded: probe it (f(x) − f(−x) = 2γ ⊙ (x − mean) / std)
            x = torch.full((width,), constant, dtype=torch.float64, device=on)
            x[1::2] = -constant
            centred = x - x.mean()
            std = torch.sqrt((centred**2).mean() + module.eps)
            out = module(x.unsqueeze(0).to(dtype))[0].double() - module(-x.unsqueeze(0).to(dtype))[0].double()
            return (out * std / (2 * centred)).to(dtype).detach()
        probe = torch.full((1, width), constant, dtype=torch.float32, device=on).to(dtype)
        return module(probe)[0].detach()


def final_norm_module(bridge: Any) -> Any:
    """The final norm as the bare HF module (``LlamaRMSNorm``, ``LayerNorm``, ...), or None.

    Needed for its weight and bias (direct logit attribution freezes the norm's scale and
    folds the rest into the read-out direction) and its kind (LayerNorm centres, RMSNorm not).
    """
    return hf_module(bridge.ln_final)


# --- running parts of the model by hand ---------------------------------------------------------


def final_norm(bridge: Any, residual_rows: torch.Tensor) -> torch.Tensor:
    """The model's final norm on residual vectors ``[rows, d_model]`` → ``[rows, d_model]``.

    Called through the bridge component (as a one-position sequence, the shape it expects), so
    the numbers are the model's own.
    """
    return bridge.ln_final(residual_rows.unsqueeze(1))[:, 0]


def logits_from_residual(bridge: Any, residual_rows: torch.Tensor) -> torch.Tensor:
    """Final norm, unembedding and the model's final soft-cap (if any) of residual vectors ``[rows, d_model]``
    → ``[rows, vocab]`` logits: what the model's forward computes at those positions.

    Needed to read out only the positions that matter (the answer, or one layer's residual in
    the logit lens) instead of running the whole model to its logits.
    """
    normed = bridge.ln_final(residual_rows.unsqueeze(1))
    return soft_cap(bridge.unembed(normed)[:, 0], final_logit_softcap(bridge))


def block_output(output: Any) -> torch.Tensor:
    """The hidden states out of a block call: HF decoder layers return a tensor or a tuple."""
    return output[0] if isinstance(output, tuple) else output


def run_block(bridge: Any, layer: int, residual: torch.Tensor, call_kwargs: dict[str, Any]) -> torch.Tensor:
    """Block ``layer`` on ``residual`` ``[rows, seq, d_model]``, through the bridge (hooks included).

    A bridge block takes its HF decoder layer's call signature: the hidden states plus the
    keyword arguments the model passes it (attention mask, position embeddings, ...), which
    callers capture from a real forward. Returns the new residual ``[rows, seq, d_model]``.
    """
    return block_output(bridge.blocks[layer](residual, **call_kwargs))


@dataclass(frozen=True)
class BlockParts:
    """The bridge components of one pre-norm decoder block, each callable on its own."""

    ln1: Any  # norm before attention
    q: Any  # query, key, value and output projections
    k: Any
    v: Any
    o: Any
    ln2: Any  # norm before the MLP
    mlp: Any


def block_parts(bridge: Any, layer: int) -> BlockParts:
    """Block ``layer``'s norms, attention projections and MLP as bridge components.

    Needed by the Llama suffix sweep, which runs a block's pieces itself (attention over a
    shared key/value prefix, which the bridge's blocks cannot do) with the model's own weights.
    """
    block = bridge.blocks[layer]
    attn = block.attn
    return BlockParts(block.ln1, attn.q, attn.k, attn.v, attn.o, block.ln2, block.mlp)


# --- the local replacement model (attribution graphs) -------------------------------------------


def frozen_hooks(bridge: Any) -> list[str]:
    """Every hook whose value the local replacement model freezes: each attention pattern and each norm's
    scale (``*.hook_scale``: the blocks' norms, post-norms and Q/K norms where present, the final norm).

    Why these: with the patterns and the norms' denominators held at their values from the real forward,
    what remains between the residual stream's writers and readers is linear (value and output projections,
    the norms' weights), which is what makes an attribution graph's edges exact direct effects.
    """
    names = set(bridge.hook_dict)
    return sorted(n for n in names if n.endswith(".attn.hook_pattern") or n.endswith(".hook_scale"))


def has_hook(bridge: Any, name: str) -> bool:
    """Whether the bridge exposes a hook of this name (aliases included)."""
    return name in bridge.hook_dict


def final_norm_logits(bridge: Any, normed_rows: torch.Tensor) -> torch.Tensor:
    """The unembedding of final-norm outputs ``[rows, d_model]`` → ``[rows, vocab]`` logits (the norm already
    applied, e.g. read at ``FINAL_NORM_OUT``)."""
    return bridge.unembed(normed_rows.unsqueeze(1))[:, 0]
