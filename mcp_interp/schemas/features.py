"""Results of the features family: ``probe`` (linear probes with controls) and stored directions."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from mcp_interp.schemas.common import Measurement, Provenance


class ProbeLayer(BaseModel):
    layer: int = Field(description="Block whose output residual stream (resid_post) was read.")
    accuracy: float = Field(description="Held-out accuracy, 0..1 (fraction of held-out texts classified right).")
    ci_low: float = Field(description="Lower end of the exact (Clopper–Pearson) 95 % interval of `accuracy`.")
    ci_high: float = Field(description="Upper end of the exact 95 % interval of `accuracy`.")
    train_accuracy: float = Field(description="Accuracy on the training texts (≫ accuracy = overfitting).")
    control_accuracy: float | None = Field(
        default=None, description="Held-out accuracy of the same probe on the control task (see `control_kind`)."
    )
    permuted_accuracy: float | None = Field(
        default=None, description="Held-out accuracy with the labels shuffled across texts (≈ chance if all is well)."
    )
    selectivity: float | None = Field(
        default=None,
        description="accuracy − control_accuracy, −1..1: what the representation adds over the control task. "
        "Near 0 = the control task is solved as well (e.g. by memorising word identity).",
    )
    direction_uri: str | None = Field(
        default=None, description="direction://… — the fitted direction (unit vector), usable by `ablate` and `steer`."
    )
    direction_norm: float = Field(description="Norm of the fitted direction before normalising (residual units).")
    projection_gap: float = Field(
        description="(mean projection of the second label − of the first) / std of the projections, on the held-out "
        "texts: how far apart unseen texts of the two classes sit along the direction, in std units."
    )


class ProbeMeasurement(Measurement):
    method: Literal["logistic", "diff_means"] = Field(
        description="logistic: scikit-learn LogisticRegression (lbfgs, L2, C=1) on standardised residuals; "
        "diff_means: the direction is the difference of the class means; texts are classified with those means "
        "under the shared covariance (LDA, Ledoit-Wolf shrinkage: Marks & Tegmark's mass-mean probe)."
    )
    position: str | int = Field(description="Where each text was read: 'last', 'mean', or a token index.")
    labels: list[str] = Field(description="The two classes; every direction points from the first to the second.")
    n_texts: int
    n_train: int
    n_test: int
    chance: float = Field(description="Accuracy of always answering the held-out majority label, 0..1.")
    seed: int = Field(description="Seed of the split and the control tasks.")
    control_kind: Literal["word_identity", "permuted"] | None = Field(
        default=None,
        description="word_identity (Hewitt & Liang): each word type read gets a random fixed label — used when the "
        "labels are a function of the token read; permuted: labels shuffled across texts. None when control=False.",
    )
    word_level: bool = Field(description="True when every token read carries a single label (word-level labels).")
    layers: list[ProbeLayer]
    best_layer: int = Field(description="The layer with the highest held-out accuracy (ties: the earliest).")
    best_ci_adjusted: list[float] = Field(
        description="[low, high]: best_layer's exact interval at the Bonferroni level 1 − 0.05/(number of layers), "
        "because it was selected by the same held-out texts. Cite this one for the best layer."
    )
    layers_beating_chance: list[int] = Field(
        description="Layers whose Bonferroni-level interval lies above chance (none = no evidence of a readout)."
    )
    figure_uri: str | None = Field(default=None, description="Accuracy (with interval), control and chance by layer.")


class ProbeResult(Provenance, ProbeMeasurement):
    pass


class StoredDirection(BaseModel):
    """The JSON behind ``direction://{id}``: a unit direction in one layer's output residual stream."""

    layer: int = Field(description="Block whose output residual stream (resid_post) the direction lives in.")
    site: Literal["resid_post"] = "resid_post"
    position: str | int = Field(description="The position rule of the texts it was fitted on.")
    vector: list[float] = Field(description="The unit vector, d_model floats.")
    norm: float = Field(description="Its norm before normalising.")
    method: str = Field(description="How it was found, e.g. 'probe:logistic'.")
    labels: list[str] = Field(description="It points from labels[0] toward labels[1].")
    accuracy: float | None = Field(default=None, description="The probe's held-out accuracy at this layer.")
    selectivity: float | None = None
    projection_std: float = Field(
        description="Std of x·vector over the probe's texts: the unit of `steer`'s coefficient for this direction."
    )
    projection_means: dict[str, float] = Field(description="Mean x·vector of each label's texts.")
    model_name: str
    model_fingerprint: str = Field(description="The weights it was fitted on; other weights refuse it.")
    data_hash: str = Field(description="sha256 of the texts, labels and position rule it was fitted on.")
