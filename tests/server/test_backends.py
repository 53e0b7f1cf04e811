"""The same numbers from every engine, on the real embedded model (SmolLM2-135M-Instruct), through an MCP client:

* ``--backend inspect`` (TransformerLens' RemoteBridge on Inspect's HF provider: whole forwards from tokens with
  captures and set/add/scale/suppress edits) — every tool that runs there equals the in-memory transformers backend
  to ≤ 1e-4, and every other tool is refused naming the backend and what it lacks;
* ``--device-map auto --max-memory '{"cpu": "300MiB"}' --offload-folder DIR`` — accelerate puts about half of the
  model on disk and TransformerLens materialises it around each call — every tool equals the in-memory model to
  ≤ 1e-5, gradient tools and edge tools included.

Each tool is called once per engine with the same arguments and every number of its structured result is compared
(provenance, timings, handles and the engine's name excluded); the tables say which tools each engine runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.options import LoadOptions
from mcp_interp.host import ModelHost
from mcp_interp.mcp.server import build_server
from tests.features.test_sae import random_weights, write_sae
from tests.graphs.common import plt_weights, write_plt
from tests.helpers import complete_result, error_text

pytestmark = [pytest.mark.embedded, pytest.mark.anyio]

CLEAN = ["When Mary and John went to the store, John gave a drink to", "When Tom and James went to the park, James"
         " gave a ball to"]  # fmt: skip
CORRUPT = ["When Mary and John went to the store, Mary gave a drink to", "When Tom and James went to the park, Tom"
           " gave a ball to"]  # fmt: skip
GOOD, BAD = [" Mary", " Tom"], [" John", " James"]
PAIRS = {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT, "correct": GOOD, "incorrect": BAD}
# Fields that say where or when a number was made, not what it is.
SKIP = {"run_id", "elapsed_s", "model", "load_seconds", "notes", "sweep", "backend", "device_map", "capabilities",
        "figure_uri", "figure_uris", "result_uri", "direction_uri", "graph_uri", "report_uri", "circuit_uri",
        "artifact_path", "job", "timing", "seconds", "examples_uri", "explanation_uri",
        "output_tokens", "engine_requests", "rows"}  # fmt: skip  # output_tokens: read from local weights (inspect: a
# note says why absent); engine_requests and rows: how a remote backend sent the work (local backends: none)


def texts_and_labels() -> tuple[list[str], list[str]]:
    subjects = ["dog", "cat", "bird", "horse", "child", "teacher"]
    texts = [f"The {s} near the tree" for s in subjects] + [f"The {s}s near the tree" for s in subjects]
    return texts * 2, (["singular"] * 6 + ["plural"] * 6) * 2


def calls(folders: dict[str, str], n_layers: int = 30, n_heads: int = 9, d_model: int = 576) -> list[tuple[str, Any]]:
    """One call of every tool the engines are compared on, with small inputs (2 pairs of ~15 tokens, a few layers) so
    the slowest engine stays in seconds. The layers and heads are placed by the model's shape (SmolLM2's by default;
    ``scripts/gpu_check.py`` runs the same table on other models)."""
    third, half, last = n_layers // 3, n_layers // 2, n_layers - 1
    direction = [1.0] + [0.0] * (d_model - 1)
    head_a, head_b = f"L{third}H{n_heads - 2}", f"L{third + 2}H{min(2, n_heads - 1)}"
    texts, labels = texts_and_labels()
    return [
        ("model_info", {}),
        ("tokenize", {"texts": CLEAN}),
        (
            "logit_diff",
            {
                "prompts": CLEAN,
                "correct": GOOD,
                "incorrect": BAD,
                "intervention": {"ablate": [head_a, f"L{2 * third}MLP"], "method": "mean"},
            },
        ),
        ("kl", {"prompts": CLEAN, "compare_prompts": CORRUPT}),
        ("answer_rank", {"prompts": CLEAN, "correct": [" Mary Smith", " Tom"]}),
        ("loss", {"texts": CLEAN, "intervention": {"ablate": ["L1H1"], "method": "resample"}}),
        (
            "ablate_head",
            {"prompts": CLEAN, "heads": [head_a, head_b], "correct": GOOD, "incorrect": BAD, "random_draws": 19},
        ),
        (
            "ablate",
            {
                "prompts": CLEAN[:1],
                "targets": [{"layer": half, "direction": direction}],
                "correct": GOOD[:1],
                "incorrect": BAD[:1],
                "positions": "last",
                "random_draws": 19,
            },
        ),
        ("patch_heads", {**PAIRS, "heads": [f"L{third}H{h}" for h in range(n_heads)]}),
        ("patch", {**PAIRS, "component": "resid_pre", "layers": [0, half, last]}),
        (
            "steer",
            {
                "prompt": CLEAN[0],
                "coefficient": 4.0,
                "positive": " happy",
                "negative": " sad",
                "max_new_tokens": 2,
                "random_draws": 19,
                "concept": [" joy", " smile"],
            },
        ),
        ("probe", {"texts": texts, "labels": labels, "layers": [half]}),
        ("sae", {"text": CLEAN[0], "sae": folders["sae"]}),
        ("sae_features", {"texts": CLEAN, "sae": folders["sae"], "features": [0, 3]}),
        ("feature_examples", {"feature": {"layer": half, "direction": direction}, "texts": [*CLEAN, *CORRUPT]}),
        (
            "score_explanation",
            {
                "feature": {"sae": folders["sae"], "feature": 3},
                "explanation": "names",
                "activating_texts": CLEAN,
                "non_activating_texts": CORRUPT,
            },
        ),
        ("attention", {"prompt": CLEAN[0], "layer": third, "head": n_heads - 2}),
        ("induction", {"seq_len": 6, "n_seqs": 2}),
        ("logit_lens", {"prompt": CLEAN[0], "target": " Mary"}),
        ("dla", {"prompt": CLEAN[0], "answer": " Mary", "baseline": " John"}),
        ("patch_heads", {**PAIRS, "method": "attribution", "heads": [head_a, head_b]}),
        ("edge_attribution", {**PAIRS, "top_k": 10}),
        ("path_patch", {**PAIRS, "sender": head_a, "receivers": [f"L{third + 1}H0", head_b]}),
        ("circuit_faithfulness", {**PAIRS, "top_k": 10, "random_circuits": 19}),
        ("attribution_graph", {"prompt": CLEAN[0], "transcoders": folders["transcoders"], "max_feature_nodes": 10}),
    ]


def folders_at(
    root: Path, model: LoadedModel | str = "smollm2-135m", d_model: int = 576, n_layers: int = 30
) -> dict[str, str]:
    """A random SAE (on the middle layer's resid_post) and random per-layer transcoders for a model of this shape."""
    half = n_layers // 2
    sae = write_sae(
        root / "sae", random_weights(16, seed=4, d_in=d_model, scale=0.05), f"blocks.{half}.hook_resid_post"
    )
    transcoders = write_plt(root / "transcoders", plt_weights(n_layers, d_model, 8, seed=5))
    return {"sae": str(sae), "transcoders": transcoders}


# What the inspect backend refuses, and the feature each refusal names (from what a RemoteBridge is: no gradients,
# no local weights, no per-head write points).
INSPECT_REFUSES = {
    "logit_lens": "the model's weights",
    "dla": "the model's weights",
    "edge_attribution": "gradients",
    "path_patch": "per-head writes and per-reader inputs",
    "circuit_faithfulness": "per-head writes and per-reader inputs",
    "attribution_graph": "gradients",
}
INSPECT_REFUSED_OPTIONS = {("patch_heads", "attribution"): "gradients"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return folders_at(tmp_path_factory.mktemp("backends"))


@pytest.fixture(scope="module")
def inspect_model() -> LoadedModel:
    return load_model("smollm2-135m", options=LoadOptions(backend="inspect"))


@pytest.fixture(scope="module")
def offloaded_model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    folder = tmp_path_factory.mktemp("offload")
    options = LoadOptions(device_map="auto", max_memory={"cpu": "300MiB"}, offload_folder=str(folder))
    return load_model("smollm2-135m", options=options)


async def run_all(model: LoadedModel, tmp: Path, folders: dict[str, str]) -> AsyncIterator[tuple[str, Any]]:
    session = ModelHost(model.name, tmp, loader=lambda name, device, dtype: model)
    async with Client(build_server(session)) as client:
        for name, args in calls(folders):
            result = await client.call_tool(name, args)
            if name in ("patch", "patch_heads") and result.structured_content is not None:
                # their grids are only in the complete result (result://): compare those whole, as before
                result.structured_content = await complete_result(client, result.structured_content)
            yield name, result


def identity(entry: Any) -> str:
    """What names an entry of a ranked list (its head, layer, position, tokens…): its fields that are not floats."""
    if not isinstance(entry, dict):
        return ""
    return repr(sorted((k, v) for k, v in entry.items() if isinstance(v, str | int) and not isinstance(v, bool)))


def numbers(value: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """Every number of a result by where it is; entries of a list of records by what names them, so a ranking whose
    near-ties (|Δ| ~ 1e-7) order differently on two engines still compares entry with entry."""
    if isinstance(value, dict):
        for key, sub in value.items():
            if key not in SKIP:
                yield from numbers(sub, f"{path}.{key}")
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        yield f"{path}.length", float(len(value))
        for sub in value:
            yield from numbers(sub, f"{path}[{identity(sub)}]")
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from numbers(sub, f"{path}[{i}]")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield path, float(value)


def worst_difference(ours: dict[str, Any], reference: dict[str, Any]) -> tuple[float, str]:
    """The largest |difference| of the numbers both results hold. A top-N list cut among tied entries (cells that
    patch nothing score exactly 0) may keep different ones on two engines: its entries are matched by name, its length
    compared, and only entries of such lists may be in one result alone (the full grids are compared whole)."""
    a, b = dict(numbers(ours)), dict(numbers(reference))
    only = a.keys() ^ b.keys()
    assert all("[[" in key for key in only), sorted(only)[:5]
    shared = a.keys() & b.keys()
    assert shared, "a result without numbers compares nothing"
    return max((abs(a[k] - b[k]), k) for k in shared)


@pytest.fixture(scope="module")
def reference(embedded: LoadedModel, folders: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """Every call on the in-memory transformers backend: what each engine is compared with (run once)."""

    async def run() -> list[Any]:
        return [result async for _, result in run_all(embedded, tmp_path_factory.mktemp("local"), folders)]

    return anyio.run(run)


async def compare(engine: LoadedModel, reference: list[Any], tmp: Path, folders: dict[str, str]) -> list[Any]:
    ours = [(n, r) async for n, r in run_all(engine, tmp / engine.options.backend, folders)]
    return [(name, mine, theirs) for (name, mine), theirs in zip(ours, reference, strict=True)]


async def test_every_tool_on_inspect_equals_the_transformers_backend_or_is_refused_by_name(
    embedded: LoadedModel, inspect_model: LoadedModel, reference: list[Any], folders: dict[str, str], tmp_path: Path
) -> None:
    assert inspect_model.fingerprint == embedded.fingerprint  # the same weights, read from the checkpoint
    results = await compare(inspect_model, reference, tmp_path, folders)
    for (name, args), (_, mine, theirs) in zip(calls(folders), results, strict=True):
        assert not theirs.is_error, (name, error_text(theirs))
        refusal = INSPECT_REFUSES.get(name) or INSPECT_REFUSED_OPTIONS.get((name, args.get("method", "")))
        if refusal is not None:  # decided by the table above, not by the result
            text = error_text(mine)
            assert mine.is_error and refusal in text and "inspect backend" in text, (name, text[:300])
            assert "--backend transformers" in text
            continue
        assert not mine.is_error, (name, error_text(mine))
        if name == "steer":
            difference, where = worst_difference_outside(mine.structured_content, theirs.structured_content,
                                                         STAND_IN_DRAWS)  # fmt: skip
            assert difference <= 1e-4, (name, where, difference)
            for field in STAND_IN_DRAWS:
                drawn = [field_of(c.structured_content, field) for c in (mine, theirs)]
                assert drawn[0] == pytest.approx(drawn[1], rel=1e-3, abs=1e-3), (name, field)
            continue
        difference, where = worst_difference(mine.structured_content, theirs.structured_content)
        assert difference <= 1e-4, (name, where, difference)


def field_of(value: Any, path: str) -> Any:
    for key in path.strip(".").split("."):
        value = value[key]
    return value


# steer's stand-ins are differences of two texts' residuals read on the engine itself, normalised: for one-token
# texts on SmolLM2 (" happy" − " sad": position 0, the attention sink, where residuals are large and nearly equal)
# the difference cancels most digits, so the engines' float32 rounding reaches the stand-ins' KLs at ~2e-4.
STAND_IN_DRAWS = (".random_next_token_kl", ".concept_baseline.draws")


def worst_difference_outside(mine: Any, theirs: Any, fields: tuple[str, ...]) -> tuple[float, str]:
    """The worst difference among the fields not at the paths ``fields`` (those compared apart)."""
    return worst_difference(without(mine, fields), without(theirs, fields))


def without(value: Any, fields: tuple[str, ...], path: str = "") -> Any:
    if isinstance(value, dict):
        return {k: without(v, fields, f"{path}.{k}") for k, v in value.items() if f"{path}.{k}" not in fields}
    return value


async def test_every_tool_with_half_the_model_on_disk_equals_the_model_in_memory(
    embedded: LoadedModel, offloaded_model: LoadedModel, reference: list[Any], folders: dict[str, str], tmp_path: Path
) -> None:
    placement = offloaded_model.backend.placement()
    assert placement is not None
    on_disk = sum(device == "disk" for device in placement.values())
    assert 0.3 * len(placement) <= on_disk <= 0.8 * len(placement), placement  # about half on disk
    assert offloaded_model.fingerprint == embedded.fingerprint
    for name, mine, theirs in await compare(offloaded_model, reference, tmp_path, folders):
        assert not mine.is_error and not theirs.is_error, (name, error_text(mine) or error_text(theirs))
        difference, where = worst_difference(mine.structured_content, theirs.structured_content)
        assert difference <= 1e-5, (name, where, difference)
