"""Results of the features family: ``probe`` (linear probes with controls). The directions it stores
(``direction://``) are ``common.StoredDirection``: every intervention and ``steer`` can name one."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from mcp_interp.schemas.common import Measurement, Provenance

ProbeMethod = Literal["logistic", "diff_means"]
SplitKind = Literal["labels", "key", "random", "groups"]  # held out: stratified by label or key type, random, groups
ControlKind = Literal["type_keyed", "shuffled_labels"]


class ProbeLayer(BaseModel):
    layer: int = Field(description="resid_post of this block.")
    accuracy: float = Field(description="Held-out, 0..1.")
    ci_low: float = Field(description="Exact 95 % interval of accuracy (held-out texts independent).")
    ci_high: float
    train_accuracy: float
    shuffled_accuracy: float | None = Field(
        default=None, description="Shuffled-label control, mean of its draws (null when it is the type-keyed one)."
    )
    shuffled_p: float | None = Field(default=None, description="Family-wise p over the layers vs those draws.")
    control_accuracy: float | None = Field(
        default=None, description="Mean of the control_kind draws (= shuffled_accuracy if shuffled_labels)."
    )
    selectivity: float | None = Field(default=None, description="accuracy − control_accuracy.")
    selectivity_ci: list[float] | None = Field(
        default=None, description="95 % interval of accuracy − control: both errors."
    )
    selectivity_p: float | None = Field(default=None, description="Family-wise p over the layers vs the control.")
    direction_uri: str | None = Field(default=None, description="direction://… for ablate and steer.")
    direction_norm: float = Field(description="Before normalising.")
    direction_accuracy: float = Field(description="Held-out accuracy of the stored direction alone.")
    projection_gap: float = Field(description="Held-out class gap along it / std; ≤ 0: it fails.")


class ProbeMeasurement(Measurement):
    SIGNIFICANT = ("layers",)  # 30 layers' rows at full float precision were over the budget
    method: ProbeMethod = Field(
        description="logistic: L2 logistic regression, direction w/σ; diff_means: direction μ₁ − μ₀, texts "
        "classified by shrunk LDA."
    )
    position: str | int
    labels: list[str] = Field(description="The two labels, sorted.")
    points_to: str = Field(description="labels[1]: every stored direction points toward it (larger projection = it).")
    n_texts: int
    n_train: int
    n_test: int
    split: SplitKind = Field(description="Held out: stratified by label or key type, random, or whole groups.")
    chance: float = Field(description="Held-out majority-label rate.")
    seed: int
    control_kind: ControlKind | None = Field(
        default=None, description="type_keyed (Hewitt & Liang) when the labels are a function of control_key."
    )
    control_key: str | None = Field(default=None, description="e.g. token 1 (40 types: …).")
    control_draws: int = Field(description="The most draws per control; drawn until 10 per layer are as good.")
    draws_made: dict[str, int] = Field(default_factory=dict, description="Draws each control made.")
    p_floor: dict[str, float] = Field(default_factory=dict, description="Per control: the smallest reachable p.")
    labellings: dict[str, int] = Field(default_factory=dict, description="Distinct other labellings, when few.")
    layers: list[ProbeLayer]
    best_layer: int = Field(description="Highest accuracy.")
    best_ci_adjusted: list[float] = Field(description="Its exact interval at level 1 − 0.05/L: cite this.")
    layers_beating_chance: list[int] = Field(description="Family-wise p ≤ 0.05 vs the shuffled-label control.")
    layers_selective: list[int] = Field(description="Family-wise p ≤ 0.05 vs the control.")
    figure_uri: str | None = None

    @classmethod
    def rows_by_importance(cls, data: dict[str, Any], name: str) -> tuple[list[int], str] | None:
        if name != "layers":
            return None
        order = layers_by_importance(
            data["layers"], data["best_layer"], data["layers_beating_chance"], data["layers_selective"]
        )
        return order, (
            "kept in layer order: the best layer by held-out accuracy, the best by selectivity, every layer of "
            "layers_selective and layers_beating_chance, then the most accurate"
        )


def layers_by_importance(
    layers: list[dict[str, Any]], best_layer: int, beating: list[int], selective: list[int]
) -> list[int]:
    """Indices of a probe's ``layers`` rows (as JSON), the ones a shortened result must keep first: the best layer by
    held-out accuracy, the best by selectivity, the family-wise selective layers, those beating chance, then the
    rest; within each, by accuracy (highest first), then layer."""
    scored = [(row["selectivity"], row["layer"]) for row in layers if row.get("selectivity") is not None]
    best_selective = max(scored, key=lambda pair: pair[0])[1] if scored else None

    def tier(row: dict[str, Any]) -> int:
        if row["layer"] == best_layer:
            return 0
        if row["layer"] == best_selective:
            return 1
        if row["layer"] in selective:
            return 2
        return 3 if row["layer"] in beating else 4

    return sorted(range(len(layers)), key=lambda i: (tier(layers[i]), -layers[i]["accuracy"], layers[i]["layer"]))


class ProbeResult(Provenance, ProbeMeasurement):
    pass
