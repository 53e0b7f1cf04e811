"""Feature naming on a known answer: `tiny` rebuilt so that neuron L0N3 fires on one token id and nowhere else.

The construction (``store_neuron_model``): residual dimension 0 of every token embedding is zeroed except the token
"store"'s, layer 0's attention writes nothing (its output projection is zero), and neuron 3 of layer 0's MLP reads
only dimension 0 through its gate and up rows. Its activation act(g·x₀)·(u·x₀), with x the MLP's normalised input,
is then exactly 0 on every other token and one value A on "store" — A is computed by hand from the weights. So every
number the tools return is known: which texts are the examples and in what order, every windowed activation, the
quantiles, which quiz texts fire, the AUROC of written texts and its exact p-value (a hypergeometric count).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from mcp import Client

from mcp_interp.core.engine.backend.loader.load import boot
from mcp_interp.core.engine.backend.loader.tiny import build_tiny
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.features.examples import FeatureExamplesJob
from mcp_interp.core.features.explanations import ScoreExplanationJob
from mcp_interp.errors import InputError
from mcp_interp.host import ModelHost
from mcp_interp.mcp.server import build_server
from tests.helpers import assert_valid_structured, tools_by_name

LAYER, NEURON, DIM, WORD = 0, 3, 0, "store"
GAIN, UP = 3.0, 2.0

# Texts in tiny's vocabulary: "store" at positions ≥ 1 in some, at position 0 only in one (never scored), absent in
# the others.
TEXTS = [
    "when mary went to the store , john gave a drink to",  # 0: store at 5
    "the capital of france is paris",  # 1
    "store gave a ball to james",  # 2: store at position 0 only: not scored
    "tom went to the park",  # 3
    "the store and the store",  # 4: store at 1 and 4
    "mary gave a drink to john",  # 5
    "james went to the store",  # 6: store at 4
    "a ball to the park",  # 7
    "when tom and james went to the shop",  # 8
    "mary and john went to paris",  # 9
]


@pytest.fixture(scope="module")
def store_neuron_model() -> LoadedModel:
    hf, tokenizer = build_tiny()
    token = tokenizer.convert_tokens_to_ids(WORD)
    with torch.no_grad():
        embed = hf.model.embed_tokens.weight
        embed[:, DIM] = 0.0
        embed[token, DIM] = 4.0
        hf.model.layers[LAYER].self_attn.o_proj.weight.zero_()
        mlp = hf.model.layers[LAYER].mlp
        for proj, value in ((mlp.gate_proj, GAIN), (mlp.up_proj, UP)):
            proj.weight[NEURON].zero_()
            proj.weight[NEURON, DIM] = value
    return boot("tiny-store-neuron", "tiny", "tiny-store-neuron", hf, tokenizer)


def activation_on_store(model: LoadedModel) -> float:
    """A by hand: the MLP reads RMSNorm(embedding of "store") (layer 0's attention adds nothing)."""
    hf = model.bridge.original_model
    token = model.tokenizer.convert_tokens_to_ids(WORD)
    x = hf.model.embed_tokens.weight[token].detach().double()
    norm = hf.model.layers[LAYER].post_attention_layernorm
    x0 = float(norm.weight[DIM].detach()) * float(x[DIM]) / math.sqrt(float((x * x).mean()) + norm.variance_epsilon)
    gate = GAIN * x0
    return gate / (1 + math.exp(-gate)) * (UP * x0)


def hand_activations(model: LoadedModel, text: str) -> tuple[list[int], list[float]]:
    ids = model.tokenizer(text)["input_ids"]
    store = model.tokenizer.convert_tokens_to_ids(WORD)
    a = activation_on_store(model)
    return ids, [a if t == store else 0.0 for t in ids]


def test_the_construction_fires_on_one_token_only(store_neuron_model: LoadedModel) -> None:
    model = store_neuron_model
    a = activation_on_store(model)
    assert a > 0.5
    _, cache = model.bridge.run_with_cache(model.tokenizer(TEXTS[4], return_tensors="pt")["input_ids"])
    got = cache[f"blocks.{LAYER}.mlp.hook_post"][0, :, NEURON]
    assert got.tolist() == pytest.approx(hand_activations(model, TEXTS[4])[1], rel=1e-6, abs=1e-6)


def test_examples_quantiles_and_firing_equal_the_hand_computation(store_neuron_model: LoadedModel) -> None:
    model = store_neuron_model
    a = activation_on_store(model)
    result = drain(FeatureExamplesJob(model=model, feature="L0N3", texts=TEXTS, top_k=4, window=2))
    # Texts 0, 4, 6 have "store" at a scored position: max A; every other text max 0; ties by text index.
    assert [e.text_index for e in result.examples] == [0, 4, 6, 1]
    assert [e.max_activation for e in result.examples] == pytest.approx([a, a, a, 0.0], rel=1e-6, abs=1e-6)
    assert [e.max_position for e in result.examples] == [5, 1, 4, 1]
    assert [e.max_token for e in result.examples] == ["store", "store", "store", "capital"]
    first = result.examples[0]  # window ± 2 around position 5 of text 0
    assert first.window_start == 3 and first.tokens == ["to", "the", "store", ",", "john"]
    assert first.activations == pytest.approx([0, 0, a, 0, 0], rel=1e-6, abs=1e-6)
    second = result.examples[1]  # "the store and the store", max at 1: window 0..3
    assert second.window_start == 0 and second.activations == pytest.approx([0, a, 0, 0], rel=1e-6, abs=1e-6)
    # Scored tokens: positions ≥ 1 of all ten texts.
    scored = [v for text in TEXTS for v in hand_activations(model, text)[1][1:]]
    maxima = [max(hand_activations(model, text)[1][1:]) for text in TEXTS]
    assert result.corpus.n_texts == 10 and result.corpus.n_tokens == len(scored)
    for row in result.quantiles:
        assert row.token == pytest.approx(float(np.quantile(scored, row.quantile)), rel=1e-6, abs=1e-6)
        assert row.text_max == pytest.approx(float(np.quantile(maxima, row.quantile)), rel=1e-6, abs=1e-6)
    threshold = float(np.quantile(maxima, 0.9))  # 3 of 10 texts at A: the 90th percentile is A itself
    assert result.firing.threshold == pytest.approx(threshold, rel=1e-6, abs=1e-6)
    assert result.firing.texts_firing == 0.0  # nothing is strictly above A
    assert result.firing.tokens_positive == pytest.approx(4 / len(scored))


def test_output_tokens_are_the_neurons_direct_logit_effect(store_neuron_model: LoadedModel) -> None:
    """W_U · (γ ⊙ W_out[:, n]) by hand from the HF weights (RMSNorm: no centring)."""
    model = store_neuron_model
    result = drain(FeatureExamplesJob(model=model, feature="L0N3", texts=TEXTS[:3], top_k=1, window=0))
    hf = model.bridge.original_model
    column = hf.model.layers[LAYER].mlp.down_proj.original_component.weight[:, NEURON].detach().double()
    gamma = hf.model.norm.original_component.weight.detach().double()
    effect = hf.lm_head.original_component.weight.detach().double() @ (gamma * column)
    output = result.output_tokens
    assert output is not None
    assert output.vector_norm == pytest.approx(float(column.norm()), rel=1e-6)
    order = torch.argsort(effect, descending=True)
    assert [t.token_id for t in output.promoted] == order[:10].tolist()
    assert [t.token_id for t in output.suppressed] == order.flip(0)[:10].tolist()
    assert [t.effect for t in output.promoted] == pytest.approx(effect[order[:10]].tolist(), abs=1e-5)


def test_generation_auroc_equals_the_hand_count_and_swapping_gives_one_minus(store_neuron_model: LoadedModel) -> None:
    """Ten texts of 5 tokens (one stratum). Activating: 3 texts with "store" (max A) and 2 without (0); non-activating:
    5 without. Pairs: 3 × 5 wins, 2 × 5 ties → AUROC (15 + 10/2)/25 = 0.8. Under relabelling of the 10 pooled values
    (3 A's, 7 zeros) U grows with the number k of A's in the first set, so p = P(k = 3) = C(7, 2)/C(10, 5) = 21/252,
    and the floor is 1/252. Two more texts of lengths the other set lacks (4 and 8 tokens) do not count."""
    model = store_neuron_model
    with_store = ["james went to the store", "tom went to the store", "mary went to the store"]
    without = ["tom went to the park", "a ball to the park", "james went to the shop", "mary went to the park",
               "john went to the shop", "the park and the shop", "mary gave a drink to"]  # fmt: skip
    activating, quiet = [*with_store, *without[:2]], without[2:]
    assert all(len(t.split()) == 5 for t in activating + quiet)
    scored = drain(
        ScoreExplanationJob(
            model=model,
            feature="L0N3",
            explanation="the word store",
            activating_texts=[*activating, "tom went to store"],
            non_activating_texts=[*quiet, "when tom and james went to the shop"],
        )
    )
    generation = scored.generation
    assert generation is not None
    assert generation.auroc == pytest.approx(0.8) and generation.pairs == 25
    assert generation.p_value == pytest.approx(21 / 252) and generation.p_floor == pytest.approx(1 / 252)
    assert generation.p_method == "exact stratified permutation"
    assert generation.activating_tokens == [5] * 5 + [4] and generation.non_activating_tokens == [5] * 5 + [8]
    assert generation.verdict.startswith("not shown to separate")  # p = 0.083 > 0.05, though it could reach 0.004
    assert any("2 of the 12 written texts have no text of their token count" in note for note in scored.notes)
    assert [t.max_activation > 0 for t in generation.per_text][:5] == [True, True, True, False, False]
    swapped = drain(
        ScoreExplanationJob(
            model=model,
            feature="L0N3",
            explanation="the word store",
            activating_texts=quiet,
            non_activating_texts=activating,
        )
    )
    assert swapped.generation is not None and swapped.generation.auroc == pytest.approx(1 - 0.8)
    assert swapped.generation.p_value == pytest.approx(1.0)  # U is at its minimum: every relabelling is ≥ it


def test_longer_activating_texts_alone_are_not_significant(store_neuron_model: LoadedModel) -> None:
    """The §4 confound on a known construction: every "activating" text is long and contains "store", every
    non-activating text is short: the ordinary AUROC would be 1 (p = 1/C(10, 5)); within equal token counts there is
    no pair to compare, so the score cannot resolve anything rather than reward length."""
    model = store_neuron_model
    long = ["when mary went to the store , john gave a drink to"] * 5
    short = ["tom went to the park", "a ball to the park", "james went to the shop", "mary went to the park",
             "john went to the shop"]  # fmt: skip
    scored = drain(
        ScoreExplanationJob(
            model=model, feature="L0N3", explanation="x", activating_texts=long, non_activating_texts=short
        )
    )
    generation = scored.generation
    assert generation is not None and generation.pairs == 0 and generation.p_value == 1.0
    assert generation.verdict.startswith("cannot resolve at α = 0.05")


def test_a_quiz_draws_held_out_texts_half_firing_and_its_truth_is_the_hand_truth(
    store_neuron_model: LoadedModel,
) -> None:
    model = store_neuron_model
    pool = [f"{name} went to the {place}" for name in ("mary", "john", "tom") for place in ("store", "park", "shop")]
    pool += [f"the {place} was near {name}" for name in ("mary", "john") for place in ("store", "park")]
    job = ScoreExplanationJob(
        model=model, feature="L0N3", explanation="the word store", quiz=6, texts=pool, threshold=0.0, seed=7
    )
    result = drain(job)
    quiz, document = result.quiz, job.quiz_document
    assert quiz is not None and document is not None
    assert len(quiz.texts) == 6 and len(set(quiz.texts)) == 6 and set(quiz.texts) <= set(pool)
    truth = [max(hand_activations(model, t)[1][1:]) > 0 for t in quiz.texts]  # "store" at a scored position
    assert document["fires"] == truth and sum(truth) == 3
    # the handle the assistant sees carries no truth, nor how many fire
    assert not hasattr(quiz, "fires") and not hasattr(quiz, "n_firing")
    # each firing text has a non-firing partner of its token count: every text here has 5
    assert document["tokens"] == [5] * 6 and document["quiet"] == 0.0
    same = drain(
        ScoreExplanationJob(model=model, feature="L0N3", explanation="x", quiz=6, texts=pool, threshold=0.0, seed=7)
    )
    assert same.quiz is not None and same.quiz.texts == quiz.texts  # the seed reproduces the draw


# --- through the MCP server ----------------------------------------------------------------------------------------


@pytest.fixture
async def client(store_neuron_model: LoadedModel, tmp_path: Path) -> AsyncIterator[Client]:
    session = ModelHost("tiny-store-neuron", tmp_path / "out", loader=lambda name, device, dtype: store_neuron_model)
    async with Client(build_server(session)) as connected:
        yield connected


def text_of(result: Any) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


@pytest.mark.anyio
async def test_quiz_round_trip_reveals_the_truth_once_and_files_the_explanation(client: Client) -> None:
    tools = await tools_by_name(client)
    names = ("mary", "john", "tom", "sam", "james", "bob", "kate", "alice")
    pool = [f"{name} went to the {place} today" for name in names for place in ("store", "park", "shop")]
    arguments = {
        "feature": "L0N3",
        "explanation": "fires on the word store",
        "texts": pool,
        "quiz": 8,
        "seed": 3,
        "threshold": 0.0,
    }
    drawn = assert_valid_structured(tools["score_explanation"], await client.call_tool("score_explanation", arguments))
    quiz = drawn["quiz"]
    assert quiz["quiz_id"].startswith("quiz://") and len(quiz["texts"]) == 8 and "n_firing" not in quiz
    hidden = json.loads((await client.read_resource(quiz["quiz_id"])).contents[0].text)
    assert "fires" not in hidden and hidden["texts"] == quiz["texts"]
    truth = [" store " in f" {t} " for t in quiz["texts"]]
    perfect = {
        "feature": "L0N3",
        "explanation": "fires on the word store",
        "quiz_id": quiz["quiz_id"],
        "predictions": truth,
    }
    scored = assert_valid_structured(tools["score_explanation"], await client.call_tool("score_explanation", perfect))
    detection = scored["detection"]
    assert detection["balanced_accuracy"] == 1.0
    assert detection["p_value"] == pytest.approx(1 / math.comb(8, 4)) == detection["p_floor"]  # one stratum: 6 tokens
    assert [row["fires"] for row in detection["truth"]] == truth
    assert scored["explanation_uri"].startswith("explanation://")
    revealed = json.loads((await client.read_resource(quiz["quiz_id"])).contents[0].text)
    assert revealed["fires"] == truth and revealed["scored_by"] == scored["explanation_uri"]
    stored = json.loads((await client.read_resource(scored["explanation_uri"])).contents[0].text)
    assert stored["detection"]["balanced_accuracy"] == 1.0 and stored["quiz_uri"] == quiz["quiz_id"]
    again = await client.call_tool("score_explanation", perfect)
    assert again.is_error and "already scored" in text_of(again)
    # feature_examples lists the scored explanation; a second quiz never redraws the revealed texts.
    examples = assert_valid_structured(
        tools["feature_examples"],
        await client.call_tool("feature_examples", {"feature": "L0N3", "texts": pool, "top_k": 2}),
    )
    assert [e["explanation_uri"] for e in examples["explanations"]] == [scored["explanation_uri"]]
    assert examples["explanations"][0]["balanced_accuracy"] == 1.0
    assert examples["examples_uri"].startswith("result://")
    second = await client.call_tool("score_explanation", {**arguments, "quiz": 4, "seed": 4})
    data = assert_valid_structured(tools["score_explanation"], second)
    assert not set(data["quiz"]["texts"]) & set(quiz["texts"])
    shown = {e["text"] for e in examples["examples"]}
    assert not set(data["quiz"]["texts"]) & shown


@pytest.mark.anyio
async def test_constant_predictions_score_exactly_chance(client: Client) -> None:
    pool = [f"{name} went to the {place}" for name in ("mary", "john", "tom") for place in ("store", "park")]
    drawn = await client.call_tool(
        "score_explanation", {"feature": "L0N3", "explanation": "e", "texts": pool, "quiz": 6, "threshold": 0.0}
    )
    quiz = drawn.structured_content["quiz"]
    scored = await client.call_tool(
        "score_explanation",
        {"feature": "L0N3", "explanation": "e", "quiz_id": quiz["quiz_id"], "predictions": [True] * 6},
    )
    detection = scored.structured_content["detection"]
    assert detection["balanced_accuracy"] == 0.5 and detection["p_value"] >= 0.3
    assert "not shown better than chance" in detection["verdict"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"feature": "L0X3"}, "is not a feature name"),
        ({"feature": "L0N3,4"}, "Name one neuron"),
        ({"feature": "L0N9999"}, "neuron 9999 is out of range; each MLP has neurons 0..127"),
        ({"feature": "L7N1"}, "layer 7 does not exist"),
        ({"feature": {"layer": 0, "direction": [1.0, 2.0]}}, "must be 64 finite numbers"),
        ({"feature": "L0N3", "corpus": "countries"}, "not a shipped text corpus"),
        ({"feature": "L0N3", "texts": ["a b"], "corpus": "wordnet_examples"}, "not both"),
        ({"feature": "L0N3", "top_k": 0}, "`top_k` must be an integer from 1 to 50"),
    ],
)
async def test_bad_feature_examples_input_is_a_clear_error(
    client: Client, arguments: dict[str, Any], message: str
) -> None:
    result = await client.call_tool("feature_examples", arguments)
    assert result.is_error and message in text_of(result), text_of(result)


@pytest.mark.anyio
async def test_bad_quiz_input_is_a_clear_error(client: Client) -> None:
    pool = [f"{name} went to the {place}" for name in ("mary", "john", "tom") for place in ("store", "park")]
    base = {"explanation": "e", "texts": pool, "quiz": 4, "threshold": 0.0}
    quiz = (await client.call_tool("score_explanation", {"feature": "L0N3", **base})).structured_content["quiz"]
    other = await client.call_tool(
        "score_explanation",
        {"feature": "L0N4", "explanation": "e", "quiz_id": quiz["quiz_id"], "predictions": [True] * 4},
    )
    assert other.is_error and "was drawn for feature 'L0N3', not 'L0N4'" in text_of(other)
    short = await client.call_tool(
        "score_explanation", {"feature": "L0N3", "explanation": "e", "quiz_id": quiz["quiz_id"], "predictions": [True]}
    )
    assert short.is_error and "one true/false per quiz text, 4 in the quiz's order; got 1" in text_of(short)
    unknown = await client.call_tool(
        "score_explanation",
        {
            "feature": "L0N3",
            "explanation": "e",
            "quiz_id": "quiz://" + "0" * 32,
            "predictions": [True] * 4,
        },
    )
    assert unknown.is_error and "No quiz with id" in text_of(unknown)
    nothing = await client.call_tool("score_explanation", {"feature": "L0N3", "explanation": "e"})
    assert nothing.is_error and "Nothing to score" in text_of(nothing)
    both = await client.call_tool(
        "score_explanation", {"feature": "L0N3", **base, "quiz_id": quiz["quiz_id"], "predictions": [True] * 4}
    )
    assert both.is_error and "not both" in text_of(both)


def test_neuron_features_are_refused_without_neurons(store_neuron_model: LoadedModel) -> None:
    """The capability check names the missing feature (a mixture-of-experts block has no neurons)."""
    from mcp_interp.core.engine.backend.capabilities import USES

    use = USES["neuron_features"]
    assert use.tools == ("feature_examples", "score_explanation") and use.needs == ("mlp_neurons", "neuron_points")
    with pytest.raises(InputError, match="out of range"):
        drain(FeatureExamplesJob(model=store_neuron_model, feature="L0N128", texts=TEXTS))
