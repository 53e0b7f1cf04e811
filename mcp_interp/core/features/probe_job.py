"""The ``probe`` measurement: one forward pass over the texts, then per layer a probe and its control draws.

Per layer it reports the held-out accuracy with its exact interval, the shuffled-label control and (when the
labels are a function of a key: a token at some position, or the group) the type-keyed control, each as the mean
of ``control_draws`` draws with a rank p-value, the selectivity over the control with its interval, and the fitted
direction as a unit vector with the statistics ``steer`` needs; the adapter stores each as ``direction://{id}``.
``core.features.probe`` defines every number and why its p-value is exact.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mcp_interp.core.engine.numbers import stats
from mcp_interp.core.engine.text.tokens import token_ids
from mcp_interp.core.features import probe
from mcp_interp.core.features.residuals import check_layers, check_position, read_residuals
from mcp_interp.errors import InputError, require_choice
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.common import StoredDirection
from mcp_interp.schemas.features import ControlKind, ProbeLayer, ProbeMeasurement, ProbeMethod

SHUFFLE_SEED_OFFSET = 1  # the shuffled-label draws come from seed + 1, the type-keyed ones from seed + 2
KEY_SEED_OFFSET = 2


def data_hash(texts: Sequence[str], labels: Sequence[str], position: Any) -> str:
    payload = json.dumps({"texts": list(texts), "labels": list(labels), "position": position}, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


@dataclass
class Draws:
    """Control draws' held-out accuracies, [draws, layers] each (None when not run)."""

    shuffled: list[np.ndarray] = field(default_factory=list)
    keyed: list[np.ndarray] = field(default_factory=list)


@dataclass(kw_only=True)
class ProbeJob:
    model: LoadedModel
    texts: Sequence[str]
    labels: Sequence[Any]
    layers: Sequence[int] | None = None
    position: str | int = "last"
    method: ProbeMethod = "logistic"
    test_fraction: float = 0.25
    seed: int = 0
    control: bool = True
    control_draws: int = stats.DEFAULT_DRAWS
    groups: Sequence[Hashable] | None = None
    result: ProbeMeasurement | None = field(default=None, init=False)
    directions: list[StoredDirection] = field(default_factory=list, init=False)

    def _chosen(self) -> list[int]:
        return check_layers(self.layers, self.model.cfg.n_layers)

    def total_steps(self) -> int:
        return 1 + len(self._chosen())

    def steps(self) -> Iterator[str]:
        check_position(self.position)
        require_choice("method", self.method, ProbeMethod)
        texts = list(self.texts)
        if len(texts) != len(self.labels):
            raise InputError(
                f"`labels` has {len(self.labels)} entries for {len(texts)} texts: give one label per text."
            )
        if self.control:
            stats.check_draws(self.control_draws, "control_draws")
        elif self.groups is not None:
            raise InputError(
                "`groups` needs the controls (control=true): texts of a held-out group are not independent, so only "
                "the permutation controls (which shuffle within or among groups) give a valid verdict."
            )
        y, classes = probe.encode_labels(self.labels)
        groups = None if self.groups is None else probe.encode_groups(self.groups, len(texts))
        tokens = [token_ids(self.model.tokenizer, text) for text in texts]
        names = [[self.model.tokenizer.decode([i]) for i in ids] for ids in tokens]  # for the notes: ' dog'
        read = -1 if self.position == "last" else self.position if isinstance(self.position, int) else None
        key = probe.find_key(tokens, y, read, groups, names)
        split = probe.split_texts(
            y, self.test_fraction, self.seed, groups=groups, key=None if key is None else key.values
        )
        residuals = read_residuals(self.model, texts, self.layers, self.position)
        yield f"read resid_post of {len(residuals.layers)} layers for {len(texts)} texts"
        shuffled = keyed = None
        shuffle_how = ""
        if self.control:
            if key is not None:
                keyed = probe.keyed_labels(key.values, y, self.control_draws, self.seed + KEY_SEED_OFFSET, split)
            if groups is not None and key is not None:
                shuffled, shuffle_how = keyed, "among the key types"  # with groups held out, the same null
                keyed = None
            else:
                shuffled, shuffle_how = probe.shuffled_labels(
                    y, split, self.control_draws, self.seed + SHUFFLE_SEED_OFFSET, groups
                )
        rows: list[ProbeLayer] = []
        draws = Draws()
        for column, layer in enumerate(residuals.layers):
            x = residuals.values[:, column].numpy()
            rows.append(self._layer(layer, x, y, classes, split, shuffled, keyed, draws, texts))
            yield f"layer {layer}: held-out accuracy {rows[-1].accuracy:.3f}"
        self.result = self._measurement(rows, y, classes, split, key, draws, shuffle_how, len(texts))

    def _layer(
        self,
        layer: int,
        x: np.ndarray,
        y: np.ndarray,
        classes: list[str],
        split: probe.Split,
        shuffled: np.ndarray | None,
        keyed: np.ndarray | None,
        draws: Draws,
        texts: list[str],
    ) -> ProbeLayer:
        method = self.method  # checked in steps()
        fit = probe.fit_probe(x, y, split, method)
        low, high = stats.clopper_pearson(fit.correct, fit.n_test)
        row = ProbeLayer(
            layer=layer,
            accuracy=fit.accuracy,
            ci_low=low,
            ci_high=high,
            train_accuracy=fit.train_accuracy,
            direction_norm=0.0,
            direction_accuracy=fit.direction_accuracy,
            projection_gap=0.0,
        )
        if shuffled is not None:
            accuracies = probe.held_out_correct(x, shuffled, split, method) / fit.n_test
            draws.shuffled.append(accuracies)
            row.shuffled_accuracy = float(accuracies.mean())
            row.shuffled_p = stats.rank_test(fit.accuracy, accuracies.tolist(), "greater").p_value
            control = accuracies
            if keyed is not None:
                control = probe.held_out_correct(x, keyed, split, method) / fit.n_test
                draws.keyed.append(control)
            interval = stats.mean_interval(control.tolist())
            row.control_accuracy = interval.mean
            row.selectivity = fit.accuracy - interval.mean
            row.selectivity_ci = [fit.accuracy - interval.high, fit.accuracy - interval.low]
            row.selectivity_p = stats.rank_test(fit.accuracy, control.tolist(), "greater").p_value
        norm = float(np.linalg.norm(fit.direction))
        unit = fit.direction / norm if norm > 0 else fit.direction
        projections = x.astype(np.float64) @ unit
        means = {name: float(projections[y == i].mean()) for i, name in enumerate(classes)}
        held_out, y_test = projections[split.test], y[split.test]
        held_spread = float(held_out.std())
        row.direction_norm = norm
        row.projection_gap = (
            float(held_out[y_test == 1].mean() - held_out[y_test == 0].mean()) / held_spread if held_spread > 0 else 0.0
        )
        self.directions.append(
            StoredDirection(
                layer=layer,
                position=self.position,
                vector=[float(v) for v in unit],
                norm=norm,
                method=f"probe:{self.method}",
                labels=classes,
                accuracy=fit.direction_accuracy,
                selectivity=row.selectivity,
                projection_std=float(projections.std()),
                projection_means=means,
                model_name=self.model.name,
                model_fingerprint=self.model.fingerprint,
                data_hash=data_hash(texts, [str(label) for label in self.labels], self.position),
            )
        )
        return row

    def _measurement(
        self,
        rows: list[ProbeLayer],
        y: np.ndarray,
        classes: list[str],
        split: probe.Split,
        key: probe.Key | None,
        draws: Draws,
        shuffle_how: str,
        n_texts: int,
    ) -> ProbeMeasurement:
        n_test = len(split.test)
        test_counts = np.bincount(y[split.test], minlength=2)
        chance = float(test_counts.max() / test_counts.sum())
        best = max(rows, key=lambda row: (row.accuracy, -row.layer))
        # The best layer is chosen among len(rows) by the same held-out texts: its interval is widened to the
        # Bonferroni level 1 − 0.05/L.
        level = 1 - (1 - stats.CONFIDENCE) / len(rows)
        best_interval = stats.clopper_pearson(round(best.accuracy * n_test), n_test, level)
        accuracies = np.array([row.accuracy for row in rows])
        kind: ControlKind | None = None
        selective: list[int] = []
        notes = [
            f"Accuracy is on {n_test} held-out texts ({_split_words(split.kind)}); chance (the majority label) is "
            f"{chance:.3f}; ci_low/ci_high are exact (Clopper–Pearson, 95 %) for independent held-out texts."
        ]
        if self.control:
            shuffled = np.stack(draws.shuffled, axis=1)
            beating = [rows[i].layer for i in np.flatnonzero(probe.family_wise_p(accuracies, shuffled) <= stats.ALPHA)]
            control = np.stack(draws.keyed, axis=1) if draws.keyed else shuffled
            selective = [rows[i].layer for i in np.flatnonzero(probe.family_wise_p(accuracies, control) <= stats.ALPHA)]
            kind = "type_keyed" if key is not None else "shuffled_labels"
            notes += self._control_notes(rows, key, beating, selective, shuffle_how)
        else:
            beating = [
                row.layer
                for row in rows
                if stats.clopper_pearson(round(row.accuracy * n_test), n_test, level)[0] > chance
            ]
            notes.append(
                f"No controls (control=false): layers_beating_chance are those whose interval at the Bonferroni level "
                f"{level:.4f} lies above chance; nothing is said about selectivity."
            )
        if beating:
            notes.append(
                f"best_layer ({best.layer}) was chosen by held-out accuracy among {len(rows)} layers: cite its "
                f"interval at the Bonferroni level {level:.4f}, [{best_interval[0]:.3f}, {best_interval[1]:.3f}]."
            )
        notes += self._direction_notes(rows)
        d_model = self.model.cfg.d_model
        if self.method == "logistic" and len(split.train) <= d_model:
            notes.append(
                f"{len(split.train)} training texts for {d_model} residual dimensions: a logistic probe can fit any "
                "labels on its training texts (see train_accuracy); only held-out accuracy and the controls count."
            )
        return ProbeMeasurement(
            method=self.method,
            position=self.position,
            labels=classes,
            n_texts=n_texts,
            n_train=len(split.train),
            n_test=n_test,
            split=split.kind,
            chance=chance,
            seed=self.seed,
            control_kind=kind,
            control_key=None if key is None else probe.key_summary(key),
            control_draws=self.control_draws if self.control else 0,
            layers=rows,
            best_layer=best.layer,
            best_ci_adjusted=list(best_interval),
            layers_beating_chance=beating,
            layers_selective=selective,
            notes=notes,
        )

    def _control_notes(
        self, rows: list[ProbeLayer], key: probe.Key | None, beating: list[int], selective: list[int], how: str
    ) -> list[str]:
        n = self.control_draws
        notes = [
            f"Shuffled-label control: the same probe on labels shuffled {how}, {n} draws; shuffled_p = (1 + #draws "
            "≥ accuracy)/(draws + 1). layers_beating_chance and layers_selective are family-wise over "
            f"{len(rows)} layers (each draw's maximum over layers, p ≤ 0.05): {len(beating)} of {len(rows)} beat "
            "chance."
        ]
        if key is not None:
            notes.append(
                f"The labels are a function of {probe.key_summary(key)}: every type carries one label. So the "
                f"control is Hewitt & Liang's, keyed on it: each type gets a random label (the types' labels "
                f"permuted, {n} draws). A probe that only recognises the type does as well there; selectivity = "
                "accuracy − that control, selectivity_p its rank p-value."
                + (
                    " Texts of a type are on both sides of the split, so memorising a type pays; pass `groups` "
                    "(e.g. the type, or its lemma) to hold whole groups out."
                    if self.groups is None
                    else ""
                )
            )
        if selective:
            notes.append(f"Selective (p ≤ 0.05 family-wise) at layers {selective}.")
        else:
            reason = "memorising the key type" if key is not None else "shuffled labels"
            notes.append(
                f"No layer is selective (p ≤ 0.05 family-wise): the accuracy is within what {reason} gives "
                f"({n} draws; the smallest possible p is {1 / (n + 1):.3f})."
            )
        return notes

    def _direction_notes(self, rows: list[ProbeLayer]) -> list[str]:
        notes = []
        if self.method == "diff_means":
            notes.append(
                "diff_means: the stored direction is μ₁ − μ₀; `accuracy` is the LDA classifier, Σ⁻¹(μ₁ − μ₀), and "
                "`direction_accuracy` the stored direction alone (projection thresholded at the training classes' "
                "midpoint) — cite the latter for what an intervention on the direction uses."
            )
        failing = [row.layer for row in rows if row.projection_gap <= 0]
        if failing:
            notes.append(
                f"projection_gap ≤ 0 at layers {failing}: along the stored direction, held-out texts of "
                f"'{self.labels_sorted()[1]}' sit no higher than the others, so it does not separate unseen texts "
                "(direction_accuracy there: "
                + ", ".join(f"L{row.layer} {row.direction_accuracy:.2f}" for row in rows if row.layer in failing[:6])
                + ")."
            )
        return notes

    def labels_sorted(self) -> list[str]:
        return sorted({str(label) for label in self.labels})


def _split_words(kind: str) -> str:
    return {
        "labels": "seeded split stratified by label",
        "key": "seeded split stratified by the key type, independent of the labels",
        "random": "seeded random split, independent of the labels",
        "groups": "whole groups held out, seeded",
    }[kind]
