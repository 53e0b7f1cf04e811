"""patch_heads / ablate_head / get_figure through a real MCP client (in-process, `tiny`)."""

from __future__ import annotations

import base64

import pytest
from mcp import Client
from mcp.types import ImageContent, ResourceLink

from mcp_interp.figures import heatmap_size, png_size
from tests.helpers import (
    assert_inline_grid,
    assert_valid_structured,
    complete_result,
    error_text,
    png_text,
    tools_by_name,
)

pytestmark = pytest.mark.anyio

CLEAN = ["when mary and john went to the store , john gave a drink to"]
CORRUPT = ["when mary and john went to the store , mary gave a drink to"]


async def test_patch_heads_heatmap_resource_and_get_figure(tiny_client: Client) -> None:
    progress: list[tuple[float, float | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total))

    tools = await tools_by_name(tiny_client)
    call = await tiny_client.call_tool(
        "patch_heads",
        {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT, "correct": "mary", "incorrect": "john"},
        progress_callback=on_progress,
    )
    result = assert_valid_structured(tools["patch_heads"], call)
    links = [block for block in call.content if isinstance(block, ResourceLink)]
    assert [str(link.uri) for link in links] == [result["figure_uri"], result["result_uri"]]  # grids: result://
    resource = await tiny_client.read_resource(result["figure_uri"])
    png = base64.b64decode(resource.contents[0].blob)
    figure = await tiny_client.call_tool("get_figure", {"uri": result["figure_uri"]})
    info = assert_valid_structured(tools["get_figure"], figure)
    bad = await tiny_client.call_tool("get_figure", {"uri": "figure://../../etc/passwd"})
    assert png_size(png) == heatmap_size(3, 4)  # layers × heads of `tiny`
    images = [block for block in figure.content if isinstance(block, ImageContent)]
    assert len(images) == 1 and base64.b64decode(images[0].data) == png
    assert (info["width"], info["height"]) == heatmap_size(3, 4)
    assert "not found" in error_text(bad).lower() or "no figure" in error_text(bad).lower()
    # One progress report for the clean and corrupt runs and one per layer swept (3 layers), the total known up front.
    assert [p[0] for p in progress] == [1, 2, 3, 4] and {p[1] for p in progress} == {4}
    grid = (await complete_result(tiny_client, result))["scores"]
    assert len(grid) == 3 and all(len(row) == 4 for row in grid)
    assert_inline_grid(result["scores"], grid)  # the whole grid inline, to 3 decimals
    assert len(result["heads"]) == 12
    assert result["heads"][0]["per_example_score"] is not None


async def test_ablate_head_and_metric_intervention_over_mcp(tiny_client: Client) -> None:
    tools = await tools_by_name(tiny_client)
    ablated = assert_valid_structured(
        tools["ablate_head"],
        await tiny_client.call_tool(
            "ablate_head",
            {
                "prompts": CLEAN + CORRUPT,
                "heads": ["L1H2", "L0H1"],
                "method": "mean",
                "correct": "mary",
                "incorrect": "john",
            },
        ),
    )
    via = assert_valid_structured(
        tools["logit_diff"],
        await tiny_client.call_tool(
            "logit_diff",
            {
                "prompts": CLEAN + CORRUPT,
                "correct": "mary",
                "incorrect": "john",
                "intervention": {"ablate": ["L1H2", "L0H1"], "method": "mean"},
            },
        ),
    )
    bad_layer = await tiny_client.call_tool("ablate_head", {"prompts": CLEAN, "heads": "L9H0"})
    bad_method = await tiny_client.call_tool("ablate_head", {"prompts": CLEAN, "heads": "L0H0", "method": "median"})
    assert ablated["mean_over"] == "per_position"
    assert via["logit_diff"]["per_example"] == pytest.approx(ablated["after"]["logit_diff"]["per_example"], abs=1e-9)
    assert "layers 0..2" in error_text(bad_layer)
    assert "method" in error_text(bad_method)


async def test_patch_over_mcp_grid_progress_and_labelled_heatmap(tiny_client: Client) -> None:
    progress: list[tuple[float, float | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total))

    arguments = {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT, "correct": "mary", "incorrect": "john"}
    tools = await tools_by_name(tiny_client)
    call = await tiny_client.call_tool("patch", {**arguments, "component": "resid_pre"}, progress_callback=on_progress)
    result = assert_valid_structured(tools["patch"], call)
    resource = await tiny_client.read_resource(result["figure_uri"])
    heads = assert_valid_structured(
        tools["patch"], await tiny_client.call_tool("patch", {**arguments, "component": "heads_by_pos", "layers": [2]})
    )
    bad = await tiny_client.call_tool("patch", {**arguments, "component": "mlp_neurons", "neurons": [128]})
    loss = assert_valid_structured(tools["loss"], await tiny_client.call_tool("loss", {"texts": CLEAN}))
    png = base64.b64decode(resource.contents[0].blob)
    description = png_text(png)["Description"]
    assert "Columns (token@position): when@0 | mary@1 | and@2" in description
    assert "| john/mary@9 | gave@10" in description  # the differing position shows clean/corrupt
    grid = (await complete_result(tiny_client, result))["scores"]
    assert len(grid) == 3 and all(len(row) == 14 for row in grid)
    assert_inline_grid(result["scores"], grid)
    assert result["skipped_positions"] == list(range(9))
    assert result["cells"][0]["label"] in call.content[0].text  # type: ignore[union-attr]
    # Progress: the clean/corrupt runs, then one step per layer swept.
    assert [p[0] for p in progress] == [1, 2, 3, 4] and {p[1] for p in progress} == {4}
    head_grid = (await complete_result(tiny_client, heads))["head_scores"]
    assert head_grid[0][0] == [None] * 14 and len(head_grid[2]) == 4
    assert_inline_grid(heads["head_scores"], head_grid)
    assert "0..127" in error_text(bad)
    assert len(loss["texts"][0]["loss"]) == 13
