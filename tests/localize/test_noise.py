"""Gaussian-noise corruption (causal tracing, Meng et al. 2022) in `patch`: the noise is what it says (σ = scale × the
token embeddings' std, only at the subject's tokens), and each restored cell equals a run built by hand from
TransformerLens hooks — the clean prompt with that noise at hook_embed and the clean residual put back at one layer
and position — averaged over the noise draws."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.engine.numbers.scores import score_interval
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.localize.patch import PatchJob
from mcp_interp.errors import InputError
from mcp_interp.schemas.localize import NoiseCorruption
from tests.helpers import IOI_CLEAN as CLEAN
from tests.helpers import IOI_CORRECT as CORRECT
from tests.helpers import IOI_INCORRECT as INCORRECT

SUBJECTS = ["mary and john", "tom and james", "dan and sid"]  # tokens 1–3 of each prompt


def run(tiny: LoadedModel, noise: NoiseCorruption) -> tuple[Any, PatchJob]:
    job = PatchJob(model=tiny, clean_prompts=CLEAN, corrupt_prompts=None, correct=CORRECT, incorrect=INCORRECT,
                   component="resid_pre", noise=noise)  # fmt: skip
    return drain(job), job


def test_noise_is_gaussian_at_the_subject_tokens_with_the_stated_scale(tiny: LoadedModel) -> None:
    from mcp_interp.core.engine.patching.noise import draw_noise, noised_positions

    spec = NoiseCorruption(subjects=SUBJECTS, samples=50, seed=3)
    positions = noised_positions(tiny.tokenizer, CLEAN, spec)
    assert positions == [[1, 2, 3]] * 3
    batch = encode(tiny.tokenizer, [p for p in CLEAN for _ in range(50)])
    noise = draw_noise(tiny.backend, batch, positions, spec)
    embedding = tiny.bridge.original_model.get_input_embeddings().weight.detach().double()
    assert noise.info.embedding_std == pytest.approx(float(embedding.std()), rel=1e-6)
    assert noise.info.sigma == pytest.approx(3 * float(embedding.std()), rel=1e-6)
    values = noise.values.double()
    inside = values[:, 1:4]
    assert float(values[:, [0, *range(4, values.shape[1])]].abs().max()) == 0.0
    assert float(inside.std()) == pytest.approx(noise.info.sigma, rel=0.02)  # 50 × 3 × 3 × 64 draws
    assert abs(float(inside.mean())) < 0.02 * noise.info.sigma


def test_noised_patching_equals_runs_built_by_hand(tiny: LoadedModel) -> None:
    spec = NoiseCorruption(subjects=SUBJECTS, samples=3, seed=1)
    result, _ = run(tiny, spec)
    from mcp_interp.core.engine.patching.noise import draw_noise, noised_positions

    samples = 3
    batch = encode(tiny.tokenizer, [p for p in CLEAN for _ in range(samples)])
    noise = draw_noise(tiny.backend, batch, noised_positions(tiny.tokenizer, CLEAN, spec), spec).values
    ids = batch.input_ids
    tok = tiny.tokenizer
    good = torch.tensor([tok.convert_tokens_to_ids(w) for w in CORRECT for _ in range(samples)])
    bad = torch.tensor([tok.convert_tokens_to_ids(w) for w in INCORRECT for _ in range(samples)])

    def metric(logits: torch.Tensor) -> torch.Tensor:  # per pair: the mean over its draws
        final = logits[:, -1].double()
        values = final.gather(1, good[:, None]) - final.gather(1, bad[:, None])
        return values.view(len(CLEAN), samples).mean(dim=1)

    def add_noise(value: torch.Tensor, hook: Any) -> torch.Tensor:
        return value + noise.to(value.dtype)

    with torch.no_grad():
        clean_logits, cache = tiny.bridge.run_with_cache(ids)
        with tiny.bridge.hooks(fwd_hooks=[("hook_embed", add_noise)]):
            corrupt = metric(tiny.bridge(ids))
    assert result.corrupt.per_example == pytest.approx(corrupt.tolist(), abs=1e-5)
    assert result.clean.per_example == pytest.approx(metric(clean_logits).tolist(), abs=1e-5)
    clean = metric(clean_logits)
    for layer in range(3):
        for position in (1, 3, 5):

            def restore(value: torch.Tensor, hook: Any, layer: int = layer, position: int = position) -> torch.Tensor:
                value = value.clone()
                value[:, position] = cache[f"blocks.{layer}.hook_resid_pre"][:, position]
                return value

            hooks = [("hook_embed", add_noise), (f"blocks.{layer}.hook_resid_pre", restore)]
            with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=hooks):
                patched = metric(tiny.bridge(ids))
            expected = float((patched - corrupt).mean() / (clean - corrupt).mean())
            assert result.scores[layer][position] == pytest.approx(expected, abs=1e-4), (layer, position)
    assert result.noise is not None and result.noise.positions == [[1, 2, 3]] * 3
    assert result.skipped_positions == [0]  # before the first noised token the runs are identical
    assert any("Gaussian noise" in note for note in result.notes)


def test_noise_arguments_are_checked(tiny: LoadedModel) -> None:
    with pytest.raises(InputError, match="does not occur"):
        run(tiny, NoiseCorruption(subjects="zebra"))
    with pytest.raises(InputError, match="one of `positions`"):
        run(tiny, NoiseCorruption())
    job = PatchJob(model=tiny, clean_prompts=CLEAN, corrupt_prompts=CLEAN, correct=CORRECT, incorrect=INCORRECT,
                   component="resid_pre", noise=NoiseCorruption(positions=[1]))  # fmt: skip
    with pytest.raises(InputError, match="not both"):
        drain(job)


def test_bootstrap_interval_of_a_cell() -> None:
    clean, corrupt = torch.tensor([2.0, 3.0, 4.0, 5.0, 6.0]), torch.zeros(5)
    assert score_interval(clean.clone(), clean, corrupt, "denoise") == pytest.approx((1.0, 1.0))
    half = clean * torch.tensor([0.4, 0.5, 0.6, 0.5, 0.5])
    low, high = score_interval(half, clean, corrupt, "denoise")  # type: ignore[misc]
    assert 0.4 <= low <= 0.5 <= high <= 0.6
    assert score_interval(half[:3], clean[:3], corrupt[:3], "denoise") is None  # too few pairs for an interval
