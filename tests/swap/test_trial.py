"""The causal-swap protocol end to end on the `tiny` model (random weights: structure, not science).

Expected statuses are derived independently with the library's own decomposition, and the batched
real/control edits are checked against TransformerLens' `coordinate_patch_hooks` run one by one.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.swap.benchmark import SwapBenchmarkJob
from mcp_interp.core.swap.controls import control_pool, distances_from, draw_controls
from mcp_interp.core.swap.lenses import identity_lens
from mcp_interp.core.swap.trial import causal_swap_trial, edit_position, edited_last_logits, never_drawn, prompt_run
from mcp_interp.errors import InputError, NumericalError
from mcp_interp.schemas.swap import SwapSettings

TEMPLATE = "The capital of {arg} is the city of"


def settings(**change: Any) -> SwapSettings:
    base: dict[str, Any] = {
        "lens": "logit",
        "position": "last",
        "alpha": 1.0,
        "k": 25,
        "control_seeds": [0, 1, 2, 3, 4],
        "control_tolerance": 0.1,
        "require_target_known": True,
    }
    return SwapSettings(**(base | change))


def top_word(model: LoadedModel, concept: str) -> str:
    """The tiny model's own top-1 for a prompt: the answer it is 'capable' of."""
    ids = model.tokenizer(TEMPLATE.replace("{arg}", concept))["input_ids"]
    with torch.no_grad():
        logits = model.bridge(torch.tensor([ids]), return_type="logits")[0, -1]
    return str(model.tokenizer.decode([int(logits.argmax())])).strip()


def source_active(model: LoadedModel, concept: str, layer: int, position: str) -> bool:
    lens, _ = identity_lens(model)
    ids, index = edit_position(model.tokenizer, TEMPLATE, concept, position)
    run = prompt_run(model, ids, index, [layer])
    support = lens.decompose(model.bridge, run.activations[layer], layer, k=25).support.tolist()
    return model.tokenizer(" " + concept, add_special_tokens=False)["input_ids"][0] in support


def trial(model: LoadedModel, layer: int, **change: Any) -> Any:
    lens, info = identity_lens(model)
    return causal_swap_trial(
        model,
        lens,
        info,
        TEMPLATE,
        "France",
        "Canada",
        top_word(model, "France"),
        top_word(model, "Canada"),
        layer,
        settings(**change),
    ).trial


def test_trial_statuses_follow_the_decomposition_and_the_control_pool(tiny: LoadedModel) -> None:
    statuses = {}
    for layer in (0, 1):
        expected_active = source_active(tiny, "France", layer, "last")
        record = trial(tiny, layer)
        statuses[layer] = record.status
        assert record.status == ("executed" if expected_active else "skipped_source_inactive")
        assert record.baseline.source_answer.top1
        assert ("not in the active support" in (record.detail or "")) == (not expected_active)
        assert record.support  # the active atoms are reported either way
    assert "skipped_source_inactive" in statuses.values() and "executed" in statuses.values()
    active_layer = next(layer for layer, status in statuses.items() if status == "executed")
    # Tolerance 0 admits only an exact distance match, which random weights never give.
    no_control = trial(tiny, active_layer, control_tolerance=0.0)
    assert no_control.status == "skipped_no_control_token"
    assert "never widened" in no_control.detail and no_control.control_pool_size == 0


def test_executed_trial_numbers_match_coordinate_patch_hooks(tiny: LoadedModel) -> None:
    layer = next(layer for layer in (0, 1) if source_active(tiny, "France", layer, "last"))
    record = trial(tiny, layer)
    assert record.status == "executed" and len(record.controls) == 5
    lens, _ = identity_lens(tiny)
    tok = tiny.tokenizer
    ids = torch.tensor([tok(TEMPLATE.replace("{arg}", "France"))["input_ids"]])
    source, target = (tok(" " + w, add_special_tokens=False)["input_ids"][0] for w in ("France", "Canada"))
    dictionary = lens.lens_vector_dictionary(tiny.bridge, layer)
    # Controls: drawn from the pool rebuilt here from its definition.
    x = prompt_run(tiny, ids[0].tolist(), ids.shape[1] - 1, [layer]).activations[layer]
    full_support = lens.decompose(tiny.bridge, x, layer, k=25).support.tolist()
    assert record.support_size == len(full_support)
    assert {a.token_id for a in record.support} <= set(full_support)
    answers = [record.baseline.source_answer.token_id, record.real.token_id]
    never = [*tok.all_special_ids, *range(len(tok), dictionary.shape[0])]
    pool = control_pool(dictionary, source, target, [*answers, *full_support, *never], 0.1)
    assert [c.token_id for c in record.controls] == draw_controls(pool.candidates, range(5), "trial/France→Canada")
    assert record.control_pool_size == pool.candidates.numel()
    # Margin gains: each edit's target-answer margin minus the unedited one (logits).
    unedited = record.baseline.target_answer.margin
    assert record.margin_gain == pytest.approx(record.real.margin - unedited)
    assert record.control_margin_gains == pytest.approx([c.score.margin - unedited for c in record.controls])
    special = set(tok.all_special_ids)
    for control in record.controls:
        expected = float(distances_from(dictionary, source)[control.token_id])
        assert control.displacement == pytest.approx(expected)
        assert abs(control.displacement - record.target_displacement) <= 0.1 * record.target_displacement
        assert control.token_id not in special
        # Substitute with the control outside the support moves c_src from the source to the control atom:
        # Δh = α·c_src·(v_t − v_src), so ‖Δh‖ = α·c_src·displacement.
        assert control.edit_norm == pytest.approx(record.source_coordinate * control.displacement, rel=1e-4)
    # The real edit, by the substitute rule: Δh = α·[(c_src − c_tgt)·v_tgt − c_src·v_src], c_tgt = 0 when the
    # target atom is not active (then ‖Δh‖ = α·c_src·‖v_tgt − v_src‖).
    decomposition = lens.decompose(tiny.bridge, x, layer, k=25)
    coordinates = dict(zip(decomposition.support.tolist(), decomposition.coordinates.tolist(), strict=True))
    c_src, c_tgt = coordinates[source], coordinates.get(target, 0.0)
    assert record.target_was_active == (target in coordinates)
    expected_delta = (c_src - c_tgt) * dictionary[target] - c_src * dictionary[source]
    assert record.real_edit_norm == pytest.approx(float(expected_delta.norm()), rel=1e-4)
    # The solver's diagnostics are recorded on every edit: the cosine of the two atoms, recomputed here.
    for edit, diagnostics in [(target, record.real_patch), *[(c.token_id, c.patch) for c in record.controls]]:
        assert diagnostics is not None
        cosine = torch.nn.functional.cosine_similarity(dictionary[source], dictionary[edit], dim=0)
        assert diagnostics.source_target_cosine == pytest.approx(float(cosine), abs=1e-5)
        assert diagnostics.residual_max_delta < 1e-4  # the anchored residual is preserved
    # Each edit, rerun alone through the library's live hook, gives the same target logit.
    for edit, score in [(target, record.real), *[(c.token_id, c.score) for c in record.controls]]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hooks = lens.coordinate_patch_hooks(tiny.bridge, source, edit, [layer], positions=[-1], k=25)
        with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=hooks):
            logits = tiny.bridge(ids, return_type="logits")[0, -1]
        assert float(logits[score.token_id]) == pytest.approx(score.logit, abs=1e-4)
        assert int((logits > logits[score.token_id]).sum()) == score.rank


def test_non_finite_logits_stop_the_trial_with_the_prompt_and_layer(tiny: LoadedModel) -> None:
    ids, index = edit_position(tiny.tokenizer, TEMPLATE, "France", "last")
    run = prompt_run(tiny, ids, index, [1])
    poisoned = torch.full((1, tiny.bridge.cfg.d_model), float("nan"))
    with pytest.raises(NumericalError, match=r"non-finite logits.*layer 1, position 7.*france"):
        edited_last_logits(tiny, run, 1, poisoned)
    finite = edited_last_logits(tiny, run, 1, run.activations[1].unsqueeze(0))
    assert torch.allclose(finite[0], run.last_logits, atol=1e-4)  # writing back the activation changes nothing


def test_concept_position_is_the_concept_token(tiny: LoadedModel) -> None:
    ids, index = edit_position(tiny.tokenizer, TEMPLATE, "France", "concept")
    assert tiny.tokenizer.decode([ids[index]]).strip() == "france" and index == 3
    ids, index = edit_position(tiny.tokenizer, "{arg} is a country", "Canada", "concept")
    assert index == 0
    ids, index = edit_position(tiny.tokenizer, TEMPLATE, "France", -2)
    assert index == len(ids) - 2 == 6
    with pytest.raises(InputError, match="outside the prompt"):
        edit_position(tiny.tokenizer, TEMPLATE, "France", 99)


def test_baseline_filter_excludes_a_prompt_the_model_cannot_answer(tiny: LoadedModel) -> None:
    lens, info = identity_lens(tiny)
    wrong = next(w for w in ("paris", "six", "the") if w != top_word(tiny, "France"))
    record = causal_swap_trial(
        tiny, lens, info, TEMPLATE, "France", "Canada", wrong, top_word(tiny, "Canada"), 1, settings()
    ).trial
    assert record.status == "excluded_not_capable"
    assert record.real is None and record.controls == []
    assert f"rank {record.baseline.source_answer.rank}" in record.detail and record.baseline.source_answer.rank > 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"control_seeds": []}, "control_seeds"),
        ({"control_seeds": [1, 1]}, "distinct"),
        ({"k": 30}, "between 1 and 25"),
    ],
)
def test_bad_settings_are_input_errors(tiny: LoadedModel, change: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        trial(tiny, 1, **change)


def test_bad_words_and_layers_are_input_errors(tiny: LoadedModel) -> None:
    lens, info = identity_lens(tiny)
    with pytest.raises(InputError, match="cannot be edited with this lens"):
        causal_swap_trial(tiny, lens, info, TEMPLATE, "France", "Canada", ".", "six", 2, settings())
    with pytest.raises(InputError, match="'zzqx' cannot be scored: ' zzqx' tokenizes to \\['\\[UNK\\]'\\]"):
        causal_swap_trial(tiny, lens, info, TEMPLATE, "France", "Canada", "zzqx", "six", 1, settings())
    with pytest.raises(InputError, match="same token"):
        causal_swap_trial(tiny, lens, info, TEMPLATE, "France", "France", ".", "six", 1, settings())


def test_special_and_padding_ids_are_never_drawn() -> None:
    class Tok:
        all_special_ids = (0, 3)

        def __len__(self) -> int:
            return 6

    assert never_drawn(Tok(), d_vocab=8) == [0, 3, 6, 7]


def test_a_template_without_a_slot_is_an_input_error(tiny: LoadedModel) -> None:
    lens, info = identity_lens(tiny)
    with pytest.raises(InputError, match="exactly once"):
        causal_swap_trial(tiny, lens, info, "no slot", "France", "Canada", ".", "six", 1, settings())


def test_a_corpus_with_no_runnable_trial_is_an_error_naming_the_words(tiny: LoadedModel) -> None:
    from mcp_interp.schemas.swap import SwapCorpus

    corpus = SwapCorpus.model_validate(
        {
            "name": "half-known",
            "concepts": ["France", "Canada"],
            "functions": [{"name": "f", "template": TEMPLATE, "answers": {"France": "paris", "Canada": "zzqx"}}],
        }
    )
    lens, info = identity_lens(tiny)
    with pytest.raises(InputError, match="No trial of corpus 'half-known' can run") as raised:
        SwapBenchmarkJob(model=tiny, corpus=corpus, layers=[1], lens=lens, lens_info=info, settings=settings())
    assert "zzqx" in str(raised.value)


def test_the_benchmark_document_records_the_finished_job_and_fingerprints_only_the_protocol(tiny: LoadedModel) -> None:
    from mcp_interp.core.swap import artifact
    from mcp_interp.schemas.common import ModelRef
    from mcp_interp.schemas.swap import SwapCorpus
    from tests.helpers import tiny_corpus

    lens, info = identity_lens(tiny)
    corpus = SwapCorpus.model_validate(tiny_corpus(tiny))
    job = SwapBenchmarkJob(model=tiny, corpus=corpus, layers=[1], lens=lens, lens_info=info, settings=settings())
    ref = ModelRef(
        name=tiny.name, source="tiny", fingerprint=tiny.fingerprint, dtype=tiny.dtype, device=tiny.device, versions={}
    )
    with pytest.raises(ValueError, match="not finished"):
        artifact.benchmark_document(job, ref, "0.0.test")
    drain(job)
    assert job.result is not None
    document = artifact.benchmark_document(job, ref, "0.0.test", {"elapsed_s": 1.5})
    protocol, run, results = document["protocol"], document["run"], document["results"]
    assert run["mcp_interp_version"] == "0.0.test" and run["elapsed_s"] == 1.5 and run["model"]["device"] == "cpu"
    assert protocol["model"] == {"name": tiny.name, "fingerprint": tiny.fingerprint, "dtype": tiny.dtype}
    assert protocol["corpus"]["name"] == "tiny-capitals" and protocol["layers"] == [1]
    assert protocol["mechanism"] == job.settings.mechanism
    assert results["summary"] == job.result.summary.model_dump(mode="json")
    assert len(results["trials"]) == len(job.trials) and len(results["exclusions"]) == len(job.result.exclusions)
    assert artifact.verify(document).valid

    # Another run of the same protocol — later, elsewhere, on another device — shares the protocol fingerprint.
    again = SwapBenchmarkJob(model=tiny, corpus=corpus, layers=[1], lens=lens, lens_info=info, settings=settings())
    drain(again)
    elsewhere = ref.model_copy(update={"device": "cuda:0", "versions": {"torch": "other"}})
    second = artifact.benchmark_document(again, elsewhere, "9.9.9", {"elapsed_s": 99.0})
    assert second["fingerprints"]["protocol"] == document["fingerprints"]["protocol"]
    assert second["fingerprints"]["results"] == document["fingerprints"]["results"]  # and the same numbers
    # One setting changed: a different protocol.
    changed = SwapBenchmarkJob(
        model=tiny, corpus=corpus, layers=[1], lens=lens, lens_info=info, settings=settings(alpha=0.5)
    )
    drain(changed)
    third = artifact.benchmark_document(changed, ref, "0.0.test")
    assert third["fingerprints"]["protocol"] != document["fingerprints"]["protocol"]


def test_the_benchmarks_batched_edits_equal_one_trial_at_a_time(tiny: LoadedModel) -> None:
    from mcp_interp.schemas.swap import SwapCorpus
    from tests.helpers import tiny_corpus

    lens, info = identity_lens(tiny)
    corpus = SwapCorpus.model_validate(tiny_corpus(tiny))
    job = SwapBenchmarkJob(
        model=tiny, corpus=corpus, layers=[0, 1], lens=lens, lens_info=info, settings=settings(control_seeds=[0, 1])
    )
    drain(job)
    executed = [t for t in job.trials if t.status == "executed"]
    assert executed  # its edits ran in a batch with the rest of its prompt's group
    templates = {f.name: f for f in corpus.functions}
    alone = {}
    for record in job.trials:
        function = templates[record.function]
        alone[(record.source, record.target, record.layer)] = causal_swap_trial(
            tiny,
            lens,
            info,
            function.template,
            record.source,
            record.target,
            function.answers[record.source],
            function.answers[record.target],
            record.layer,
            settings(control_seeds=[0, 1]),
        ).trial
    # The decomposition alone decides whether a trial runs: the same statuses, apart from control pools (a single
    # trial's controls are matched at its layer only, a benchmark's at every prompt and layer of the target).
    inactive = "skipped_source_inactive"
    assert [alone[(r.source, r.target, r.layer)].status == inactive for r in job.trials] == [
        r.status == inactive for r in job.trials
    ]
    for record in executed:  # scores exist exactly for executed trials: compare every one
        single = alone[(record.source, record.target, record.layer)]
        assert [single.real.rank, single.real.logit] == pytest.approx([record.real.rank, record.real.logit], abs=1e-4)
        # Each batched control edit, rerun alone through the library's live hook: the same target logit and rank.
        source = tiny.tokenizer(" " + record.source, add_special_tokens=False)["input_ids"][0]
        prompt = torch.tensor([tiny.tokenizer(record.prompt)["input_ids"]])
        for control in record.controls:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                hooks = lens.coordinate_patch_hooks(
                    tiny.bridge, source, control.token_id, [record.layer], positions=[-1], k=25
                )
            with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=hooks):
                logits = tiny.bridge(prompt, return_type="logits")[0, -1]
            assert float(logits[control.score.token_id]) == pytest.approx(control.score.logit, abs=1e-4)
            assert int((logits > logits[control.score.token_id]).sum()) == control.score.rank


def greedy_words(model: LoadedModel, concept: str, n: int = 2) -> str:
    """The tiny model's own greedy continuation of n words: an answer of n tokens it is capable of."""
    ids = model.tokenizer(TEMPLATE.replace("{arg}", concept))["input_ids"]
    words = []
    for _ in range(n):
        with torch.no_grad():
            token = int(model.bridge(torch.tensor([ids]), return_type="logits")[0, -1].argmax())
        ids.append(token)
        words.append(str(model.tokenizer.decode([token])).strip())
    return " ".join(words)


def test_a_trial_with_two_token_answers_scores_every_step(tiny: LoadedModel) -> None:
    layer = next(layer for layer in (0, 1) if source_active(tiny, "France", layer, "last"))
    lens, info = identity_lens(tiny)
    source_answer, target_answer = greedy_words(tiny, "France"), greedy_words(tiny, "Canada")
    tok = tiny.tokenizer
    target_ids = tok(" " + target_answer, add_special_tokens=False)["input_ids"]
    assert len(target_ids) == 2 and source_answer != target_answer
    record = causal_swap_trial(
        tiny, lens, info, TEMPLATE, "France", "Canada", source_answer, target_answer, layer, settings()
    ).trial
    assert record.baseline.source_answer.top1 and record.baseline.source_answer.n_tokens == 2
    assert record.status == "executed" and record.real is not None and record.real.n_tokens == 2
    # The real edit rerun through the library's own hook on the prompt + the target's first token.
    prompt = tok(TEMPLATE.replace("{arg}", "France"))["input_ids"]
    source, target = (tok(" " + w, add_special_tokens=False)["input_ids"][0] for w in ("France", "Canada"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hooks = lens.coordinate_patch_hooks(tiny.bridge, source, target, [layer], positions=[len(prompt) - 1], k=25)
    with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=hooks):
        logits = tiny.bridge(torch.tensor([prompt + target_ids[:1]]), return_type="logits")[0, -2:].double()
    margins = []
    for step, token in enumerate(target_ids):
        others = torch.cat([logits[step, :token], logits[step, token + 1 :]])
        margins.append(float(logits[step, token] - others.max()))
    assert record.real.margin == pytest.approx(min(margins), abs=1e-4)
    assert record.real.top1 == (min(margins) > 0)
    assert record.real.logit == pytest.approx(float(logits[0, target_ids[0]]), abs=1e-4)
    # A second word the model does not say makes the source prompt incapable: the filter reads every step.
    first_word = source_answer.split()[0]
    wrong = next(w for w in ("paris", "six", "the", "of") if w != source_answer.split()[1])
    excluded = causal_swap_trial(
        tiny, lens, info, TEMPLATE, "France", "Canada", f"{first_word} {wrong}", target_answer, layer, settings()
    ).trial
    assert excluded.status == "excluded_not_capable"
    assert excluded.baseline.source_answer.rank == 0 and excluded.baseline.source_answer.margin < 0


def test_a_swaps_controls_are_one_token_per_seed_matched_at_every_layer(tiny: LoadedModel) -> None:
    """The benchmark draws each swap's controls once, from the tokens that qualify at every layer its source is
    active at: the same token per seed at each layer, matched there, never in that layer's support nor a corpus word
    (a concept is another target's real arm). On tiny the logit lens finds France only at layer 1, so layer 0 gets a
    lens J₀ = I + w_F (h₀ − w_F)ᵀ / ‖w_F‖² whose France atom is the layer-0 activation itself (France is then active
    there, and the two layers' dictionaries differ, so the pools do too). The pools are rebuilt here from their
    definition, layer by layer."""
    from transformer_lens.tools.analysis.jacobian_lens import JacobianLens

    from mcp_interp.schemas.swap import SwapCorpus
    from tests.helpers import tiny_corpus

    tok = tiny.tokenizer
    france = tok(" France", add_special_tokens=False)["input_ids"][0]
    prompt, index = edit_position(tok, TEMPLATE, "France", "last")
    h0 = prompt_run(tiny, prompt, index, [0]).activations[0].float()
    w = tiny.bridge.W_U[:, france].detach().float()
    j0 = torch.eye(w.numel()) + torch.outer(w, h0 - w) / w.dot(w)
    lens = JacobianLens({0: j0, 1: torch.eye(w.numel())}, n_prompts=0, d_model=w.numel())
    _, info = identity_lens(tiny)
    corpus = SwapCorpus.model_validate(tiny_corpus(tiny))
    change = {"control_tolerance": 0.3}
    job = SwapBenchmarkJob(
        model=tiny, corpus=corpus, layers=[0, 1], lens=lens, lens_info=info, settings=settings(**change)
    )
    drain(job)
    answers = {
        w: tok(" " + a, add_special_tokens=False)["input_ids"][0] for w, a in corpus.functions[0].answers.items()
    }
    # tiny answers China and Egypt with France's own answer ('.'), so those swaps are ledgered: France → Canada
    target = "Canada"
    trials = [t for t in job.trials if (t.function, t.source, t.target) == ("own", "France", target)]
    assert [t.status for t in trials] == ["executed", "executed"], [t.detail for t in trials]
    target_id = tok(" " + target, add_special_tokens=False)["input_ids"][0]
    pools = []
    for layer in (0, 1):
        x = prompt_run(tiny, prompt, index, [layer]).activations[layer]
        support = lens.decompose(tiny.bridge, x, layer, k=25).support.tolist()
        assert france in support
        dictionary = lens.lens_vector_dictionary(tiny.bridge, layer)
        never = [*tok.all_special_ids, *range(len(tok), dictionary.shape[0])]
        excluded = [answers["France"], answers[target], *support, *never]
        pools.append(set(control_pool(dictionary, france, target_id, excluded, 0.3).candidates.tolist()))
    words = {tok(" " + w, add_special_tokens=False)["input_ids"][0] for w in corpus.concepts}
    words |= {
        i
        for f in corpus.functions
        for a in f.answers.values()
        for i in tok(" " + a, add_special_tokens=False)["input_ids"]
    }
    shared = sorted(pools[0] & pools[1] - words)
    assert pools[0] != pools[1] and len(shared) >= 5
    expected = draw_controls(torch.tensor(shared), range(5), "own/France→Canada")
    for trial in trials:
        assert trial.control_pool_size == len(shared)
        assert [c.token_id for c in trial.controls] == expected
        reference = trial.target_displacement
        assert all(abs(c.displacement - reference) <= 0.3 * reference for c in trial.controls)
