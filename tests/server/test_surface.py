"""The agent-sized surface: tools/list within its budgets, every tool's typical result within 16 KB with a short text
summary, the complete data one resources/read away, handles accepted back, background jobs, completions."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import PromptReference, ResourceTemplateReference

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.host import ModelHost
from tests.features.test_sae import random_weights, write_sae
from tests.graphs.common import plt_weights, write_plt
from tests.helpers import (
    EXPECTED_TOOLS,
    TEMPLATE,
    assert_inline_grid,
    assert_valid_structured,
    complete_result,
    tiny_corpus,
    tools_by_name,
    top_word,
)
from tests.server.test_numbers import non_numeric_values

pytestmark = pytest.mark.anyio

# Bytes of names, descriptions, input schemas and annotations (≈ 11k tokens): 40 000 for 32 tools, raised by what the
# naming tools (3.7 KB) and export (0.6 KB), then brought back to 40 000 (issue 42): shared arguments described once.
MODEL_FACING_BUDGET = 40_000
# The whole tools/list, output schemas included: back to 120 000 (issue 52: nested output types by shape only).
TOOLS_LIST_BUDGET = 120_000
RESULT_BUDGET = 16_000  # a typical structured result
SUMMARY_BUDGET = 2_000  # the text content

CLEAN = ["when mary and john went to the store , john gave a drink to"]
CORRUPT = ["when mary and john went to the store , mary gave a drink to"]
PAIR = {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT, "correct": "mary", "incorrect": "john"}


def compact(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


async def test_tools_list_fits_its_budgets(tiny_client: Client) -> None:
    tools = [
        t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in (await tiny_client.list_tools()).tools
    ]
    assert {t["name"] for t in tools} == EXPECTED_TOOLS
    facing = sum(compact({k: v for k, v in t.items() if k != "outputSchema"}) for t in tools)
    total = compact(tools)
    print(f"tools/list: {len(tools)} tools, model-facing {facing} B, total {total} B")
    assert facing <= MODEL_FACING_BUDGET, f"model-facing tool definitions are {facing} B > {MODEL_FACING_BUDGET}"
    assert total <= TOOLS_LIST_BUDGET, f"tools/list is {total} B > {TOOLS_LIST_BUDGET}"
    # The figures the README and docs/performance.md state are this measurement (scripts/measure_docs.py)
    measured = json.loads((Path(__file__).resolve().parents[2] / "docs" / "measured.json").read_text())["listing"]
    now = {"tools": len(tools), "total_bytes": total, "model_facing_bytes": facing}
    assert measured == now, f"docs/measured.json says {measured}, the listing is {now}: run ./run measure"
    text = json.dumps(tools)
    assert '"title"' not in text  # pydantic's generated titles are dropped: they restate the field names
    logit_diff = next(t for t in tools if t["name"] == "logit_diff")
    assert compact(logit_diff["inputSchema"]) < 2_500  # was 5.7 KB with the answer and intervention unions inlined


def typical_calls(tiny: LoadedModel, sae: str, transcoders: str) -> dict[str, dict[str, Any]]:
    """One ordinary call of every tool that computes something (job tools and get_figure follow handles)."""
    capital = {
        "template": TEMPLATE,
        "source": "France",
        "target": "Canada",
        "source_answer": top_word(tiny, TEMPLATE, "France"),
        "target_answer": top_word(tiny, TEMPLATE, "Canada"),
        "layer": 1,
        "lens": "logit",
    }
    return {
        "model_info": {},
        "tokenize": {"texts": CLEAN},
        "logit_diff": {"prompts": CLEAN, "correct": "mary", "incorrect": "john"},
        "kl": {"prompts": CLEAN, "intervention": {"ablate": ["L1H1"]}},
        "answer_rank": {"prompts": CLEAN, "correct": "mary"},
        "ablate_head": {"prompts": CLEAN, "heads": "L1H1", "correct": "mary", "incorrect": "john"},
        "ablate": {"prompts": CLEAN, "targets": ["L1MLP", "L2H0"], "correct": "mary", "incorrect": "john"},
        "loss": {"texts": CLEAN},
        "patch_heads": PAIR,
        "patch": {**PAIR, "component": "resid_pre"},
        "edge_attribution": PAIR,
        "path_patch": {**PAIR, "sender": "L1H1"},
        "circuit_faithfulness": {**PAIR, "top_k": 20},
        "find_circuit": {**PAIR, "top": 5},  # more edges than that: its complete result is a result://
        "probe": {
            "texts": ["mary went", "john went", "tom went", "alice went", "kate went", "sam went"] * 4,
            "labels": [0, 1, 0, 1, 0, 1] * 4,  # a function of the name: the split keeps each name on both sides
        },
        "sae": {"text": CLEAN[0], "sae": sae},
        "attribution_graph": {"prompt": CLEAN[0], "transcoders": transcoders},
        "graph_intervene": {
            "prompt": CLEAN[0],
            "transcoders": transcoders,
            "features": [{"layer": 1, "position": -1, "feature": 0, "value": 1.0}],
        },
        "sae_features": {"texts": CLEAN, "sae": sae, "features": [1, 2]},
        "feature_examples": {"feature": "L1N3"},  # the shipped corpus's 2,000 search texts
        "score_explanation": {
            "feature": "L1N3",
            "explanation": "names",
            "activating_texts": ["mary went to the store", "john gave a drink to mary"],
            "non_activating_texts": ["the capital of france is paris", "a ball to the park"],
        },
        "logit_lens": {"prompt": CLEAN[0]},
        "dla": {"prompt": CLEAN[0], "answer": "mary", "baseline": "john"},
        "attention": {"prompt": CLEAN[0], "layer": 1, "head": 1},
        "induction": {"seq_len": 10, "n_seqs": 2},
        "steer": {"prompt": CLEAN[0], "coefficient": 2.0, "positive": "happy", "negative": "sad", "max_new_tokens": 4},
        "explain": {"prompt": CLEAN[0], "answer": "mary", "baseline": "john"},
        "fit_lens": {"texts": [CLEAN[0], "the capital of france is the city of paris , and so"]},
        "causal_swap_trial": capital,
        "causal_swap_benchmark": {
            "corpus": tiny_corpus(tiny),
            "layers": [1],
            "control_seeds": [0],
            "lens": "logit",
            "position": "last",
        },
    }


@pytest.fixture
def cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MCP_INTERP_CACHE", str(tmp_path / "cache"))  # fit_lens writes its lens there
    return tmp_path / "cache"


async def test_every_tool_returns_a_small_result_and_a_short_summary(
    tiny: LoadedModel, tiny_client: Client, tmp_path: Path, cache_folder: Path
) -> None:
    sae = write_sae(tmp_path / "sae", random_weights(32, seed=1), hook="blocks.1.hook_resid_post")
    transcoders = write_plt(tmp_path / "transcoders", plt_weights(3, 64, 32, seed=1))
    tools = await tools_by_name(tiny_client)
    calls = typical_calls(tiny, sae, transcoders)
    sizes = {}
    for name, arguments in calls.items():
        result = await tiny_client.call_tool(name, arguments)
        data = assert_valid_structured(tools[name], result)
        assert non_numeric_values(data) == [], f"{name}: numeric-looking fields hold non-numbers"
        text = "".join(getattr(block, "text", "") for block in result.content)
        sizes[name] = compact(data)
        assert sizes[name] <= RESULT_BUDGET, f"{name}: {sizes[name]} B of structured content"
        assert 0 < len(text.encode()) <= SUMMARY_BUDGET, f"{name}: a {len(text.encode())} B summary"
        assert not text.lstrip().startswith(("{", "[")), f"{name}: the text is a JSON dump, not a summary"
    assert (
        set(calls) | {"get_figure", "job_status", "job_cancel", "verify_artifact", "export_investigation"}
        == EXPECTED_TOOLS
    )
    print("structured sizes:", dict(sorted(sizes.items(), key=lambda kv: -kv[1])))


async def test_a_cut_result_is_complete_one_read_away(tiny_client: Client) -> None:
    """patch_heads with top=3: the returned list holds the 3 best heads, result:// holds all 12 (tiny: 3 layers × 4
    heads) and the grids with the same numbers, and a note says what was cut and where the rest is. The grids are
    never in the returned result, so even with every head returned the complete result is stored."""
    cut = (await tiny_client.call_tool("patch_heads", {**PAIR, "top": 3})).structured_content
    assert cut is not None and len(cut["heads"]) == 3 and cut["result_uri"].startswith("result://")
    assert any(cut["result_uri"] in note and "`scores` to 3 decimals" in note for note in cut["notes"])
    full = json.loads((await tiny_client.read_resource(cut["result_uri"])).contents[0].text)
    assert len(full["heads"]) == 12 and full["heads"][:3] == cut["heads"]
    assert cut["patched_logit_diff"] is None
    assert_inline_grid(cut["scores"], full["scores"])
    assert len(full["scores"]) == 3 and all(len(row) == 4 for row in full["scores"])
    assert {(h["layer"], h["head_index"]): h["score"] for h in full["heads"]} == {
        (layer, head): score for layer, row in enumerate(full["scores"]) for head, score in enumerate(row)
    }
    uncut = (await tiny_client.call_tool("patch_heads", {**PAIR, "top": 100})).structured_content
    assert uncut is not None and len(uncut["heads"]) == 12
    assert_inline_grid(uncut["scores"], full["scores"])
    assert uncut["result_uri"].startswith("result://") and uncut["result_uri"] != cut["result_uri"]
    assert [h["score"] for h in uncut["heads"]] == [h["score"] for h in full["heads"]]


PATCH_SIZE = 5_000  # bytes: tiny's patch (resid_pre, heads_by_pos) and patch_heads with top=5, grids inline


def top_cells(grid: Any, top: int) -> list[tuple[tuple[int, ...], float]]:
    """The ``top`` cells of a nested grid by decreasing |score| (nulls never), each with its index path."""
    cells: list[tuple[tuple[int, ...], float]] = []

    def visit(node: Any, where: tuple[int, ...]) -> None:
        if isinstance(node, list):
            for index, sub in enumerate(node):
                visit(sub, (*where, index))
        elif node is not None:
            cells.append((where, node))

    visit(grid, ())
    return sorted(cells, key=lambda cell: -abs(cell[1]))[:top]


async def test_patch_results_return_their_top_cells_and_store_the_grids(tiny_client: Client) -> None:
    """patch and patch_heads return the top cells only (the grids made SmolLM2's results 13–16 KB): each returned
    result is under PATCH_SIZE, and its top cells are the top 5 of the complete grid read from result://, sorted here
    by |score|."""
    heads = (await tiny_client.call_tool("patch_heads", {**PAIR, "top": 5})).structured_content
    assert heads is not None and compact(heads) <= PATCH_SIZE
    grid = (await complete_result(tiny_client, heads))["scores"]
    assert_inline_grid(heads["scores"], grid)
    expected = top_cells(grid, 5)
    assert len(grid) * len(grid[0]) == 12 and len(expected) == 5 and abs(expected[0][1]) > abs(expected[4][1])
    assert [((h["layer"], h["head_index"]), h["score"]) for h in heads["heads"]] == expected
    for component, index in (("resid_pre", ("layer", "position")), ("heads_by_pos", ("layer", "head", "position"))):
        cut = (await tiny_client.call_tool("patch", {**PAIR, "component": component, "top": 5})).structured_content
        assert cut is not None and compact(cut) <= PATCH_SIZE, (component, compact(cut))
        assert cut["patched"] is None and cut["head_patched"] is None
        full = await complete_result(tiny_client, cut)
        grid = full["scores" if component == "resid_pre" else "head_scores"]
        assert_inline_grid(cut["scores" if component == "resid_pre" else "head_scores"], grid)
        expected = top_cells(grid, 5)
        assert len(expected) == 5 and abs(expected[0][1]) > 0.1, component
        assert [(tuple(c[k] for k in index), c["score"]) for c in cut["cells"]] == expected, component
        assert full["cells"][:5] == cut["cells"]


async def poll(client: Client, job: str, states: set[str], timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status = (await client.call_tool("job_status", {"job": job})).structured_content
        assert status is not None
        if status["state"] in states or time.monotonic() > deadline:
            return status
        await anyio.sleep(0.05)


async def test_background_jobs_return_at_once_queue_finish_and_cancel(tiny_client: Client) -> None:
    foreground = (await tiny_client.call_tool("patch_heads", PAIR)).structured_content
    assert foreground is not None
    started = time.perf_counter()
    first = (await tiny_client.call_tool("patch_heads", {**PAIR, "background": True})).structured_content
    second = (await tiny_client.call_tool("find_circuit", {**PAIR, "background": True})).structured_content
    returned = time.perf_counter() - started
    assert first is not None and second is not None
    assert returned < 1.0, f"two background calls took {returned:.2f} s to return"
    assert first["job"]["job_uri"].startswith("job://") and second["job"]["state"] in ("queued", "running")
    queued = (await tiny_client.call_tool("job_status", {"job": second["job"]["job_uri"]})).structured_content
    assert queued is not None and (queued["state"] == "running" or queued["queue_position"] == 0)
    done = await poll(tiny_client, first["job"]["job_uri"], {"done", "failed"})
    assert done["state"] == "done", done
    assert done["result"]["heads"] == foreground["heads"]  # the same numbers as the foreground call
    background_grid = (await complete_result(tiny_client, done["result"]))["scores"]
    assert background_grid == (await complete_result(tiny_client, foreground))["scores"]
    cancelled = (await tiny_client.call_tool("job_cancel", {"job": second["job"]["job_uri"]})).structured_content
    assert cancelled is not None and cancelled["state"] in ("cancelled", "done")
    final = await poll(tiny_client, second["job"]["job_uri"], {"cancelled", "done"})
    assert final["state"] in ("cancelled", "done")
    answered = time.perf_counter()
    ok = await tiny_client.call_tool("logit_diff", {"prompts": CLEAN, "correct": "mary", "incorrect": "john"})
    assert not ok.is_error and time.perf_counter() - answered < 5.0
    missing = await tiny_client.call_tool("job_status", {"job": "job://" + "0" * 32})
    assert missing.is_error


async def test_completions_for_prompts_and_stored_ids(tiny_session: ModelHost, tiny_client: Client) -> None:
    prompt = PromptReference(type="ref/prompt", name="find-circuit")
    tasks = await tiny_client.complete(prompt, {"name": "task", "value": "i"})
    assert "ioi" in tasks.completion.values
    await tiny_client.call_tool("logit_diff", {"prompts": CLEAN, "correct": "mary", "incorrect": "john"})
    tiny_session.wait_loaded(60)
    figure = (await tiny_client.call_tool("attention", {"prompt": CLEAN[0], "layer": 1, "head": 1})).structured_content
    assert figure is not None
    figure_id = figure["figure_uri"].removeprefix("figure://")
    ids = await tiny_client.complete(
        ResourceTemplateReference(type="ref/resource", uri="figure://{figure_id}"),
        {"name": "figure_id", "value": figure_id[:4]},
    )
    assert figure_id in ids.completion.values
    assert all(v.startswith(figure_id[:4]) for v in ids.completion.values)
    listed = {r.uri for r in (await tiny_client.list_resources()).resources}
    assert figure["figure_uri"] in listed
