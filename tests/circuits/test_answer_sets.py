"""The circuit tools on answer sets and the probability difference: one forward per run whatever a set's size, the
numbers equal to runs built by hand from TransformerLens hooks, and answers of several tokens refused with the fix."""

from __future__ import annotations

import pytest
import torch

from mcp_interp.core.circuits.faithfulness_job import CircuitFaithfulnessJob
from mcp_interp.core.circuits.job import EdgeAttributionJob
from mcp_interp.core.circuits.path import PathPatchJob
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.errors import InputError
from tests.circuits.common import CLEAN, CORRUPT

GOOD = {"any_of": ["mary", "tom", "dan"]}
BAD = {"any_of": ["john", "the"]}


def members(model: LoadedModel, spec: dict[str, list[str]]) -> list[int]:
    return [model.tokenizer.convert_tokens_to_ids(w) for w in spec["any_of"]]


def prob_diff(model: LoadedModel, logits: torch.Tensor) -> torch.Tensor:
    p = torch.softmax(logits.double(), dim=-1)
    return p[:, members(model, GOOD)].sum(-1) - p[:, members(model, BAD)].sum(-1)


def test_an_mlp_path_to_the_logits_in_probability_mass(tiny: LoadedModel) -> None:
    job = PathPatchJob(model=tiny, clean_prompts=CLEAN, corrupt_prompts=CORRUPT, correct=GOOD, incorrect=BAD,
                       sender="L1MLP", receivers="logits", metric="prob_diff")  # fmt: skip
    ours = drain(job)
    tok = tiny.tokenizer
    clean_ids, corrupt_ids = encode(tok, CLEAN).input_ids, encode(tok, CORRUPT).input_ids
    clean_logits, clean_cache = tiny.bridge.run_with_cache(clean_ids)
    _, corrupt_cache = tiny.bridge.run_with_cache(corrupt_ids)
    delta = clean_cache["blocks.1.hook_mlp_out"] - corrupt_cache["blocks.1.hook_mlp_out"]
    with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=[("blocks.2.hook_resid_post", lambda v, hook: v + delta)]):
        patched = tiny.bridge(corrupt_ids)[:, -1]
    assert ours.receivers[0].patched_logit_diff == pytest.approx(float(prob_diff(tiny, patched).mean()), abs=1e-6)
    assert ours.clean_logit_diff.per_example == pytest.approx(
        prob_diff(tiny, clean_logits[:, -1].detach()).tolist(), abs=1e-6
    )
    assert any("P(correct) − P(incorrect)" in note for note in ours.notes)


def test_edge_attribution_and_faithfulness_take_sets(tiny: LoadedModel) -> None:
    """EAP's clean and corrupt metric are the hand-computed probability differences; the whole graph as a circuit
    recovers exactly the clean run (1) and none of it the corrupt one (0), on a set metric too."""
    eap = drain(EdgeAttributionJob(model=tiny, clean_prompts=CLEAN, corrupt_prompts=CORRUPT, correct=GOOD,
                                   incorrect=BAD, metric="prob_diff"))  # fmt: skip
    tok = tiny.tokenizer
    with torch.no_grad():
        clean = prob_diff(tiny, tiny.bridge(encode(tok, CLEAN).input_ids)[:, -1])
        corrupt = prob_diff(tiny, tiny.bridge(encode(tok, CORRUPT).input_ids)[:, -1])
    assert eap.clean_logit_diff.value == pytest.approx(float(clean.mean()), abs=1e-6)
    assert eap.corrupt_logit_diff.value == pytest.approx(float(corrupt.mean()), abs=1e-6)
    common = dict(model=tiny, clean_prompts=CLEAN, corrupt_prompts=CORRUPT, correct=GOOD, incorrect=BAD,
                  metric="prob_diff", random_circuits=19)  # fmt: skip
    empty = drain(CircuitFaithfulnessJob(edges=[], **common))  # type: ignore[arg-type]
    whole = drain(CircuitFaithfulnessJob(top_k=10**6, **common))  # type: ignore[arg-type]
    assert empty.faithfulness.value == pytest.approx(0.0, abs=1e-4)  # a fraction: float error over a small gap
    assert whole.faithfulness.value == pytest.approx(1.0, abs=1e-4)


def test_answers_of_several_tokens_are_refused_with_the_fix(tiny: LoadedModel) -> None:
    job = PathPatchJob(model=tiny, clean_prompts=CLEAN, corrupt_prompts=CORRUPT, correct="mary john",
                       incorrect="john", sender="L1MLP", receivers="logits")  # fmt: skip
    with pytest.raises(InputError, match="patch_heads"):
        drain(job)
