"""Choosing circuits and judging them: node circuits, rankings, the held-out split, the candidate-pool baseline
(a circuit of the least-attributed edges must fail it, the top edges pass), circuit:// re-evaluation to 1e-6,
and zero-gap pairs refused."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import numpy as np
import pytest
import torch
from mcp import Client

from mcp_interp.core.circuits.edge_graph import build_graph
from mcp_interp.core.circuits.selection import held_out_split, node_circuit, rank
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.errors import InputError
from tests.circuits.common import CLEAN, CORRUPT, distinct_draws, sequential_p
from tests.helpers import assert_valid_structured, error_text, tools_by_name

PAIRS: dict[str, Any] = {
    "clean_prompts": [
        CLEAN[0],
        "when tom and james went to the park , james gave a ball to",
        "when alice and paul went to the shop , paul gave a book to",
        "when kate and sam went to the beach , sam gave a cup to",
    ],
    "corrupt_prompts": [
        CORRUPT[0],
        "when tom and james went to the park , tom gave a ball to",
        "when alice and paul went to the shop , alice gave a book to",
        "when kate and sam went to the beach , kate gave a cup to",
    ],
    "correct": ["mary", "tom", "alice", "kate"],
    "incorrect": ["john", "james", "paul", "sam"],
}


def test_node_circuit_rank_and_split_by_hand() -> None:
    graph = build_graph(n_layers=2, n_heads=2, n_kv_heads=2)
    # writers: 0 embed, 1-2 L0 heads, 3 L0MLP, 4-5 L1 heads, 6 L1MLP
    assert node_circuit(graph, [3]) == {(w, r) for w, r in graph.edges if w in (0, 3)}
    scores = torch.zeros(len(graph.writers), len(graph.readers))
    for (w, r), value in zip(graph.edges, torch.linspace(-1, 1, len(graph.edges)), strict=True):
        scores[w, r] = value
    by_abs = rank(graph, scores, "edge", "abs").items
    assert [abs(float(scores[e])) for e in by_abs] == sorted((abs(float(scores[e])) for e in graph.edges), reverse=True)
    signed = rank(graph, scores, "edge", "signed").items
    assert float(scores[signed[0]]) == pytest.approx(1.0) and float(scores[signed[-1]]) == pytest.approx(-1.0)
    totals = scores.sum(dim=1)
    nodes = rank(graph, scores, "node", "signed").items
    assert nodes == sorted(range(1, 7), key=lambda w: -float(totals[w]))  # embed is not a node: always kept
    selecting, held = held_out_split(8, 0.5, seed=3)
    order = list(range(8))
    random.Random(3).shuffle(order)
    assert held == sorted(order[:4]) and selecting == sorted(order[4:])
    assert held_out_split(5, 0.0, 1) == ([0, 1, 2, 3, 4], [])
    for n, fraction in ((1, 0.5), (4, 0.1), (3, 0.9)):
        with pytest.raises(InputError, match="held_out"):
            held_out_split(n, fraction, 0)


def find(model: LoadedModel, **kwargs: Any) -> Any:
    from mcp_interp.core.circuits.faithfulness_job import FindCircuitJob

    job = FindCircuitJob(model=model, **PAIRS, **kwargs)
    steps = [step for step in job.steps() if isinstance(step, str)]  # what progress counts (not Progress or Pause)
    assert len(steps) <= job.total_steps()  # progress never reports more steps than its total
    assert job.result is not None
    return job


def faithful(model: LoadedModel, pairs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    from mcp_interp.core.circuits.faithfulness_job import CircuitFaithfulnessJob

    return drain(CircuitFaithfulnessJob(model=model, **(pairs or PAIRS), **kwargs))


def test_the_baseline_can_fail_and_its_p_value_is_the_rank_formula(tiny: LoadedModel) -> None:
    """The top 10 edges beat random 10-edge circuits drawn from the top 40; the 10 least-attributed edges, a circuit
    that cannot carry the behaviour, do not (p > 0.25). Every draw is rebuilt by hand from the seeded pool (numpy's
    ``default_rng(seed)``, 10 of the 40 without replacement, never the top 10 itself nor a repeat) and re-measured as
    an explicit circuit. Ranked and scored on the same pairs (held_out=0), the top 10's p is post-selection: no
    verdict."""
    from mcp_interp.core.circuits.attribution import graph_of
    from mcp_interp.core.circuits.faithfulness import Ablator
    from mcp_interp.core.circuits.faithfulness_job import edge_names
    from mcp_interp.core.engine.backend.bridge import edge_hooks
    from mcp_interp.core.engine.patching.pairs import prepare_pairs
    from tests.circuits.common import run_eap_on

    top = faithful(tiny, top_k=10, random_circuits=40, seed=2, held_out=0.0)
    pairs = prepare_pairs(tiny, **PAIRS)
    scores = run_eap_on(tiny, pairs)
    graph = graph_of(tiny.backend)
    ranked = sorted(graph.edges, key=lambda e: -abs(float(scores.scores[e])))
    generator = np.random.default_rng(2)
    chosen: list[tuple[int, ...]] = []
    while len(chosen) < top.baseline.draws_made:
        subset = tuple(sorted(int(i) for i in generator.choice(tuple(range(40)), 10, replace=False)))
        if subset != tuple(range(10)) and subset not in chosen:
            chosen.append(subset)
    with edge_hooks(tiny.bridge):
        ablator = Ablator(tiny.backend, graph, pairs, "corrupt")  # faithfulness itself is checked against TL elsewhere
        draws = [ablator.recovered(ablator.run({ranked[i] for i in subset})).value for subset in chosen]
    assert top.baseline.pool == 40
    assert top.baseline.draws == pytest.approx(draws, abs=1e-6)
    assert top.baseline.p_value == pytest.approx(sequential_p(top.faithfulness.value, draws, 40))
    assert top.baseline.p_value < 1 / 21, top.baseline  # below the floor of the fixed 20 draws
    bottom = faithful(tiny, edges=edge_names(graph, set(ranked[-10:])), random_circuits=40, seed=2)
    assert bottom.baseline.p_value == pytest.approx(sequential_p(bottom.faithfulness.value, bottom.baseline.draws, 40))
    assert bottom.baseline.p_value > 0.25, bottom.baseline  # far from significant
    assert bottom.baseline.verdict.startswith("the circuit does not beat") and not bottom.baseline.post_selection
    assert top.baseline.post_selection and top.baseline.verdict.startswith("post-selection p")
    assert top.baseline.pool_size == math.comb(40, 10) - 1 and top.baseline.p_floor == pytest.approx(1 / 41)


def selected_alone(model: LoadedModel, job: Any) -> Any:
    """find_circuit run from scratch on the selecting pairs of ``job`` alone (no split): what selection may see."""
    from mcp_interp.core.circuits.faithfulness_job import FindCircuitJob
    from mcp_interp.core.engine.patching.pairs import pick

    selecting = [i for i in range(len(PAIRS["clean_prompts"])) if i not in job.result.held_out_pairs]
    alone = FindCircuitJob(model=model, **{k: pick(v, selecting) for k, v in PAIRS.items()}, target=0.6, held_out=0.0)
    drain(alone)
    return alone


def test_held_out_pairs_never_reach_the_selection(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """find_circuit with held_out = 0.5 must choose its circuit from the selecting pairs only: the circuit equals the
    one find_circuit chooses when given those two pairs and nothing else (attribution, ranking and bisection all on
    them), and held_out is that independently chosen circuit re-measured on the two held-out pairs. A planted leak —
    selection run on every pair, the held-out ones included — chooses another circuit, so the comparison fails on
    it."""
    from mcp_interp.core.circuits import faithfulness_job
    from mcp_interp.core.circuits.faithfulness_job import edge_names
    from mcp_interp.core.engine.patching.pairs import pick

    job = find(tiny, target=0.6, held_out=0.5, seed=1)
    result = job.result
    assert result.held_out is not None and len(result.held_out_pairs) == 2
    alone = selected_alone(tiny, job)
    assert job.circuit == alone.circuit
    assert result.faithfulness.value == pytest.approx(alone.result.faithfulness.value, abs=1e-9)
    assert result.faithfulness.value >= 0.6
    held = {k: pick(v, result.held_out_pairs) for k, v in PAIRS.items()}
    again = faithful(tiny, pairs=held, edges=edge_names(alone.graph, alone.circuit), random_circuits=19)
    assert result.held_out.value == pytest.approx(again.faithfulness.value, abs=1e-9)

    split = faithfulness_job.held_out_split
    monkeypatch.setattr(
        faithfulness_job, "held_out_split", lambda n, fraction, seed: (list(range(n)), split(n, fraction, seed)[1])
    )
    leaky = find(tiny, target=0.6, held_out=0.5, seed=1)
    assert leaky.result.held_out_pairs == result.held_out_pairs  # the same pairs held out, but seen by selection
    assert leaky.circuit != alone.circuit


def test_node_level_find_circuit_keeps_every_edge_out_of_its_nodes(tiny: LoadedModel) -> None:
    from mcp_interp.core.circuits.faithfulness_job import edge_names

    job = find(tiny, target=0.7, granularity="node", rank_by="signed", held_out=0.0)
    result = job.result
    graph = job.graph
    names = {str(w): i for i, w in enumerate(graph.writers)}
    chosen = [names[n.node] for n in result.nodes]
    assert len(chosen) == result.k and all(graph.writers[w].kind in ("head", "mlp") for w in chosen)
    assert job.circuit == node_circuit(graph, chosen)
    assert [n.score for n in result.nodes] == sorted((n.score for n in result.nodes), reverse=True)
    again = faithful(tiny, edges=edge_names(graph, job.circuit), random_circuits=19)
    assert (
        result.faithfulness.value == pytest.approx(again.faithfulness.value, abs=1e-9)
        and again.faithfulness.value >= 0.7
    )
    if result.k > 1:  # k − 1 nodes do not reach the target (bisection's answer is the smallest k)
        fewer = faithful(tiny, edges=edge_names(graph, node_circuit(graph, chosen[:-1])), random_circuits=19)
        assert fewer.faithfulness.value < 0.7
    assert result.baseline.pool == min(4 * result.k, len(graph.writers) - 1)
    assert result.baseline.p_value == pytest.approx(
        sequential_p(
            result.faithfulness.value,
            result.baseline.draws,
            min(result.baseline.most_draws, result.baseline.pool_size),
            min(10, result.baseline.pool_size),
        )
    )
    assert result.baseline.post_selection and "no verdict" in result.baseline.verdict  # held_out=0: post-selection


def ablated_by_hand(model: LoadedModel, pairs: dict[str, Any], circuits: list[set[tuple[int, int]]]) -> list[float]:
    """Each circuit's faithfulness on ``pairs``, measured directly with an Ablator (no job, no ranking)."""
    from mcp_interp.core.circuits.attribution import graph_of
    from mcp_interp.core.circuits.faithfulness import Ablator
    from mcp_interp.core.engine.backend.bridge import edge_hooks
    from mcp_interp.core.engine.patching.pairs import prepare_pairs

    with edge_hooks(model.bridge):
        ablator = Ablator(model.backend, graph_of(model.backend), prepare_pairs(model, **pairs), "corrupt")
        return [ablator.recovered(ablator.run(circuit)).value for circuit in circuits]


@pytest.mark.anyio
async def test_a_stored_node_circuit_is_judged_as_it_was_found(
    tiny_client: Client, tiny_session: Any, tiny: LoadedModel
) -> None:
    """find_circuit(granularity="node") on 2 of 4 pairs, the other 2 held out; its circuit:// re-evaluated on the
    held-out pairs keeps node granularity and find_circuit's pool of min(4k, heads + MLPs) nodes (not the 190-edge
    graph), and its faithfulness is the node circuit measured directly, = find_circuit's held-out number. The random
    draws, rebuilt by hand from the stored pool with the same seed, are find_circuit's own; p is computed from them.
    A payload stored before the pool was kept is judged as edges, with a note saying so."""
    from mcp_interp.core.circuits.attribution import graph_of
    from mcp_interp.core.engine.patching.pairs import pick

    tools = await tools_by_name(tiny_client)
    settings = {"seed": 1, "random_circuits": 40}
    found = assert_valid_structured(
        tools["find_circuit"],
        await tiny_client.call_tool(
            "find_circuit", {**PAIRS, **settings, "target": 0.7, "granularity": "node", "held_out": 0.5}
        ),
    )
    stored = json.loads((await tiny_client.read_resource(found["circuit_uri"])).contents[0].text)
    graph = graph_of(tiny.backend)
    writers = {str(w): i for i, w in enumerate(graph.writers)}
    k, heads_and_mlps = found["k"], len(graph.writers) - 1
    pool = min(4 * k, heads_and_mlps)
    assert stored["granularity"] == "node" and stored["k"] == k and len(stored["pool"]) == pool
    assert stored["pool"][:k] == stored["nodes"] == [n["node"] for n in found["nodes"]]
    held = {key: pick(value, found["held_out_pairs"]) for key, value in PAIRS.items()}
    again = assert_valid_structured(
        tools["circuit_faithfulness"],
        await tiny_client.call_tool("circuit_faithfulness", {**held, **settings, "circuit": found["circuit_uri"]}),
    )
    assert again["granularity"] == "node" and again["baseline"]["pool"] == found["baseline"]["pool"] == pool < 190
    circuit = node_circuit(graph, [writers[n] for n in stored["nodes"]])
    made = again["baseline"]["draws_made"]
    nodes = [writers[n] for n in stored["pool"]]
    draws = [node_circuit(graph, [nodes[i] for i in subset]) for subset in distinct_draws(pool, k, 1, made)]
    direct, *by_hand = ablated_by_hand(tiny, held, [circuit, *draws])
    assert again["n_edges"] == len(circuit) == found["n_edges"]
    assert again["faithfulness"]["value"] == pytest.approx(direct, abs=1e-6)
    assert again["faithfulness"]["value"] == pytest.approx(found["held_out"]["value"], abs=1e-6)
    assert again["baseline"]["draws"] == pytest.approx(by_hand, abs=1e-6)
    assert again["baseline"]["draws"] == pytest.approx(found["baseline"]["draws"], abs=1e-6)
    cap = min(40, math.comb(pool, k) - 1)
    assert again["baseline"]["pool_size"] == math.comb(pool, k) - 1
    assert again["baseline"]["p_value"] == pytest.approx(sequential_p(direct, by_hand, cap, min(10, cap)))
    assert any(f"k = {k} nodes" in note for note in again["notes"])

    old = {key: value for key, value in stored.items() if key not in ("pool", "k", "rank_by")}
    old_uri = tiny_session.store.put("circuit", json.dumps(old).encode()).uri
    legacy = assert_valid_structured(
        tools["circuit_faithfulness"],
        await tiny_client.call_tool("circuit_faithfulness", {**held, "random_circuits": 19, "circuit": old_uri}),
    )
    assert legacy["granularity"] == "edge" and legacy["baseline"]["pool"] == min(4 * len(circuit), 190)
    assert legacy["faithfulness"]["value"] == pytest.approx(direct, abs=1e-6)
    assert any("stored before circuits kept how they were chosen" in note for note in legacy["notes"])


def test_zero_gap_pairs_are_refused(tiny: LoadedModel) -> None:
    same = {**PAIRS, "corrupt_prompts": [PAIRS["clean_prompts"][0], *PAIRS["corrupt_prompts"][1:]]}
    with pytest.raises(InputError, match=r"Pair\(s\) \[0\].*do\s+not change the metric"):
        faithful(tiny, pairs=same, top_k=5)


@pytest.mark.anyio
async def test_circuit_uri_reproduces_find_circuit_to_1e_6(tiny_client: Client) -> None:
    tools = await tools_by_name(tiny_client)
    found = assert_valid_structured(
        tools["find_circuit"],
        await tiny_client.call_tool("find_circuit", {**PAIRS, "target": 0.9, "top": 3, "held_out": 0.0}),
    )
    stored = json.loads((await tiny_client.read_resource(found["circuit_uri"])).contents[0].text)
    assert len(stored["edges"]) == found["n_edges"] > 3 and len(found["edges"]) == 3
    again = assert_valid_structured(
        tools["circuit_faithfulness"],
        await tiny_client.call_tool("circuit_faithfulness", {**PAIRS, "circuit": found["circuit_uri"]}),
    )
    assert again["n_edges"] == found["n_edges"]
    assert again["faithfulness"]["value"] == pytest.approx(found["faithfulness"]["value"], abs=1e-6)
    both = await tiny_client.call_tool(
        "circuit_faithfulness",
        {**PAIRS, "circuit": found["circuit_uri"], "edges": [{"writer": "embed", "reader": "logits"}]},
    )
    wrong = await tiny_client.call_tool("circuit_faithfulness", {**PAIRS, "circuit": found["figure_uri"]})
    unknown = await tiny_client.call_tool("circuit_faithfulness", {**PAIRS, "circuit": "circuit://" + "0" * 32})
    assert both.is_error and "not both" in error_text(both)
    assert wrong.is_error and "circuit:// URI" in error_text(wrong)
    assert unknown.is_error
    zero = await tiny_client.call_tool(
        "find_circuit", {**PAIRS, "corrupt_prompts": PAIRS["clean_prompts"], "target": 0.5}
    )
    assert zero.is_error and "do not change the metric" in error_text(zero).replace("\n", " ")


def test_find_circuit_holds_half_the_pairs_out_by_default_from_four(tiny: LoadedModel) -> None:
    """4 pairs: by default 2 select the circuit and the other 2 (seeded) score it and its baseline, which then gives a
    verdict; the same call with held_out=0 is post-selection and gives none."""
    default = find(tiny, target=0.6, seed=1).result
    assert len(default.held_out_pairs) == 2 and default.held_out is not None
    assert default.held_out_pairs == held_out_split(4, 0.5, 1)[1] and not default.baseline.post_selection
    assert default.baseline.verdict.startswith("the circuit ")
    same = find(tiny, target=0.6, seed=1, held_out=0.0).result
    assert same.held_out is None and same.baseline.post_selection and "no verdict" in same.baseline.verdict
