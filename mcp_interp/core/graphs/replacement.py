"""The local replacement model of one prompt: its nodes, and the frozen forward whose gradients are its edges.

Circuit tracing (Ameisen et al. 2025; circuit-tracer's ``attribute``) explains one forward pass of the real
model with a *local replacement model*: every MLP is replaced by its transcoder, the attention patterns and
the norms' scales (denominators) are frozen at their values from the real forward, and each MLP gets an
*error node* ε_l,p = y_l,p − ŷ_l,p (its real write minus the transcoder's reconstruction), so the replacement
reproduces the model's activations exactly. With those freezes every path between the residual stream's
writers and readers is linear, and the *direct effect* of a source node on a target node is an exact number:

* a target feature t (layer l_t, position p_t, encoder row w_t) is read as its pre-activation w_t · x_{l_t,p_t}
  + b_t; a target logit k as u_k · n_{T−1}, with n the final norm's output and u_k the unembedding row of
  token k minus the mean row over the vocabulary (the *demeaned* logit, logit_k − mean_v logit_v);
* a source feature s (activation a_s, decoder row d_s,l' at each layer l' it writes to) has edge
  A[t, s] = a_s · Σ_l' w_tᵀ (∂x_{l_t,p_t} / ∂y_{l',p_s}) d_s,l' — the change of the target when a_s · d_s is
  written once more at the source's output(s) with everything else frozen (MLPs included, so only direct
  paths count: the residual stream, attention's value/output path under the frozen pattern, the skip);
* an error node (l, p): A[t, e] = w_tᵀ (∂x / ∂y_{l,p}) ε_{l,p}; an input token p: A[t, p] = w_tᵀ (∂x / ∂e_p) e_p
  with e_p its embedding as the model saw it (``hook_embed``).

Edges are signed: positive means the source pushes the target's pre-activation (or demeaned logit) up.
``FrozenForward`` runs ``batch_size`` copies of the prompt once with these freezes and keeps the autograd
graph; each backward through it injects one target's read-out vector per copy and returns that many rows of
the adjacency matrix at once (circuit-tracer's ``AttributionContext.compute_batch``).

Positions: the project's tokenization rule applies (``engine.tokens``; SmolLM2 adds no BOS). When the first
token is a special token (a BOS), position 0 gets no feature or error nodes, as in circuit-tracer: its
huge-norm activations are an attention sink, not content. Otherwise every position has nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mcp_interp.core.engine.backend.edits import Edit, Rewrite
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.points import FINAL_NORM_OUT, HOOK_EMBED
from mcp_interp.core.engine.dictionaries.transcoders import Transcoders
from mcp_interp.core.engine.references import transcoder_set
from mcp_interp.core.engine.text.tokens import encode, token_strings
from mcp_interp.errors import InputError


@dataclass
class CleanRun:
    """The real forward pass of the prompt: what every node and every freeze is read from."""

    input_ids: torch.Tensor  # [1, T]
    inputs: torch.Tensor  # [L, T, d_model]: each transcoder's input (its feature-input hook)
    outputs: torch.Tensor  # [L, T, d_model]: each MLP's write (the feature-output hook)
    embeddings: torch.Tensor  # [T, d_model]: hook_embed, the input tokens' vectors
    frozen: dict[str, torch.Tensor]  # every attention pattern and norm scale (``bridge.frozen_hooks``)
    logits: torch.Tensor  # [vocab]: the last position's logits before any final soft-cap (``targets``)

    @property
    def n_positions(self) -> int:
        return int(self.input_ids.shape[1])


def clean_run(model: LoadedModel, transcoders: Transcoders, input_ids: torch.Tensor) -> CleanRun:
    """One real forward of ``input_ids`` ``[1, T]`` recording the transcoders' inputs and outputs, the embeddings,
    every pattern and norm scale, and the last position's pre-cap logits (the unembedding of the final norm's output:
    what the logit nodes read; the model's own logits are ``backend.soft_cap`` of them)."""
    freeze = model.backend.frozen_points()
    names = [*transcoders.input_hooks, *transcoders.output_hooks, HOOK_EMBED, *freeze, FINAL_NORM_OUT]
    # the logits are read at the last position only: the forward stops at the final norm's output
    captured = model.backend.run(input_ids, capture=names, stop_at=FINAL_NORM_OUT).acts
    with torch.inference_mode():
        logits = model.backend.logits_from_normed(captured[FINAL_NORM_OUT][:, -1])[0]
    acts = {name: value.clone() for name, value in captured.items()}  # normal tensors, usable under autograd
    return CleanRun(
        input_ids=input_ids,
        inputs=torch.stack([acts[h][0] for h in transcoders.input_hooks]).float(),
        outputs=torch.stack([acts[h][0] for h in transcoders.output_hooks]).float(),
        embeddings=acts[HOOK_EMBED][0].float(),
        frozen={name: acts[name] for name in freeze},
        logits=logits.clone().float(),
    )


def first_position_has_nodes(model: LoadedModel, input_ids: torch.Tensor) -> bool:
    """False when the first token is a special token (a BOS): then it gets no feature or error nodes."""
    special = set(getattr(model.tokenizer, "all_special_ids", []) or [])
    return int(input_ids[0, 0]) not in special


@dataclass
class DecoderEntries:
    """What the active features write at one output layer: positions, the source feature's index, and
    activation × decoder row (the vector the edge formula contracts with the gradient)."""

    positions: torch.Tensor  # [m] long, ascending
    sources: torch.Tensor  # [m] long, indices into ActiveFeatures
    vectors: torch.Tensor  # [m, d_model]
    counts: list[int]  # entries at each position 0..T−1 (they are sorted by position)


@dataclass
class ActiveFeatures:
    """Every node of the replacement model but the logits: the active features (sorted by layer, position,
    feature), the error vectors and the token vectors."""

    layers: torch.Tensor  # [n] long
    positions: torch.Tensor  # [n] long
    features: torch.Tensor  # [n] long
    values: torch.Tensor  # [n] activations (≠ 0)
    encoders: torch.Tensor  # [n, d_model]: W_enc rows, the read-out of each feature as a target
    decoders: list[DecoderEntries]  # one per output layer
    activations: torch.Tensor  # [L, T, d_transcoder], dense, zero where positions have no nodes
    reconstruction: torch.Tensor  # [L, T, d_model]
    errors: torch.Tensor  # [L, T, d_model]: MLP write − reconstruction (0 where positions have no nodes)
    tokens: torch.Tensor  # [T, d_model]
    first_node_position: int  # 0, or 1 when position 0 is a special token without nodes

    @property
    def n(self) -> int:
        return int(self.layers.numel())


def active_features(transcoders: Transcoders, clean: CleanRun, first_node_position: int) -> ActiveFeatures:
    """Encode every layer's input, zero the positions without nodes, decode, and take the error vectors."""
    with torch.no_grad():
        acts = torch.stack([transcoders.encode(layer, clean.inputs[layer]) for layer in range(transcoders.n_layers)])
        acts[:, :first_node_position] = 0
        reconstruction = transcoders.reconstruct(clean.inputs, acts)
        errors = clean.outputs - reconstruction
        errors[:, :first_node_position] = 0
        index = acts.nonzero()
        layers, positions, features = index[:, 0], index[:, 1], index[:, 2]
        values = acts[layers, positions, features]
        encoders = transcoders.W_enc[layers, features]
        decoders = []
        for out_layer in range(transcoders.n_layers):
            sources, rows = [], []
            for source_layer in range(out_layer + 1):
                chosen = torch.nonzero(layers == source_layer).flatten()
                if out_layer in transcoders.output_layers(source_layer) and chosen.numel():
                    sources.append(chosen)
                    rows.append(transcoders.decoder_rows(source_layer, features[chosen], out_layer))
            index_of = torch.cat(sources) if sources else torch.zeros(0, dtype=torch.long, device=acts.device)
            vectors = torch.cat(rows) if rows else torch.zeros(0, transcoders.d_model, device=acts.device)
            order = torch.argsort(positions[index_of], stable=True)
            index_of, vectors = index_of[order], vectors[order]
            counts = torch.bincount(positions[index_of], minlength=clean.n_positions).tolist()
            decoders.append(DecoderEntries(positions[index_of], index_of, vectors * values[index_of, None], counts))
    return ActiveFeatures(
        layers=layers,
        positions=positions,
        features=features,
        values=values,
        encoders=encoders,
        decoders=decoders,
        activations=acts,
        reconstruction=reconstruction,
        errors=errors,
        tokens=clean.embeddings,
        first_node_position=first_node_position,
    )


class FrozenForward:
    """``batch_size`` copies of the prompt through the model under the replacement model's freezes, the autograd
    graph kept for repeated backward passes.

    Hooks: every attention pattern and norm scale is detached (frozen); the embeddings become a leaf; each
    transcoder input's live tensor is kept (a *root*: a feature target's read-out is injected there); each MLP
    write becomes ``skip(x) + y`` with ``y`` a detached leaf of the MLP's real output minus the skip (so its value
    is the real one, nothing flows back through the MLP, the skip stays linear, and the gradient at ``y`` is the
    gradient at the MLP's write); the final norm's output is the logits' root, and the forward stops there (the
    vocabulary projection is never computed).
    """

    def __init__(self, model: LoadedModel, transcoders: Transcoders, input_ids: torch.Tensor, batch_size: int) -> None:
        self.backend, self.transcoders, self.batch_size = model.backend, transcoders, batch_size
        n_layers = transcoders.n_layers
        roots: dict[int, torch.Tensor] = {}
        leaves: dict[int, torch.Tensor] = {}
        held: dict[str, torch.Tensor] = {}

        def detach(values: torch.Tensor) -> torch.Tensor:
            return values.detach()

        def embed_leaf(values: torch.Tensor) -> torch.Tensor:
            held["embed"] = values.detach().requires_grad_(True)
            return held["embed"]

        def keep_input(layer: int) -> Callable[[torch.Tensor], torch.Tensor]:
            def keep(values: torch.Tensor) -> torch.Tensor:
                roots[layer] = values
                return values

            return keep

        def output_leaf(layer: int) -> Callable[[torch.Tensor], torch.Tensor]:
            def leaf(values: torch.Tensor) -> torch.Tensor:
                skip = transcoders.skip(layer, roots[layer]).to(values.dtype) if transcoders.has_skip else None
                rest = values.detach() if skip is None else (values - skip).detach()
                leaves[layer] = rest.requires_grad_(True)
                return leaves[layer] if skip is None else skip + leaves[layer]

            return leaf

        def keep_final(values: torch.Tensor) -> None:
            roots[n_layers] = values

        # Every edit here builds the autograd graph the backward passes walk: local only.
        edits: list[Edit] = [Rewrite(name, detach, is_pure=False) for name in self.backend.frozen_points()]
        edits.append(Rewrite(HOOK_EMBED, embed_leaf, is_pure=False))
        for layer in range(n_layers):
            edits.append(Rewrite(transcoders.input_hooks[layer], keep_input(layer), is_pure=False))
            edits.append(Rewrite(transcoders.output_hooks[layer], output_leaf(layer), is_pure=False))
        edits.append(Rewrite(FINAL_NORM_OUT, keep_final, is_pure=False))
        self.backend.run(input_ids.expand(batch_size, -1), edits=edits, stop_at=FINAL_NORM_OUT, mode="grad")
        if len(roots) != n_layers + 1 or len(leaves) != n_layers or "embed" not in held:
            raise RuntimeError("the frozen forward did not reach every transcoder hook and the final norm")
        self.roots = [roots[layer] for layer in range(n_layers + 1)]
        self.leaves = [held["embed"], *(leaves[layer] for layer in range(n_layers))]

    def gradients(
        self, layers: torch.Tensor, positions: torch.Tensor, vectors: torch.Tensor, last: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One backward for ``k ≤ batch_size`` targets: target r reads ``vectors[r]`` · root ``layers[r]`` (a layer's
        transcoder input, or n_layers = the final norm's output) at ``positions[r]``. Returns the gradients of each
        target with respect to the embeddings ``[k, T, d_model]`` and to every MLP write ``[L, k, T, d_model]``.
        ``last`` frees the graph."""
        k = int(layers.numel())
        if not 0 < k <= self.batch_size:
            raise ValueError(f"{k} targets for a batch of {self.batch_size}")
        outputs, grad_outputs = [], []
        rows = torch.arange(k, device=vectors.device)
        for layer in torch.unique(layers).tolist():
            root = self.roots[int(layer)]
            seed = torch.zeros_like(root)
            mask = layers == layer
            seed[rows[mask], positions[mask]] = vectors[mask].to(seed.dtype)
            outputs.append(root)
            grad_outputs.append(seed)
        grads = self.backend.backward(
            outputs, self.leaves, grad_outputs, retain_graph=not last, allow_unused=True, materialize_grads=True
        )
        gradients = [g for g in grads if g is not None]  # materialize_grads: none is None
        return gradients[0][:k].float(), torch.stack(gradients[1:])[:, :k].float()


def contract(active: ActiveFeatures, grad_embed: torch.Tensor, grad_outputs: torch.Tensor) -> torch.Tensor:
    """Adjacency rows ``[k, n_features + L·T + T]`` from one backward's gradients: each source's vector (activation
    × decoder row, error vector, token vector) contracted with the gradient at the place it is written. Columns:
    active features in ``active``'s order, then error nodes (layer-major: layer 0 positions 0..T−1, layer 1, …),
    then token positions."""
    k, n = int(grad_embed.shape[0]), active.n
    n_layers, n_positions = int(active.errors.shape[0]), int(active.errors.shape[1])
    row = torch.zeros(k, n + n_layers * n_positions + n_positions, device=grad_embed.device)
    for out_layer, entries in enumerate(active.decoders):
        if entries.sources.numel():
            blocks = torch.split(entries.vectors, entries.counts)  # the entries at each position
            grads = grad_outputs[out_layer]  # [k, T, d]
            picked = torch.cat([grads[:, p] @ block.T for p, block in enumerate(blocks) if block.numel()], dim=1)
            row[:, :n].index_add_(1, entries.sources, picked)
    row[:, n : n + n_layers * n_positions] = torch.einsum("lktd,ltd->klt", grad_outputs, active.errors).reshape(k, -1)
    row[:, n + n_layers * n_positions :] = torch.einsum("ktd,td->kt", grad_embed, active.tokens)
    return row


MAX_GRAPH_TOKENS = 128  # each token adds n_layers error nodes and a row of every feature's edges


@dataclass
class Prepared:
    """A prompt ready for the replacement model: its transcoders, tokens, real run and nodes."""

    transcoders: Transcoders
    input_ids: torch.Tensor  # [1, T]
    tokens: list[str]
    clean: CleanRun
    active: ActiveFeatures


def prepare(model: LoadedModel, prompt: str, transcoders: str) -> Prepared:
    """Load the transcoders, tokenize ``prompt`` by the server's rule, run it and find its nodes."""
    if not isinstance(prompt, str) or not prompt:
        raise InputError("`prompt` must be one non-empty string (a graph explains one next-token prediction).")
    loaded = transcoder_set(transcoders, model)
    batch = encode(model.tokenizer, [prompt], model.device)
    n_tokens = batch.lengths[0]
    if n_tokens > MAX_GRAPH_TOKENS:
        raise InputError(
            f"The prompt is {n_tokens} tokens; attribution graphs take at most {MAX_GRAPH_TOKENS} (every token adds "
            f"{loaded.n_layers} error nodes and a column per feature). Shorten it to the part that matters."
        )
    ids = batch.input_ids[:, :n_tokens]
    clean = clean_run(model, loaded, ids)
    first = 0 if first_position_has_nodes(model, ids) else 1
    if first >= n_tokens:
        raise InputError(
            "The prompt is only a special token, which gets no nodes: give at least one real token after it."
        )
    return Prepared(
        loaded, ids, token_strings(model.tokenizer, batch.ids(0)), clean, active_features(loaded, clean, first)
    )
