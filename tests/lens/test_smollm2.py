"""The lens family on the real embedded model: DLA sums, the logit lens, induction heads."""

from __future__ import annotations

import pytest

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.lens.dla import dla
from mcp_interp.core.lens.induction import induction
from mcp_interp.core.lens.logit_lens import logit_lens
from mcp_interp.core.readouts import predictions as readouts
from mcp_interp.corpora import ioi_pairs

pytestmark = pytest.mark.embedded


def test_dla_and_logit_lens_checks_on_smollm2(embedded: LoadedModel) -> None:

    pair = ioi_pairs()[0]
    result = dla(embedded, pair.clean, pair.correct, pair.incorrect)
    measured = readouts.logit_diff(embedded, [pair.clean], pair.correct, pair.incorrect).logit_diff.value
    assert result.measured == pytest.approx(measured, abs=1e-4)
    assert abs(result.measured - result.total) < 1e-3, (result.measured, result.total)
    seen = logit_lens(embedded, pair.clean)
    top1 = readouts.answer_rank(embedded, [pair.clean], pair.correct).examples[0].top1_id
    assert seen.layers[-1].top[0].id == top1
    print(
        f"\nDLA on SmolLM2: measured {result.measured:+.4f}, sum of parts {result.total:+.4f}; "
        f"top {[(c.component, round(c.value, 3)) for c in result.top[:5]]}"
    )


def test_induction_heads_on_smollm2_structure(embedded: LoadedModel) -> None:

    result = induction(embedded, seq_len=30, n_seqs=4, seed=0)
    cfg = embedded.bridge.cfg
    assert len(result.scores) == cfg.n_layers and all(len(row) == cfg.n_heads for row in result.scores)
    values = [c.value for c in result.heads]
    assert values == sorted(values, reverse=True) and len(values) == cfg.n_layers * cfg.n_heads
    assert all(0.0 <= v <= 1.0 for v in values)
    mean = sum(values) / len(values)
    print(
        f"\ntop induction heads on SmolLM2: {[(c.component, round(c.value, 3)) for c in result.heads[:5]]}, "
        f"mean {mean:.3f}"
    )
    # A trained LM has heads far more inductive than its average head.
    assert values[0] > 5 * mean
