"""The ``probe`` measurement: one forward pass over the texts, then a probe (and its controls) per layer.

Per layer it reports the held-out accuracy with its exact interval, the control accuracies and the
selectivity (``core.features.probe`` defines them), and the fitted direction as a unit vector with
the statistics ``steer`` needs (the spread and class means of the texts' projections onto it); the
adapter stores each direction as ``direction://{id}``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mcp_interp.core.engine.stats import clopper_pearson
from mcp_interp.core.features import probe
from mcp_interp.core.features.residuals import Residuals, check_layers, check_position, read_residuals
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel
from mcp_interp.schemas.features import ProbeLayer, ProbeMeasurement, StoredDirection

LOW_SELECTIVITY = 0.1  # accuracy points over the control task below which a note is written
CONTROL_SEED_OFFSET = 1  # the control tasks draw from seed + 1, the split from seed


def data_hash(texts: Sequence[str], labels: Sequence[str], position: Any) -> str:
    payload = json.dumps({"texts": list(texts), "labels": list(labels), "position": position}, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


@dataclass(kw_only=True)
class ProbeJob:
    model: LoadedModel
    texts: Sequence[str]
    labels: Sequence[Any]
    layers: Sequence[int] | None = None
    position: str | int = "last"
    method: str = "logistic"
    test_fraction: float = 0.25
    seed: int = 0
    control: bool = True
    result: ProbeMeasurement | None = field(default=None, init=False)
    directions: list[StoredDirection] = field(default_factory=list, init=False)

    def _chosen(self) -> list[int]:
        return check_layers(self.layers, self.model.bridge.cfg.n_layers)

    def total_steps(self) -> int:
        return 1 + len(self._chosen())

    def steps(self) -> Iterator[str]:
        check_position(self.position)
        if self.method not in ("logistic", "diff_means"):
            raise InputError(f"Unknown probe method {self.method!r}; use 'logistic' or 'diff_means'.")
        texts = list(self.texts)
        if len(texts) != len(self.labels):
            raise InputError(
                f"`labels` has {len(self.labels)} entries for {len(texts)} texts: give one label per text."
            )
        y, classes = probe.encode_labels(self.labels)
        split = probe.stratified_split(y, self.test_fraction, self.seed)
        residuals = read_residuals(self.model, texts, self.layers, self.position)
        yield f"read resid_post of {len(residuals.layers)} layers for {len(texts)} texts"
        word_level = probe.is_word_level(residuals.words, y)
        controls = self._controls(residuals, y, word_level)
        rows: list[ProbeLayer] = []
        for column, layer in enumerate(residuals.layers):
            x = residuals.values[:, column].numpy()
            rows.append(self._layer(layer, x, y, classes, split, controls, texts))
            yield f"layer {layer}: held-out accuracy {rows[-1].accuracy:.3f}"
        self.result = self._measurement(rows, y, classes, split, word_level, controls, len(texts))

    def _controls(self, residuals: Residuals, y: np.ndarray, word_level: bool) -> dict[str, np.ndarray]:
        if not self.control:
            return {}
        seed = self.seed + CONTROL_SEED_OFFSET
        controls = {"permuted": probe.permuted_control(y, seed)}
        if word_level:
            assert residuals.words is not None
            controls["word_identity"] = probe.word_identity_control(residuals.words, y, seed)
        return controls

    def _layer(
        self,
        layer: int,
        x: np.ndarray,
        y: np.ndarray,
        classes: list[str],
        split: probe.Split,
        controls: dict[str, np.ndarray],
        texts: list[str],
    ) -> ProbeLayer:
        method = self.method  # checked in steps()
        fit = probe.fit_probe(x, y, split, method)  # type: ignore[arg-type]
        low, high = clopper_pearson(fit.correct, fit.n_test)
        control_accuracy = permuted_accuracy = selectivity = None
        if controls:
            permuted_accuracy = probe.fit_probe(x, controls["permuted"], split, method).accuracy  # type: ignore[arg-type]
            kind = "word_identity" if "word_identity" in controls else "permuted"
            control_accuracy = (
                probe.fit_probe(x, controls[kind], split, method).accuracy  # type: ignore[arg-type]
                if kind == "word_identity"
                else permuted_accuracy
            )
            selectivity = fit.accuracy - control_accuracy
        norm = float(np.linalg.norm(fit.direction))
        unit = fit.direction / norm if norm > 0 else fit.direction
        projections = x.astype(np.float64) @ unit
        spread = float(projections.std())
        means = {name: float(projections[y == i].mean()) for i, name in enumerate(classes)}
        held_out, y_test = projections[split.test], y[split.test]
        held_spread = float(held_out.std())
        gap = (
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
                accuracy=fit.accuracy,
                selectivity=selectivity,
                projection_std=spread,
                projection_means=means,
                model_name=self.model.name,
                model_fingerprint=self.model.fingerprint,
                data_hash=data_hash(texts, [str(label) for label in self.labels], self.position),
            )
        )
        return ProbeLayer(
            layer=layer,
            accuracy=fit.accuracy,
            ci_low=low,
            ci_high=high,
            train_accuracy=fit.train_accuracy,
            control_accuracy=control_accuracy,
            permuted_accuracy=permuted_accuracy,
            selectivity=selectivity,
            direction_norm=norm,
            projection_gap=gap,
        )

    def _measurement(
        self,
        rows: list[ProbeLayer],
        y: np.ndarray,
        classes: list[str],
        split: probe.Split,
        word_level: bool,
        controls: dict[str, np.ndarray],
        n_texts: int,
    ) -> ProbeMeasurement:
        test_counts = np.bincount(y[split.test], minlength=2)
        chance = float(test_counts.max() / test_counts.sum())
        best = max(rows, key=lambda row: (row.accuracy, -row.layer))
        # The best layer is chosen among len(rows) by the same held-out texts: its interval is widened to the
        # Bonferroni level 1 − 0.05/L, and "beats chance" is judged at that level for every layer.
        n_test = len(split.test)
        corrects = [round(row.accuracy * n_test) for row in rows]
        indices, level = probe.beyond_chance(corrects, n_test, chance)
        beating = [rows[i].layer for i in indices]
        best_interval = clopper_pearson(round(best.accuracy * n_test), n_test, level)
        kind = None if not controls else "word_identity" if "word_identity" in controls else "permuted"
        notes = [
            f"Accuracy is on {len(split.test)} held-out texts (seeded stratified split); the interval is exact "
            f"(Clopper–Pearson, 95 %). Chance (always the majority label) is {chance:.3f}.",
        ]
        if not beating:
            notes.append(
                f"No layer beats chance at the Bonferroni level {level:.4f} for {len(rows)} layers: these texts give "
                "no evidence of a linear readout."
            )
        else:
            notes.append(
                f"best_layer ({best.layer}) was chosen by held-out accuracy among {len(rows)} layers: cite its "
                f"Bonferroni interval [{best_interval[0]:.3f}, {best_interval[1]:.3f}] "
                f"(level {level:.4f}). Layers beating chance at that level: {len(beating)} of {len(rows)}."
            )
        if kind == "word_identity":
            notes.append(
                "The labels are word-level (each token read always carries the same label), so the control is "
                "Hewitt & Liang's: every word type gets a random fixed label. Selectivity = accuracy − that control."
            )
            low = [row.layer for row in rows if row.selectivity is not None and row.selectivity < LOW_SELECTIVITY]
            if low:
                notes.append(
                    f"Low selectivity (< {LOW_SELECTIVITY}) at layers {low}: a probe that only memorises which word "
                    "it reads does as well there, so the accuracy may reflect token identity rather than the "
                    "property. Test on words that never occur in training to tell them apart."
                )
        elif kind == "permuted":
            noisy = [
                row.layer for row in rows if row.permuted_accuracy is not None and row.permuted_accuracy > chance + 0.2
            ]
            if noisy:
                notes.append(
                    f"With shuffled labels the probe still beats chance by > 0.2 at layers {noisy}: too few "
                    "held-out texts for a stable estimate, or leakage between training and test texts."
                )
        d_model = self.model.bridge.cfg.d_model
        if self.method == "logistic" and len(split.train) <= d_model:
            notes.append(
                f"{len(split.train)} training texts for {d_model} residual dimensions: a logistic probe can fit any "
                "labels on its training texts (see train_accuracy); only held-out accuracy and selectivity count."
            )
        return ProbeMeasurement(
            method=self.method,  # type: ignore[arg-type]
            position=self.position,
            labels=classes,
            n_texts=n_texts,
            n_train=len(split.train),
            n_test=len(split.test),
            chance=chance,
            seed=self.seed,
            control_kind=kind,  # type: ignore[arg-type]
            word_level=word_level,
            layers=rows,
            best_layer=best.layer,
            best_ci_adjusted=list(best_interval),
            layers_beating_chance=beating,
            notes=notes,
        )
