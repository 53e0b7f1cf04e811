"""Answers that are sets, sequences or sets of sequences, and the probability difference, in patching.

The reference is written here independently of ``patching.rows``: one row per (pair, alternative, token) with no
sharing, the metric summed by hand from log-softmaxes, run through TransformerLens' own patcher
(``get_act_patch_attn_head_out_all_pos``). The plan must give the same numbers from far fewer rows: a set of single
tokens costs one row per pair (one forward), whatever its size.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from transformer_lens import patching as tl_patching

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.engine.patching.rows import RowPlan
from mcp_interp.core.engine.text.answers import resolve_answer_specs
from mcp_interp.core.heads.patch_heads import PatchHeadsJob
from mcp_interp.errors import InputError
from tests.helpers import IOI_CLEAN as CLEAN
from tests.helpers import IOI_CORRUPT as CORRUPT

SET_GOOD = {"any_of": ["mary", "tom", "dan"]}
SET_BAD = {"any_of": ["john", "james", "sid", "the"]}
SEQ_GOOD = {"any_of": ["to mary", "to tom", "a ball"]}  # two share the first token 'to'
SEQ_BAD = {"any_of": ["to john", "the store"]}


def alternatives(model: LoadedModel, spec: dict[str, list[str]]) -> list[list[int]]:
    return [model.tokenizer(text, add_special_tokens=False)["input_ids"] for text in spec["any_of"]]


def reference(model: LoadedModel, good: dict[str, Any], bad: dict[str, Any], metric: str) -> torch.Tensor:
    """TransformerLens' head patching of every head over every row a brute force needs, [layers, heads] mean."""
    tok = model.tokenizer
    rows: list[tuple[list[int], list[int]]] = []
    reads: list[tuple[int, int, int, int, int]] = []  # (pair, role, alternative, row, token)
    for pair in range(len(CLEAN)):
        prompts = tok(CLEAN[pair])["input_ids"], tok(CORRUPT[pair])["input_ids"]
        for role, spec in ((0, good), (1, bad)):
            for a, alt in enumerate(alternatives(model, spec)):
                for k, token in enumerate(alt):
                    rows.append(([*prompts[0], *alt[:k]], [*prompts[1], *alt[:k]]))
                    reads.append((pair, role, a, len(rows) - 1, token))
    width = max(len(r[0]) for r in rows)
    clean_ids = torch.tensor([r[0] + [0] * (width - len(r[0])) for r in rows])
    corrupt_ids = torch.tensor([r[1] + [0] * (width - len(r[1])) for r in rows])
    last = [len(r[0]) - 1 for r in rows]

    def value(logits: torch.Tensor) -> torch.Tensor:
        log_p: dict[tuple[int, int, int], torch.Tensor] = {}
        for pair, role, a, row, token in reads:
            lp = torch.log_softmax(logits[row, last[row]].double(), dim=-1)[token]
            log_p[(pair, role, a)] = log_p.get((pair, role, a), torch.zeros((), dtype=torch.float64)) + lp
        total = torch.zeros((), dtype=torch.float64)
        for pair in range(len(CLEAN)):
            p = [sum(v.exp() for (q, r, _), v in log_p.items() if (q, r) == (pair, role)) for role in (0, 1)]
            total = total + (p[0] - p[1] if metric == "prob_diff" else torch.log(p[0]) - torch.log(p[1]))
        return total / len(CLEAN)

    _, cache = model.bridge.run_with_cache(clean_ids)
    return tl_patching.get_act_patch_attn_head_out_all_pos(model.bridge, corrupt_ids, cache, value).double()


def patched(model: LoadedModel, good: Any, bad: Any, metric: str) -> tuple[Any, PatchHeadsJob]:
    job = PatchHeadsJob(model=model, clean_prompts=CLEAN, corrupt_prompts=CORRUPT, correct=good, incorrect=bad,
                        metric=metric)  # type: ignore[arg-type]  # fmt: skip
    return drain(job), job


@pytest.mark.parametrize("metric", ["prob_diff", "logit_diff"])
def test_a_set_of_single_tokens_is_one_row_per_pair_and_equals_the_brute_force(tiny: LoadedModel, metric: str) -> None:
    result, job = patched(tiny, SET_GOOD, SET_BAD, metric)
    assert job.plan.n_rows == len(CLEAN)  # one forward's rows, not one per member
    ours = torch.tensor(result.patched_logit_diff, dtype=torch.float64)
    assert (ours - reference(tiny, SET_GOOD, SET_BAD, metric)).abs().max().item() < 1e-6


def test_sets_of_sequences_share_their_rows_and_equal_the_brute_force(tiny: LoadedModel) -> None:
    result, job = patched(tiny, SEQ_GOOD, SEQ_BAD, "prob_diff")
    # Per pair: the prompt, prompt + 'to', prompt + 'a', prompt + 'the' — 4 rows, where the brute force has 10.
    assert job.plan.n_rows == 4 * len(CLEAN)
    ours = torch.tensor(result.patched_logit_diff, dtype=torch.float64)
    assert (ours - reference(tiny, SEQ_GOOD, SEQ_BAD, "prob_diff")).abs().max().item() < 1e-6
    assert any(f"{job.plan.n_rows} rows for {len(CLEAN)} pairs" in n for n in result.notes)


def test_the_plan_folds_hand_made_values_as_the_formula_says(tiny: LoadedModel) -> None:
    good = resolve_answer_specs(tiny.tokenizer, [SEQ_GOOD], 1, "correct")
    bad = resolve_answer_specs(tiny.tokenizer, [SEQ_BAD], 1, "incorrect")
    plan = RowPlan.answers("prob_diff", good, bad)
    values = torch.randn(plan.n_rows, plan.reads.shape[1], dtype=torch.float64).clamp(max=-0.01)  # type: ignore[union-attr]
    lookup = {
        (tuple(c), int(t)): float(values[r, s])
        for r, c in enumerate(plan.continuations)
        for s, t in enumerate(plan.reads[r].tolist())  # type: ignore[union-attr]
        if t >= 0
    }

    def mass(spec: dict[str, list[str]]) -> float:
        total = 0.0
        for alt in alternatives(tiny, spec):
            total += math.exp(sum(lookup[(tuple(alt[:k]), t)] for k, t in enumerate(alt)))
        return total

    assert float(plan.combine(values)[0]) == pytest.approx(mass(SEQ_GOOD) - mass(SEQ_BAD), abs=1e-12)


def test_attribution_of_a_set_metric_is_its_directional_derivative(tiny: LoadedModel) -> None:
    """The first-order estimate of a head's patch, for prob_diff over sets, equals the derivative of the metric along
    the patch direction, taken here by a central finite difference of hand-interpolated runs."""
    result, _ = patched(tiny, SET_GOOD, SET_BAD, "prob_diff")
    attribution = PatchHeadsJob(model=tiny, clean_prompts=CLEAN, corrupt_prompts=CORRUPT, correct=SET_GOOD,
                                incorrect=SET_BAD, metric="prob_diff", method="attribution")  # fmt: skip
    estimated = torch.tensor(drain(attribution).patched_logit_diff, dtype=torch.float64)
    corrupt_value = result.corrupt_logit_diff.value
    layer, head = 1, 2
    tok = tiny.tokenizer
    clean_ids = torch.tensor([tok(t)["input_ids"] for t in CLEAN])
    corrupt_ids = torch.tensor([tok(t)["input_ids"] for t in CORRUPT])
    _, cache = tiny.bridge.run_with_cache(clean_ids)
    good = [t[0] for t in alternatives(tiny, SET_GOOD)]
    bad = [t[0] for t in alternatives(tiny, SET_BAD)]

    def at(eps: float) -> float:
        def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:
            z = z.clone()
            clean_z = cache[f"blocks.{layer}.attn.hook_z"][:, :, head]
            z[:, :, head] = z[:, :, head] + eps * (clean_z - z[:, :, head])
            return z

        with torch.no_grad():
            logits = tiny.bridge.run_with_hooks(corrupt_ids, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", hook)])
        p = torch.softmax(logits[:, -1].double(), dim=-1)
        return float((p[:, good].sum(-1) - p[:, bad].sum(-1)).mean())

    derivative = (at(1e-3) - at(-1e-3)) / 2e-3
    assert at(0.0) == pytest.approx(corrupt_value, abs=1e-6)
    assert float(estimated[layer, head]) - corrupt_value == pytest.approx(derivative, abs=1e-5)


def test_prob_diff_needs_both_answers(tiny: LoadedModel) -> None:
    with pytest.raises(InputError, match="needs `incorrect`"):
        drain(PatchHeadsJob(model=tiny, clean_prompts=CLEAN, corrupt_prompts=CORRUPT, correct=SET_GOOD,
                            metric="prob_diff"))  # fmt: skip
