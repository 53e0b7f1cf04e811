"""Which tools and options this model's architecture supports, and why not: the one place that decides.

Every tool works on sequential and parallel-residual blocks alike, except where a measurement needs a
feature some architectures lack. Those needs are listed here once (``USES``), each feature with the test
that finds it missing (``FEATURES``). A tool that cannot apply calls ``require`` before any model work and
refuses with an ``InputError`` naming the feature, the reason and what to use instead; ``model_info``
reports the same table through ``capabilities`` — one function behind both, so an assistant told that a
tool applies is never refused, and the other way round.

The features:

* **per-head attention hooks** — each head's own write to the residual stream (``hook_result``) and each
  head's own query/key/value input. TransformerLens 4.3 runs GPT-J's attention as one opaque module
  (``AttentionBridge``) that offers neither.
* **additive head writes** — the heads' outputs add to the residual stream as they are. On post-norm
  blocks (Gemma-2, Gemma-3, OLMo-2) a norm sits between the heads' sum and the residual add, so a head's
  ``hook_result`` is not a term of the stream: edge scores, path patches and edge ablations built on it
  would be wrong (measured: a single-edge ablation off by 0.04–0.09 on a logit difference of ~1).
* **a residual stream between attention and MLP** (``resid_mid``) — absent on parallel blocks (GPT-NeoX,
  GPT-J, Phi), where attention and MLP both read the block's input.
* **MLP neurons** — absent on mixture-of-experts blocks, whose ``mlp.hook_post`` is the experts' combined
  output (d_model wide), not a layer of neurons.
* **uncapped logits** — an attribution graph's logit nodes are linear read-outs of the residual stream; Gemma-2
  soft-caps its logits (c · tanh(x / c)), so the graph's edges would explain the pre-cap logits while its checks
  compare capped ones (measured on a tiny Gemma-2: replacement error 7.7e-3 against ≤ 1e-3 elsewhere). Graphs also
  need per-head attention hooks: on GPT-J's opaque attention the frozen pattern is not the one the module applies
  (the graph mispredicted its own frozen run by 2.1e-2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mcp_interp.core.engine.backend.bridge import (
    attention_classes,
    attention_output_scale,
    attention_write_norm,
    final_logit_softcap,
    hf_model,
    mixture_of_experts,
    per_head_attention_hooks,
)
from mcp_interp.errors import InputError
from mcp_interp.schemas.readouts import Capability


def _opaque_attention(bridge: Any) -> str | None:
    if per_head_attention_hooks(bridge):
        return None
    return (
        f"TransformerLens runs this model's attention as one module ({', '.join(attention_classes(bridge))}), "
        "which exposes neither each head's write (hook_result) nor each head's query/key/value input"
    )


def _normed_head_sum(bridge: Any) -> str | None:
    for layer in range(bridge.cfg.n_layers):
        scale = attention_output_scale(bridge, layer)
        if scale != 1.0:
            return (
                f"blocks.{layer} multiplies the heads' sum by {scale} before adding it to the residual stream, so one "
                "head's write (hook_result, taken before it) is not a term of the residual stream"
            )
        between = attention_write_norm(bridge, layer)
        if between is not None:
            return (
                f"blocks.{layer} applies {between} to the heads' sum before adding it to the residual stream "
                "(a post-attention norm), so one head's write (hook_result, taken before it) is not a term of the "
                "residual stream and edge scores, path patches and edge ablations built on it would be wrong"
            )
    return None


def _parallel_block(bridge: Any) -> str | None:
    if not getattr(bridge.cfg, "parallel_attn_mlp", False):
        return None
    return (
        "this is a parallel-residual block (attention and MLP both read the block's input, resid_pre), so there "
        "is no residual stream between them"
    )


def _capped_logits(bridge: Any) -> str | None:
    cap = final_logit_softcap(bridge)
    if cap is None:
        return None
    return (
        f"this model soft-caps its logits ({cap:g} · tanh(x / {cap:g})), which the replacement model's linear logit "
        "read-out does not reproduce"
    )


def _experts(bridge: Any) -> str | None:
    layers = [layer for layer in range(bridge.cfg.n_layers) if mixture_of_experts(bridge, layer)]
    if not layers:
        return None
    return (
        f"the MLPs of layers {layers} are mixtures of experts: their mlp.hook_post is the experts' combined output "
        f"(d_model = {bridge.cfg.d_model} wide), not a layer of neurons, and each expert has its own"
    )


@dataclass(frozen=True)
class Feature:
    """Something a measurement needs of the architecture; ``missing(bridge)`` says why a model lacks it (None:
    it has it)."""

    name: str
    missing: Callable[[Any], str | None]


FEATURES: dict[str, Feature] = {
    "per_head_hooks": Feature("per-head attention hooks", _opaque_attention),
    "additive_heads": Feature("additive head writes", _normed_head_sum),
    "resid_mid": Feature("a residual stream between attention and MLP (resid_mid)", _parallel_block),
    "mlp_neurons": Feature("MLP neurons", _experts),
    "uncapped_logits": Feature("uncapped logits", _capped_logits),
}

EDGES = ("per_head_hooks", "additive_heads")
EDGE_INSTEAD = (
    "Node-level tools work on this model: patch_heads, patch (resid_pre, attn_out, mlp_out, heads_by_pos), "
    "ablate, ablate_head, dla."
)


@dataclass(frozen=True)
class Use:
    """Tools, or one option of them (``option``, as the caller writes it), and the features they need."""

    tools: tuple[str, ...]
    option: str | None
    needs: tuple[str, ...]
    instead: str


INTERVENING = ("ablate", "logit_diff", "kl", "answer_rank", "loss")  # the tools taking ablation targets
NAMING = ("feature_examples", "score_explanation")  # the tools naming one feature
SAE_TOOLS = ("sae", "sae_features", "steer", *INTERVENING, *NAMING)  # the tools taking an SAE

USES: dict[str, Use] = {
    "edge_attribution": Use(("edge_attribution",), None, EDGES, EDGE_INSTEAD),
    "path_patch": Use(("path_patch",), None, EDGES, EDGE_INSTEAD),
    "circuit_faithfulness": Use(("circuit_faithfulness",), None, EDGES, EDGE_INSTEAD),
    "find_circuit": Use(("find_circuit",), None, EDGES, EDGE_INSTEAD),
    "attribution_graph": Use(
        ("attribution_graph", "graph_intervene"),
        None,
        ("per_head_hooks", "uncapped_logits"),
        "Transcoder features still work as `ablate` targets and in `steer`; dla decomposes the logits before the cap.",
    ),
    "patch_resid_mid": Use(
        ("patch",), "component='resid_mid'", ("resid_mid",), "Patch resid_pre, attn_out or mlp_out instead."
    ),
    "patch_mlp_neurons": Use(
        ("patch",), "component='mlp_neurons'", ("mlp_neurons",), "Patch mlp_out (the whole MLP) instead."
    ),
    "neuron_targets": Use(
        INTERVENING,
        "neuron targets 'L1N0,3'",
        ("mlp_neurons",),
        "Ablate the whole MLP ('L1MLP') instead.",
    ),
    "neuron_features": Use(
        NAMING,
        "neuron features 'L1N0'",
        ("mlp_neurons",),
        "Name a residual direction {layer, direction} or an SAE feature instead.",
    ),
    "sae_resid_mid": Use(
        SAE_TOOLS, "an SAE on blocks.L.hook_resid_mid", ("resid_mid",), "Use an SAE on resid_pre or resid_post."
    ),
    "sae_mlp_post": Use(SAE_TOOLS, "an SAE on blocks.L.mlp.hook_post", ("mlp_neurons",), "Use an SAE on mlp_out."),
}


def capability(backend: Any, key: str) -> Capability:
    """Whether the use ``key`` of ``USES`` applies to this model (the first missing feature decides why not), as
    ``model_info`` reports it."""
    bridge = backend.bridge
    use = USES[key]
    tools = list(use.tools)
    for need in use.needs:
        feature = FEATURES[need]
        why = feature.missing(bridge)
        if why is not None:
            reason = f"{why}. {use.instead}"
            return Capability(
                tools=tools, option=use.option, available=False, missing_feature=feature.name, reason=reason
            )
    return Capability(tools=tools, option=use.option, available=True, missing_feature=None, reason=None)


def capabilities(backend: Any) -> list[Capability]:
    """Every tool and option whose availability depends on the architecture, for this model (``model_info``)."""
    return [capability(backend, key) for key in USES]


def require(backend: Any, key: str) -> None:
    """Refuse the use ``key`` of ``USES`` before any model work when this model lacks what it needs: an
    ``InputError`` naming the missing feature, why, and what to use instead."""
    found = capability(backend, key)
    if not found.available:
        what = f"{found.option} ({', '.join(found.tools)})" if found.option else f"`{found.tools[0]}`"
        architecture = type(hf_model(backend.bridge)).__name__
        raise InputError(
            f"{what} needs {found.missing_feature}, which this model ({architecture}) does not have: {found.reason} "
            "(model_info lists under `capabilities` what applies to this model.)"
        )
