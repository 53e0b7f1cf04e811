"""`explain` on the real embedded model agrees with the single tools."""

from __future__ import annotations

import pytest
import torch

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.lens.dla import dla
from mcp_interp.corpora import ioi_pairs

pytestmark = pytest.mark.embedded


def test_explain_on_smollm2_agrees_with_single_tools(embedded: LoadedModel) -> None:
    from mcp_interp.core.explain.job import ExplainJob
    from mcp_interp.core.heads.patch_heads import PatchHeadsJob

    pair = ioi_pairs()[0]
    job = ExplainJob(
        model=embedded, prompt=pair.clean, answer=pair.correct, baseline=pair.incorrect, corrupt=pair.corrupt
    )
    drain(job)
    assert job.result is not None
    single_dla = dla(embedded, pair.clean, pair.correct, pair.incorrect, top_k=10)
    patch = PatchHeadsJob(
        model=embedded,
        clean_prompts=[pair.clean],
        corrupt_prompts=[pair.corrupt],
        correct=pair.correct,
        incorrect=pair.incorrect,
    )
    drain(patch)
    assert patch.result is not None
    assert job.result.top_dla == single_dla.top[:5]
    assert [c.head for c in job.result.causal_heads or []] == [h.head for h in patch.result.heads[:5]]
    print("\nexplain on SmolLM2 (IOI):\n  " + "\n  ".join(job.result.findings))
    print(f"  stage seconds: {job.result.stage_seconds}")


FACT = "The Eiffel Tower is located in the city of"
FACT_CORRUPT = "The Colosseum is located in the city of"


def test_explain_names_the_positions_and_mlps_that_carry_a_fact(embedded: LoadedModel) -> None:
    """Factual recall with a corrupt subject: explain's layer × position maps equal `patch`'s and TransformerLens'
    own patching, and the carriers, the move and the top MLP it names are what those maps show."""
    from mcp_interp.core.explain.job import ExplainJob
    from mcp_interp.core.localize.patch import PatchJob
    from tests.smollm2_references import block_reference, setting

    job = ExplainJob(model=embedded, prompt=FACT, answer=" Paris", baseline=" Rome", corrupt=FACT_CORRUPT)
    result = drain(job)
    assert result.resid_pre_map is not None and result.attn_out_map is not None and result.mlp_out_map is not None
    mapped = sorted({p for row in result.mlp_out_map for p, v in enumerate(row) if v is not None})
    patched = {}
    for component, positions in (("resid_pre", None), ("attn_out", mapped), ("mlp_out", mapped)):
        patch = PatchJob(
            model=embedded, clean_prompts=[FACT], corrupt_prompts=[FACT_CORRUPT], correct=" Paris",
            incorrect=" Rome", component=component, positions=positions,
        )  # fmt: skip
        patched[component] = drain(patch).scores
    assert result.resid_pre_map == patched["resid_pre"]
    assert result.attn_out_map == patched["attn_out"] and result.mlp_out_map == patched["mlp_out"]

    # TransformerLens' patching (no mcp-interp engine code) at the layers the findings are about.
    s = setting(embedded, [FACT], [FACT_CORRUPT], [" Paris"], [" Rome"])
    with torch.no_grad():
        clean = float(s.metric(embedded.bridge(torch.tensor([embedded.tokenizer(FACT).input_ids]))))
        corrupt = float(s.metric(embedded.bridge(s.corrupt_ids)))
    compared = 0
    for component, layers in (("resid_pre", [0, 12, 23, 24, 29]), ("attn_out", [23]), ("mlp_out", [0, 4])):
        cells, values = block_reference(embedded, s, component, layers)
        grid = getattr(result, f"{component}_map")
        wanted = range(s.width) if component == "resid_pre" else mapped
        for (layer, position), value in zip(cells, values, strict=True):
            if position in wanted:
                assert grid[layer][position] == pytest.approx((value - corrupt) / (clean - corrupt), abs=1e-4)
                compared += 1
    assert compared == 5 * (s.width - s.first) + 3 * len(mapped)  # every TransformerLens cell explain has

    # What the maps show, read here by hand: the subject's last token ('iffel', position 2) carries the gap at
    # layers 0–23, the last token (' of', 9) from layer 24; layer 23's attention at ' of' moved it; L0's MLP at the
    # subject writes the most.
    resid = torch.tensor([[v if v is not None else float("nan") for v in row] for row in result.resid_pre_map])
    dominant = resid.nan_to_num(-1).argmax(dim=1).tolist()
    assert dominant == [2] * 24 + [9] * 6
    top = next(c for c in result.carriers or [] if c.position == 2)
    assert (top.from_layer, top.to_layer) == (0, 23) and top.min_fraction == pytest.approx(float(resid[:24, 2].min()))
    (move,) = result.moves or []
    assert (move.from_position, move.to_position, move.layer, move.attention_layer) == (2, 9, 24, 23)
    attn_at_end = [row[9] for row in result.attn_out_map[:24]]
    assert move.attention_fraction == max(attn_at_end) == result.attn_out_map[23][9]
    mlp = torch.tensor([[v if v is not None else 0.0 for v in row] for row in result.mlp_out_map])
    best = int(mlp.abs().argmax())
    first = (result.top_mlps or [])[0]
    assert (first.layer, first.position) == divmod(best, mlp.shape[1]) == (0, 2)
    assert any("position 2 ('iffel') at layers 0–23" in f for f in result.findings)
    assert not move.to_position_differs  # ' of' is the same token in both prompts: attention brought the difference
    assert any("Information moves from position 2 to 9" in f and "input of layer 24" in f for f in result.findings)
    print("\nexplain on factual recall:\n  " + "\n  ".join(result.findings[-5:]))
