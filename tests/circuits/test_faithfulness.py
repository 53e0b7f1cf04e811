"""Circuit faithfulness and find_circuit: the sanity pins, TransformerLens' faithfulness on a multi-head
model, bad input, and the smallest top-k circuit."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp import Client

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.tokens import encode
from tests.circuits.common import CLEAN, CORRUPT, run_eap, sequential_p

# --- circuit_faithfulness ------------------------------------------------------------------------


def faithfulness_job(model: LoadedModel, clean_override: list[str] | None = None, **kwargs: Any) -> Any:
    from mcp_interp.core.circuits.faithfulness_job import CircuitFaithfulnessJob
    from mcp_interp.core.engine.jobs import drain

    pairs_clean = clean_override or [CLEAN[0], "when tom and james went to the park , james gave a ball to"]
    pairs_corrupt = [CORRUPT[0], "when tom and james went to the park , tom gave a ball to"]
    if clean_override:
        pairs_corrupt = [CORRUPT[0], "when tom and james went to the park , tom gave a drink to"]
    job = CircuitFaithfulnessJob(
        model=model,
        clean_prompts=pairs_clean,
        corrupt_prompts=pairs_corrupt,
        correct=["mary", "tom"],
        incorrect=["john", "james"],
        **kwargs,
    )
    drain(job)
    assert job.result is not None
    return job.result


def test_the_curve_ends_at_the_full_graph_and_mean_ablation_reports_its_empty_circuit(tiny: LoadedModel) -> None:
    """The empty circuit under mean ablation is a known answer computed by hand: with every edge ablated, the logits'
    input is the sum of every writer's mean write (plus constant biases), i.e. the pairs' mean clean final residual
    at each position — so its logit difference is the unembedding of that mean at the answer position."""
    import torch

    from mcp_interp.core.engine.backend.bridge import logits_from_residual

    clean = [CLEAN[0], "when tom and james went to the park , james gave a drink to"]
    ids = encode(tiny.tokenizer, clean).input_ids
    assert ids.shape[1] == encode(tiny.tokenizer, clean[:1]).input_ids.shape[1]  # equal lengths: mean is defined
    with torch.no_grad():
        _, cache = tiny.bridge.run_with_cache(ids)
        final = cache[f"blocks.{tiny.bridge.cfg.n_layers - 1}.hook_resid_post"][:, -1].mean(dim=0, keepdim=True)
        mean_logits = logits_from_residual(tiny.bridge, final)[0].double()
        clean_logits = tiny.bridge(ids)[:, -1].double()
        corrupt_ids = encode(tiny.tokenizer, [CORRUPT[0], "when tom and james went to the park , tom gave a drink to"])
        corrupt_logits = tiny.bridge(corrupt_ids.input_ids)[:, -1].double()
    good = [tiny.tokenizer.convert_tokens_to_ids(w) for w in ("mary", "tom")]
    bad = [tiny.tokenizer.convert_tokens_to_ids(w) for w in ("john", "james")]
    rows = torch.arange(2)
    clean_m = clean_logits[rows, good] - clean_logits[rows, bad]
    corrupt_m = corrupt_logits[rows, good] - corrupt_logits[rows, bad]
    empty_m = mean_logits[good] - mean_logits[bad]
    expected = float((empty_m.mean() - corrupt_m.mean()) / (clean_m.mean() - corrupt_m.mean()))
    result = faithfulness_job(tiny, top_k=0, ablation="mean", clean_override=clean)
    assert result.empty_circuit == pytest.approx(expected, abs=1e-4)
    assert result.faithfulness.value == pytest.approx(expected, abs=1e-4)  # top 0 = the empty circuit
    assert abs(expected) > 0.01  # mean ablation's zero point is not the corrupt run's
    assert any("not 0" in note for note in result.notes)
    full = faithfulness_job(tiny, top_k=10**6)
    assert [p.k for p in full.curve] == [10, 25, 50, 100, 190] and full.n_edges == full.total_edges == 190


def test_a_baseline_whose_pool_is_the_circuit_says_so(tiny: LoadedModel) -> None:
    """A known construction: the circuit of every edge (k = 190 = the whole graph) has a pool of 190, so the only
    190-edge circuit *is* the circuit: no other circuit exists, nothing is drawn (a redraw of the circuit would be a
    tie), p = 1 with floor 1, and a note says the draws overlap the circuit (k/pool = 1 > 1/4). The top 10 edges
    (pool 40, k/pool = 1/4 exactly) get no such note. With 2 pairs nothing is held out: the p is post-selection."""
    full = faithfulness_job(tiny, top_k=190, random_circuits=19)
    assert full.baseline.pool == 190 and full.baseline.overlap == 1.0 and full.baseline.pool_size == 0
    assert full.baseline.draws == [] and full.baseline.draws_made == 0
    assert full.baseline.p_value == 1.0 == full.baseline.p_floor
    assert full.baseline.post_selection and "no verdict" in full.baseline.verdict
    overlap = [note for note in full.notes if "overlap the circuit heavily" in note]
    assert len(overlap) == 1 and "190 of a pool of only 190 edges" in overlap[0] and "190.0 of its 190" in overlap[0]
    top = faithfulness_job(tiny, top_k=10, random_circuits=19)
    assert top.baseline.pool == 40 and top.baseline.overlap == 0.25
    assert not [note for note in top.notes if "overlap the circuit" in note]


def test_faithfulness_equals_transformer_lens_on_a_multi_head_model(multi_head: LoadedModel) -> None:
    """TransformerLens' ablate-outside faithfulness on the same circuit, its edges at every position."""
    from transformer_lens.tools.analysis.attribution_patching import FaithfulnessConfig, Node, faithfulness

    eap = run_eap(multi_head)
    graph = eap.graph
    top = sorted(graph.edges, key=lambda e: -abs(float(eap.scores[e])))[:12]
    names = [{"writer": str(graph.writers[w]), "reader": str(graph.readers[r])} for w, r in top]
    from mcp_interp.core.circuits.faithfulness_job import CircuitFaithfulnessJob
    from mcp_interp.core.engine.jobs import drain

    job = CircuitFaithfulnessJob(
        model=multi_head, clean_prompts=CLEAN, corrupt_prompts=CORRUPT, correct="mary", incorrect="john", edges=names
    )
    drain(job)
    assert job.result is not None
    seq = encode(multi_head.tokenizer, CLEAN).input_ids.shape[1]
    n_layers = multi_head.bridge.cfg.n_layers

    def node(kind: str, layer: int, index: int, position: int, writer: bool) -> Any:
        if writer:
            if kind == "embed":
                return Node("embed", position)
            return Node("attn_head_out", position, layer, index) if kind == "head" else Node("mlp_out", position, layer)
        if kind == "logits":
            return Node("logits", position, n_layers - 1)
        if kind == "mlp":
            return Node("mlp_in", position, layer)
        return Node(f"{kind}_input", position, layer, index)

    circuit = [
        (
            node(graph.writers[w].kind, graph.writers[w].layer, graph.writers[w].index, p, True),
            node(graph.readers[r].kind, graph.readers[r].layer, graph.readers[r].index, p, False),
        )
        for w, r in top
        for p in range(seq)
    ]
    tok = multi_head.tokenizer
    good, bad = tok.convert_tokens_to_ids("mary"), tok.convert_tokens_to_ids("john")
    reference = faithfulness(
        multi_head.bridge,
        encode(tok, CLEAN).input_ids,
        encode(tok, CORRUPT).input_ids,
        lambda logits: logits[0, -1, good] - logits[0, -1, bad],
        circuit,
        FaithfulnessConfig(ablation="corrupt"),
    )
    assert job.result.faithfulness.value == pytest.approx(float(reference.recovered), abs=1e-4)
    assert abs(job.result.faithfulness.value) > 0.0 and job.result.faithfulness.value != pytest.approx(1.0, abs=1e-3)


def test_faithfulness_bad_input(tiny: LoadedModel) -> None:
    from mcp_interp.errors import InputError

    for kwargs, message in [
        ({"edges": [{"writer": "L9H0", "reader": "logits"}]}, "Unknown writer"),
        ({"edges": [{"writer": "L0H0", "reader": "L0H1.q"}]}, "no edge L0H0 → L0H1.q"),
        ({"edges": [{"writer": "embed", "reader": "L0KV7.k"}]}, "Unknown reader"),
        ({"edges": [], "top_k": 3}, "Pass one of"),
        ({"top_k": 3, "random_circuits": 5}, "from 19 to 1000"),
        ({"top_k": 3, "random_circuits": 1001}, "from 19 to 1000"),
        ({"edges": [{"writer": "embed", "reader": "logits"}], "held_out": 0.5}, "applies to `top_k`"),
        ({"top_k": 3, "granularity": "head"}, "'edge' or 'node'"),
    ]:
        with pytest.raises(InputError, match=message):
            faithfulness_job(tiny, **kwargs)


@pytest.mark.anyio
async def test_circuit_faithfulness_over_mcp_with_its_curve(tiny_client: Client) -> None:
    import base64

    from tests.helpers import assert_valid_structured, png_text, tools_by_name

    arguments = {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT, "correct": "mary", "incorrect": "john"}
    tools = await tools_by_name(tiny_client)
    result = assert_valid_structured(
        tools["circuit_faithfulness"], await tiny_client.call_tool("circuit_faithfulness", {**arguments, "top_k": 25})
    )
    figure = await tiny_client.read_resource(result["figure_uri"])
    explicit = assert_valid_structured(
        tools["circuit_faithfulness"],
        await tiny_client.call_tool(
            "circuit_faithfulness",
            {**arguments, "edges": [{"writer": "L2H1", "reader": "logits", "score": 0.3}], "random_circuits": 19},
        ),
    )
    assert result["n_edges"] == 25 and [p["k"] for p in result["curve"]] == [10, 25, 50, 100, 190]
    description = png_text(base64.b64decode(figure.contents[0].blob))["Description"]  # type: ignore[union-attr]
    assert "k=190: 1.0" in description
    assert explicit["n_edges"] == 1 and explicit["curve"] == []
    baseline = explicit["baseline"]
    assert len(baseline["draws"]) == baseline["draws_made"] <= 19 and baseline["most_draws"] == 19
    cap = min(19, baseline["pool_size"])  # 1 edge from a pool of 4: 3 other circuits, all drawn
    assert baseline["pool_size"] == 3 and baseline["p_floor"] == pytest.approx(1 / 4)
    value = explicit["faithfulness"]["value"]
    assert baseline["p_value"] == pytest.approx(sequential_p(value, baseline["draws"], cap, min(10, cap)))
    assert baseline["verdict"].startswith("the circuit cannot resolve at α = 0.05")


def test_find_circuit_returns_the_smallest_top_k_reaching_the_target(tiny: LoadedModel) -> None:
    """Bisection's answer k: its faithfulness reaches the target and k − 1 edges do not (checked here
    with circuit_faithfulness on the top k − 1 edges by the same attribution)."""
    from mcp_interp.core.circuits.faithfulness_job import FindCircuitJob
    from mcp_interp.core.engine.jobs import drain

    clean = [CLEAN[0], "when tom and james went to the park , james gave a ball to"]
    corrupt = [CORRUPT[0], "when tom and james went to the park , tom gave a ball to"]
    job = FindCircuitJob(
        model=tiny,
        clean_prompts=clean,
        corrupt_prompts=corrupt,
        correct=["mary", "tom"],
        incorrect=["john", "james"],
        target=0.8,
        random_circuits=200,
    )
    drain(job)
    found = job.result
    assert found is not None and 0 < found.n_edges < found.total_edges
    assert found.faithfulness.value >= 0.8
    below = faithfulness_job(tiny, top_k=found.n_edges - 1)
    assert below.faithfulness.value < 0.8
    assert [s.k for s in found.search] and all(0 < s.k < found.total_edges for s in found.search)
    # A strong effect: no draw of 200 reaches the circuit, so p = 1/201, below the fixed 20 draws' floor of 1/21.
    held = found.faithfulness.value
    assert found.baseline.draws_made == len(found.baseline.draws) == 200 and found.baseline.most_draws == 200
    assert found.baseline.at_least_as_good == sum(d >= held for d in found.baseline.draws) == 0
    assert found.baseline.p_value == pytest.approx(sequential_p(held, found.baseline.draws, 200)) == 1 / 201
    # 2 pairs are too few to hold any out: the circuit was chosen on the pairs it is scored on, so no verdict
    assert found.held_out is None and found.baseline.post_selection
    assert found.baseline.verdict.startswith("post-selection p = 0.00498") and "beats" not in found.baseline.verdict


def test_the_baseline_draws_in_batches_and_stops_when_cancelled(tiny: LoadedModel, monkeypatch: Any) -> None:
    """One progress step per batch of 20 random circuits; closing the job after the first batch runs no more
    circuits (each random circuit is one ``Ablator.run``) and leaves no result."""
    from mcp_interp.core.circuits import faithfulness_job as module
    from mcp_interp.core.circuits.faithfulness import Ablator

    runs = []
    real_run = Ablator.run
    monkeypatch.setattr(Ablator, "run", lambda self, circuit: runs.append(len(circuit)) or real_run(self, circuit))
    job = module.CircuitFaithfulnessJob(
        model=tiny, clean_prompts=CLEAN, corrupt_prompts=CORRUPT, correct="mary", incorrect="john", top_k=10
    )
    steps = job.steps()
    messages = []
    for message in steps:
        if not isinstance(message, str):  # Progress within a stage, or a Pause between draws (others' turn)
            continue
        messages.append(message)
        if message.startswith("random circuits"):
            break
    before = len(runs)
    steps.close()
    assert messages[-1] == "random circuits: 20 drawn (at most 100)"
    assert before == 2 + 20 and len(runs) == before and job.result is None  # the circuit, the empty one, 20 draws
    assert job.total_steps() == 3 + 2 + 5 + 5  # attribution, circuit, done, ≤ 5 batches of 20, the curve's sizes


@pytest.mark.anyio
async def test_find_circuit_over_mcp(tiny_client: Client) -> None:

    from tests.helpers import assert_valid_structured, error_text, tools_by_name

    arguments = {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT, "correct": "mary", "incorrect": "john"}
    tools = await tools_by_name(tiny_client)
    found = assert_valid_structured(
        tools["find_circuit"], await tiny_client.call_tool("find_circuit", {**arguments, "target": 0.5})
    )
    bad = await tiny_client.call_tool("find_circuit", {**arguments, "target": 1.5})
    assert found["faithfulness"]["value"] >= 0.5 and found["n_edges"] > 20
    # The returned result lists the top 20 edges; the complete one, one resources/read away, lists every edge.
    assert len(found["edges"]) == 20 and found["result_uri"].startswith("result://")
    complete = json.loads((await tiny_client.read_resource(found["result_uri"])).contents[0].text)
    assert len(complete["edges"]) == found["n_edges"] and complete["edges"][:20] == found["edges"]
    assert found["figure_uri"].startswith("figure://")
    assert "(0, 1]" in error_text(bad)
