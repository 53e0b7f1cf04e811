"""Probes and stored directions (features family): the probe's statistics on constructed data (model-free,
seeded simulations of the interval's coverage and power), the residuals it reads against a per-text loop on
`tiny`, direction ablation against a hand projection hook, the random-direction baselines, `steer` along a
stored direction, and `probe` → `direction://` → `ablate` over a real stdio session."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mcp_interp.core.engine.stats import clopper_pearson
from mcp_interp.core.engine.tokens import encode
from mcp_interp.core.features import probe
from mcp_interp.errors import InputError
from mcp_interp.models import LoadedModel

COUNTRIES = ["france", "germany", "italy", "spain", "canada", "japan", "china", "india", "egypt", "brazil"]
CITIES = ["paris", "berlin", "rome", "madrid", "ottawa", "tokyo", "beijing", "delhi", "cairo", "lima"]
NAMES = ["mary", "john", "tom", "alice", "bob", "kate"]


def places() -> tuple[list[str], list[str]]:
    texts, labels = [], []
    for name in NAMES:
        for country, city in zip(COUNTRIES, CITIES, strict=True):
            texts += [f"{name} went to {country}", f"{name} went to {city}"]
            labels += ["country", "city"]
    return texts, labels


# --- the probe's statistics, model-free ---------------------------------------------------------------


def signal_data(n: int, d: int, strength: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian noise with the label in coordinate 3 only: x_3 += strength · (2y − 1)."""
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1], n // 2)
    x = rng.normal(size=(n, d))
    x[:, 3] += strength * (2 * y - 1)
    return x, y


@pytest.mark.parametrize("method", ["logistic", "diff_means"])
def test_a_probe_finds_the_coordinate_that_carries_the_label(method: str) -> None:
    x, y = signal_data(400, 32, 4.0, seed=0)
    split = probe.stratified_split(y, 0.25, seed=0)
    fit = probe.fit_probe(x, y, split, method)  # type: ignore[arg-type]
    assert fit.n_test == 100 and fit.accuracy >= 0.97
    unit = fit.direction / np.linalg.norm(fit.direction)
    assert unit[3] > 0.9  # points toward class 1, along coordinate 3
    control = probe.fit_probe(x, probe.permuted_control(y, 1), split, method)  # type: ignore[arg-type]
    assert fit.accuracy - control.accuracy > 0.3
    assert 0.35 <= control.accuracy <= 0.65


def test_diff_means_survives_a_dominant_nuisance_balanced_against_the_label() -> None:
    """A factorial design like subject_number: 20 nuisance values (the token read, norm 30) each with both labels,
    the label a 0.5-unit shift in one coordinate. The split leaves a chance imbalance of nuisance values between
    the training classes, the held-out part the opposite one, so the plain projection on μ₁ − μ₀ classifies near
    or below chance; under the shared covariance the label is read (≥ 0.9). The stored direction is still
    μ₁ − μ₀, dominated by coordinate 3 once the nuisance averages out over all texts."""
    rng = np.random.default_rng(0)
    nuisance = np.repeat(np.arange(20), 10)
    y = np.tile([0, 1], 100)
    x = 30.0 * np.eye(40)[nuisance] + rng.normal(scale=0.3, size=(200, 40))
    x[:, 39] = 0.0
    x[:, 39] += 0.5 * (2 * y - 1)
    split = probe.stratified_split(y, 0.25, seed=0)
    fit = probe.fit_probe(x, y, split, "diff_means")
    assert fit.accuracy >= 0.9
    projection = x[split.test] @ fit.direction
    threshold = (x[split.train][y[split.train] == 1] @ fit.direction).mean() / 2 + (
        x[split.train][y[split.train] == 0] @ fit.direction
    ).mean() / 2
    plain = float(((projection > threshold).astype(int) == y[split.test]).mean())
    assert plain < fit.accuracy - 0.2  # what the plain projection would have reported


def test_the_exact_interval_is_clopper_pearson() -> None:
    # All wrong / all right: the bounds solve (1 − p)^n = α/2 and p^n = α/2 in closed form.
    assert clopper_pearson(0, 10) == pytest.approx((0.0, 1 - 0.025 ** (1 / 10)))
    assert clopper_pearson(10, 10) == pytest.approx((0.025 ** (1 / 10), 1.0))


@pytest.mark.parametrize("method", ["logistic", "diff_means"])
def test_on_random_labels_the_interval_covers_chance_at_its_level(method: str) -> None:
    """Size: labels independent of x, so every probe's true accuracy is 0.5; the 95 % interval must exclude
    0.5 in at most ~5 % of seeded datasets (300 draws: 5 % + 2.5 standard errors = 8.2 %)."""
    excluded = 0
    draws = 300
    for seed in range(draws):
        x, y = signal_data(80, 10, 0.0, seed)
        split = probe.stratified_split(y, 0.5, seed)
        fit = probe.fit_probe(x, y, split, method)  # type: ignore[arg-type]
        low, high = clopper_pearson(fit.correct, fit.n_test)
        excluded += not low <= 0.5 <= high
    assert excluded / draws <= 0.082


def test_with_a_weak_signal_the_interval_excludes_chance_most_of_the_time() -> None:
    """Power: coordinate 3 shifted by ±0.8 σ (Bayes accuracy Φ(0.8) ≈ 0.79) on 40 held-out texts."""
    excluded = 0
    for seed in range(100):
        x, y = signal_data(80, 10, 0.8, seed)
        split = probe.stratified_split(y, 0.5, seed)
        fit = probe.fit_probe(x, y, split, "diff_means")
        excluded += clopper_pearson(fit.correct, fit.n_test)[0] > 0.5
    assert excluded >= 70


def test_layers_beating_chance_hold_their_family_wise_level() -> None:
    """Size: 20 independent null layers (labels unrelated to x); without adjustment some layer's 95 % interval
    clears chance in far more than 5 % of datasets; `beyond_chance` (Bonferroni) must keep "any layer beats
    chance" at ≤ 5 % (+ 2.5 standard errors over 150 draws: 9.5 %). Power: with a 1 σ signal in every layer most
    layers are found."""
    false_alarms = unadjusted_alarms = 0
    draws = 150
    for seed in range(draws):
        rng = np.random.default_rng(seed)
        y = np.repeat([0, 1], 30)
        split = probe.stratified_split(y, 0.5, seed)
        corrects = [probe.fit_probe(rng.normal(size=(60, 8)), y, split, "diff_means").correct for _ in range(20)]
        found, level = probe.beyond_chance(corrects, len(split.test), 0.5)
        assert level == pytest.approx(1 - 0.05 / 20)
        false_alarms += bool(found)
        unadjusted_alarms += any(clopper_pearson(c, len(split.test))[0] > 0.5 for c in corrects)
    assert false_alarms / draws <= 0.095
    assert unadjusted_alarms > false_alarms  # the adjustment is doing something
    y = np.repeat([0, 1], 40)
    split = probe.stratified_split(y, 0.5, 0)
    signal = [probe.fit_probe(signal_data(80, 8, 1.0, seed)[0], y, split, "diff_means").correct for seed in range(20)]
    assert len(probe.beyond_chance(signal, len(split.test), 0.5)[0]) >= 12


def test_word_identity_control_memorisation_gives_no_selectivity() -> None:
    """One-hot word identity is all x carries and the label is a function of the word: the real probe and the
    Hewitt & Liang control both reach 1 (every test word was seen in training), so selectivity is 0."""
    words = [f"w{i % 20}" for i in range(400)]
    y = np.array([int(i % 20 < 10) for i in range(400)])
    x = np.eye(20)[[i % 20 for i in range(400)]]
    assert probe.is_word_level(words, y)
    control = probe.word_identity_control(words, y, seed=3)
    assert all(control[i] == control[j] for i in range(400) for j in (i % 20, i % 20 + 20))  # fixed per type
    assert control.tolist() == probe.word_identity_control(words, y, seed=3).tolist()
    split = probe.stratified_split(y, 0.25, 0)
    real = probe.fit_probe(x, y, split, "logistic").accuracy
    if_memorised = probe.fit_probe(x, control, split, "logistic").accuracy
    assert real == 1.0 and if_memorised == 1.0
    assert not probe.is_word_level(words, np.array([(i // 20) % 2 for i in range(400)]))  # a word with both labels


def test_probe_input_errors_say_how_to_fix_them() -> None:
    with pytest.raises(InputError, match="exactly 2 distinct"):
        probe.encode_labels(["a", "b", "c"])
    with pytest.raises(InputError, match="at least 2 texts of each label"):
        probe.stratified_split(np.array([0, 0, 0, 0, 1]), 0.25, 0)
    with pytest.raises(InputError, match="between 0 and 1"):
        probe.stratified_split(np.array([0, 1] * 10), 1.5, 0)


# --- on tiny -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("position", "words"),
    [
        ("last", ["paris", "paris", "gift"]),
        ("mean", None),  # no single token is read
        (1, ["went", "capital", "gave"]),
        (-2, ["to", "called", "a"]),
    ],
)
def test_residuals_equal_one_text_at_a_time(tiny: LoadedModel, position: Any, words: list[str] | None) -> None:
    from mcp_interp.core.features.residuals import read_residuals

    texts = ["mary went to paris", "the capital of france is called paris", "bob gave a gift"]
    got = read_residuals(tiny, texts, [0, 2], position)
    for i, text in enumerate(texts):
        ids = encode(tiny.tokenizer, [text]).input_ids
        _, cache = tiny.bridge.run_with_cache(ids)
        for column, layer in enumerate([0, 2]):
            resid = cache[f"blocks.{layer}.hook_out"][0]
            expected = resid.mean(0) if position == "mean" else resid[-1 if position == "last" else position]
            assert torch.allclose(got.values[i, column], expected, atol=1e-5)
    assert got.words == words


def test_residuals_refuse_a_position_a_text_lacks(tiny: LoadedModel) -> None:
    from mcp_interp.core.features.residuals import read_residuals

    with pytest.raises(InputError, match="outside text 1"):
        read_residuals(tiny, ["mary went to paris", "bob"], None, 2)
    with pytest.raises(InputError, match=r"layer indices 0\.\.2"):
        read_residuals(tiny, ["mary"], [5], "last")


def run_probe(tiny: LoadedModel, **options: Any) -> Any:
    from mcp_interp.core.engine.jobs import drain
    from mcp_interp.core.features.probe_job import ProbeJob

    texts, labels = places()
    job = ProbeJob(model=tiny, texts=texts, labels=labels, **options)
    drain(job)
    return job


def test_probe_job_directions_are_unit_vectors_with_their_statistics(tiny: LoadedModel) -> None:
    from mcp_interp.core.features.residuals import read_residuals

    job = run_probe(tiny, position="last")
    result = job.result
    assert [row.layer for row in result.layers] == [0, 1, 2]
    assert result.word_level and result.control_kind == "word_identity"  # the last word decides the label
    texts, labels = places()
    values = read_residuals(tiny, texts, None, "last").values.double()
    for row, direction in zip(result.layers, job.directions, strict=True):
        unit = torch.tensor(direction.vector, dtype=torch.float64)
        assert float(unit.norm()) == pytest.approx(1.0, abs=1e-9)
        projections = values[:, row.layer] @ unit
        assert direction.projection_std == pytest.approx(float(projections.std(unbiased=False)), rel=1e-6)
        city = projections[[i for i, label in enumerate(labels) if label == "city"]].mean()
        assert direction.projection_means["city"] == pytest.approx(float(city), rel=1e-6)
        assert direction.labels == ["city", "country"] and direction.model_fingerprint == tiny.fingerprint
        assert row.selectivity == pytest.approx(row.accuracy - row.control_accuracy)
        assert row.ci_low <= row.accuracy <= row.ci_high
    # The best of 3 layers, chosen on the held-out texts, gets the wider Bonferroni interval (level 1 − 0.05/3).
    best = next(row for row in result.layers if row.layer == result.best_layer)
    low, high = result.best_ci_adjusted
    assert low <= best.ci_low and high >= best.ci_high and (low < best.ci_low or high > best.ci_high)
    assert result.layers_beating_chance == [
        row.layer
        for row in result.layers
        if clopper_pearson(round(row.accuracy * result.n_test), result.n_test, 1 - 0.05 / 3)[0] > result.chance
    ]


def test_direction_ablation_equals_a_hand_projection_hook(tiny: LoadedModel) -> None:
    from mcp_interp.core.localize.ablate import ablate
    from mcp_interp.schemas.common import Intervention

    prompts = ["when mary and john went to the store , john gave a drink to"] * 2
    vector = torch.randn(64, generator=torch.Generator().manual_seed(5))
    unit = vector / vector.norm()
    spec = Intervention(ablate=[{"layer": 1, "direction": vector.tolist()}])  # type: ignore[list-item]
    result = ablate(tiny, prompts, spec, "mary", "john")

    def project_out(resid: torch.Tensor, hook: Any) -> torch.Tensor:
        return resid - (resid @ unit).unsqueeze(-1) * unit

    ids = encode(tiny.tokenizer, prompts).input_ids
    good, bad = (tiny.tokenizer.convert_tokens_to_ids(w) for w in ("mary", "john"))
    with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=[("blocks.1.hook_resid_post", project_out)]):
        logits = tiny.bridge(ids)[:, -1].double()
    assert result.after.logit_diff is not None
    assert result.after.logit_diff.value == pytest.approx(float((logits[:, good] - logits[:, bad]).mean()), abs=1e-5)

    # Its random baseline is rebuilt by hand in tests/engine/test_baselines.py.


def test_directions_sharing_a_layer_are_kept_apart_and_orthonormalised(tiny: LoadedModel) -> None:
    from mcp_interp.core.engine.interventions import ablation_from_spec
    from mcp_interp.schemas.common import Intervention

    first, second = [1.0] + [0.0] * 63, [1.0, 1.0] + [0.0] * 62
    spec = Intervention(ablate=[{"layer": 2, "direction": first}, {"layer": 2, "direction": second}])  # type: ignore[list-item]
    ablation = ablation_from_spec(spec, tiny.bridge.cfg, tiny)
    assert ablation is not None and len(ablation.targets) == 2
    vectors = [t.direction for t in ablation.targets]
    assert vectors[0] is not None and vectors[1] is not None
    assert vectors[0].tolist() == first and vectors[1].tolist() == [0.0, 1.0] + [0.0] * 62
    duplicate = Intervention(ablate=[{"layer": 2, "direction": first}, {"layer": 2, "direction": [2.0] + [0.0] * 63}])  # type: ignore[list-item]
    deduplicated = ablation_from_spec(duplicate, tiny.bridge.cfg, tiny)
    assert deduplicated is not None and len(deduplicated.targets) == 1  # the same unit vector twice
    third = [0.0, 3.0] + [0.0] * 62
    same = Intervention(ablate=[{"layer": 2, "direction": v} for v in (first, second, third)])  # type: ignore[misc]
    with pytest.raises(InputError, match="linearly dependent"):
        ablation_from_spec(same, tiny.bridge.cfg, tiny)


def test_steer_with_a_stored_direction(tiny: LoadedModel) -> None:
    from mcp_interp.core.lens.steer import greedy, steer

    job = run_probe(tiny, layers=[1])
    direction = job.directions[0]
    prompt = "when mary and john went to the store , john gave a drink to"
    result = steer(tiny, prompt, None, None, None, 2.0, 5, 0, direction, "direction://x")
    unit = torch.tensor(direction.vector)
    added = 2.0 * direction.projection_std * unit

    def add(resid: torch.Tensor, hook: Any) -> torch.Tensor:
        return resid + added

    ids = encode(tiny.tokenizer, [prompt]).ids(0)
    expected = greedy(tiny, ids, 5, [("blocks.1.hook_out", add)])
    assert result.site == "resid_post" and result.layer == 1
    assert result.steered_text == tiny.tokenizer.decode(expected)
    with torch.no_grad():
        base = torch.log_softmax(tiny.bridge(torch.tensor([ids]))[0, -1].double(), -1)
        with tiny.bridge.hooks(fwd_hooks=[("blocks.1.hook_out", add)]):
            moved = torch.log_softmax(tiny.bridge(torch.tensor([ids]))[0, -1].double(), -1)
    assert result.next_token_kl == pytest.approx(float((base.exp() * (base - moved)).sum()), abs=1e-6)
    # Its random baseline is rebuilt by hand in tests/engine/test_baselines.py.
    with pytest.raises(InputError, match="not both"):
        steer(tiny, prompt, "good", "bad", None, 1.0, 5, 0, direction)
    with pytest.raises(InputError, match="a stored `direction`"):
        steer(tiny, prompt, None, None, 1, 1.0, 5, 0)


def test_stored_directions_are_checked_against_the_loaded_weights(tiny: LoadedModel) -> None:
    from mcp_interp.core.features.directions import encode_direction, load_direction
    from mcp_interp.store import NotFound

    job = run_probe(tiny, layers=[2])
    data = encode_direction(job.directions[0])
    loaded = load_direction("direction://" + "a" * 32, lambda _id: data, tiny)
    assert loaded.vector == job.directions[0].vector and loaded.layer == 2

    foreign = job.directions[0].model_copy(update={"model_fingerprint": "f" * 64, "model_name": "other"})
    with pytest.raises(InputError, match="fitted on model 'other'"):
        load_direction("direction://" + "a" * 32, lambda _id: encode_direction(foreign), tiny)

    def missing(_id: str) -> bytes:
        raise NotFound("No direction with id 'b…'.")

    with pytest.raises(InputError, match="Run `probe` again"):
        load_direction("direction://" + "b" * 32, missing, tiny)
    with pytest.raises(InputError, match="not a direction URI"):
        load_direction("figure://" + "a" * 32, missing, tiny)

    from mcp_interp.core.features.directions import resolve_direction_refs
    from mcp_interp.schemas.common import Intervention

    elsewhere = Intervention(ablate=[{"layer": 1, "direction": "direction://" + "a" * 32}])  # type: ignore[list-item]
    with pytest.raises(InputError, match="fitted on layer 2's resid_post, but the target names layer 1"):
        resolve_direction_refs(elsewhere, lambda _id: data, tiny)


# --- end to end over stdio -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_stdio_probe_then_ablate_its_direction(tmp_path: Path, tiny: LoadedModel) -> None:
    from mcp import Client

    from tests.helpers import assert_valid_structured, error_text, stdio_params, tools_by_name

    texts, labels = places()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MCP_INTERP_OUTPUT": str(tmp_path / "out")}
    prompts = ["when mary and john went to the store , john gave a drink to"] * 2
    async with Client(stdio_params("tiny", env), read_timeout_seconds=120) as client:
        tools = await tools_by_name(client)
        result = assert_valid_structured(
            tools["probe"], await client.call_tool("probe", {"texts": texts, "labels": labels, "layers": [1, 2]})
        )
        uri = result["layers"][0]["direction_uri"]
        resource = await client.read_resource(uri)
        stored = json.loads(resource.contents[0].text)  # type: ignore[union-attr]
        ablated = assert_valid_structured(
            tools["ablate"],
            await client.call_tool(
                "ablate",
                {
                    "prompts": prompts,
                    "targets": [{"layer": 1, "direction": uri}],
                    "correct": "mary",
                    "incorrect": "john",
                },
            ),
        )
        by_vector = assert_valid_structured(
            tools["ablate"],
            await client.call_tool(
                "ablate",
                {
                    "prompts": prompts,
                    "targets": [{"layer": 1, "direction": stored["vector"]}],
                    "correct": "mary",
                    "incorrect": "john",
                },
            ),
        )
        unknown = await client.call_tool(
            "ablate", {"prompts": prompts, "targets": [{"layer": 1, "direction": "direction://" + "0" * 32}]}
        )
        figure = await client.read_resource(result["figure_uri"])
    assert resource.contents[0].mime_type == "application/json"
    assert stored["layer"] == 1 and len(stored["vector"]) == 64
    assert float(np.linalg.norm(stored["vector"])) == pytest.approx(1.0, abs=1e-6)
    assert ablated["after"] == by_vector["after"] and len(ablated["random_baseline"]["draws"]) == 20
    assert "Run `probe` again" in error_text(unknown)
    assert figure.contents[0].mime_type == "image/png"
