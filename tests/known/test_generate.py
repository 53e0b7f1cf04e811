"""``generate-rasp`` (issue 53 §2): programs no one has seen, deterministic by seed, each with its ground truth, a
reference implementation that needs no tracr, and its task; what is served computes what the reference says."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.text.tokens import encode

FILES = ("model.safetensors", "compiled_program.json", "vocabulary.json", "ground_truth.json", "task.json",
         "reference.py")  # fmt: skip


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("tracr", reason="generate-rasp needs mcp-interp[tracr] (in the dev extra)")
    from mcp_interp.app.cli import main

    root = tmp_path_factory.mktemp("generated")
    assert main(["generate-rasp", "--seed", "0", "--count", "2", str(root / "many")]) == 0
    assert main(["generate-rasp", "--seed", "1", str(root / "again")]) == 0  # after other programs were built
    return {"seed_0": root / "many" / "seed_0", "seed_1": root / "many" / "seed_1", "again_1": root / "again"}


def test_a_seed_gives_the_same_folder_byte_for_byte(generated: dict[str, Path]) -> None:
    """tracr's labels come from a process-wide counter; pinned to the tree, the same seed writes the same bytes
    whatever was built before it in the process."""
    for name in FILES:
        assert (generated["seed_1"] / name).read_bytes() == (generated["again_1"] / name).read_bytes(), name


def test_two_seeds_give_two_programs_each_with_its_ground_truth(generated: dict[str, Path]) -> None:
    tasks = [json.loads((generated[s] / "task.json").read_text()) for s in ("seed_0", "seed_1")]
    references = [(generated[s] / "reference.py").read_text() for s in ("seed_0", "seed_1")]
    assert references[0] != references[1]
    for seed, task in zip((0, 1), tasks, strict=True):
        truth = json.loads((generated[f"seed_{seed}"] / "ground_truth.json").read_text())
        assert task["seed"] == seed and 1 <= task["depth"] <= 4 and task["input_values"] == [0, 1, 2, 3]
        assert truth["output"]["components"] and truth["n_nodes"] == len(truth["nodes"]) >= 2


@pytest.mark.parametrize("seed", ["seed_0", "seed_1"])
def test_the_served_program_computes_what_its_reference_says(generated: dict[str, Path], seed: str) -> None:
    """On held-out random inputs (not the ones the generator checked), the served model's top output value at the
    last position equals the reference's, wherever the reference is defined; the reference runs without tracr."""
    from mcp_interp.core.known.generate import load_reference

    folder = generated[seed]
    reference = load_reference((folder / "reference.py").read_text())
    model = load_model(str(folder))
    rng = random.Random(f"held out {seed}")
    inputs = [[rng.choice([0, 1, 2, 3]) for _ in range(rng.randint(1, 5))] for _ in range(60)]
    defined = [xs for xs in inputs if reference(xs)[-1] is not None]
    assert len(defined) >= 20
    batch = encode(model.tokenizer, [" ".join(map(str, xs)) for xs in defined], model.device)
    logits = model.backend.logits(batch.input_ids)[torch.arange(len(defined)), batch.answer_positions]
    served = model.tokenizer.convert_ids_to_tokens(logits.argmax(-1).tolist())
    assert served == [str(reference(xs)[-1]) for xs in defined]
    assert len({reference(xs)[-1] for xs in defined}) >= 2  # not a constant function
    assert model.name == "compiled-program"  # served with its truth hidden, like any compiled program
