"""What an agent tripped on, on compiled programs (issue 53 §4), each with its answer known by construction.

* ``relay``: each position reads the *next* one's token (layer 0) and then the previous position's result (layer 1),
  so the answer at the last position is carried by the position *before* it — before the first difference of a pair
  that differs only at the end. Attention is bidirectional, so those positions are patched and run, and every cell
  equals TransformerLens' own ``get_act_patch_resid_pre``.
* ``same_as_first``: one head (L0H0) and one MLP in one layer: no other head to draw a random baseline from, and no
  later layer for a head to act through.
* Zero-ablating the head that writes the output leaves every logit 0: a flat output, which has no top-1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformer_lens import patching as tl_patching

from mcp_interp.app.api import Session
from mcp_interp.core.engine.text.tokens import encode

RELAY = """
from tracr.rasp import rasp

after = rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == q + 1)
nxt = rasp.categorical(rasp.Aggregate(after, rasp.tokens))
before = rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == q - 1)
program = rasp.categorical(rasp.Aggregate(before, nxt))
vocab = {0, 1, 2}
max_seq_len = 4
"""
SAME_AS_FIRST = """
from tracr.rasp import rasp

first = rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == 0)
token0 = rasp.categorical(rasp.Aggregate(first, rasp.tokens))
program = rasp.categorical(rasp.SequenceMap(lambda a, b: 1 if a == b else 0, token0, rasp.tokens))
vocab = {0, 1, 2}
max_seq_len = 4
"""


def compiled(root: Path, name: str, source: str) -> Path:
    from mcp_interp.app.cli import main

    file = root / f"{name}.py"
    file.write_text(source, encoding="utf-8")
    assert main(["compile-rasp", str(file), str(root / name)]) == 0
    return root / name


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("tracr", reason="compiling needs mcp-interp[tracr] (in the dev extra)")
    root = tmp_path_factory.mktemp("trips")
    return {"relay": compiled(root, "relay", RELAY), "same_as_first": compiled(root, "same_as_first", SAME_AS_FIRST)}


@pytest.fixture(scope="module")
def relay(folders: dict[str, Path]) -> Iterator[Session]:
    session = Session(str(folders["relay"]), output_dir=folders["relay"].parent / "out-relay")
    yield session
    session.close()


@pytest.fixture(scope="module")
def same_as_first(folders: dict[str, Path]) -> Iterator[Session]:
    session = Session(str(folders["same_as_first"]), output_dir=folders["same_as_first"].parent / "out-first")
    yield session
    session.close()


def outputs(session: Session, prompts: list[str]) -> list[str]:
    """The program's value at the last position of each prompt, read from the model (no tie there)."""
    model = session.host.wait_loaded()
    batch = encode(model.tokenizer, prompts, model.device)
    logits = model.backend.logits(batch.input_ids)
    last = logits[torch.arange(len(prompts)), batch.answer_positions]
    return [model.tokenizer.decode([int(i)]) for i in last.argmax(-1)]


CLEAN, CORRUPT = ["0 1 2 1", "2 0 1 0"], ["0 1 2 2", "2 0 1 1"]  # differ at the last value only


def test_patch_runs_every_position_where_attention_is_bidirectional(relay: Session) -> None:
    """The pairs differ only at the last position; the answer there is carried by the position before it. Every
    cell, those before the first difference included, equals TransformerLens' get_act_patch_resid_pre, and the
    cell that carries the whole gap sits before the first difference (the old rule skipped it, reading 0)."""
    correct, incorrect = outputs(relay, CLEAN), outputs(relay, CORRUPT)
    assert correct != incorrect
    result = relay.patch(clean_prompts=CLEAN, corrupt_prompts=CORRUPT, correct=correct, incorrect=incorrect,
                         component="resid_pre")  # fmt: skip
    model = relay.host.wait_loaded()
    clean, corrupt = (encode(model.tokenizer, p, model.device) for p in (CLEAN, CORRUPT))
    good = torch.tensor([model.tokenizer.convert_tokens_to_ids(c) for c in correct])
    bad = torch.tensor([model.tokenizer.convert_tokens_to_ids(c) for c in incorrect])
    rows = torch.arange(len(CLEAN))

    def metric(logits: torch.Tensor) -> torch.Tensor:
        final = logits[rows, corrupt.answer_positions]
        return (final[rows, good] - final[rows, bad]).mean()

    _, cache = model.backend.bridge.run_with_cache(clean.input_ids)
    reference = tl_patching.get_act_patch_resid_pre(model.backend.bridge, corrupt.input_ids, cache, metric)
    assert result.result_uri is not None
    stored = json.loads(relay.read(result.result_uri))  # the full grids (a returned result holds scores rounded)
    ours = torch.tensor(stored["patched"], dtype=torch.float64)
    assert (ours - reference.double()).abs().max().item() < 1e-4
    first_diff = min(d[0] for d in result.differing_positions)
    assert result.skipped_positions == [] and first_diff == 4
    assert result.scores is not None
    carried = [(layer, p) for layer, row in enumerate(result.scores) for p, v in enumerate(row) if v and v > 0.99]
    assert (1, first_diff - 1) in carried  # layer 1's input at position 3 carries all of the gap
    assert any("bidirectional" in note for note in result.notes)
    listed = {(c.layer, c.position) for c in result.cells}
    assert (1, first_diff - 1) in listed and len(listed) == len(result.scores) * len(result.scores[0])


def test_a_flat_output_has_no_top1_in_answer_rank_logit_lens_and_ablate_head(relay: Session) -> None:
    """Zero-ablating L1H0 (it writes the output) leaves every output logit at 0: all tokens tie."""
    prompts = CLEAN
    correct = outputs(relay, prompts)
    ablated = relay.answer_rank(prompts=prompts, correct=correct, intervention={"ablate": ["L1H0"]})
    model = relay.host.wait_loaded()
    vocabulary = model.cfg.d_vocab
    for example in ablated.examples:
        assert example.rank == 0 and example.tied == vocabulary - 1  # every other token shares its logit
        assert example.top1_token is None and example.top1_id is None
    assert any("no single top token" in note for note in ablated.notes)
    plain = relay.answer_rank(prompts=prompts, correct=correct)
    assert [e.top1_token for e in plain.examples] == correct and all(e.tied == 0 for e in plain.examples)
    lens = relay.logit_lens(prompt=prompts[0])
    # Only layer 1's head writes the output: the embedding's and layer 0's rows are flat (a tie, not top-1)
    assert [row.target_tied > 0 for row in lens.layers] == [True, True, False]
    assert lens.first_top1_layer == 1
    assert any("shares the top logit" in note for note in lens.notes)
    head = relay.ablate_head(prompts=prompts, heads="L1H0", correct=correct, random_draws=19)
    assert head.after.rank.value == 0  # rank alone reads "still top-1"
    assert any(note.startswith("After the ablation") and "rank 0 is shared" in note for note in head.notes)


def test_one_head_no_random_baseline_and_no_later_layer(same_as_first: Session) -> None:
    """One head in the whole model: ablate_head has no random set to draw, so it shows no p and says why; explain
    says its head acts through its layer's MLP, not through later layers it does not have."""
    prompts = ["0 1 2 0", "1 1 2 1", "2 0 1 0", "0 2 2 1"]
    correct = outputs(same_as_first, prompts)
    incorrect = ["1" if c == "0" else "0" for c in correct]
    head = same_as_first.ablate_head(prompts=prompts, heads="L0H0", correct=correct, incorrect=incorrect)
    assert head.random_baseline is None
    assert any(note.startswith("No random baseline") for note in head.notes)
    assert not any("p =" in note or "p=" in note for note in head.notes)
    mlp = same_as_first.ablate(prompts=prompts, targets=["L0MLP"], correct=correct, incorrect=incorrect)
    assert mlp.random_baseline is None and any(note.startswith("No random baseline") for note in mlp.notes)
    assert not any("head unimportant" in note for note in mlp.notes)
    explained = same_as_first.explain(prompt="0 1 2 0", answer="1", baseline="0", corrupt="1 1 2 0")
    routes = [f for f in explained.findings if f.startswith("L0H0 acts")]
    assert routes and "its layer's MLP (the last layer)" in routes[0]
    assert not any("later layers" in f for f in explained.findings)


def test_attention_takes_a_head_name_or_an_index_with_its_layer(relay: Session) -> None:
    named = relay.attention(prompt="0 1 2 1", head="L1H0")
    indexed = relay.attention(prompt="0 1 2 1", layer=1, head=0)
    assert (named.layer, named.head) == (1, 0) and named.pattern == indexed.pattern
    from mcp_interp.errors import ToolCallError

    with pytest.raises(ToolCallError, match="pass `layer` too"):
        relay.attention(prompt="0 1 2 1", head=0)
    with pytest.raises(ToolCallError, match="is in layer 1, but `layer` is 0"):
        relay.attention(prompt="0 1 2 1", head="L1H0", layer=0)


def test_tokenize_top_k_gives_the_output_at_every_position_and_no_value_where_it_is_flat(relay: Session) -> None:
    """The program's value at every position, from tracr's RASP evaluator (independent of the model): relay's first
    value reads a position before it that does not exist, so the program is undefined there and the compiled model's
    output is flat (every logit 0) — predicted null; every other position's top-1 is the evaluator's value."""
    from tracr.rasp import rasp

    names: dict = {}
    exec(RELAY, names)
    prompts = ["0 1 2 1", "2 0 1", "1"]
    result = relay.tokenize(texts=prompts, top_k=3)
    for prompt, row in zip(prompts, result.texts, strict=True):
        expected = rasp.evaluate(names["program"], [int(v) for v in prompt.split()])
        assert row.predicted is not None and row.top is not None
        assert len(row.predicted) == len(row.top) == row.n_tokens == len(expected) + 1  # BOS first
        assert row.predicted[1:] == [None if e is None else str(e) for e in expected]
        assert expected[0] is None  # the flat position is really there
        for k in range(row.n_tokens):
            probs = [t.prob for t in row.top[k]]
            assert len(probs) == 3 and probs == sorted(probs, reverse=True) and 0 < probs[0] <= 1
            if row.predicted[k] is not None:
                assert row.top[k][0].token == row.predicted[k] and probs[0] > probs[1]
            else:
                assert probs[0] == pytest.approx(probs[1], abs=1e-9)
    assert any("tied top logit" in note for note in result.notes)
    plain = relay.tokenize(texts=prompts)
    assert all(row.predicted is None and row.top is None for row in plain.texts)


def test_resample_draws_from_reference_prompts(same_as_first: Session) -> None:
    """same_as_first's L0H0 writes the first value to every position; resampled from a reference prompt r, the
    output at the last position becomes [r's first value == the prompt's last value], by the program (RASP-level):
    +1 logit difference of "1" over "0" when they match, −1 otherwise."""
    prompts = ["0 1 2 0", "1 1 2 1", "2 0 1 0", "0 2 2 1"]
    references = ["2 0 0 0", "1 2 2 2", "0 0 1 1"]
    result = same_as_first.ablate(prompts=prompts, targets=["L0H0"], method="resample", reference_prompts=references,
                                  correct="1", incorrect="0", seed=0)  # fmt: skip
    assert result.permutation is not None and len(result.permutation) == len(prompts)
    assert set(result.permutation) <= set(range(len(references)))
    expected = [1.0 if references[j].split()[0] == p.split()[-1] else -1.0
                for p, j in zip(prompts, result.permutation, strict=True)]  # fmt: skip
    assert result.after.logit_diff.per_example == pytest.approx(expected, abs=1e-4)
    assert len(set(expected)) == 2  # the draw reaches both outcomes
    from mcp_interp.errors import ToolCallError

    with pytest.raises(ToolCallError, match="equal token length"):
        same_as_first.ablate(prompts=prompts, targets=["L0H0"], method="resample", reference_prompts=["0 1"],
                             correct="1", incorrect="0")  # fmt: skip
    with pytest.raises(ToolCallError, match="'mean' and 'resample'"):
        same_as_first.ablate(prompts=prompts, targets=["L0H0"], method="zero", reference_prompts=references,
                             correct="1", incorrect="0")  # fmt: skip


def test_find_circuit_names_the_components_its_pairs_cannot_test(same_as_first: Session) -> None:
    """same_as_first: L0H0 copies the first value everywhere, L0MLP compares it with each value. Pairs that change
    only the last value leave L0H0's write unchanged, so patching cannot see it, although zero-ablating it moves
    the output; find_circuit says so. Pairs that change the first value test it, and the note names nothing."""
    clean = ["0 1 2 0", "1 1 2 1", "2 0 1 2", "0 2 2 0"]
    last = ["0 1 2 1", "1 1 2 0", "2 0 1 0", "0 2 2 1"]  # the last value changed: the answer flips
    correct = outputs(same_as_first, clean)
    incorrect = outputs(same_as_first, last)
    assert all(c != i for c, i in zip(correct, incorrect, strict=True))
    found = same_as_first.find_circuit(clean_prompts=clean, corrupt_prompts=last, correct=correct,
                                       incorrect=incorrect, held_out=0)  # fmt: skip
    [note] = [n for n in found.notes if n.startswith("Untested by these pairs")]
    assert note.startswith("Untested by these pairs: L0H0 write")
    ablated = same_as_first.ablate(prompts=clean, targets=["L0H0"], correct=correct, incorrect=incorrect)
    assert ablated.after.logit_diff.value < ablated.before.logit_diff.value - 0.5  # needed, though untested
    first = ["1 1 2 0", "0 1 2 1", "0 0 1 2", "1 2 2 0"]  # the first value changed: the answer flips too
    incorrect_first = outputs(same_as_first, first)
    assert all(c != i for c, i in zip(correct, incorrect_first, strict=True))
    tested = same_as_first.find_circuit(clean_prompts=clean, corrupt_prompts=first, correct=correct,
                                        incorrect=incorrect_first, held_out=0)  # fmt: skip
    assert not any(n.startswith("Untested") for n in tested.notes)


def test_explain_maps_the_mlp_that_writes_the_answer_in_a_one_layer_model(same_as_first: Session) -> None:
    """The pair differs at the first value; L0H0 moves it to the answer position inside layer 0, where L0MLP writes
    the answer. No resid_pre cell of the answer position sees that (layer 0's input there is the same clean and
    corrupt), yet patching L0MLP's output there restores the whole gap: the program's output is L0MLP's write."""
    explained = same_as_first.explain(prompt="0 1 2 0", answer="1", baseline="0", corrupt="1 1 2 0")
    answer_position = len(explained.map_tokens) - 1
    assert explained.resid_pre_map[0][answer_position] == pytest.approx(0.0, abs=1e-6)
    cells = {(c.layer, c.position): c.score for c in explained.top_mlps}
    assert cells[(0, answer_position)] == pytest.approx(1.0, abs=1e-3)
    mlp_line = next(f for f in explained.findings if f.startswith("MLPs that write it"))
    assert f"L0 MLP at '0' (position {answer_position}) +1.00" in mlp_line
