"""Known answers: RASP programs compiled by tracr, served through TransformerLens' tracr bridge.

Every expected value here comes from outside the server's measuring code: tracr's own forward pass
(``assembled.apply``), tracr's weights (``assembled.params``), or the RASP program evaluated by tracr's evaluator.
"""

from __future__ import annotations

import json
import random
import re
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch

from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.options import LoadOptions
from mcp_interp.core.engine.backend.points import hook_attn_out, hook_mlp_out
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.engine.text.answers import parse_answer
from mcp_interp.core.engine.text.tokens import encode, token_ids
from mcp_interp.core.readouts.info import model_info
from mcp_interp.errors import InputError
from tests.known.conftest import EXAMPLES, Program

RESIDUAL_TOLERANCE = 1e-5


def random_inputs(program: Program, lengths: tuple[int, ...], n: int, seed: int = 0) -> list[list[object]]:
    rng = random.Random(seed)
    return [[rng.choice(program.values) for _ in range(lengths[i % len(lengths)])] for i in range(n)]


def prompt(xs: list[object]) -> str:
    return " ".join(str(x) for x in xs)


# --- compile-rasp end to end --------------------------------------------------------------------------------


def test_compile_rasp_writes_a_folder_the_server_boots_and_answers_as_the_program(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tracr")
    from mcp_interp.app.cli import main

    out = tmp_path / "hist"
    assert main(["compile-rasp", str(EXAMPLES / "histogram.py"), str(out)]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["ground_truth"]["output"]["name"] == "hist" and facts["ground_truth"]["program_file"] == "histogram.py"
    assert facts["bridge_config"]["attention_dir"] == "bidirectional"
    files = {"model.safetensors", "compiled_program.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "vocabulary.json", "ground_truth.json"}  # fmt: skip
    assert {p.name for p in out.iterdir()} <= files and {"model.safetensors", "ground_truth.json"} <= files
    # only ground_truth.json names a node or the program: the rest is what a hidden serve reads
    truth = json.loads((out / "ground_truth.json").read_text())
    assert truth["output"]["name"] == "hist" and truth["program_file"] == "histogram.py"
    for name in files - {"ground_truth.json", "model.safetensors"}:
        if (out / name).is_file():
            text = (out / name).read_text()
            assert "hist" not in text and "histogram" not in text, name
    vocabulary = json.loads((out / "vocabulary.json").read_text())
    assert vocabulary["input"] == ["a", "b", "c"] and vocabulary["output"] == ["0", "1", "2", "3", "4", "5"]
    program = runpy.run_path(str(EXAMPLES / "histogram.py"))["program"]
    model = load_model(str(out))
    inputs = [list(s) for s in ("abcab", "aaaaa", "cb", "c", "bbcab")]
    batch = encode(model.tokenizer, [prompt(xs) for xs in inputs])
    logits = model.backend.logits(batch.input_ids)
    for row, xs in enumerate(inputs):
        top = model.tokenizer.convert_ids_to_tokens(logits[row, 1 : len(xs) + 1].argmax(-1).tolist())
        assert top == [str(v) for v in program(xs)]  # tracr's evaluator, not the model


def test_a_program_that_does_not_compile_is_refused_naming_the_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tracr")
    from mcp_interp.app.cli import main

    bad = tmp_path / "bad.py"
    bad.write_text(
        "from tracr.rasp import rasp\n"
        "program = rasp.categorical(rasp.Map(lambda x: 12 // x, rasp.tokens)).named('twelve_over')\n"
        "vocab = {0, 1, 2}\nmax_seq_len = 3\n"
    )
    assert main(["compile-rasp", str(bad), str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert "at node twelve_over_" in error and "ZeroDivisionError" in error
    assert not (tmp_path / "out").exists()
    missing = tmp_path / "missing.py"
    missing.write_text("from tracr.rasp import rasp\nprogram = rasp.tokens\n")
    assert main(["compile-rasp", str(missing), str(tmp_path / "out")]) == 1
    assert "does not define vocab, max_seq_len" in capsys.readouterr().err


# --- the forward pass is tracr's ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["histogram", "two_branch", "shift_two"])
def test_every_residual_and_every_decoded_output_equal_tracrs_forward(programs: dict[str, Program], name: str) -> None:
    """One right-padded batch of mixed lengths (the padding masked) against tracr's forward of each unpadded input:
    the residual after every attention and MLP half-layer to 1e-5, the decoded output at every position identical,
    and equal to the RASP program's own value there."""
    program = programs[name]
    n_max = program.compiled.max_seq_len
    inputs = random_inputs(program, (n_max, 2, n_max - 1), 12)
    model = program.model
    batch = encode(model.tokenizer, [prompt(xs) for xs in inputs])
    assert int((batch.attention_mask == 0).sum()) > 0, "the batch must be padded to test the mask"
    points = [f"blocks.{layer}.hook_resid_{half}" for layer in range(model.cfg.n_layers) for half in ("mid", "post")]
    run = model.backend.run(batch.input_ids, capture=points)
    assert run.logits is not None
    worst = 0.0
    for row, xs in enumerate(inputs):
        reference = program.compiled.assembled.apply([program.compiled.compiler_bos, *xs])
        width = len(xs) + 1
        for point, residual in zip(points, reference.residuals, strict=True):
            worst = max(worst, float(np.abs(np.asarray(residual[0]) - run.acts[point][row, :width].numpy()).max()))
        decoded = model.tokenizer.convert_ids_to_tokens(run.logits[row, 1:width].argmax(-1).tolist())
        assert decoded == [str(v) for v in reference.decoded[1:]]
        assert decoded == [str(v) for v in program.compiled.program(xs)]
    assert worst <= RESIDUAL_TOLERANCE


# --- exact patching finds the known circuit and nothing else --------------------------------------------------


@pytest.mark.parametrize("name", ["histogram", "two_branch", "shift_two"])
def test_exact_patching_puts_the_whole_effect_on_the_known_components(programs: dict[str, Program], name: str) -> None:
    """Every attn_out and mlp_out cell (layer × position): a cell computing a unit of the known circuit recovers what
    RASP-level patching of that unit predicts; every other cell recovers nothing beyond 1e-4; the output's own
    component at the answer position recovers the whole gap."""
    from mcp_interp.core.known.families import cell_units, make_family, rasp_score
    from mcp_interp.core.localize.patch import PatchJob

    program = programs[name]
    n_max = program.compiled.max_seq_len
    families = [f for p in range(n_max) if (f := make_family(program.compiled.program, program.values, n_max, p,
                                                             program.truth, pairs=4)) is not None]  # fmt: skip
    assert families
    units = cell_units(program.truth)
    output = next(e for e in program.truth if e["output"])
    checked_known = 0
    for family in families[:2]:
        known = {cell for cell in family.model.cells if cell[0] != "embed"}
        for component, half in (("attn_out", "attn"), ("mlp_out", "mlp")):
            job = PatchJob(model=program.model, **family.inputs(), component=component)
            drain(job)
            assert job.result is not None and job.result.scores is not None
            for layer, row in enumerate(job.result.scores):
                for position, score in enumerate(row):
                    assert score is not None
                    if (half, layer, position) in known:
                        expected = rasp_score(program.compiled.program, family, units[(half, layer)], position)
                        if expected is not None:  # None: the patched program is undefined in RASP
                            assert score == pytest.approx(expected, abs=1e-3), (half, layer, position)
                            checked_known += 1
                    else:
                        assert abs(score) <= 1e-4, (half, layer, position, score)
        last = output["writes"][-1]
        half = "mlp" if last.endswith("MLP") else "attn"
        layer = int(last[1:].split("H")[0].split("M")[0])
        assert (half, layer, n_max) in known
    assert checked_known > 0


# --- ground_truth.json is what tracr's weights do -------------------------------------------------------------


@pytest.mark.parametrize("name", ["histogram", "two_branch", "shift_two"])
def test_ground_truth_names_the_sublayers_tracrs_model_writes_each_node_with(
    programs: dict[str, Program], name: str
) -> None:
    """From tracr's own parameters: the residual dimensions each head's output projection and each MLP's second
    layer write; every node's dimensions are written by exactly the components ground_truth.json names. And from
    the served model's activations on many inputs: those components, and no other, write there."""
    program = programs[name]
    params = program.compiled.assembled.params
    config = program.compiled.assembled.model_config
    written: dict[str, set[int]] = {}
    for layer in range(config.num_layers):
        linear = np.asarray(params[f"transformer/layer_{layer}/attn/linear"]["w"])  # [heads·key_size, d_model]
        for head in range(config.num_heads):
            rows = linear[head * config.key_size : (head + 1) * config.key_size]
            written[f"L{layer}H{head}"] = set(np.nonzero(np.abs(rows).sum(0))[0].tolist())
        down = np.asarray(params[f"transformer/layer_{layer}/mlp/linear_2"]["w"])  # [d_mlp, d_model]
        written[f"L{layer}MLP"] = set(np.nonzero(np.abs(down).sum(0))[0].tolist())

    model = program.model
    inputs = random_inputs(program, (program.compiled.max_seq_len, 2), 24, seed=3)
    batch = encode(model.tokenizer, [prompt(xs) for xs in inputs])
    n_layers = int(model.cfg.n_layers)
    points = [f"blocks.{layer}.attn.hook_result" for layer in range(n_layers)]
    points += [hook_mlp_out(layer) for layer in range(n_layers)]
    with model.backend.edge_points():
        run = model.backend.run(batch.input_ids, capture=points)
    real = batch.attention_mask.bool()
    active: dict[str, set[int]] = {}
    for layer in range(n_layers):
        result = run.acts[f"blocks.{layer}.attn.hook_result"][real]  # [tokens, heads, d_model]
        for head in range(result.shape[1]):
            active[f"L{layer}H{head}"] = set(torch.nonzero(result[:, head].abs().amax(0) > 1e-6).flatten().tolist())
        mlp = run.acts[hook_mlp_out(layer)][real]
        active[f"L{layer}MLP"] = set(torch.nonzero(mlp.abs().amax(0) > 1e-6).flatten().tolist())

    checked = 0
    for node in program.truth:
        dims = set(node["residual_dims"])
        if not dims or node["writes"] == ["embed"]:
            continue
        assert {c for c, rows in written.items() if rows & dims} == set(node["writes"]), node["label"]
        assert {c for c, rows in active.items() if rows & dims} == set(node["writes"]), node["label"]
        checked += 1
    assert checked >= 1


def test_edge_hooks_run_the_native_attention_head_by_head_without_changing_it(programs: dict[str, Program]) -> None:
    model = programs["two_branch"].model
    batch = encode(model.tokenizer, ["0 1 2 3 1", "2 2 1", "3 0 0 1 2"])
    plain = model.backend.run(batch.input_ids, capture=[hook_attn_out(0)])
    with model.backend.edge_points():
        split = model.backend.run(batch.input_ids, capture=[hook_attn_out(0), "blocks.0.attn.hook_result"])
    assert plain.logits is not None and split.logits is not None
    assert float((plain.logits - split.logits).abs().max()) == 0.0
    per_head = split.acts["blocks.0.attn.hook_result"]
    assert per_head.shape[2] == 2
    assert float((per_head.sum(2) - split.acts[hook_attn_out(0)]).abs().max()) < 1e-6


# --- what the server says and refuses ---------------------------------------------------------------------------


def test_model_info_says_it_is_a_compiled_program_and_keeps_its_ground_truth_back(
    programs: dict[str, Program],
) -> None:
    program = programs["histogram"]
    info = model_info(program.model)
    assert info.name == "compiled-program" and str(program.folder) not in info.model_dump_json()
    assert info.program is not None and info.program.output is None and info.program.n_nodes is None
    assert info.program.output_values == ["0", "1", "2", "3", "4", "5"] and info.program.ground_truth is None
    assert "ground_truth" not in json.dumps(info.model_dump(mode="json", exclude_none=True))
    assert "hist" not in info.model_dump_json()  # the output node's label, hist_1, is the truth's
    assert info.architecture == "TracrProgram" and info.prepends_bos
    [available] = [c for c in info.capabilities if c.available and c.option is None]  # one entry, every tool
    assert "sae" in available.tools  # the tool itself; the SAE option is refused:
    dictionaries = next(c for c in info.capabilities if c.option == "an SAE or transcoders")
    assert not dictionaries.available
    assert dictionaries.missing_feature == "a trained language model (text in, next token out)"
    for tool in ("loss", "steer", "induction", "feature_examples"):
        entry = next(c for c in info.capabilities if c.tools == [tool] and c.option is None)
        assert not entry.available, tool
    for tool in ("edge_attribution", "find_circuit", "patch_heads", "dla", "explain"):
        assert tool in available.tools, tool
    # each capability said once: no option lists a tool refused outright (loss under head targets, say), no SAE site
    # reads as available beside "no trained SAEs", no refusal points to a refused tool (induction → loss)
    refused = {t for c in info.capabilities if c.option is None and not c.available for t in c.tools}
    assert {"loss", "steer", "induction", "feature_examples", "score_explanation"} <= refused
    assert not any(set(c.tools) & refused for c in info.capabilities if c.option is not None)
    sae_sites = [c for c in info.capabilities if (c.option or "").startswith("an SAE on ")]
    assert sae_sites and not any(c.available for c in sae_sites)
    for entry in info.capabilities:
        if not entry.available:
            named = set(re.findall(r"\b[a-z_]+\b", (entry.reason or "").split(".")[-2]))
            assert not named & refused, (entry.tools, entry.option, entry.reason)
    assert len(info.model_dump_json(exclude_none=True)) < 10_000
    revealed = load_model(str(program.folder), options=LoadOptions(reveal_ground_truth=True))
    shown = model_info(revealed)
    assert shown.name == str(program.folder)
    assert shown.program is not None and shown.program.ground_truth == program.truth
    assert shown.program.output is not None and shown.program.output.startswith("hist_")
    assert shown.program.n_nodes == len(program.truth) and "(output hist_" in shown.notes[0]


def test_prompts_are_input_values_and_answers_output_values(programs: dict[str, Program]) -> None:
    tokenizer = programs["histogram"].model.tokenizer
    ids = token_ids(tokenizer, "a b c")
    assert tokenizer.convert_ids_to_tokens(ids) == ["BOS", "a", "b", "c"]
    with pytest.raises(InputError, match="'d' is not an input value"):
        token_ids(tokenizer, "a d")
    with pytest.raises(InputError, match="at most 5"):
        token_ids(tokenizer, "a b c a b c")
    assert parse_answer(tokenizer, " 2", "correct").alternatives == parse_answer(tokenizer, "2", "correct").alternatives
    with pytest.raises(InputError, match="not one output value"):
        parse_answer(tokenizer, "a", "correct")
    with pytest.raises(InputError, match="not one output value"):
        parse_answer(tokenizer, "1 2", "correct")
