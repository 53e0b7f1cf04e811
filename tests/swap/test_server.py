"""The causal-swap tools through an in-process MCP client on `tiny`: benchmark, artifact, verify, fit_lens."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from mcp import Client
from mcp.shared.exceptions import MCPError
from scipy import stats

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.tokens import adds_bos
from mcp_interp.host import ModelHost
from tests.helpers import CONCEPTS, TEMPLATE, assert_valid_structured, error_text, tiny_corpus, tools_by_name, top_word

pytestmark = pytest.mark.anyio


async def test_benchmark_summary_agrees_with_its_own_artifact(
    tiny_session: ModelHost, tiny_client: Client, tiny: LoadedModel
) -> None:
    corpus = tiny_corpus(tiny)
    tools = await tools_by_name(tiny_client)
    progress: list[float] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(done)

    result = await tiny_client.call_tool(
        "causal_swap_benchmark",
        {"corpus": corpus, "layers": [0, 1], "control_seeds": [0, 1, 2], "lens": "logit", "position": "last"},
        progress_callback=on_progress,
    )
    out = assert_valid_structured(tools["causal_swap_benchmark"], result)
    text = (await tiny_client.read_resource(out["artifact_uri"])).contents[0].text
    check = assert_valid_structured(
        tools["verify_artifact"], await tiny_client.call_tool("verify_artifact", {"artifact_json": text})
    )
    by_uri = assert_valid_structured(  # the stored artifact, named by its URI: nothing to paste
        tools["verify_artifact"], await tiny_client.call_tool("verify_artifact", {"artifact_uri": out["artifact_uri"]})
    )
    assert by_uri["valid"] and by_uri["checks"] == check["checks"]
    neither = await tiny_client.call_tool("verify_artifact", {})
    missing = await tiny_client.call_tool("verify_artifact", {"artifact_uri": "artifact://" + "0" * 32})
    assert "Pass one of `artifact_uri`" in error_text(neither) and "0" * 32 in error_text(missing)
    figure = await tiny_client.read_resource(out["figure_uri"])
    assert check["valid"] and check["altered"] == []
    assert figure.contents[0].mime_type == "image/png"
    document = json.loads(text)
    assert Path(out["artifact_path"]).read_text(encoding="utf-8") == text
    assert Path(out["artifact_path"]).is_relative_to(tiny_session.store.root)
    assert document["protocol"]["corpus"]["name"] == "tiny-capitals"
    assert document["protocol"]["model"]["fingerprint"] == tiny.fingerprint
    assert document["protocol"]["settings"]["control_seeds"] == [0, 1, 2]
    assert "0-based" in document["protocol"]["rank_definition"]
    assert document["fingerprints"] == out["fingerprints"]
    trials, summary = document["results"]["trials"], out["summary"]
    assert progress == sorted(progress) and len(progress) == 1 + 3 * 12 * 2

    # Ledger: 'wrong' prompts are not capable (with their rank); 'zzqx' is not one known token.
    ledger = out["exclusions"]
    wrong = [e for e in ledger if e["kind"] == "prompt" and e["function"] == "wrong"]
    assert len(wrong) == 4 and all(e["rank"] > 0 and "not capable" in e["reason"] for e in wrong)
    unknown = [e for e in ledger if e["kind"] == "prompt" and e["function"] == "unknown" and e["concept"] == "France"]
    assert len(unknown) == 1 and "zzqx" in unknown[0]["reason"]
    # Slots: every (function, source, target, layer) is a trial or an excluded slot, never both, never lost.
    assert sum(summary["status_counts"].values()) == len(trials)
    assert len(trials) + summary["excluded_trials"] == 3 * 12 * 2
    assert all(t["function"] == "own" for t in trials)
    same_answer = {
        (t["source"], t["target"])
        for t in trials
        if t["baseline"]["source_answer"]["token_id"] == t["baseline"]["target_answer"]["token_id"]
    }
    assert same_answer == set()

    executed = [t for t in trials if t["status"] == "executed"]
    assert summary["status_counts"]["executed"] == len(executed)
    real_wins = sum(t["real"]["top1"] for t in executed)
    assert summary["real"]["successes"] == real_wins and summary["real"]["n"] == len(executed)
    assert executed, summary["status_counts"]  # the checks below need executed trials on tiny
    low = 0.0 if real_wins == 0 else stats.beta.ppf(0.025, real_wins, len(executed) - real_wins + 1)
    assert math.isclose(summary["real"]["ci_low"], low, abs_tol=1e-12)
    draws = [c["score"]["top1"] for t in executed for c in t["controls"]]
    assert summary["control"]["n"] == len(draws) == 3 * len(executed)
    assert summary["control"]["successes"] == sum(draws)
    # The graded effect, recomputed from the artifact's trials: margin gain = edited − unedited target margin; per
    # target, its swap with the most executed trials (the first on a tie) is tested: per arm the mean over that swap's
    # trials; the specificity statistic is their real − control mean.
    by_swap: dict[tuple[str, str, str], list[list[float]]] = {}
    controls: dict[tuple[str, str, str], set[tuple[int, ...]]] = {}
    for t in executed:
        unedited = t["baseline"]["target_answer"]["margin"]
        row = [t["real"]["margin"] - unedited, *(c["score"]["margin"] - unedited for c in t["controls"])]
        assert t["margin_gain"] == pytest.approx(row[0]) and t["control_margin_gains"] == pytest.approx(row[1:])
        swap = (t["target"], t["function"], t["source"])
        by_swap.setdefault(swap, []).append(row)
        controls.setdefault(swap, set()).add(tuple(c["token_id"] for c in t["controls"]))
    # A swap's controls are the same tokens at every layer, and never a corpus word.
    assert all(len(drawn) == 1 for drawn in controls.values()), controls
    concepts = {tiny.tokenizer(" " + c, add_special_tokens=False)["input_ids"][0] for c in CONCEPTS}
    assert not {token for drawn in controls.values() for token in next(iter(drawn))} & concepts
    tested: dict[str, tuple[tuple[str, str, str], int]] = {}
    for swap, rows in by_swap.items():
        if swap[0] not in tested or len(rows) > tested[swap[0]][1]:
            tested[swap[0]] = (swap, len(rows))
    assert summary["tested_swaps"] == [f"{f}/{s}→{t}" for (t, f, s), _ in tested.values()]
    chosen = [by_swap[swap] for swap, _ in tested.values()]
    means = [[sum(column) / len(rows) for column in zip(*rows, strict=True)] for rows in chosen]
    gain = summary["specificity"]["margin_gain"]
    assert gain["targets"] == len(means)
    assert gain["real"] == pytest.approx(sum(m[0] for m in means) / len(means))
    assert gain["difference"] == pytest.approx(sum(m[0] - sum(m[1:]) / 3 for m in means) / len(means))
    assert gain["real_above"] == sum(m[0] > max(m[1:]) for m in means)
    beats = sum(all(row[0] > g for g in row[1:]) for rows in by_swap.values() for row in rows)
    assert summary["specificity"]["beats_all"] == beats and summary["specificity"]["chance"] == 0.25
    assert f"in {beats}/{len(executed)} trials" in summary["verdict"]
    assert summary["n_independent_prompts"] == len({(t["function"], t["source"]) for t in executed})
    winners = {f"{t['function']}/{t['source']}" for t in executed if t["real"]["top1"]}
    assert summary["real_success_prompts"] == sorted(winners)
    assert summary["layers_executed"] == sorted({t["layer"] for t in executed})


async def test_tampering_with_the_artifact_is_named(tiny_client: Client, tiny: LoadedModel) -> None:
    out = (
        await tiny_client.call_tool(
            "causal_swap_benchmark",
            {"corpus": tiny_corpus(tiny), "layers": [1], "control_seeds": [0], "lens": "logit", "position": "last"},
        )
    ).structured_content
    document = json.loads((await tiny_client.read_resource(out["artifact_uri"])).contents[0].text)
    document["results"]["trials"][0]["detail"] = "edited after the run"
    checked = await tiny_client.call_tool("verify_artifact", {"artifact_json": json.dumps(document)})
    with pytest.raises(MCPError, match="No artifact with id"):
        await tiny_client.read_resource("artifact://" + "0" * 32)
    tampered = checked.structured_content
    assert tampered["valid"] is False and tampered["altered"] == ["results", "results.trials"]


async def test_benchmark_errors_name_the_fix(
    tiny_client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCP_INTERP_CACHE", str(tmp_path / "empty-cache"))  # no lens fitted here (an allowed root)
    no_lens = await tiny_client.call_tool(
        "causal_swap_trial",
        {"template": TEMPLATE, "source": "France", "target": "Canada", "source_answer": "six"}
        | {"target_answer": "six", "layer": 0, "lens": "jacobian", "lens_path": str(tmp_path / "empty-cache" / "x.pt")},
    )
    bad_layer = await tiny_client.call_tool("causal_swap_benchmark", {"layers": [2], "lens": "logit"})
    nothing = await tiny_client.call_tool(
        "causal_swap_benchmark", {"corpus": "countries", "layers": [0], "lens": "logit"}
    )
    assert "fit_lens" in error_text(no_lens)
    assert "cannot be edited" in error_text(bad_layer)
    # The shipped corpus runs on tiny; its answers outside tiny's vocabulary are ledgered, not fatal.
    ledger = nothing.structured_content["exclusions"]
    pound = [e for e in ledger if e["kind"] == "prompt" and e["function"] == "currency" and e["concept"] == "Egypt"]
    assert len(pound) == 1 and "'Pound'" in pound[0]["reason"] and "does not know" in pound[0]["reason"]


async def test_fit_lens_then_a_jacobian_trial(
    tiny_client: Client, tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCP_INTERP_CACHE", str(tmp_path / "cache"))
    texts = [" ".join(["when mary and john went to the store , john gave a drink to mary ."] * 3)] * 2
    tools = await tools_by_name(tiny_client)
    first = assert_valid_structured(
        tools["fit_lens"], await tiny_client.call_tool("fit_lens", {"texts": texts, "corpus_name": "ioi-ish"})
    )
    again = assert_valid_structured(tools["fit_lens"], await tiny_client.call_tool("fit_lens", {"texts": texts}))
    trial = assert_valid_structured(
        tools["causal_swap_trial"],
        await tiny_client.call_tool(
            "causal_swap_trial",
            {
                "template": TEMPLATE,
                "source": "France",
                "target": "Canada",
                "source_answer": top_word(tiny, TEMPLATE, "France"),
                "target_answer": top_word(tiny, TEMPLATE, "Canada"),
                "layer": 1,
                "lens": "jacobian",
            },
        ),
    )
    short = await tiny_client.call_tool("fit_lens", {"texts": ["too short"]})
    lens = first["lens"]
    assert first["from_cache"] is False and again["from_cache"] is True
    assert lens["n_prompts"] == 2 and lens["source_layers"] == [0, 1] and lens["corpus"] == "ioi-ish"
    assert Path(lens["path"]).is_relative_to(tmp_path / "cache")
    assert again["lens"]["sha256"] == lens["sha256"]
    # The fit is the library's: one JacobianLens.fit over both texts gives the same matrices.
    from transformer_lens.tools.analysis.jacobian_lens import JacobianLens

    saved = JacobianLens.load(lens["path"])
    bos = adds_bos(tiny.tokenizer)  # the fit tokenizes by the project's rule, not to_tokens' default
    assert saved.metadata["mcp_interp"]["prepend_bos"] is bos
    default = tiny.bridge.cfg.default_prepend_bos
    tiny.bridge.cfg.default_prepend_bos = bos
    try:
        direct = JacobianLens.fit(
            tiny.bridge, texts, corpus="x", dim_batch=32, max_seq_len=32, skip_first_positions=4, show_progress=False
        )
    finally:
        tiny.bridge.cfg.default_prepend_bos = default
    for layer in (0, 1):
        assert torch.allclose(saved.jacobians[layer], direct.jacobians[layer], atol=1e-5)
    assert trial["lens"]["kind"] == "jacobian" and trial["lens"]["sha256"] == lens["sha256"]
    assert trial["trial"]["status"] in ("executed", "skipped_source_inactive", "skipped_no_control_token")
    assert "too short" in error_text(short)


async def test_the_default_benchmark_fits_the_default_lens_on_first_need(
    tiny_client: Client, tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCP_INTERP_CACHE", str(tmp_path / "cache"))
    messages: list[str] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    arguments = {"corpus": tiny_corpus(tiny), "layers": [1], "control_seeds": [0]}  # lens and position: defaults
    tools = await tools_by_name(tiny_client)
    first = assert_valid_structured(
        tools["causal_swap_benchmark"],
        await tiny_client.call_tool("causal_swap_benchmark", arguments, progress_callback=on_progress),
    )
    fitted = len(messages)
    second = assert_valid_structured(
        tools["causal_swap_benchmark"], await tiny_client.call_tool("causal_swap_benchmark", arguments)
    )
    assert first["settings"]["lens"] == "jacobian" and first["settings"]["position"] == "concept"
    assert first["lens"]["kind"] == "jacobian" and Path(first["lens"]["path"]).is_relative_to(tmp_path / "cache")
    fit_settings = first["lens"]["settings"]
    assert (fit_settings["max_seq_len"], fit_settings["skip_first_positions"]) == (32, 4)
    assert first["lens"]["n_prompts"] == 8  # the default fit: the first 8 shipped paragraphs
    fit_messages = [m for m in messages[:fitted] if "fitting one first" in m]
    assert len(fit_messages) == 8 + 1  # one per text, then the save
    assert any("was fitted for this run" in n for n in first["notes"])
    assert second["lens"]["sha256"] == first["lens"]["sha256"]  # cached: the second run reuses it
    assert not any("was fitted for this run" in n for n in second["notes"])


async def test_a_trial_without_a_cached_lens_says_what_fitting_costs_or_fits_when_asked(
    tiny_client: Client, tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCP_INTERP_CACHE", str(tmp_path / "cache"))
    arguments = {
        "template": TEMPLATE,
        "source": "France",
        "target": "Canada",
        "source_answer": top_word(tiny, TEMPLATE, "France"),
        "target_answer": top_word(tiny, TEMPLATE, "Canada"),
        "layer": 1,
    }
    refused = error_text(await tiny_client.call_tool("causal_swap_trial", arguments))
    assert "No Jacobian lens is cached" in refused and "fit_lens" in refused and "fit_if_missing" in refused
    assert "backward passes for each of 8 texts" in refused  # the cost, in passes (and minutes on SmolLM2)
    assert not (tmp_path / "cache" / "jacobian-lens").exists()  # nothing was fitted
    messages: list[str] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    tools = await tools_by_name(tiny_client)
    fitted = assert_valid_structured(
        tools["causal_swap_trial"],
        await tiny_client.call_tool(
            "causal_swap_trial", arguments | {"fit_if_missing": True}, progress_callback=on_progress
        ),
    )
    assert sum("fitted text" in m for m in messages) == 8  # progress per fitted text
    assert fitted["lens"]["kind"] == "jacobian" and any(
        "Fitted the default Jacobian lens" in n for n in fitted["notes"]
    )


async def test_alpha_beyond_one_extrapolates_proportionally_up_to_its_bound(
    tiny_client: Client, tiny: LoadedModel
) -> None:
    """The edit is strictly proportional to α (TransformerLens' solver), so α = 40 is 40 times the α = 1 edit, for the
    real edit and every control; beyond ±100 the call is refused with the bound named."""
    arguments = {
        "template": TEMPLATE,
        "source": "France",
        "target": "Canada",
        "source_answer": top_word(tiny, TEMPLATE, "France"),
        "target_answer": top_word(tiny, TEMPLATE, "Canada"),
        "layer": next(layer for layer in (0, 1) if source_active(tiny, "France", layer)),
        "lens": "logit",
        "position": "last",
    }
    one = (await tiny_client.call_tool("causal_swap_trial", arguments)).structured_content["trial"]
    forty = (await tiny_client.call_tool("causal_swap_trial", arguments | {"alpha": 40.0})).structured_content["trial"]
    assert one["status"] == forty["status"] == "executed"
    assert forty["real_edit_norm"] == pytest.approx(40 * one["real_edit_norm"], rel=1e-4)
    assert [c["edit_norm"] for c in forty["controls"]] == pytest.approx(
        [40 * c["edit_norm"] for c in one["controls"]], rel=1e-4
    )
    assert any("extrapolates" in w for w in forty["real_patch"]["warnings"])  # recorded, per edit
    too_far = error_text(await tiny_client.call_tool("causal_swap_trial", arguments | {"alpha": 101.0}))
    assert "100" in too_far


def source_active(model: LoadedModel, concept: str, layer: int) -> bool:
    from mcp_interp.core.swap.lenses import identity_lens
    from mcp_interp.core.swap.trial import edit_position, prompt_run

    lens, _ = identity_lens(model)
    ids, index = edit_position(model.tokenizer, TEMPLATE, concept, "last")
    x = prompt_run(model, ids, index, [layer]).activations[layer]
    token = model.tokenizer(" " + concept, add_special_tokens=False)["input_ids"][0]
    return token in lens.decompose(model.bridge, x, layer, k=25).support.tolist()
