"""Head ablation: known answers, and the metric tools' interventions equal to `ablate_head`."""

from __future__ import annotations

import pytest

from mcp_interp.core.engine.ablation.targets import Ablation
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.components import Head
from mcp_interp.core.heads.ablate_head import ablate_heads
from mcp_interp.core.readouts import predictions as readouts
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import Intervention
from tests.conftest import CARRIER
from tests.helpers import IOI_CLEAN as CLEAN
from tests.helpers import IOI_CORRECT as CORRECT
from tests.helpers import IOI_CORRUPT as CORRUPT
from tests.helpers import IOI_INCORRECT as INCORRECT


def test_known_answer_ablation_removes_exactly_the_carriers_information(one_head_model: LoadedModel) -> None:
    carrier = ablate_heads(one_head_model, CLEAN, Ablation([CARRIER], "zero"), CORRECT, INCORRECT)
    corrupt_ablated = ablate_heads(one_head_model, CORRUPT, Ablation([CARRIER], "zero"), CORRECT, INCORRECT)
    assert carrier.before.logit_diff is not None and carrier.after.logit_diff is not None
    assert corrupt_ablated.after.logit_diff is not None
    # With the only cross-position path cut, clean and corrupt prompts look identical at the answer.
    assert carrier.after.logit_diff.per_example == pytest.approx(corrupt_ablated.after.logit_diff.per_example, abs=1e-5)
    assert carrier.after.logit_diff.value != pytest.approx(carrier.before.logit_diff.value, abs=1e-3)
    assert carrier.kl.value > 0
    idle = ablate_heads(one_head_model, CLEAN, Ablation([Head(0, 1), Head(2, 3)], "zero"), CORRECT, INCORRECT)
    assert idle.kl.per_example == pytest.approx([0.0] * 3, abs=1e-10)
    assert idle.after == idle.before


def test_intervention_in_metric_tools_equals_ablate_head(tiny: LoadedModel) -> None:
    spec = Intervention(ablate=["L1H2", "L2H0"], method="mean")
    ablated = ablate_heads(tiny, CLEAN, Ablation([Head(1, 2), Head(2, 0)], "mean"), CORRECT, INCORRECT)
    via_ld = readouts.logit_diff(tiny, CLEAN, CORRECT, INCORRECT, spec)
    via_kl = readouts.kl(tiny, CLEAN, intervention=spec)
    via_rank = readouts.answer_rank(tiny, CLEAN, CORRECT, spec)
    assert ablated.after.logit_diff is not None
    assert via_ld.logit_diff.per_example == pytest.approx(ablated.after.logit_diff.per_example, abs=1e-9)
    assert via_kl.kl.per_example == pytest.approx(ablated.kl.per_example, abs=1e-9)
    assert via_rank.rank.per_example == ablated.after.rank.per_example
    assert via_ld.intervention and "L1H2" in via_ld.intervention
    with pytest.raises(InputError, match="compare against"):
        readouts.kl(tiny, CLEAN)
