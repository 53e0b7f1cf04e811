"""Which tools and options this model's architecture supports, and why not: the one place that decides.

Every tool works on sequential and parallel-residual blocks alike, except where a measurement needs a
feature some architectures lack. Those needs are listed here once (``USES``), each feature with the test
that finds it missing (``FEATURES``). A tool that cannot apply calls ``require`` before any model work and
refuses with an ``InputError`` naming the feature, the reason and what to use instead; ``model_info``
reports the same table through ``capabilities`` — one function behind both, so an assistant told that a
tool applies is never refused, and the other way round.

The features:

* **per-head attention hooks** — each head's own write to the residual stream (``hook_result``) and each
  head's own query/key/value input, and an attention pattern that, edited, is the one the attention applies.
  TransformerLens 4.3 runs GPT-J's attention as one opaque module (``AttentionBridge``) that offers neither; the
  local backend runs it per head itself (``backend.gptj_heads``), so GPT-J has them there. What still lacks them:
  any other attention TransformerLens runs as one module.
* **additive head writes** — the heads' outputs reach the residual stream as they are or through a norm the
  circuit tools recompute. Post-norm blocks (Gemma-2, Gemma-3, OLMo-2) have a norm between the heads' sum and the
  residual add; the circuit tools recompute it exactly (``core.circuits.edge_writes``) and edge attribution
  linearises it with its scale frozen. What stays refused is a block scaling the heads' sum by a factor of its own
  (Granite's ``residual_multiplier``), whose place among TransformerLens' hooks the tools do not know.
* **a residual stream between attention and MLP** (``resid_mid``) — absent on parallel blocks (GPT-NeoX,
  GPT-J, Phi), where attention and MLP both read the block's input.
* **MLP neurons** — absent on mixture-of-experts blocks, whose ``mlp.hook_post`` is the experts' combined
  output (d_model wide), not a layer of neurons.

Attribution graphs need per-head attention hooks: on an opaque attention the frozen pattern is not the one the module
applies (on GPT-J run whole, the graph mispredicted its own frozen run by 2.1e-2; run per head, by 2.6e-7). A
soft-capped model (Gemma-2) is no gap: its graphs explain the pre-cap logits, which are a linear read-out
(``graphs.targets``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mcp_interp.core.engine.backend.base import FEATURE_WORDS, LOCAL_FIX, Backend, BackendFeature
from mcp_interp.core.engine.backend.points import hook_in, hook_mlp_post, hook_pattern, hook_resid_mid, hook_z
from mcp_interp.errors import InputError
from mcp_interp.schemas.readouts import Capability


def _opaque_attention(backend: Backend) -> str | None:
    classes = backend.opaque_attention()
    if not classes:
        return None
    return (
        f"TransformerLens runs this model's attention as one module ({', '.join(classes)}), "
        "which exposes neither each head's write (hook_result) nor each head's query/key/value input"
    )


def _normed_head_sum(backend: Backend) -> str | None:
    for layer in range(backend.n_layers):
        scale = backend.attention_output_scale(layer)
        if scale != 1.0:
            return (
                f"blocks.{layer} multiplies the heads' sum by {scale} before adding it to the residual stream, so one "
                "head's write (hook_result, taken before it) is not a term of the residual stream"
            )
    return None


def _parallel_block(backend: Backend) -> str | None:
    if not getattr(backend.cfg, "parallel_attn_mlp", False):
        return None
    return (
        "this is a parallel-residual block (attention and MLP both read the block's input, resid_pre), so there "
        "is no residual stream between them"
    )


def _experts(backend: Backend) -> str | None:
    layers = [layer for layer in range(backend.n_layers) if backend.mixture_of_experts(layer)]
    if not layers:
        return None
    return (
        f"the MLPs of layers {layers} are mixtures of experts: their mlp.hook_post is the experts' combined output "
        f"(d_model = {backend.cfg.d_model} wide), not a layer of neurons, and each expert has its own"
    )


def _compiled_program(backend: Backend) -> str | None:
    if backend.program is None:
        return None
    return (
        "a compiled RASP program reads input values, not text, writes its value at every position instead of "
        "predicting a next token, and has no trained SAEs, transcoders or lenses"
    )


def _backend_lacks(feature: BackendFeature) -> Callable[[Backend], str | None]:
    def missing(backend: Backend) -> str | None:
        return None if backend.supports(feature) else f"the {backend.name} backend does not provide it"

    return missing


def _backend_reads(point: Callable[[int], str], what: str) -> Callable[[Backend], str | None]:
    def missing(backend: Backend) -> str | None:
        return None if backend.has_point(point(0)) else f"the {backend.name} backend's driver does not serve {what}"

    return missing


def _resid_mid_writes(backend: Backend) -> str | None:
    if backend.supports("local_edits"):
        return None
    return (
        f"the {backend.name} backend only reads resid_mid (it is derived there, resid_pre + attn_out); a write needs "
        "both at once"
    )


@dataclass(frozen=True)
class Feature:
    """Something a measurement needs of the architecture or the backend; ``missing(backend)`` says why this model
    lacks it (None: it has it). ``backend``: a feature of the backend, got by running the server another way."""

    name: str
    missing: Callable[[Backend], str | None]
    backend: bool = False


def _backend_feature(feature: BackendFeature) -> Feature:
    return Feature(FEATURE_WORDS[feature], _backend_lacks(feature), backend=True)


FEATURES: dict[str, Feature] = {
    "language_model": Feature("a trained language model (text in, next token out)", _compiled_program),
    "per_head_hooks": Feature("per-head attention hooks", _opaque_attention),
    "additive_heads": Feature("additive head writes", _normed_head_sum),
    "resid_mid": Feature("a residual stream between attention and MLP (resid_mid)", _parallel_block),
    "mlp_neurons": Feature("MLP neurons", _experts),
    "gradients": _backend_feature("gradients"),
    "weights": _backend_feature("weights"),
    "local_edits": _backend_feature("local_edits"),
    "edge_points": _backend_feature("edge_points"),
    "jacobian_lens": _backend_feature("jacobian_lens"),
    "block_calls": _backend_feature("block_calls"),
    "attention_patterns": Feature(
        "attention patterns (hook_pattern)", _backend_reads(hook_pattern, "attention patterns"), backend=True
    ),
    "neuron_points": Feature(
        "the MLP neurons' point (mlp.hook_post)", _backend_reads(hook_mlp_post, "mlp.hook_post"), backend=True
    ),
    "resid_mid_points": Feature(
        "the residual stream between attention and MLP (resid_mid)",
        _backend_reads(hook_resid_mid, "resid_mid"),
        backend=True,
    ),
    "resid_mid_writes": Feature("writes to resid_mid", _resid_mid_writes, backend=True),
    "head_points": Feature(
        "each head's output before the output projection (attn.hook_z)",
        _backend_reads(hook_z, "attn.hook_z"),
        backend=True,
    ),
    "resid_pre_points": Feature(
        "the residual stream entering block 0 (hook_in)", _backend_reads(hook_in, "blocks.0.hook_in"), backend=True
    ),
}

EDGES = ("per_head_hooks", "additive_heads")
EDGE_INSTEAD = (
    "Node-level tools work on this model: patch_heads, patch (resid_pre, attn_out, mlp_out, heads_by_pos), "
    "ablate, ablate_head, dla."
)


@dataclass(frozen=True)
class Use:
    """Tools, or one option of them (``option``, as the caller writes it), and the features they need (architecture
    features first: when a model lacks one, no backend helps)."""

    tools: tuple[str, ...]
    option: str | None
    needs: tuple[str, ...]
    instead: str
    on_program: str = ""  # what to use instead on a compiled program (default: PROGRAM_INSTEAD)


INTERVENING = ("ablate", "logit_diff", "kl", "answer_rank", "loss")  # the tools taking ablation targets
NAMING = ("feature_examples", "score_explanation")  # the tools naming one feature
SAE_TOOLS = ("sae", "sae_features", "steer", *INTERVENING, *NAMING)  # the tools taking an SAE
EVERY_BACKEND = (
    "model_info", "tokenize", "logit_diff", "kl", "answer_rank", "loss", "ablate", "patch", "steer", "probe", "sae",
    "sae_features", "get_figure", "job_status", "job_cancel", "verify_artifact", "export_investigation", *NAMING,
)  # fmt: skip

PROGRAM_INSTEAD = "On a compiled program use patch, patch_heads, edge_attribution, find_circuit, probe or ablate."
LANGUAGE_MODEL_ONLY = ("loss", "steer", *NAMING)  # next-token loss, text generation, a corpus of texts

USES: dict[str, Use] = {
    **{tool: Use((tool,), None, (), "") for tool in EVERY_BACKEND},
    **{tool: Use((tool,), None, ("language_model",), PROGRAM_INSTEAD) for tool in LANGUAGE_MODEL_ONLY},
    "dictionaries": Use(
        (*SAE_TOOLS, "attribution_graph"), "an SAE or transcoders", ("language_model",), PROGRAM_INSTEAD
    ),
    "ablate_head": Use(("ablate_head",), None, ("head_points",), "Ablate MLPs or attention layers ('L9ATTN')."),
    "patch_heads": Use(("patch_heads",), None, ("head_points",), "Patch attn_out (each layer's heads together)."),
    "head_targets": Use(INTERVENING, "head targets 'L9H3'", ("head_points",), "Ablate attention layers ('L9ATTN')."),
    "patch_heads_by_pos": Use(
        ("patch",), "component='heads_by_pos'", ("head_points",), "Patch attn_out (each layer's heads together)."
    ),
    "patch_resid_pre": Use(("patch",), "component='resid_pre'", ("resid_pre_points",), "Patch resid_post instead."),
    "sae_z": Use(
        SAE_TOOLS, "an SAE on blocks.L.attn.hook_z", ("language_model", "head_points"), "Use an SAE on attn_out."
    ),
    "sae_resid_pre": Use(
        SAE_TOOLS,
        "an SAE on blocks.L.hook_resid_pre",
        ("language_model", "resid_pre_points"),
        "Use an SAE on resid_post.",
    ),
    "logit_lens": Use(("logit_lens",), None, ("weights",), "Use patch (resid_pre) for where the answer forms."),
    "dla": Use(("dla",), None, ("weights",), "Use patch_heads or ablate for each component's effect."),
    "attention": Use(("attention",), None, ("attention_patterns",), ""),
    "induction": Use(("induction",), None, ("language_model", "attention_patterns"), "Use loss on repeated tokens."),
    "explain": Use(("explain",), None, ("weights",), "Use patch_heads and patch for its causal maps."),
    "edge_attribution": Use(("edge_attribution",), None, (*EDGES, "gradients", "edge_points"), EDGE_INSTEAD),
    "path_patch": Use(("path_patch",), None, (*EDGES, "edge_points", "local_edits"), EDGE_INSTEAD),
    "circuit_faithfulness": Use(("circuit_faithfulness",), None, (*EDGES, "edge_points", "local_edits"), EDGE_INSTEAD),
    "find_circuit": Use(("find_circuit",), None, (*EDGES, "gradients", "edge_points", "local_edits"), EDGE_INSTEAD),
    "attribution_graph": Use(
        ("attribution_graph", "graph_intervene"),
        None,
        ("language_model", "per_head_hooks", "gradients", "weights", "local_edits"),
        "Transcoder features still work as `ablate` targets and in `steer`.",
    ),
    "causal_swap": Use(
        ("causal_swap_trial", "causal_swap_benchmark", "fit_lens"), None, ("language_model", "jacobian_lens"), ""
    ),
    "patch_noise": Use(
        ("patch",),
        "noise corruption",
        ("language_model", "block_calls"),
        "Give `corrupt_prompts` instead.",
        on_program="Give `corrupt_prompts` instead.",
    ),
    "patch_attribution": Use(
        ("patch", "patch_heads"), "method='attribution'", ("gradients",), "Use method 'exact' (the default)."
    ),
    "patch_resid_mid": Use(
        ("patch",),
        "component='resid_mid'",
        ("resid_mid", "resid_mid_writes"),
        "Patch resid_pre, attn_out or mlp_out instead.",
    ),
    "patch_mlp_neurons": Use(
        ("patch",),
        "component='mlp_neurons'",
        ("mlp_neurons", "neuron_points"),
        "Patch mlp_out (the whole MLP) instead.",
    ),
    "neuron_targets": Use(
        INTERVENING,
        "neuron targets 'L1N0,3'",
        ("mlp_neurons", "neuron_points"),
        "Ablate the whole MLP ('L1MLP') instead.",
    ),
    "neuron_features": Use(
        NAMING,
        "neuron features 'L1N0'",
        ("mlp_neurons", "neuron_points"),
        "Name a residual direction {layer, direction} or an SAE feature instead.",
    ),
    "sae_resid_mid": Use(
        SAE_TOOLS,
        "an SAE on blocks.L.hook_resid_mid",
        ("language_model", "resid_mid", "resid_mid_points", "resid_mid_writes"),
        "Use an SAE on resid_pre or resid_post.",
    ),
    "sae_mlp_post": Use(
        SAE_TOOLS,
        "an SAE on blocks.L.mlp.hook_post",
        ("language_model", "mlp_neurons", "neuron_points"),
        "Use an SAE on mlp_out.",
    ),
    "transcoder_targets": Use(
        INTERVENING,
        "transcoder features {transcoders, layer, features}",
        ("local_edits",),
        "Ablate the MLP ('L1MLP') or use an SAE instead.",
    ),
}


def capability(backend: Backend, key: str) -> Capability:
    """Whether the use ``key`` of ``USES`` applies to this model on this backend (the first missing feature decides
    why not), as ``model_info`` reports it."""
    use = USES[key]
    tools = list(use.tools)
    for need in use.needs:
        feature = FEATURES[need]
        why = feature.missing(backend)
        if why is not None:
            fix = f"Run the server with {LOCAL_FIX}." if feature.backend else ""
            # a compiled program lacks what the usual alternative needs too (loss for induction, say): say what works
            instead = (use.on_program or PROGRAM_INSTEAD) if need == "language_model" else use.instead
            reason = " ".join(part for part in (f"{why}.", fix, instead) if part)
            return Capability(
                tools=tools, option=use.option, available=False, missing_feature=feature.name, reason=reason
            )
    return Capability(tools=tools, option=use.option, available=True, missing_feature=None, reason=None)


def capabilities(backend: Backend) -> list[Capability]:
    """Every tool, and every option whose availability depends on the architecture or the backend, for this model on
    this backend (``model_info``), each said once: the tools available are one entry, then each refusal and each
    option. An option lists only the tools not refused outright, so that no tool
    reads as both refused and available for an option; an option left with no tool is not listed."""
    found = [capability(backend, key) for key in USES]
    refused = {tool for c in found if c.option is None and not c.available for tool in c.tools}
    available = Capability(tools=[], option=None, available=True, missing_feature=None, reason=None)
    listed: list[Capability] = [available]
    for entry in found:
        if entry.option is None and entry.available:
            available.tools.extend(tool for tool in entry.tools if tool not in available.tools)
        elif entry.option is None:
            listed.append(entry)
        else:
            tools = [tool for tool in entry.tools if tool not in refused]
            if tools:
                listed.append(entry.model_copy(update={"tools": tools}))
    return listed


def require(backend: Backend, key: str) -> None:
    """Refuse the use ``key`` of ``USES`` before any model work when this model or backend lacks what it needs: an
    ``InputError`` naming the missing feature, the backend, why, and what to use instead."""
    found = capability(backend, key)
    if not found.available:
        what = f"{found.option} ({', '.join(found.tools)})" if found.option else f"`{found.tools[0]}`"
        raise InputError(
            f"{what} needs {found.missing_feature}, which this model ({backend.architecture()} on the {backend.name} "
            f"backend) does not have: {found.reason} (model_info lists under `capabilities` what applies here.)"
        )
