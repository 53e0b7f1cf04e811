"""`probe` on the real embedded model (SmolLM2-135M-Instruct) and the shipped `subject_number` corpus, against
numbers computed independently: residuals from the bridge's own TransformerLens hooks (``blocks.L.hook_resid_post``,
texts batched by length, no padding), the split rebuilt with scikit-learn's splitter, every fit by scikit-learn
directly, and a Hewitt & Liang control drawn with numpy's legacy generator rather than the probe's."""

from __future__ import annotations

import numpy as np
import pytest

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.features.probe_job import ProbeJob
from mcp_interp.corpora import subject_number
from tests.features.test_probe import bridge_residuals, hewitt_liang, sklearn_probe

pytestmark = pytest.mark.embedded

LAYERS = [3, 15]


def test_probe_on_subject_number_against_scikit_learn(embedded: LoadedModel) -> None:
    """The label is the subject's number, a function of token 1 (the noun, 40 types) while the probe reads the last
    token (the prepositional object, both numbers): the control is keyed on token 1. Reading the last token, the
    residual still identifies the subject, so a probe memorising the 40 nouns' random labels reaches far above chance,
    and the selectivity is well below the 0.40–0.52 the shuffled-label "control" used to give."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.model_selection import train_test_split

    corpus = subject_number()
    job = ProbeJob(model=embedded, texts=corpus.texts, labels=corpus.labels, layers=LAYERS)
    drain(job)
    result = job.result
    assert result is not None
    assert (result.control_kind, result.split, result.n_test) == ("type_keyed", "key", 100)
    assert result.control_key is not None and result.control_key.startswith("token 1 (40 types: ' dog', ' dogs'")
    ids = [embedded.tokenizer(text).input_ids for text in corpus.texts]
    key = np.unique([str(i[1]) for i in ids], return_inverse=True)[1]  # strata coded as the probe codes key types
    train, test = (
        np.sort(part) for part in train_test_split(np.arange(400), test_size=100, stratify=key, random_state=0)
    )
    y = np.array([label == "singular" for label in corpus.labels], dtype=np.int64)  # sorted: plural, singular
    x = bridge_residuals(embedded, corpus.texts, LAYERS)
    for column, row in enumerate(result.layers):
        accuracy, train_accuracy, direction_accuracy = sklearn_probe(x[:, column], y, train, test)
        assert (row.accuracy, row.train_accuracy, row.direction_accuracy) == pytest.approx(
            (accuracy, train_accuracy, direction_accuracy), abs=0.011
        )  # float32 capture vs float64 here: at most one held-out text may flip
        independent = hewitt_liang(x[:, column], key, y, train, test)
        assert row.control_accuracy == pytest.approx(independent, abs=0.06)
        assert row.control_accuracy is not None and row.control_accuracy > 0.65  # memorising 40 nouns pays
        assert row.selectivity is not None and row.selectivity < 0.35
        assert row.shuffled_accuracy is not None and abs(row.shuffled_accuracy - 0.5) < 0.1
    # diff_means at one layer: LDA's accuracy from scikit-learn, the stored μ₁ − μ₀'s own accuracy by hand.
    lda_job = ProbeJob(model=embedded, texts=corpus.texts, labels=corpus.labels, layers=[3], method="diff_means")
    drain(lda_job)
    assert lda_job.result is not None
    row = lda_job.result.layers[0]
    z_mean, z_scale = x[train, 0].mean(axis=0), x[train, 0].std(axis=0)
    lda = LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto").fit((x[train, 0] - z_mean) / z_scale, y[train])
    assert row.accuracy == pytest.approx(
        float((lda.predict((x[test, 0] - z_mean) / z_scale) == y[test]).mean()), abs=0.011
    )
    means = x[train, 0][y[train] == 1].mean(axis=0) - x[train, 0][y[train] == 0].mean(axis=0)
    projection = x[:, 0] @ means
    threshold = (projection[train][y[train] == 1].mean() + projection[train][y[train] == 0].mean()) / 2
    assert row.direction_accuracy == pytest.approx(float(((projection[test] > threshold) == y[test]).mean()), abs=0.011)
    assert np.allclose(lda_job.directions[0].vector, means / np.linalg.norm(means), atol=1e-4)
