"""Head patching on the real embedded model: equal to TransformerLens, and cancellation between layers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mcp import Client

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.heads.ablate_head import ablate_heads
from mcp_interp.core.heads.patch_heads import PatchHeadsJob
from mcp_interp.corpora import ioi_arguments, ioi_pairs
from mcp_interp.schemas.common import Intervention
from tests import smollm2_references as refs

pytestmark = pytest.mark.embedded


def patched_grid(model: LoadedModel, heads: list[str] | None = None) -> list[list[float | None]]:
    job = PatchHeadsJob(
        model=model,
        clean_prompts=refs.CLEAN,
        corrupt_prompts=refs.CORRUPT,
        correct=refs.CORRECT,
        incorrect=refs.INCORRECT,
        heads=heads,
    )
    drain(job)
    assert job.result is not None and job.sweep is not None and job.sweep.startswith("suffix")
    return job.result.patched_logit_diff


def test_exact_head_patching_equals_the_stored_transformer_lens_references(embedded: LoadedModel) -> None:
    """All 270 heads (every position) against TransformerLens' get_act_patch_attn_head_out_all_pos, stored by
    ``./run golden``."""
    reference = refs.golden(embedded)["heads_all_positions"]
    grid = patched_grid(embedded)
    got = torch.tensor([grid[layer][head] for layer, head in reference["index"]], dtype=torch.float64)
    difference = (got - torch.tensor(reference["values"], dtype=torch.float64)).abs().max().item()
    print(f"\nexact patching vs TransformerLens on SmolLM2 (2 IOI pairs, 270 heads): max |diff| {difference:.2e}")
    assert difference < refs.TOLERANCE


@pytest.mark.live_reference
def test_exact_head_patching_equals_transformer_lens_run_now(embedded: LoadedModel) -> None:
    """The heads family's live comparison: TransformerLens rerun on the heads of the first and last layers."""
    layers = [0, 29]
    index, values = refs.heads_all_positions_reference(embedded, refs.setting(embedded), layers)
    grid = patched_grid(embedded, [f"L{layer}H{head}" for layer, head in index])
    got = torch.tensor([grid[layer][head] for layer, head in index], dtype=torch.float64)
    assert (got - torch.tensor(values, dtype=torch.float64)).abs().max().item() < refs.TOLERANCE


@pytest.mark.anyio
async def test_cancelled_patch_heads_stops_at_the_next_layer(embedded: LoadedModel, tmp_path: Path) -> None:
    import time

    import anyio

    from mcp_interp.host import ModelHost
    from mcp_interp.mcp.server import build_server

    session = ModelHost("smollm2-135m", tmp_path / "out", loader=lambda name, device, dtype: embedded)
    args = {
        "clean_prompts": [p.clean for p in ioi_pairs()],
        "corrupt_prompts": [p.corrupt for p in ioi_pairs()],
        "correct": [p.correct for p in ioi_pairs()],
        "incorrect": [p.incorrect for p in ioi_pairs()],
    }
    progress: list[float] = []
    async with Client(build_server(session)) as client:
        await client.call_tool("model_info", {})
        with anyio.move_on_after(120) as scope:

            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                progress.append(value)
                if len(progress) == 3:
                    scope.cancel()

            await client.call_tool("patch_heads", args, progress_callback=on_progress)
        cancelled_at = time.perf_counter()
        after = await client.call_tool("logit_diff", ioi_arguments())
        answered_in = time.perf_counter() - cancelled_at
    assert scope.cancelled_caught and not after.is_error
    assert len(progress) <= 4, "the scan went on after the cancellation"
    # One layer of the scan is at most ~1 s here; the next call must not wait for the whole scan (~8 s).
    print(f"\nnext call answered {answered_in:.2f} s after cancelling patch_heads at layer {len(progress)}")
    assert answered_in < 3.0
    assert session.store.ids("figure") == [], "a cancelled scan must not leave a figure behind"


# Own IOI prompts (not the corpus' ioi_pairs the audit used): the §1 check of issue 41 on data of its own.
IOI_NAMES = [(" Sarah", " Tom"), (" Emma", " David"), (" Anna", " Mark"), (" Lucy", " Paul"), (" Kate", " Peter"),
             (" Alice", " Brian"), (" Rachel", " Simon"), (" Laura", " Kevin")]  # fmt: skip
IOI_PLACES = ["the market", "the beach", "the office", "the garden", "the station", "the library", "the cinema",
              "the hospital"]  # fmt: skip
IOI_OBJECTS = ["a book", "an apple", "a letter", "a cup", "a ticket", "a key", "a pen", "a flower"]


def test_the_strong_ioi_head_beats_random_heads_of_a_band_that_excludes_it(embedded: LoadedModel) -> None:
    """Mean-ablating L23H3 (the head that moved the audit's logit difference by −2.78) on 8 IOI prompts of this test's
    own: its random heads come from the band of layers 7–29 (207 heads, the nearest layers holding ≥ 200 other
    heads), never L23H3 itself, so nothing ties it; p = 1/201 ≤ 0.01. Before issue 41 the heads of its own layer (the
    real one among them) capped p at about 1/9."""
    prompts = [
        f"When{a} and{b} went to {place},{b} gave {thing} to"
        for (a, b), place, thing in zip(IOI_NAMES, IOI_PLACES, IOI_OBJECTS, strict=True)
    ]
    spec = Intervention(ablate=["L23H3"], method="mean")  # type: ignore[list-item]
    result = ablate_heads(embedded, prompts, spec, [a for a, _ in IOI_NAMES], [b for _, b in IOI_NAMES])
    baseline = result.random_baseline
    assert baseline is not None and baseline.pool_size == 23 * 9 - 1 == 206
    assert baseline.real < -1.0 and baseline.p_value <= 0.01 and baseline.p_floor == pytest.approx(1 / 201)
    assert min(abs(d - baseline.real) for d in baseline.draws) > 0.3  # no draw equals (or ties) the real head
    assert "layers 7–29" in baseline.notes[0] and baseline.verdict.startswith("beats 200 random heads")
