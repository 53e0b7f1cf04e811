"""`explain` end to end through a real stdio client, and its numbers against the single tools."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import pytest
import torch
from mcp import Client
from mcp.types import ResourceLink

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.explain.findings import route_finding
from mcp_interp.core.explain.job import ExplainJob
from mcp_interp.figures import png_size
from tests.helpers import assert_valid_structured, complete_result, stdio_params, tools_by_name

pytestmark = pytest.mark.anyio

PROMPT = "when mary and john went to the store , john gave a drink to"
CORRUPT = "when mary and john went to the store , mary gave a drink to"


async def test_explain_over_stdio_report_figures_and_agreement(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MCP_INTERP_OUTPUT": str(tmp_path / "out")}
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with Client(stdio_params("tiny", env), read_timeout_seconds=300) as client:
        tools = await tools_by_name(client)
        call = await client.call_tool(
            "explain",
            {"prompt": PROMPT, "answer": "mary", "baseline": "john", "corrupt": CORRUPT, "top_k": 3},
            progress_callback=on_progress,
        )
        explained = assert_valid_structured(tools["explain"], call)
        report = (await client.read_resource(explained["report_uri"])).contents[0].text
        pngs = {}
        for uri in explained["figure_uris"]:
            blob = (await client.read_resource(uri)).contents[0].blob
            pngs[uri] = base64.b64decode(blob)
        single = {
            "ld": await client.call_tool("logit_diff", {"prompts": [PROMPT], "correct": "mary", "incorrect": "john"}),
            "dla": await client.call_tool("dla", {"prompt": PROMPT, "answer": "mary", "baseline": "john", "top_k": 3}),
            "lens": await client.call_tool("logit_lens", {"prompt": PROMPT, "target": "mary"}),
            "patch": await client.call_tool(
                "patch_heads",
                {"clean_prompts": [PROMPT], "corrupt_prompts": [CORRUPT], "correct": "mary", "incorrect": "john"},
            ),
        }
        pair = {"clean_prompts": [PROMPT], "corrupt_prompts": [CORRUPT], "correct": "mary", "incorrect": "john"}
        maps = {  # the grids are in the complete results (result://)
            component: await complete_result(
                client,
                assert_valid_structured(
                    tools["patch"], await client.call_tool("patch", {**pair, "component": component})
                ),
            )
            for component in ("resid_pre", "attn_out", "mlp_out")
        }
    single = {
        k: assert_valid_structured(
            tools[{"ld": "logit_diff", "dla": "dla", "lens": "logit_lens", "patch": "patch_heads"}[k]], v
        )
        for k, v in single.items()
    }
    # Same numbers as the single tools.
    assert explained["logit_diff"] == pytest.approx(single["ld"]["logit_diff"]["value"], abs=1e-9)
    assert explained["top_dla"] == single["dla"]["top"]
    assert explained["answer_prob"] == pytest.approx(single["lens"]["final_prob"], abs=1e-12)
    assert explained["forms_at_layer"] == single["lens"]["first_top1_layer"]
    patch_scores = {h["head"]: h["score"] for h in single["patch"]["heads"]}
    for head in explained["causal_heads"]:
        assert head["recovered_fraction"] == pytest.approx(patch_scores[head["head"]], abs=1e-9)
    # The layer × position maps are patch's: resid_pre everywhere, attn_out/mlp_out at the positions it picked.
    assert explained["resid_pre_map"] == maps["resid_pre"]["scores"]
    mapped = {p for row in explained["mlp_out_map"] for p, v in enumerate(row) if v is not None}
    assert mapped and mapped == {p for row in explained["attn_out_map"] for p, v in enumerate(row) if v is not None}
    # explain patches only the positions it picked, patch every position: the sweep's batches differ in size, so
    # float32 matmuls round differently (measured up to 2e-7 on a fraction of order 0.4).
    for component in ("attn_out", "mlp_out"):
        for layer, row in enumerate(explained[f"{component}_map"]):
            for position, value in enumerate(row):
                expected = maps[component]["scores"][layer][position] if position in mapped else None
                assert value == (pytest.approx(expected, abs=1e-6) if expected is not None else None)
    best_mlp = max(
        (
            (abs(v), layer, p)
            for layer, row in enumerate(maps["mlp_out"]["scores"])
            for p, v in enumerate(row)
            if p in mapped
        ),
    )
    assert (explained["top_mlps"][0]["layer"], explained["top_mlps"][0]["position"]) == best_mlp[1:]
    # The report is Markdown that cites the real numbers and links every figure.
    assert report.startswith("# Why does the model say")
    assert f"{explained['logit_diff']:+.4f}" in report
    for contribution in explained["top_dla"]:
        assert f"| {contribution['component']} | {contribution['value']:+.4f} |" in report
    assert set(re.findall(r"figure://[0-9a-f]{32}", report)) == set(explained["figure_uris"])
    links = [b for b in call.content if isinstance(b, ResourceLink)]
    assert {str(link.uri) for link in links} == set(explained["figure_uris"]) | {explained["report_uri"]}
    for png in pngs.values():
        width, height = png_size(png)
        assert width > 100 and height > 100
    assert len(pngs) == 3 + 3 + 3  # lens, DLA, head patching, the three position maps, attention of the top 3 heads
    # 3 stages, then four patching sweeps (heads, resid_pre, attn_out, mlp_out) of the pair runs + 3 layers of `tiny`
    assert progress == sorted(progress) and progress[-1] == 3 + 4 * (1 + 3)
    stages = {"logit_lens", "dla", "patch_heads", "position_maps", "attention", "figures"}
    assert set(explained["stage_seconds"]) == stages


async def test_prompts_are_listed_and_rendered(tiny_client: Client) -> None:
    names = {p.name for p in (await tiny_client.list_prompts()).prompts}
    rendered = await tiny_client.get_prompt(
        "explain-prediction", {"prompt": "When Mary and John went", "answer": " Mary", "baseline": " John"}
    )
    claim = await tiny_client.get_prompt("test-causal-claim", {"claim": "L9H3 moves names"})
    probing = await tiny_client.get_prompt("probe-property", {"property": "subject number"})
    naming = await tiny_client.get_prompt("interpret-feature", {"feature": "L1N3"})
    assert "Feature: L1N3" in naming.messages[0].content.text and "quiz_id" in naming.messages[0].content.text
    assert names == {
        "explain-prediction",
        "find-circuit",
        "test-causal-claim",
        "probe-property",
        "trace-prediction",
        "interpret-feature",
    }
    probe_text = probing.messages[0].content.text
    assert "subject number" in probe_text and "'The dog near the river' → singular" in probe_text
    text = rendered.messages[0].content.text
    assert "When Mary and John went" in text and "' Mary'" in text and "leading space" in text
    assert "rank saturates" in text.lower() or "Rank saturates" in text
    assert "L9H3 moves names" in claim.messages[0].content.text


def test_direct_effect_is_the_dla_of_the_heads_change_computed_by_hand(tiny: LoadedModel) -> None:
    job = ExplainJob(model=tiny, prompt=PROMPT, answer="mary", baseline="john", corrupt=CORRUPT, top_k=4)
    result = drain(job)
    assert result.causal_heads is not None and len(result.causal_heads) == 4
    tok, bridge = tiny.tokenizer, tiny.bridge
    answer, baseline = (tok(w, add_special_tokens=False)["input_ids"][0] for w in ("mary", "john"))
    w_u = bridge.unembed.original_component.weight.detach().double()
    gain = bridge.ln_final.original_component.weight.detach().double()
    direction = (w_u[answer] - w_u[baseline]) * gain
    runs = {}
    for name, text in (("clean", PROMPT), ("corrupt", CORRUPT)):
        ids = torch.tensor([tok(text)["input_ids"]])
        with torch.no_grad():
            logits, cache = bridge.run_with_cache(ids)
        runs[name] = (logits[0, -1].double(), cache)
    corrupt_logits, corrupt_cache = runs["corrupt"]
    scale = float(corrupt_cache["ln_final.hook_scale"][0, -1].reshape(-1)[0])
    d_head = tiny.bridge.cfg.d_head
    for head in result.causal_heads:
        layer, index = (int(x) for x in head.head[1:].split("H"))
        w_o = (
            bridge.blocks[layer]
            .attn.o.original_component.weight.detach()
            .double()[:, index * d_head : (index + 1) * d_head]
        )

        def output(cache: object, w_o: torch.Tensor = w_o, layer: int = layer, index: int = index) -> torch.Tensor:
            return w_o @ cache[f"blocks.{layer}.attn.hook_z"][0, -1, index].double()  # type: ignore[index]

        change = output(runs["clean"][1]) - output(corrupt_cache)
        assert head.direct_effect == pytest.approx(float(change @ direction) / scale, abs=1e-4)
        # The total effect: the patched run's logit difference minus the corrupt run's, read from patching.
        corrupt_ld = float(corrupt_logits[answer] - corrupt_logits[baseline])
        patched = next(h for h in job.patching.heads if h.head == head.head)  # type: ignore[union-attr]
        assert head.patch_effect == pytest.approx(patched.patched_logit_diff - corrupt_ld, abs=1e-4)


LATER = "later components (its layer's MLP, later layers)"
LAST = "its layer's MLP (the last layer)"


@pytest.mark.parametrize(
    ("total", "direct", "last", "expected"),
    [
        (1.0, 0.9, False, "acts mostly directly"),
        (1.0, 0.1, False, f"acts mostly through {LATER}"),
        (1.0, -0.5, False, f"acts mostly through {LATER}"),  # its direct effect opposes the total
        (-2.0, -1.0, False, f"acts both directly and through {LATER}"),
        (1.0, 0.1, True, f"acts mostly through {LAST}"),  # a head in the last layer has no later layer to act through
    ],
)
def test_route_findings_on_constructed_effects(total: float, direct: float, last: bool, expected: str) -> None:
    sentence = route_finding("L3H1", total, direct, last)
    assert sentence is not None and sentence.startswith(f"L3H1 {expected}:")
    assert ("later layers" in sentence) is not last
    assert f"{total:+.3f}" in sentence and f"{direct:+.3f}" in sentence and f"{total - direct:+.3f}" in sentence


def test_a_negligible_patch_effect_earns_no_sentence() -> None:
    assert route_finding("L3H1", 0.05, 0.05) is None
    assert route_finding("L3H1", -0.09, 0.8) is None  # however large the direct term, the total is what is judged


def test_a_corrupt_prompt_identical_to_the_prompt_is_refused(tiny: LoadedModel) -> None:
    from mcp_interp.errors import InputError

    with pytest.raises(InputError, match="tokenizes exactly like `prompt`"):
        drain(ExplainJob(model=tiny, prompt=PROMPT, answer="mary", baseline="john", corrupt=PROMPT))


def test_without_a_position_to_map_attention_and_mlps_are_not_patched(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcp_interp.core.explain import positions

    monkeypatch.setattr(positions, "MAPPED", 2.0)  # no cell recovers 200% of the gap: no position gets the maps
    result = drain(ExplainJob(model=tiny, prompt=PROMPT, answer="mary", baseline="john", corrupt=CORRUPT))
    assert result.resid_pre_map is not None and len(result.resid_pre_map) == tiny.bridge.cfg.n_layers
    assert (result.attn_out_map, result.mlp_out_map, result.top_mlps, result.top_attention) == (None, None, [], [])
    assert result.moves is not None and all(m.attention_layer is None for m in result.moves)
