"""Answers of several tokens and sets of answers (core.answers) in the metric tools, on `tiny`:
against a hand teacher-forced loop, a hand log-sum-exp, and the single-token path."""

from __future__ import annotations

import math

import pytest
import torch

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.answers import parse_answer
from mcp_interp.core.localize.ablate import ablate
from mcp_interp.core.readouts import predictions as readouts
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import AnyOf, Intervention

PROMPTS = ["when mary and john went to the store , john gave a drink", "when tom went to the park"]
LONG = " to mary"  # two tokens under the tiny tokenizer: ' to' + ' mary' (checked below)


def hand_sequence_log_prob(model: LoadedModel, prompt: str, answer: str, hooks: list | None = None) -> float:  # type: ignore[type-arg]
    """Σ_k log P(t_k | prompt, t_<k), one forward per step, each prompt alone (no padding, no batching)."""
    context = list(model.tokenizer(prompt)["input_ids"])
    total = 0.0
    for token in model.tokenizer(answer, add_special_tokens=False)["input_ids"]:
        with model.bridge.hooks(fwd_hooks=hooks or []):
            logits = model.bridge(torch.tensor([context]))[0, -1]
        total += float(torch.log_softmax(logits.double(), dim=-1)[token])
        context.append(token)
    return total


def test_the_answers_used_here_have_the_lengths_the_tests_assume(tiny: LoadedModel) -> None:
    assert parse_answer(tiny.tokenizer, LONG, "correct").kind == "sequence"
    assert len(parse_answer(tiny.tokenizer, LONG, "correct").alternatives[0]) == 2
    assert parse_answer(tiny.tokenizer, "mary", "correct").kind == "token"


def test_sequence_logit_diff_is_the_difference_of_teacher_forced_log_probs(tiny: LoadedModel) -> None:
    result = readouts.logit_diff(tiny, PROMPTS, LONG, " to john")
    assert result.answer_kind == "sequence"
    for prompt, example in zip(PROMPTS, result.examples, strict=True):
        good = hand_sequence_log_prob(tiny, prompt, LONG)
        bad = hand_sequence_log_prob(tiny, prompt, " to john")
        assert example.correct_log_prob == pytest.approx(good, abs=1e-5)
        assert example.logit_diff == pytest.approx(good - bad, abs=1e-5)
    assert any("teacher-forced" in note for note in result.notes)


def test_single_token_answers_keep_the_logit_path(tiny: LoadedModel) -> None:
    token = readouts.logit_diff(tiny, PROMPTS, "mary", "john")
    assert token.answer_kind == "token"
    for prompt, example in zip(PROMPTS, token.examples, strict=True):  # log P and P(correct) − P(incorrect) by hand
        assert example.correct_log_prob == pytest.approx(hand_sequence_log_prob(tiny, prompt, "mary"), abs=1e-5)
    assert token.prob_diff is not None
    expected = [
        math.exp(hand_sequence_log_prob(tiny, p, "mary")) - math.exp(hand_sequence_log_prob(tiny, p, "john"))
        for p in PROMPTS
    ]
    assert token.prob_diff.per_example == pytest.approx(expected, abs=1e-6)
    # The same answers as one-member sets go through the sequence path: log P(a) − log P(b) = logit difference.
    as_sets = readouts.logit_diff(tiny, PROMPTS, AnyOf(any_of=["mary"]), AnyOf(any_of=["john"]))
    assert as_sets.answer_kind == "set"
    assert as_sets.logit_diff.per_example == pytest.approx(token.logit_diff.per_example, abs=1e-5)


def test_a_set_scores_the_log_of_its_summed_probability(tiny: LoadedModel) -> None:
    members = ["mary", "john", LONG]
    result = readouts.answer_rank(tiny, PROMPTS, {"any_of": members})
    for prompt, example in zip(PROMPTS, result.examples, strict=True):
        expected = math.log(sum(math.exp(hand_sequence_log_prob(tiny, prompt, m)) for m in members))
        assert example.log_prob == pytest.approx(expected, abs=1e-5)
        # rank: the best-ranked member's first token ('mary', 'john' or ' to')
        ids = torch.tensor([tiny.tokenizer(prompt)["input_ids"]])
        logits = tiny.bridge(ids)[0, -1]
        firsts = [tiny.tokenizer(m, add_special_tokens=False)["input_ids"][0] for m in members]
        best = min(int((logits > logits[t]).sum()) for t in firsts)
        assert example.rank == best


def test_per_prompt_lists_mix_tokens_sequences_and_sets(tiny: LoadedModel) -> None:
    result = readouts.answer_rank(tiny, PROMPTS, ["mary", AnyOf(any_of=["tom", LONG])])
    assert result.answer_kind == "set"
    assert result.examples[0].log_prob == pytest.approx(hand_sequence_log_prob(tiny, PROMPTS[0], "mary"), abs=1e-5)


def test_sequences_under_an_intervention_and_in_ablate(tiny: LoadedModel) -> None:
    def zero_head(z: torch.Tensor, hook: object) -> torch.Tensor:
        z = z.clone()
        z[:, :, 1] = 0
        return z

    hooks = [("blocks.1.attn.hook_z", zero_head)]
    spec = Intervention(ablate=["L1H1"])
    measured = readouts.logit_diff(tiny, PROMPTS, LONG, " to john", spec)
    for prompt, example in zip(PROMPTS, measured.examples, strict=True):
        good = hand_sequence_log_prob(tiny, prompt, LONG, hooks)
        bad = hand_sequence_log_prob(tiny, prompt, " to john", hooks)
        assert example.logit_diff == pytest.approx(good - bad, abs=1e-5)
    outcome = ablate(tiny, PROMPTS, Intervention(ablate=["L1H1"]), LONG, " to john")
    assert outcome.after.logit_diff is not None and outcome.before.logit_diff is not None
    assert outcome.after.logit_diff.per_example == pytest.approx(measured.logit_diff.per_example, abs=1e-6)
    plain = readouts.logit_diff(tiny, PROMPTS, LONG, " to john")
    assert outcome.before.logit_diff.per_example == pytest.approx(plain.logit_diff.per_example, abs=1e-6)


def test_bad_answers_say_how_to_fix_them(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    import mcp_interp.state.limits as limits

    with pytest.raises(InputError, match="non-empty string"):
        readouts.answer_rank(tiny, PROMPTS, "")
    with pytest.raises(InputError, match="any_of"):
        readouts.answer_rank(tiny, PROMPTS, {"any_of": []})
    with pytest.raises(InputError, match="one answer per prompt"):
        readouts.answer_rank(tiny, PROMPTS, ["mary"])
    monkeypatch.setattr(limits, "_current", limits.Limits(max_tokens=14))
    with pytest.raises(InputError, match="max_tokens"):  # 13 prompt tokens + 3 of the 4 answer tokens fed = 16 > 14
        readouts.answer_rank(tiny, PROMPTS, " to mary to mary")


def hand_mean_answer_z(model: LoadedModel, prompts: list[str], layer: int, head: int) -> dict[int, torch.Tensor]:
    """Each prompt run alone: the head's z at every distance from the prompt's end, averaged over the prompts."""
    by_distance: dict[int, list[torch.Tensor]] = {}
    for text in prompts:
        ids = torch.tensor([model.tokenizer(text)["input_ids"]])
        _, cache = model.bridge.run_with_cache(ids, names_filter=lambda n: n == f"blocks.{layer}.attn.hook_z")
        z = cache[f"blocks.{layer}.attn.hook_z"][0, :, head]
        for distance in range(z.shape[0]):
            by_distance.setdefault(distance, []).append(z[z.shape[0] - 1 - distance])
    return {d: torch.stack(v).mean(dim=0) for d, v in by_distance.items()}


@pytest.mark.parametrize("positions", ["all", "last"])
def test_mean_ablation_with_sequence_answers_uses_the_prompts_replacements(tiny: LoadedModel, positions: str) -> None:
    """The replacement is the prompts' own mean (by distance from each prompt's end), whatever the answers: one
    prompt's number is the same whether the other prompt's answer has 1 or 3 tokens, and equals a hand
    teacher-forced loop that writes that mean at the prompt's positions (and, for 'all', the mean answer-position z
    at the answer's tokens)."""
    layer, head = 1, 1
    means = hand_mean_answer_z(tiny, PROMPTS, layer, head)
    spec = Intervention(ablate=[f"L{layer}H{head}"], method="mean", positions=positions)  # type: ignore[arg-type]
    short = readouts.answer_rank(tiny, PROMPTS, [LONG, "mary"], spec)
    long = readouts.answer_rank(tiny, PROMPTS, [LONG, " to mary and"], spec)
    assert short.examples[0].log_prob == pytest.approx(long.examples[0].log_prob, abs=1e-6)
    prompt_length = len(tiny.tokenizer(PROMPTS[0])["input_ids"])

    def write_mean(z: torch.Tensor, hook: object) -> torch.Tensor:
        z = z.clone()
        for p in range(z.shape[1]):
            if p < prompt_length:
                if positions == "all" or p == prompt_length - 1:
                    z[0, p, head] = means[prompt_length - 1 - p]
            elif positions == "all":
                z[0, p, head] = means[0]
        return z

    expected = hand_sequence_log_prob(tiny, PROMPTS[0], LONG, [(f"blocks.{layer}.attn.hook_z", write_mean)])
    assert short.examples[0].log_prob == pytest.approx(expected, abs=1e-5)


def test_resample_ablation_with_sequence_answers_by_hand(tiny: LoadedModel) -> None:
    """Two equal-length prompts swap z (the only derangement of 2); the answer tokens get the partner's answer-position
    z. Checked against a hand loop."""
    prompts = ["when tom went to the park", "when mary went to the shop"]
    lengths = {len(tiny.tokenizer(p)["input_ids"]) for p in prompts}
    assert len(lengths) == 1
    name = "blocks.1.attn.hook_z"
    partner = tiny.bridge.run_with_cache(torch.tensor([tiny.tokenizer(prompts[1])["input_ids"]]))[1][name][0, :, 2]
    measured = readouts.answer_rank(tiny, prompts, LONG, Intervention(ablate=["L1H2"], method="resample"))

    def swap_in(z: torch.Tensor, hook: object) -> torch.Tensor:
        z = z.clone()
        n = partner.shape[0]
        z[0, : min(n, z.shape[1]), 2] = partner[: z.shape[1]]
        z[0, n:, 2] = partner[n - 1]
        return z

    expected = hand_sequence_log_prob(tiny, prompts[0], LONG, [(name, swap_in)])
    assert measured.examples[0].log_prob == pytest.approx(expected, abs=1e-5)


def test_mean_ablation_of_one_prompt_is_refused_and_reference_prompts_give_the_mean(tiny: LoadedModel) -> None:
    with pytest.raises(InputError, match="reference_prompts"):
        ablate(tiny, PROMPTS[:1], Intervention(ablate=["L1H1"], method="mean"), "mary", "john")
    references = ["when tom went to the park", "when mary and john went to the store , john gave a drink"]
    means = hand_mean_answer_z(tiny, references, 1, 1)
    length = len(tiny.tokenizer(PROMPTS[0])["input_ids"])

    def write_mean(z: torch.Tensor, hook: object) -> torch.Tensor:
        z = z.clone()
        for p in range(z.shape[1]):
            z[0, p, 1] = means[length - 1 - p]
        return z

    spec = Intervention(ablate=["L1H1"], method="mean", reference_prompts=references)
    outcome = ablate(tiny, PROMPTS[:1], spec, "mary", "john")
    with tiny.bridge.hooks(fwd_hooks=[("blocks.1.attn.hook_z", write_mean)]):
        logits = tiny.bridge(torch.tensor([tiny.tokenizer(PROMPTS[0])["input_ids"]]))[0, -1]
    mary, john = (tiny.tokenizer(w, add_special_tokens=False)["input_ids"][0] for w in ("mary", "john"))
    assert outcome.after.logit_diff is not None
    assert outcome.after.logit_diff.value == pytest.approx(float(logits[mary] - logits[john]), abs=1e-5)
    with pytest.raises(InputError, match="methods 'mean' and 'resample'"):
        ablate(tiny, PROMPTS, Intervention(ablate=["L1H1"], reference_prompts=references), "mary", "john")
    with pytest.raises(InputError, match="at least as long"):
        ablate(tiny, PROMPTS[:1], Intervention(ablate=["L1H1"], method="mean", reference_prompts=["tom"]))


def test_a_set_whose_member_begins_another_is_refused(tiny: LoadedModel) -> None:
    with pytest.raises(InputError, match="token prefix"):
        readouts.answer_rank(tiny, PROMPTS, {"any_of": [" to", LONG]})
