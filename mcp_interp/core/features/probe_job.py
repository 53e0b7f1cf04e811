"""The ``probe`` measurement: one forward pass over the texts, then per layer a probe and its control draws.

Per layer it reports the held-out accuracy with its exact interval, the shuffled-label control and (when the
labels are a function of a key whose types recur: a token at some position, or the group) the type-keyed control,
each as the mean of its draws with a family-wise p-value over the layers (drawn sequentially, at most
``control_draws`` draws), the selectivity over the control with its interval, and the fitted direction as a unit
vector with the statistics ``steer`` needs; the adapter stores each as ``direction://{id}``. ``core.features.probe``
defines every number and why its p-value is exact.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.numbers import stats
from mcp_interp.core.engine.text.tokens import token_ids
from mcp_interp.core.features import probe
from mcp_interp.core.features.residuals import check_layers, check_position, read_residuals
from mcp_interp.errors import InputError, require_choice
from mcp_interp.schemas.common import StoredDirection
from mcp_interp.schemas.features import ControlKind, ProbeLayer, ProbeMeasurement, ProbeMethod

SHUFFLE_SEED_OFFSET = 1  # the shuffled-label draws come from seed + 1, the type-keyed ones from seed + 2
KEY_SEED_OFFSET = 2


def data_hash(texts: Sequence[str], labels: Sequence[str], position: Any) -> str:
    payload = json.dumps({"texts": list(texts), "labels": list(labels), "position": position}, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Control:
    """One control run over every layer: its sequential family-wise test (None when no labelling but the real one
    exists: nothing to rank against), the held-out hits of the draws it made (per layer, [draws, n_test]), how many
    distinct labellings it could draw (None: more than it needs) and the smallest p it can reach."""

    kind: ControlKind
    test: stats.FamilyRankTest | None
    hits: list[np.ndarray]
    labellings: int | None
    p_floor: float

    def p_values(self, members: int) -> tuple[float, ...]:
        return self.test.p_values if self.test is not None else (1.0,) * members


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
    control_draws: int = stats.MOST_DRAWS
    groups: Sequence[Hashable] | None = None
    result: ProbeMeasurement | None = field(default=None, init=False)
    directions: list[StoredDirection] = field(default_factory=list, init=False)

    def _chosen(self) -> list[int]:
        return check_layers(self.layers, self.model.cfg.n_layers)

    def total_steps(self) -> int:
        batches = -(-self.control_draws // stats.BATCH) * 2 if self.control else 0
        return 1 + len(self._chosen()) + batches

    def steps(self) -> Iterator[str]:
        check_position(self.position)
        require_choice("method", self.method, ProbeMethod)
        texts = list(self.texts)
        if len(texts) != len(self.labels):
            raise InputError(
                f"`labels` has {len(self.labels)} entries for {len(texts)} texts: give one label per text."
            )
        if self.control:
            stats.check_most_draws(self.control_draws, "control_draws")
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
        candidates = probe.key_candidates(tokens, y, read, groups, names)
        key = next((candidate for candidate in candidates if candidate.problem is None), None)
        unused = candidates[0] if key is None and candidates else None
        split = probe.split_texts(
            y, self.test_fraction, self.seed, groups=groups, key=None if key is None else key.values
        )
        residuals = read_residuals(self.model, texts, self.layers, self.position)
        yield f"read resid_post of {len(residuals.layers)} layers for {len(texts)} texts"
        xs = [residuals.values[:, column].numpy() for column in range(len(residuals.layers))]
        rows: list[ProbeLayer] = []
        fits: list[probe.ProbeFit] = []
        for x, layer in zip(xs, residuals.layers, strict=True):
            fit, row = self._layer(layer, x, y, classes, split, texts)
            fits.append(fit)
            rows.append(row)
            yield f"layer {layer}: held-out accuracy {row.accuracy:.3f}"
        controls: list[Control] = []
        if self.control:
            for kind, labellings, distinct in self._nulls(y, split, groups, key):
                cap = min(self.control_draws, len(labellings))
                floor = max(stats.rank_floor(self.control_draws, distinct), stats.rank_floor(cap))
                if cap == 0:
                    controls.append(Control(kind, None, [], 0, 1.0))
                    continue
                test = stats.SequentialMaxTest(
                    [fit.accuracy for fit in fits], h=min(stats.STOP_AFTER, cap), n_max=cap, batch=min(stats.BATCH, cap)
                )
                hits: list[list[np.ndarray]] = [[] for _ in xs]
                while wanted := test.wanted():
                    batch = labellings[test.n : test.n + wanted]
                    for column, x in enumerate(xs):
                        hits[column].append(probe.held_out_hits(x, batch, split, self.method))
                    test.add(np.stack([h[-1].mean(axis=1) for h in hits], axis=1))
                    yield f"{kind.replace('_', '-')} control: {test.n} draws (at most {cap})"
                result = test.result()
                controls.append(Control(kind, result, [np.vstack(h)[: result.n] for h in hits], distinct, floor))
            self._fill_controls(rows, fits, controls, self._units(split, groups, key))
        self.result = self._measurement(rows, y, classes, split, key, unused, controls, len(texts))

    def _nulls(
        self, y: np.ndarray, split: probe.Split, groups: np.ndarray | None, key: probe.Key | None
    ) -> list[tuple[ControlKind, np.ndarray, int | None]]:
        """The controls to run, each with up to ``control_draws`` relabellings (a sequential test uses a prefix) and
        how many distinct ones exist when that is fewer (None: plenty). With whole groups held out and the labels a
        function of a key, the only exact shuffle is among the key types — the type-keyed control itself — so it runs
        once (it answers both "beats chance" and "selective")."""
        n = self.control_draws
        keyed = None if key is None else probe.keyed_labels(key.values, y, n, self.seed + KEY_SEED_OFFSET, split)
        keyed_count = None if keyed is None or len(keyed) >= n else len(keyed)
        if keyed is not None and groups is not None:
            return [("type_keyed", keyed, keyed_count)]
        shuffled, _ = probe.shuffled_labels(y, split, n, self.seed + SHUFFLE_SEED_OFFSET, groups)
        units = (
            [split.train, split.test] if groups is None else [np.flatnonzero(groups == g) for g in np.unique(groups)]
        )
        shuffles = math.prod(math.comb(len(unit), int(y[unit].sum())) for unit in units) - 1
        nulls: list[tuple[ControlKind, np.ndarray, int | None]] = [
            ("shuffled_labels", shuffled, shuffles if shuffles < n else None)
        ]
        return nulls + ([("type_keyed", keyed, keyed_count)] if keyed is not None else [])

    @staticmethod
    def _units(split: probe.Split, groups: np.ndarray | None, key: probe.Key | None) -> np.ndarray:
        """The held-out units that are independent, for the selectivity interval: groups, else key types, else
        texts."""
        if groups is not None:
            return groups[split.test]
        return key.values[split.test] if key is not None else split.test

    def _fill_controls(
        self, rows: list[ProbeLayer], fits: list[probe.ProbeFit], controls: list[Control], units: np.ndarray
    ) -> None:
        """Each layer's control numbers: the shuffled-label control's mean and family-wise p (absent when the only
        exact shuffle is the type-keyed control), and the selectivity over the last control (type-keyed, or the
        shuffled-label one when there is no key) with its interval and family-wise p."""
        chance = next((c for c in controls if c.kind == "shuffled_labels"), None)
        selectivity = controls[-1]
        for column, (row, fit) in enumerate(zip(rows, fits, strict=True)):
            if chance is not None and chance.test is not None:
                row.shuffled_accuracy = float(chance.test.draws[:, column].mean())
                row.shuffled_p = chance.test.p_values[column]
            if selectivity.test is None:  # no labelling but the real one: nothing to compare with
                row.selectivity_p = 1.0
                continue
            row.control_accuracy = float(selectivity.test.draws[:, column].mean())
            row.selectivity = fit.accuracy - row.control_accuracy
            low, high = probe.selectivity_interval(fit.hits, selectivity.hits[column], units, self.seed + column)
            row.selectivity_ci = [low, high]
            row.selectivity_p = selectivity.test.p_values[column]

    def _layer(
        self,
        layer: int,
        x: np.ndarray,
        y: np.ndarray,
        classes: list[str],
        split: probe.Split,
        texts: list[str],
    ) -> tuple[probe.ProbeFit, ProbeLayer]:
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
                points_to=classes[1],
                accuracy=fit.direction_accuracy,
                selectivity=None,
                projection_std=float(projections.std()),
                projection_means=means,
                model_name=self.model.name,
                model_fingerprint=self.model.fingerprint,
                data_hash=data_hash(texts, [str(label) for label in self.labels], self.position),
            )
        )
        return fit, row

    def _measurement(
        self,
        rows: list[ProbeLayer],
        y: np.ndarray,
        classes: list[str],
        split: probe.Split,
        key: probe.Key | None,
        unused: probe.Key | None,
        controls: list[Control],
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
        kind: ControlKind | None = None
        selective: list[int] = []
        notes = [
            f"Accuracy is on {n_test} held-out texts ({_split_words(split.kind)}); chance (the majority label of the "
            f"held-out texts) is {chance:.3f}; ci_low/ci_high are exact (Clopper–Pearson, 95 %) for independent "
            "held-out texts."
        ]
        if unused is not None:
            notes.append(
                f"The labels are a function of {probe.key_summary(unused)}, but {unused.problem}: no type-keyed "
                "control was applied, the split is stratified by label and the control is the shuffled-label one."
            )
        if self.control:
            for row, direction in zip(rows, self.directions, strict=True):
                direction.selectivity = row.selectivity
            first, last = controls[0].p_values(len(rows)), controls[-1].p_values(len(rows))
            beating = [row.layer for row, p in zip(rows, first, strict=True) if p <= stats.ALPHA]
            selective = [row.layer for row, p in zip(rows, last, strict=True) if p <= stats.ALPHA]
            kind = controls[-1].kind
            notes += self._control_notes(rows, key, beating, selective, controls)
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
            points_to=classes[1],
            n_texts=n_texts,
            n_train=len(split.train),
            n_test=n_test,
            split=split.kind,
            chance=chance,
            seed=self.seed,
            control_kind=kind,
            control_key=None if key is None else probe.key_summary(key),
            control_draws=self.control_draws if self.control else 0,
            draws_made={c.kind: 0 if c.test is None else c.test.n for c in controls},
            p_floor={c.kind: c.p_floor for c in controls},
            labellings={c.kind: c.labellings for c in controls if c.labellings is not None},
            layers=rows,
            best_layer=best.layer,
            best_ci_adjusted=list(best_interval),
            layers_beating_chance=beating,
            layers_selective=selective,
            notes=notes,
        )

    def _control_notes(
        self,
        rows: list[ProbeLayer],
        key: probe.Key | None,
        beating: list[int],
        selective: list[int],
        controls: list[Control],
    ) -> list[str]:
        cap = self.control_draws
        made = ", ".join(f"{c.kind} {0 if c.test is None else c.test.n}" for c in controls)
        floors = ", ".join(f"{c.kind} {c.p_floor:.4f}" for c in controls)
        notes = [
            f"Controls drawn sequentially (Besag & Clifford): until every layer has {stats.STOP_AFTER} draws whose "
            f"best layer (centred) is at least as good as it, or {cap} draws — made: {made}. Each p-value is "
            f"family-wise over the {len(rows)} layers (the draws' maximum over layers), so layers_beating_chance and "
            f"layers_selective hold at α = 0.05 together; the smallest possible p (p_floor): {floors}. "
            f"{len(beating)} of {len(rows)} layers beat chance."
        ]
        for c in controls:
            if c.labellings is not None:
                notes.append(
                    f"The {c.kind.replace('_', '-')} control has only {c.labellings} distinct usable labelling(s) "
                    f"besides the real one (drawn once each, never the real one): its p cannot go below "
                    f"{c.p_floor:.3g}" + (", so it cannot reject at α = 0.05." if c.p_floor > stats.ALPHA else ".")
                )
        if controls[0].kind == "shuffled_labels":
            how = "within groups" if self.groups is not None else "among texts, within each part of the split"
            notes.append(f"Shuffled-label control: the same probe on labels shuffled {how}.")
        if key is not None:
            notes.append(
                f"The labels are a function of {probe.key_summary(key)}: every type carries one label. So the "
                f"control is Hewitt & Liang's, keyed on it: each type gets a random label (the types' labels "
                "permuted). A probe that only recognises the type does as well there; selectivity = accuracy − that "
                "control, selectivity_p its family-wise p."
                + (
                    " Texts of a type are on both sides of the split, so memorising a type pays; pass `groups` "
                    "(e.g. the type, or its lemma) to hold whole groups out."
                    if self.groups is None
                    else " With whole groups held out this is also the only exact shuffle of the labels, so it is "
                    "the one control (shuffled_accuracy and shuffled_p are empty; layers_beating_chance is the same "
                    "test as layers_selective)."
                )
            )
        else:
            notes.append(
                "control_kind is shuffled_labels: with no key to memorise, control_accuracy, selectivity and "
                "selectivity_p are the shuffled-label control's own (equal to shuffled_accuracy and shuffled_p): "
                "selective here means above chance."
            )
        last = controls[-1]
        smallest = min(last.p_values(len(rows)))
        reason = "memorising the key type" if key is not None else "shuffled labels"
        notes.append(
            "Selectivity: "
            + stats.worded(
                "probe_selective" if last.kind == "type_keyed" else "probe_chance",
                smallest,
                last.p_floor,
                f"selective at layers {selective} (family-wise, smallest p)",
                f"no layer shown more accurate than {reason} gives at α = 0.05 (smallest family-wise p)",
            )
            + "."
        )
        if controls[0].kind == "shuffled_labels" and len(controls) > 1:
            first = controls[0]
            notes.append(
                "Above chance: "
                + stats.worded(
                    "probe_chance",
                    min(first.p_values(len(rows))),
                    first.p_floor,
                    f"layers {beating} beat shuffled labels (family-wise, smallest p)",
                    "no layer shown above shuffled labels at α = 0.05 (smallest family-wise p)",
                )
                + "."
            )
        notes.append(
            "selectivity_ci: accuracy − control ± t·√(v + s²/draws), v the larger of the draws' variance s² and a "
            "bootstrap over held-out units of the accuracy's variance (its own error and the control mean's)."
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
