"""Testing what a graph claims: set or scale features and measure the target logits, three ways.

A graph's edge is a *direct* effect under frozen attention, norms and MLPs. Whether the model behaves that way
is an empirical question, so ``graph_intervene`` reports the same intervention in three runs, each one forward:

* ``direct`` — attention patterns, norm scales and every MLP write frozen at their real values (the skip
  connections, which are linear, respond), plus the intervened features' change (new − real activation) ×
  their decoder rows at their output layer(s). This is the linear model the graph's edges describe: its change
  of each demeaned logit equals the graph's prediction Σ edge × Δa / a (``predicted_direct``) up to float
  rounding — the check that the graph is computed right.
* ``replacement`` — the replacement model itself: every MLP write is its transcoder's reconstruction from the
  *live* input (features downstream re-encode, with their activation function) plus the real run's error node;
  the intervened features are forced to their new values. Attention patterns frozen iff ``freeze_attention``.
* ``model`` — the real model, with the intervened features' change × decoder rows added to their MLP writes
  (circuit-tracer's ``feature_intervention``: the change is measured from the feature's activation on the live
  input); downstream MLPs are the real ones. Attention frozen iff ``freeze_attention``; norms are live.

Logit changes are of the demeaned logit (logit − mean over the vocabulary), what the graph's logit nodes read: on a
model that soft-caps its logits (Gemma-2), of the pre-cap logit (``targets``), in all three runs, so each is comparable
with the graph's prediction. Probabilities, top tokens and KL are of the model's own next-token distribution (after
the cap).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.edits import Edit, Rewrite, Set
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.points import FINAL_NORM_OUT
from mcp_interp.core.engine.dictionaries.transcoders import Transcoders
from mcp_interp.core.engine.numbers.metrics import kl_divergence
from mcp_interp.core.graphs.replacement import (
    FrozenForward,
    Prepared,
    prepare,
)
from mcp_interp.core.graphs.summary import transcoder_info
from mcp_interp.core.graphs.targets import LogitTargets, logit_targets, softcap_note
from mcp_interp.errors import InputError
from mcp_interp.schemas.graphs import (
    FeatureIntervention,
    GraphInterveneMeasurement,
    InterventionApplied,
    InterventionRun,
    InterventionRunName,
    TargetChange,
)

MlpMode = Literal["frozen", "replacement", "model"]
MAX_INTERVENTIONS = 256


@dataclass(frozen=True)
class FeatureChange:
    """Feature ``feature`` of layer ``layer`` at ``position`` set to ``value`` (its real activation: ``clean``)."""

    layer: int
    position: int
    feature: int
    value: float
    clean: float


def replacement_logits(
    model: LoadedModel,
    prepared: Prepared,
    changes: Sequence[FeatureChange],
    mlps: MlpMode,
    freeze_patterns: bool,
    freeze_scales: bool,
) -> torch.Tensor:
    """The last position's pre-cap logits ``[vocab]`` of one run of the prompt (see the module docstring for ``mlps``),
    read as the clean run's are: the unembedding of the final norm's output, the forward stopped there."""
    tc, clean, active = prepared.transcoders, prepared.clean, prepared.active
    first = active.first_node_position
    by_layer: dict[int, list[FeatureChange]] = {}
    for change in changes:
        by_layer.setdefault(change.layer, []).append(change)
    live_inputs: dict[int, torch.Tensor] = {}
    live_acts: dict[int, torch.Tensor] = {}

    def read_input(layer: int) -> Callable[[torch.Tensor], None]:
        def hook(values: torch.Tensor) -> None:
            x = values[0].float()
            live_inputs[layer] = x
            acts = tc.encode(layer, x)
            if mlps == "replacement":
                acts[:first] = 0
                for change in by_layer.get(layer, []):
                    acts[change.position, change.feature] = change.value
            live_acts[layer] = acts

        return hook

    def decoder_change(out_layer: int, reference: Callable[[FeatureChange], float]) -> torch.Tensor:
        delta = torch.zeros_like(clean.outputs[out_layer])
        for source, members in by_layer.items():
            if out_layer in tc.output_layers(source):
                for change in members:
                    row = tc.decoder_rows(source, [change.feature], out_layer)[0]
                    delta[change.position] += (change.value - reference(change)) * row
        return delta

    def write_output(layer: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def hook(values: torch.Tensor) -> torch.Tensor:
            x = live_inputs[layer]
            skip_change = tc.skip(layer, x) - tc.skip(layer, clean.inputs[layer])
            if mlps == "frozen":
                new = clean.outputs[layer] + skip_change + decoder_change(layer, lambda c: c.clean)
            elif mlps == "replacement":
                new = tc.b_dec[layer] + tc.skip(layer, x) + active.errors[layer]
                for source in range(layer + 1):
                    if layer in tc.output_layers(source):
                        new = new + live_acts[source] @ tc.decoder_matrix(source, layer)
                new[:first] = clean.outputs[layer][:first] + skip_change[:first]
            else:
                new = values[0].float() + decoder_change(
                    layer, lambda c: float(live_acts[c.layer][c.position, c.feature])
                )
            return new.unsqueeze(0).to(values.dtype)

        return hook

    edits: list[Edit] = []
    for name in model.backend.frozen_points():
        if (freeze_patterns and name.endswith("hook_pattern")) or (freeze_scales and name.endswith("hook_scale")):
            edits.append(Set(name, clean.frozen[name]))
    for layer in range(tc.n_layers):  # the replacement's MLPs read one point and write another: local only
        edits.append(Rewrite(tc.input_hooks[layer], read_input(layer), is_pure=False))
        edits.append(Rewrite(tc.output_hooks[layer], write_output(layer), is_pure=False))
    normed = model.backend.run(prepared.input_ids, capture=[FINAL_NORM_OUT], edits=edits, stop_at=FINAL_NORM_OUT)
    with torch.inference_mode():
        logits = model.backend.logits_from_normed(normed.acts[FINAL_NORM_OUT][:, -1])
    return logits[0].float()


def replacement_logit_error(model: LoadedModel, prepared: Prepared) -> float:
    """max |replacement-model logit − real logit| at the last position, with patterns and norm scales frozen: of the
    pre-cap logits, the graph's target (on a soft-capped model the capped error is at most this, tanh being
    1-Lipschitz)."""
    logits = replacement_logits(model, prepared, [], "replacement", freeze_patterns=True, freeze_scales=True)
    return float((logits - prepared.clean.logits).abs().max())


def resolve_changes(
    prepared: Prepared, features: Sequence[FeatureIntervention | dict[str, Any]]
) -> list[FeatureChange]:
    """The requested interventions, checked (layer, position, feature in range; value or scale; no duplicates)."""
    tc, active = prepared.transcoders, prepared.active
    n_positions = prepared.clean.n_positions
    if not isinstance(features, list) or not features:
        raise InputError(
            "`features` must be a non-empty list of {layer, position, feature, value} (or scale instead of value), "
            "e.g. [{'layer': 3, 'position': -1, 'feature': 812, 'value': 0}]."
        )
    if len(features) > MAX_INTERVENTIONS:
        raise InputError(f"`features` lists {len(features)} interventions; at most {MAX_INTERVENTIONS} per call.")
    changes: dict[tuple[int, int, int], FeatureChange] = {}
    for item in features:
        spec = item if isinstance(item, FeatureIntervention) else FeatureIntervention.model_validate(item)
        where = f"intervention {spec.model_dump(exclude_none=True)}"
        if not 0 <= spec.layer < tc.n_layers:
            raise InputError(
                f"{where}: layer {spec.layer} does not exist; the transcoders have layers 0..{tc.n_layers - 1}."
            )
        position = spec.position + n_positions if spec.position < 0 else spec.position
        if not active.first_node_position <= position < n_positions:
            raise InputError(
                f"{where}: position {spec.position} is outside the prompt's positions with nodes "
                f"{active.first_node_position}..{n_positions - 1} (negative positions count from the end"
                + ("; position 0 is a special token without features" if active.first_node_position else "")
                + ")."
            )
        if not 0 <= spec.feature < tc.d_transcoder:
            raise InputError(f"{where}: feature {spec.feature} does not exist; ids are 0..{tc.d_transcoder - 1}.")
        if (spec.value is None) == (spec.scale is None):
            raise InputError(f"{where}: give exactly one of `value` (the new activation) or `scale` (a multiplier).")
        clean = float(active.activations[spec.layer, position, spec.feature])
        if spec.value is not None:
            value = float(spec.value)
        else:
            assert spec.scale is not None  # exactly one of the two, checked above
            value = clean * float(spec.scale)
        if not abs(value) < 1e6:
            raise InputError(f"{where}: the new activation must be a finite number of magnitude < 1e6, got {value}.")
        key = (spec.layer, position, spec.feature)
        if key in changes:
            raise InputError(f"{where}: this feature at this position is listed twice; give it once.")
        changes[key] = FeatureChange(spec.layer, position, spec.feature, value, clean)
    return list(changes.values())


def predicted_direct(
    model: LoadedModel, prepared: Prepared, vectors: torch.Tensor, changes: Sequence[FeatureChange]
) -> torch.Tensor:
    """The graph's direct-effect prediction for each logit read-out in ``vectors`` ``[k, d_model]``: one backward
    through the frozen forward, the gradient at each changed feature's output layer(s) contracted with
    (new − real activation) × its decoder row — the edge formula, for features active or not."""
    tc = prepared.transcoders
    k, n_positions = int(vectors.shape[0]), prepared.clean.n_positions
    with model.backend.weights_frozen():
        frozen = FrozenForward(model, tc, prepared.input_ids, batch_size=k)
        layers = torch.full((k,), tc.n_layers, device=vectors.device)
        positions = torch.full((k,), n_positions - 1, device=vectors.device)
        _, grad_outputs = frozen.gradients(layers, positions, vectors, last=True)
    prediction = torch.zeros(k, device=vectors.device)
    for change in changes:
        for out_layer in tc.output_layers(change.layer):
            row = tc.decoder_rows(change.layer, [change.feature], out_layer)[0]
            prediction += (change.value - change.clean) * (grad_outputs[out_layer][:, change.position] @ row)
    return prediction


def graph_intervene(
    model: LoadedModel,
    prompt: str,
    transcoders: str,
    features: Sequence[FeatureIntervention | dict[str, Any]],
    targets: Sequence[str] | None = None,
    freeze_attention: bool = True,
) -> GraphInterveneMeasurement:
    """Set or scale features and report every target logit's change in the three runs (module docstring)."""
    require(model.backend, "attribution_graph")
    if not isinstance(freeze_attention, bool):
        raise InputError(f"`freeze_attention` must be true or false, got {freeze_attention!r}.")
    prepared = prepare(model, prompt, transcoders)
    changes = resolve_changes(prepared, features)
    clean = prepared.clean
    capped_clean = model.backend.soft_cap(clean.logits.double())  # the model's own logits
    chosen = logit_targets(model, clean.logits, targets)
    index = torch.tensor(chosen.ids, device=clean.logits.device)
    predicted = predicted_direct(model, prepared, chosen.vectors, changes)
    runs: dict[InterventionRunName, tuple[bool, bool, str]] = {
        "direct": (True, True, "frozen at the real run's writes, plus the intervened features' decoder change"),
        "replacement": (freeze_attention, False, "transcoders re-encoding their live input + the real run's errors"),
        "model": (freeze_attention, False, "the real MLPs, plus the intervened features' decoder change"),
    }
    mode: dict[InterventionRunName, MlpMode] = {"direct": "frozen", "replacement": "replacement", "model": "model"}
    deltas, summaries = {}, []
    for name, (patterns, scales, what) in runs.items():
        logits = replacement_logits(model, prepared, changes, mode[name], patterns, scales)
        deltas[name] = demeaned(logits)[index] - demeaned(clean.logits)[index]
        capped = model.backend.soft_cap(logits.double())
        kl = kl_divergence(capped_clean[None], capped[None]).value
        summaries.append(
            InterventionRun(
                name=name,
                attention_frozen=patterns,
                norm_scales_frozen=scales,
                mlps=what,
                top_token=model.tokenizer.decode([int(capped.argmax())]),
                kl_from_clean=float(kl),
            )
        )
        if name == "model":
            model_probabilities = torch.softmax(capped, -1)[index]
    target_rows = [
        TargetChange(
            token=chosen.tokens[i],
            token_id=chosen.ids[i],
            clean_logit=chosen.logits[i],
            clean_probability=float(chosen.probabilities[i]),
            predicted_direct=float(predicted[i]),
            direct=float(deltas["direct"][i]),
            replacement=float(deltas["replacement"][i]),
            model=float(deltas["model"][i]),
            model_probability=float(model_probabilities[i]),
        )
        for i in range(len(chosen))
    ]
    error = max(abs(t.direct - t.predicted_direct) for t in target_rows)
    return GraphInterveneMeasurement(
        prompt=prompt,
        tokens=prepared.tokens,
        transcoders=transcoder_info(prepared.transcoders),
        interventions=[
            InterventionApplied(
                layer=c.layer,
                position=c.position,
                token=prepared.tokens[c.position],
                feature=c.feature,
                clean_activation=c.clean,
                new_activation=c.value,
            )
            for c in changes
        ],
        freeze_attention=freeze_attention,
        runs=summaries,
        targets=target_rows,
        logit_softcap=model.backend.final_logit_softcap(),
        max_prediction_error=error,
        notes=_intervention_notes(model, prepared.transcoders, chosen, changes, target_rows, freeze_attention, error),
    )


def demeaned(logits: torch.Tensor) -> torch.Tensor:
    """logit − mean over the vocabulary (what a graph's logit node reads)."""
    return logits.double() - logits.double().mean()


def _intervention_notes(
    model: LoadedModel,
    tc: Transcoders,
    chosen: LogitTargets,
    changes: Sequence[FeatureChange],
    targets: list[TargetChange],
    freeze_attention: bool,
    error: float,
) -> list[str]:
    notes = list(tc.notes)
    capped = softcap_note(model, chosen)
    if capped is not None:
        notes.append(capped)
    inactive = [c for c in changes if c.clean == 0]
    if inactive:
        notes.append(
            f"{len(inactive)} intervened feature(s) are off in the real run (activation 0): the graph has no node for "
            "them, so predicted_direct comes from the same frozen gradients, not from a listed edge; scaling them "
            "does nothing."
        )
    if error > 1e-3 * max(1.0, max(abs(t.direct) for t in targets)):
        notes.append(
            f"The frozen run differs from the graph's prediction by up to {error:.2e}: more than float rounding — "
            "report this as a bug in mcp-interp."
        )
    gap = max(abs(t.model - t.direct) for t in targets)
    notes.append(
        f"The real model's response differs from the direct (graph) prediction by up to {gap:.3g} in demeaned logit: "
        "the graph shows direct effects only; indirect paths through later MLPs"
        + ("" if freeze_attention else ", attention patterns")
        + " and norms make up the difference."
    )
    return notes
