"""``patch`` (localize family) on `tiny`: agreement with TransformerLens' patching module cell by
cell, a known-answer construction, attribution against exact on a linear case, and bad input."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
from transformer_lens import patching as tl_patching

from mcp_interp.core.engine.backend.loader.load import boot
from mcp_interp.core.engine.backend.loader.tiny import build_tiny
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.localize.ablate import ablate
from mcp_interp.core.localize.loss import text_losses
from mcp_interp.core.localize.patch import PatchJob
from mcp_interp.core.readouts import predictions as readouts
from mcp_interp.errors import InputError
from mcp_interp.schemas.common import Intervention
from mcp_interp.schemas.localize import PatchMeasurement
from tests.helpers import teacher_forced_reference

# Two pairs that differ at two positions (the names), so some positions come before the first
# difference (scored 0 without being run) and several after it are run.
CLEAN = [
    "when mary and john went to the store , john gave a drink to",
    "when tom and james went to the park , james gave a ball to",
]
CORRUPT = [
    "when mary and john went to the store , mary gave a drink to",
    "when tom and james went to the park , tom gave a ball to",
]
CORRECT, INCORRECT = ["mary", "tom"], ["john", "james"]


def run(job: PatchJob) -> PatchMeasurement:
    result = drain(job)
    assert job.result is not None
    return result


def ids(model: LoadedModel, words: list[str]) -> torch.Tensor:
    return torch.tensor([model.tokenizer.convert_tokens_to_ids(w) for w in words])


def tl_metric(model: LoadedModel, base: list[str], metric: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The metric as a TransformerLens patching metric: logits [batch, seq, vocab] → mean over pairs."""
    batch = encode(model.tokenizer, base)
    good, bad = ids(model, CORRECT), ids(model, INCORRECT)
    clean = encode(model.tokenizer, CLEAN)
    clean_final = model.bridge(clean.input_ids)[torch.arange(len(CLEAN)), clean.answer_positions].detach()

    def fn(logits: torch.Tensor) -> torch.Tensor:
        final = logits[torch.arange(len(base)), batch.answer_positions].double()
        if metric == "logit_diff":
            return (final.gather(1, good[:, None]) - final.gather(1, bad[:, None])).mean()
        log_q = torch.log_softmax(final, dim=-1)
        if metric == "log_prob":
            return log_q.gather(1, good[:, None]).mean()
        log_p = torch.log_softmax(clean_final.double(), dim=-1)
        return (log_p.exp() * (log_p - log_q)).sum(-1).mean()

    return fn


def tl_grid(model: LoadedModel, function: Callable[..., torch.Tensor], direction: str, metric: str) -> torch.Tensor:
    base, source = (CORRUPT, CLEAN) if direction == "denoise" else (CLEAN, CORRUPT)
    _, cache = model.bridge.run_with_cache(encode(model.tokenizer, source).input_ids)
    base_ids = encode(model.tokenizer, base).input_ids
    return function(model.bridge, base_ids, cache, tl_metric(model, base, metric)).double()


TL_FUNCTIONS = {
    "resid_pre": tl_patching.get_act_patch_resid_pre,
    "attn_out": tl_patching.get_act_patch_attn_out,
    "mlp_out": tl_patching.get_act_patch_mlp_out,
}


@pytest.mark.parametrize("component", list(TL_FUNCTIONS))
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_block_components_match_transformer_lens_on_every_cell(
    tiny: LoadedModel, component: str, direction: str
) -> None:
    job = PatchJob(
        model=tiny,
        clean_prompts=CLEAN,
        corrupt_prompts=CORRUPT,
        correct=CORRECT,
        incorrect=INCORRECT,
        component=component,
        direction=direction,
    )
    result = run(job)
    assert job.sweep is not None and job.sweep.startswith("suffix")
    reference = tl_grid(tiny, TL_FUNCTIONS[component], direction, "logit_diff")  # [layer, pos]
    assert result.patched is not None
    ours = torch.tensor(result.patched, dtype=torch.float64)
    assert ours.shape == reference.shape
    assert (ours - reference).abs().max().item() < 1e-4
    # Positions before the first difference were not run and score exactly 0.
    assert result.skipped_positions == list(range(9))  # the names differ at position 9
    assert result.scores is not None
    assert all(row[p] == 0.0 for row in result.scores for p in result.skipped_positions)


@pytest.mark.parametrize("metric", ["log_prob", "kl"])
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_other_metrics_match_transformer_lens(tiny: LoadedModel, metric: str, direction: str) -> None:
    result = run(
        PatchJob(
            model=tiny,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=None,
            component="resid_pre",
            direction=direction,
            metric=metric,
        )
    )
    reference = tl_grid(tiny, tl_patching.get_act_patch_resid_pre, direction, metric)
    assert result.patched is not None
    assert (torch.tensor(result.patched, dtype=torch.float64) - reference).abs().max().item() < 1e-4


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_kl_of_the_clean_run_is_zero_in_both_directions(tiny: LoadedModel, direction: str) -> None:
    result = run(
        PatchJob(
            model=tiny,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=None,
            incorrect=None,
            component="attn_out",
            direction=direction,
            metric="kl",
        )
    )
    assert result.clean.per_example == pytest.approx([0.0, 0.0], abs=1e-9)
    assert min(result.corrupt.per_example) > 0


def test_generic_engine_matches_transformer_lens(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    from mcp_interp.core.engine.backend import llama_suffix

    monkeypatch.setattr(llama_suffix, "SUPPORTED_MODEL_TYPES", frozenset())
    for component, function in TL_FUNCTIONS.items():
        job = PatchJob(
            model=tiny,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=INCORRECT,
            component=component,
        )
        result = run(job)
        assert job.sweep is not None and job.sweep.startswith("generic")
        assert result.patched is not None
        reference = tl_grid(tiny, function, "denoise", "logit_diff")
        assert (torch.tensor(result.patched, dtype=torch.float64) - reference).abs().max().item() < 1e-4


def test_heads_by_position_match_transformer_lens(tiny: LoadedModel) -> None:
    result = run(
        PatchJob(
            model=tiny,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=INCORRECT,
            component="heads_by_pos",
        )
    )
    reference = tl_grid(tiny, tl_patching.get_act_patch_attn_head_out_by_pos, "denoise", "logit_diff")  # [l, pos, h]
    assert result.head_patched is not None
    ours = torch.tensor(result.head_patched, dtype=torch.float64).permute(0, 2, 1)
    assert (ours - reference).abs().max().item() < 1e-4


def resid_mid_reference(model: LoadedModel) -> torch.Tensor:
    """Patching the residual stream between attention and MLP, written through ``hook_attn_out``
    with TransformerLens' own generic patcher: attn_out := clean resid_mid − corrupt resid_pre,
    so the carried residual equals the clean one. (The bridge's ``hook_resid_mid`` is the MLP
    norm's input; TransformerLens' ``get_act_patch_resid_mid`` patches only what the MLP sees.)"""
    _, clean_cache = model.bridge.run_with_cache(encode(model.tokenizer, CLEAN).input_ids)
    corrupt_ids = encode(model.tokenizer, CORRUPT).input_ids
    _, corrupt_cache = model.bridge.run_with_cache(corrupt_ids)
    wanted = {
        f"blocks.{layer}.hook_attn_out": clean_cache[f"blocks.{layer}.hook_resid_mid"]
        - corrupt_cache[f"blocks.{layer}.hook_resid_pre"]
        for layer in range(model.bridge.cfg.n_layers)
    }
    return tl_patching.generic_activation_patch(
        model.bridge,
        corrupt_ids,
        wanted,  # type: ignore[arg-type]
        tl_metric(model, CORRUPT, "logit_diff"),
        patch_setter=tl_patching.layer_pos_patch_setter,
        activation_name="attn_out",
        index_axis_names=("layer", "pos"),
    ).double()


@pytest.mark.parametrize("sweep", ["suffix", "generic"])
def test_resid_mid_carries_the_patched_residual(tiny: LoadedModel, sweep: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from mcp_interp.core.engine.backend import llama_suffix

    if sweep == "generic":
        monkeypatch.setattr(llama_suffix, "SUPPORTED_MODEL_TYPES", frozenset())
    job = PatchJob(
        model=tiny,
        clean_prompts=CLEAN,
        corrupt_prompts=CORRUPT,
        correct=CORRECT,
        incorrect=INCORRECT,
        component="resid_mid",
    )
    result = run(job)
    assert job.sweep is not None and job.sweep.startswith(sweep)
    assert result.patched is not None
    reference = resid_mid_reference(tiny)
    assert (torch.tensor(result.patched, dtype=torch.float64) - reference).abs().max().item() < 1e-4


def test_resid_post_is_the_next_layers_resid_pre(tiny: LoadedModel) -> None:
    post = run(
        PatchJob(
            model=tiny,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=INCORRECT,
            component="resid_post",
        )
    )
    pre = run(
        PatchJob(
            model=tiny,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=INCORRECT,
            component="resid_pre",
        )
    )
    assert post.patched is not None and pre.patched is not None
    post_grid, pre_grid = torch.tensor(post.patched), torch.tensor(pre.patched)
    assert (post_grid[:-1] - pre_grid[1:]).abs().max().item() < 1e-4
    # After the last block, patching the answer position's residual gives the source run itself.
    clean_ld = torch.tensor(post.clean.per_example).mean()
    answer = encode(tiny.tokenizer, CORRUPT).answer_positions[0].item()
    assert post_grid[-1, answer].item() == pytest.approx(clean_ld.item(), abs=1e-4)


def test_neurons_match_a_hand_patched_loop(tiny: LoadedModel) -> None:
    neurons = [3, 77]
    result = run(
        PatchJob(
            model=tiny,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=INCORRECT,
            component="mlp_neurons",
            layers=[1],
            neurons=neurons,
        )
    )
    _, clean_cache = tiny.bridge.run_with_cache(encode(tiny.tokenizer, CLEAN).input_ids)
    corrupt_ids = encode(tiny.tokenizer, CORRUPT).input_ids
    metric = tl_metric(tiny, CORRUPT, "logit_diff")
    got = {cell.neuron: cell.patched for cell in result.cells}
    assert set(got) == set(neurons)
    for neuron in neurons:

        def hook(values: torch.Tensor, hook: object, neuron: int = neuron) -> torch.Tensor:
            values = values.clone()
            values[:, :, neuron] = clean_cache["blocks.1.mlp.hook_post"][:, :, neuron]
            return values

        with tiny.bridge.hooks(fwd_hooks=[("blocks.1.mlp.hook_post", hook)]):
            expected = metric(tiny.bridge(corrupt_ids)).item()
        assert got[neuron] == pytest.approx(expected, abs=1e-4)


@pytest.fixture(scope="module")
def one_mlp_model() -> LoadedModel:
    """`tiny` where attention moves the name to the answer position but only layer 1's MLP
    writes to the residual stream after it: every other MLP's down projection and every
    attention output projection after layer 0 are zeroed. The answer position sees the names
    only through layer-0 attention (into its residual) and layer 1's MLP reading it."""
    hf_model, tokenizer = build_tiny()
    with torch.no_grad():
        for layer, block in enumerate(hf_model.model.layers):
            if layer != 1:
                block.mlp.down_proj.weight.zero_()
            else:
                block.mlp.down_proj.weight.mul_(300.0)  # so its write dominates the final norm
            if layer != 0:
                block.self_attn.o_proj.weight.zero_()
    return boot("tiny-one-mlp", "tiny", "tiny-one-mlp", hf_model, tokenizer)


def test_known_answer_the_only_mlp_is_on_top_at_the_answer(one_mlp_model: LoadedModel) -> None:
    result = run(
        PatchJob(
            model=one_mlp_model,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=INCORRECT,
            component="mlp_out",
        )
    )
    assert abs(result.clean.value - result.corrupt.value) > 0.05, "the pair must differ"
    answer = encode(one_mlp_model.tokenizer, CORRUPT).answer_positions[0].item()
    top = result.cells[0]
    assert (top.layer, top.position) == (1, answer)
    assert top.score == pytest.approx(1.0, abs=5e-3)  # the rest: attention 0 direct path, diluted by the norm
    assert result.scores is not None
    others = [v for layer, row in enumerate(result.scores) for p, v in enumerate(row) if (layer, p) != (1, answer)]
    assert max(abs(v) for v in others if v is not None) < 1e-4


def test_attribution_is_exact_where_the_metric_is_linear(one_mlp_model: LoadedModel) -> None:
    """After the last MLP the residual reaches the metric only through the final norm; at the
    last layer's mlp_out, attribution ≈ exact to first order. Here we check the estimate on the
    top cell against exact patching (verify_top) and that it is labelled approximate."""
    result = run(
        PatchJob(
            model=one_mlp_model,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=INCORRECT,
            component="mlp_out",
            method="attribution",
            verify_top=3,
        )
    )
    assert result.approximate and result.verified is not None and len(result.verified) == 3
    exact = run(
        PatchJob(
            model=one_mlp_model,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=INCORRECT,
            component="mlp_out",
        )
    )
    assert exact.scores is not None
    for row in result.verified:
        cell = next(c for c in exact.cells if c.label == row.label)
        assert row.exact_score == pytest.approx(cell.score, abs=1e-6)
    assert any("first-order" in note for note in result.notes)


def test_attribution_terms_equal_a_finite_difference(tiny: LoadedModel) -> None:
    """Attribution of resid_pre at one cell = Δa · ∂m/∂a, checked against a central finite
    difference of the metric along Δa (an independent computation of the same derivative)."""
    result = run(
        PatchJob(
            model=tiny,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=INCORRECT,
            component="resid_pre",
            method="attribution",
            layers=[2],
        )
    )
    _, clean_cache = tiny.bridge.run_with_cache(encode(tiny.tokenizer, CLEAN).input_ids)
    corrupt_ids = encode(tiny.tokenizer, CORRUPT).input_ids
    _, corrupt_cache = tiny.bridge.run_with_cache(corrupt_ids)
    metric = tl_metric(tiny, CORRUPT, "logit_diff")
    position, eps = 9, 1e-2
    delta = (clean_cache["blocks.2.hook_resid_pre"] - corrupt_cache["blocks.2.hook_resid_pre"])[:, position]

    def shifted(scale: float) -> float:
        def hook(values: torch.Tensor, hook: object) -> torch.Tensor:
            values = values.clone()
            values[:, position] += scale * delta
            return values

        with tiny.bridge.hooks(fwd_hooks=[("blocks.2.hook_resid_pre", hook)]):
            return float(metric(tiny.bridge(corrupt_ids)))

    derivative = (shifted(eps) - shifted(-eps)) / (2 * eps)
    base = float(metric(tiny.bridge(corrupt_ids)))
    assert result.patched is not None
    assert result.patched[2][position] == pytest.approx(base + derivative, abs=1e-3)


def test_bad_input_says_how_to_fix_it(tiny: LoadedModel) -> None:
    cases = [
        (dict(component="mlp_neurons", layers=[1], neurons=[9999]), "out of range.*0..127"),
        (dict(component="resid_pre", layers=[7]), "layers.*0..2"),
        (dict(component="resid_pre", positions=[40]), "positions.*0..13"),
        (dict(component="everything"), "component"),
        (dict(component="resid_pre", neurons=[1]), "only to component 'mlp_neurons'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(InputError, match=message):
            run(
                PatchJob(
                    model=tiny,
                    clean_prompts=CLEAN,
                    corrupt_prompts=CORRUPT,
                    correct=CORRECT,
                    incorrect=INCORRECT,
                    **kwargs,
                )
            )  # type: ignore[arg-type]
    with pytest.raises(InputError, match="needs `correct`"):
        run(
            PatchJob(
                model=tiny,
                clean_prompts=CLEAN,
                corrupt_prompts=CORRUPT,
                correct=None,
                incorrect=None,
                component="resid_pre",
            )
        )
    with pytest.raises(InputError, match="same number of tokens"):
        run(
            PatchJob(
                model=tiny,
                clean_prompts=CLEAN,
                corrupt_prompts=["when mary went"] * 2,
                correct=CORRECT,
                incorrect=INCORRECT,
                component="resid_pre",
            )
        )


def test_tokens_and_labels_name_the_positions(tiny: LoadedModel) -> None:
    result = run(
        PatchJob(
            model=tiny,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=INCORRECT,
            component="resid_pre",
            layers=[0],
        )
    )
    differing = [t.position for t in result.tokens if t.differs_in_pairs]
    assert differing == [9]
    token = result.tokens[9]
    assert (token.clean_token.strip(), token.corrupt_token.strip()) == ("john", "mary")
    assert result.cells[0].label.startswith("layer 0 resid_pre, token")


# --- loss ----------------------------------------------------------------------------------------

TEXTS = ["when mary and john went to the store , john gave a drink to mary", "the park was full"]


def test_loss_equals_torch_cross_entropy_per_text(tiny: LoadedModel) -> None:
    result = text_losses(tiny, TEXTS)
    pooled_loss, pooled_hits, pooled_n = 0.0, 0, 0
    for text, row in zip(TEXTS, result.texts, strict=True):
        ids_ = torch.tensor([tiny.tokenizer(text)["input_ids"]])
        logits = tiny.bridge(ids_)[0]  # each text alone: no padding involved
        expected = torch.nn.functional.cross_entropy(logits[:-1].double(), ids_[0, 1:], reduction="none")
        assert row.loss == pytest.approx(expected.tolist(), abs=1e-5)
        assert row.mean_loss == pytest.approx(float(expected.mean()), abs=1e-5)
        hits = (logits[:-1].argmax(-1) == ids_[0, 1:]).tolist()
        assert row.correct == hits
        pooled_loss += float(expected.sum())
        pooled_hits += sum(hits)
        pooled_n += len(hits)
    assert result.mean_loss == pytest.approx(pooled_loss / pooled_n, abs=1e-5)
    assert result.accuracy == pytest.approx(pooled_hits / pooled_n)


def test_loss_under_an_intervention_reports_both(tiny: LoadedModel) -> None:
    spec = Intervention(ablate=["L1H2", "L2H0"], method="zero")
    ablated = text_losses(tiny, TEXTS, spec)
    plain = text_losses(tiny, TEXTS)
    assert ablated.clean_mean_loss == pytest.approx(plain.mean_loss, abs=1e-9)
    assert ablated.mean_loss != pytest.approx(plain.mean_loss, abs=1e-4)
    # Zero-ablating through a hook on hook_z, by hand, gives the same per-token losses.
    ids_ = torch.tensor([tiny.tokenizer(TEXTS[1])["input_ids"]])

    def zero(head: int):  # type: ignore[no-untyped-def]
        def hook(z: torch.Tensor, hook: object) -> torch.Tensor:
            z = z.clone()
            z[:, :, head] = 0
            return z

        return hook

    with tiny.bridge.hooks(fwd_hooks=[("blocks.1.attn.hook_z", zero(2)), ("blocks.2.attn.hook_z", zero(0))]):
        logits = tiny.bridge(ids_)[0]
    expected = torch.nn.functional.cross_entropy(logits[:-1].double(), ids_[0, 1:], reduction="none")
    assert ablated.texts[1].loss == pytest.approx(expected.tolist(), abs=1e-5)
    with pytest.raises(InputError, match="fewer than 2 tokens"):
        text_losses(tiny, ["the"])


# --- ablate: any target --------------------------------------------------------------------------

PROMPTS = CLEAN  # two prompts of equal length (14 tokens)


def hand_logit_diff(model: LoadedModel, hooks: list) -> list[float]:  # type: ignore[type-arg]
    batch = encode(model.tokenizer, PROMPTS)
    good, bad = ids(model, CORRECT), ids(model, INCORRECT)
    with model.bridge.hooks(fwd_hooks=hooks):
        final = model.bridge(batch.input_ids)[torch.arange(2), batch.answer_positions]
    return (final.gather(1, good[:, None]) - final.gather(1, bad[:, None])).squeeze(1).tolist()


def ablated(model: LoadedModel, targets: list, method: str = "zero", **kwargs: object) -> list[float]:  # type: ignore[type-arg]
    spec = Intervention(ablate=targets, method=method, **kwargs)  # type: ignore[arg-type]
    result = ablate(model, PROMPTS, spec, CORRECT, INCORRECT)
    assert result.after.logit_diff is not None
    return result.after.logit_diff.per_example


def test_ablating_an_mlp_and_an_attention_layer_equals_hand_hooks(tiny: LoadedModel) -> None:
    def zero(values: torch.Tensor, hook: object) -> torch.Tensor:
        return torch.zeros_like(values)

    assert ablated(tiny, ["L1MLP"]) == pytest.approx(hand_logit_diff(tiny, [("blocks.1.hook_mlp_out", zero)]), abs=1e-5)
    _, cache = tiny.bridge.run_with_cache(encode(tiny.tokenizer, PROMPTS).input_ids)
    mean = cache["blocks.2.hook_attn_out"].mean(dim=0, keepdim=True)

    def to_mean(values: torch.Tensor, hook: object) -> torch.Tensor:
        return mean.expand_as(values).clone()

    expected = hand_logit_diff(tiny, [("blocks.2.hook_attn_out", to_mean)])
    assert ablated(tiny, ["L2ATTN"], "mean") == pytest.approx(expected, abs=1e-5)


def test_ablating_neurons_by_resampling_equals_a_hand_hook(tiny: LoadedModel) -> None:
    _, cache = tiny.bridge.run_with_cache(encode(tiny.tokenizer, PROMPTS).input_ids)
    swapped = cache["blocks.1.mlp.hook_post"].flip(0)  # with two prompts the only derangement is the swap

    def resample(values: torch.Tensor, hook: object) -> torch.Tensor:
        values = values.clone()
        values[:, :, [3, 77]] = swapped[:, :, [3, 77]]
        return values

    expected = hand_logit_diff(tiny, [("blocks.1.mlp.hook_post", resample)])
    assert ablated(tiny, ["L1N77,3"], "resample") == pytest.approx(expected, abs=1e-5)


def test_ablating_a_basis_direction_zeroes_that_coordinate(tiny: LoadedModel) -> None:
    d_model = tiny.bridge.cfg.d_model
    direction = [0.0] * d_model
    direction[5] = -3.0  # any length and sign: the unit vector ±e_5 spans the same line

    def zero_coordinate(values: torch.Tensor, hook: object) -> torch.Tensor:
        values = values.clone()
        values[:, -1, 5] = 0.0  # only the last position (positions='last'; equal lengths)
        return values

    expected = hand_logit_diff(tiny, [("blocks.1.hook_resid_post", zero_coordinate)])
    got = ablated(tiny, [{"layer": 1, "direction": direction}], positions="last")
    assert got == pytest.approx(expected, abs=1e-5)
    assert got != pytest.approx(hand_logit_diff(tiny, []), abs=1e-4), "the coordinate must matter here"


def test_metric_tools_accept_the_same_targets(tiny: LoadedModel) -> None:
    spec = Intervention(ablate=["L1MLP", "L0H2"])
    measured = readouts.logit_diff(tiny, PROMPTS, CORRECT, INCORRECT, spec)
    assert measured.logit_diff.per_example == pytest.approx(ablated(tiny, ["L1MLP", "L0H2"]), abs=1e-9)


def test_bad_targets_say_how_to_fix_them(tiny: LoadedModel) -> None:
    cases = [
        ([{"layer": 1, "direction": [1.0, 2.0]}], "d_model = 64"),
        (["L1N128"], "neurons 0..127"),
        (["L7MLP"], "layers 0..2"),
        (["L1MLPX"], "form 'L<layer>H<head>'"),
        ([{"layer": 0, "direction": [0.0] * 64}], "non-zero"),
    ]
    for targets, message in cases:
        with pytest.raises(InputError, match=message):
            ablated(tiny, targets)
    with pytest.raises(InputError, match="needs components in `ablate`"):
        ablate(tiny, PROMPTS, Intervention(ablate=[]), CORRECT, INCORRECT)


def test_kl_attribution_from_the_clean_run_is_zero_and_says_why(tiny: LoadedModel) -> None:
    """Known answer: KL(clean‖·) has zero gradient at the clean run, so every first-order estimate
    of noising it is exactly the base value 0."""
    result = run(
        PatchJob(
            model=tiny,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=None,
            incorrect=None,
            component="resid_pre",
            direction="noise",
            method="attribution",
            metric="kl",
        )
    )
    assert result.patched is not None
    assert max(abs(v) for row in result.patched for v in row if v is not None) < 1e-9
    assert any("gradient there is 0" in note for note in result.notes)
    denoise = run(
        PatchJob(
            model=tiny,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=None,
            incorrect=None,
            component="resid_pre",
            method="attribution",
            metric="kl",
        )
    )
    assert denoise.scores is not None and max(abs(v or 0) for row in denoise.scores for v in row) > 0.01


def test_neurons_chosen_by_attribution_are_then_patched_exactly(tiny: LoadedModel) -> None:
    result = run(
        PatchJob(
            model=tiny,
            clean_prompts=CLEAN,
            corrupt_prompts=CORRUPT,
            correct=CORRECT,
            incorrect=INCORRECT,
            component="mlp_neurons",
            layers=[0, 2],
            top_neurons=3,
        )
    )
    assert sorted({c.layer for c in result.cells}) == [0, 2] and len(result.cells) == 6
    chosen = [c for c in result.cells if c.layer == 2]
    _, clean_cache = tiny.bridge.run_with_cache(encode(tiny.tokenizer, CLEAN).input_ids)
    corrupt_ids = encode(tiny.tokenizer, CORRUPT).input_ids
    metric = tl_metric(tiny, CORRUPT, "logit_diff")
    for cell in chosen:

        def hook(values: torch.Tensor, hook: object, neuron: int | None = cell.neuron) -> torch.Tensor:
            values = values.clone()
            values[:, :, neuron] = clean_cache["blocks.2.mlp.hook_post"][:, :, neuron]
            return values

        with tiny.bridge.hooks(fwd_hooks=[("blocks.2.mlp.hook_post", hook)]):
            assert cell.patched == pytest.approx(metric(tiny.bridge(corrupt_ids)).item(), abs=1e-4)


# --- patch with answers of several tokens --------------------------------------------------------

SHORT_CLEAN = [c.removesuffix(" to") for c in CLEAN]
SHORT_CORRUPT = [c.removesuffix(" to") for c in CORRUPT]
GOOD_SEQ, BAD_SEQ = ["to mary", "to tom"], ["to john", "to james"]


def test_patch_with_sequence_answers_matches_transformer_lens_on_teacher_forced_rows(tiny: LoadedModel) -> None:
    """Reference: TransformerLens' get_act_patch_resid_pre on a batch holding, for each pair, the
    corrupt prompt and the corrupt prompt + 'to' (the teacher-forced rows), with a metric written
    here: mean over pairs of Σ log P(correct tokens) − Σ log P(incorrect tokens)."""
    result = run(
        PatchJob(
            model=tiny,
            clean_prompts=SHORT_CLEAN,
            corrupt_prompts=SHORT_CORRUPT,
            correct=GOOD_SEQ,
            incorrect=BAD_SEQ,
            component="resid_pre",
        )
    )
    assert result.patched is not None and any("teacher-forced" in n for n in result.notes)
    reference = teacher_forced_reference(
        tiny, SHORT_CLEAN, SHORT_CORRUPT, GOOD_SEQ, BAD_SEQ, tl_patching.get_act_patch_resid_pre
    )
    ours = torch.tensor(result.patched, dtype=torch.float64)
    prompt_width = ours.shape[1]  # the grid covers the prompts' positions
    assert (ours - reference[:, :prompt_width]).abs().max().item() < 1e-4
    plain = readouts.logit_diff(tiny, SHORT_CLEAN, GOOD_SEQ, BAD_SEQ)
    assert result.clean.per_example == pytest.approx(plain.logit_diff.per_example, abs=1e-5)


def test_patch_attribution_with_sequence_answers_is_checked_by_its_exact_runs(tiny: LoadedModel) -> None:
    result = run(
        PatchJob(
            model=tiny,
            clean_prompts=SHORT_CLEAN,
            corrupt_prompts=SHORT_CORRUPT,
            correct=GOOD_SEQ,
            incorrect=BAD_SEQ,
            component="mlp_out",
            method="attribution",
            verify_top=2,
        )
    )
    exact = run(
        PatchJob(
            model=tiny,
            clean_prompts=SHORT_CLEAN,
            corrupt_prompts=SHORT_CORRUPT,
            correct=GOOD_SEQ,
            incorrect=BAD_SEQ,
            component="mlp_out",
        )
    )
    assert result.verified is not None and exact.scores is not None
    for row in result.verified:
        layer, position = (int(x) for x in re.findall(r"layer (\d+) .*\(position (\d+)\)", row.label)[0])
        assert row.exact_score == pytest.approx(exact.scores[layer][position], abs=1e-6)


def test_patch_is_one_step_per_layer_and_stops_between_layers(tiny: LoadedModel) -> None:
    """What cancellation relies on (``Toolkit.run_job`` closes the job between steps): one step for the
    clean/corrupt runs, one per layer swept, as announced by total_steps; closing mid-sweep leaves no result."""
    job = PatchJob(
        model=tiny,
        clean_prompts=CLEAN,
        corrupt_prompts=CORRUPT,
        correct=CORRECT,
        incorrect=INCORRECT,
        component="resid_pre",
        layers=[1, 2],
    )
    steps = list(job.steps())
    assert len(steps) == job.total_steps() == 1 + 2  # the runs, then layers 1 and 2
    assert steps[1:] == ["exact patching: layer 1 of 2 done", "exact patching: layer 2 of 2 done"]
    stopped = PatchJob(
        model=tiny,
        clean_prompts=CLEAN,
        corrupt_prompts=CORRUPT,
        correct=CORRECT,
        incorrect=INCORRECT,
        component="resid_pre",
    )
    generator = stopped.steps()
    next(generator), next(generator)
    generator.close()
    assert stopped.result is None


@pytest.mark.parametrize("sweep", ["suffix", "generic"])
def test_pairs_of_different_lengths_are_padded_and_still_match_transformer_lens(
    tiny: LoadedModel, sweep: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcp_interp.core.engine.backend import llama_suffix

    if sweep == "generic":
        monkeypatch.setattr(llama_suffix, "SUPPORTED_MODEL_TYPES", frozenset())
    clean = [CLEAN[0], "when tom and james went to the park , james gave a ball to the"]
    corrupt = [CORRUPT[0], "when tom and james went to the park , tom gave a ball to the"]
    good, bad = ["mary", "tom"], ["john", "james"]
    job = PatchJob(
        model=tiny, clean_prompts=clean, corrupt_prompts=corrupt, correct=good, incorrect=bad, component="attn_out"
    )
    result = run(job)
    assert job.sweep is not None and job.sweep.startswith(sweep)
    batch = encode(tiny.tokenizer, corrupt)
    assert len(set(batch.lengths)) == 2, "the batch must be padded"
    g, b = ids(tiny, good), ids(tiny, bad)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        final = logits[torch.arange(2), batch.answer_positions]
        return (final.gather(1, g[:, None]) - final.gather(1, b[:, None])).mean()

    _, cache = tiny.bridge.run_with_cache(encode(tiny.tokenizer, clean).input_ids)
    reference = tl_patching.get_act_patch_attn_out(tiny.bridge, batch.input_ids, cache, metric).double()
    assert result.patched is not None
    assert (torch.tensor(result.patched, dtype=torch.float64) - reference).abs().max().item() < 1e-4
