"""feature_examples on SmolLM2 against an independent forward pass: plain ``transformers`` (the converted weights loaded
with ``AutoModelForCausalLM``, no TransformerLens), each text run alone, the neuron read as the input of layer L's
``down_proj`` and the residual direction as layer L's output projected by hand. The tool's batched, length-sorted,
cached pass must give the same activations (≤ 1e-4), the same examples in the same order, and a direct logit effect
equal to W_U · (γ ⊙ W_out[:, n]) from the same weights."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from mcp_interp.core.engine.backend.loader.embedded import embedded_cache_folder
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.features.examples import FeatureExamplesJob
from mcp_interp.corpora import text_corpus

pytestmark = pytest.mark.embedded

LAYER, NEURON = 3, 562
TEXTS = text_corpus("wordnet_examples").search[:80]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def plain(embedded: LoadedModel) -> Iterator[Any]:
    """The same weights in plain transformers, cut after LAYER (nothing later is read)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(embedded_cache_folder()), dtype=torch.float32,
                                                 attn_implementation="eager").eval()  # fmt: skip
    model.model.layers = model.model.layers[: LAYER + 1]
    yield model


def independent(plain: Any, tokenizer: Any, text: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(neuron NEURON's activation, layer LAYER's output) on each token of ``text`` run alone."""
    seen: dict[str, torch.Tensor] = {}
    layer = plain.model.layers[LAYER]
    hooks = [
        layer.mlp.down_proj.register_forward_pre_hook(lambda m, args: seen.__setitem__("post", args[0][0])),
        layer.register_forward_hook(lambda m, args, out: seen.__setitem__("resid", (out[0] if isinstance(out, tuple)
                                                                                      else out)[0])),
    ]  # fmt: skip
    try:
        with torch.no_grad():
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            plain.model(ids, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return seen["post"][:, NEURON].double(), seen["resid"].double()


def test_neuron_and_direction_activations_equal_a_plain_transformers_forward(embedded: LoadedModel, plain: Any) -> None:
    neuron = drain(FeatureExamplesJob(model=embedded, feature=f"L{LAYER}N{NEURON}", texts=TEXTS, top_k=10, window=64))
    by_hand = {text: independent(plain, embedded.tokenizer, text) for text in TEXTS}
    maxima = {text: float(values[1:].max()) for text, (values, _) in by_hand.items()}
    expected = sorted(range(len(TEXTS)), key=lambda i: (-maxima[TEXTS[i]], i))[:10]
    assert [e.text_index for e in neuron.examples] == expected
    worst = 0.0
    for example in neuron.examples:
        values = by_hand[example.text][0]
        assert example.window_start == 0 and len(example.activations) == values.shape[0]  # window 64 ≥ every text
        worst = max(worst, float((torch.tensor(example.activations).double() - values).abs().max()))
        assert example.max_position == 1 + int(values[1:].argmax())
    assert worst <= TOLERANCE
    top = torch.tensor(sorted(maxima.values()), dtype=torch.float64)
    assert neuron.quantiles[-1].text_max == pytest.approx(float(top[-1]), abs=TOLERANCE)
    # A residual direction at the same layer: the projection of layer LAYER's output on a unit vector.
    generator = torch.Generator().manual_seed(0)
    direction = torch.randn(embedded.cfg.d_model, generator=generator, dtype=torch.float64)
    unit = direction / direction.norm()
    projected = drain(FeatureExamplesJob(model=embedded, feature={"layer": LAYER, "direction": direction.tolist()},
                                         texts=TEXTS, top_k=5, window=64))  # fmt: skip
    for example in projected.examples:
        reference = by_hand[example.text][1] @ unit
        assert float((torch.tensor(example.activations).double() - reference).abs().max()) <= TOLERANCE
    print(f"SmolLM2 L{LAYER}N{NEURON} vs plain transformers: max |diff| {worst:.2e}")


def test_output_tokens_equal_the_unembedded_output_weights(embedded: LoadedModel, plain: Any) -> None:
    result = drain(FeatureExamplesJob(model=embedded, feature=f"L{LAYER}N{NEURON}", texts=TEXTS[:4], top_k=1))
    column = plain.model.layers[LAYER].mlp.down_proj.weight[:, NEURON].detach().double()
    gamma = plain.model.norm.weight.detach().double()
    effect = plain.lm_head.weight.detach().double() @ (gamma * column)
    output = result.output_tokens
    assert output is not None
    order = torch.argsort(effect, descending=True)
    assert [t.token_id for t in output.promoted] == order[:10].tolist()
    assert [t.effect for t in output.promoted] == pytest.approx(effect[order[:10]].tolist(), abs=1e-4)
    assert [t.token_id for t in output.suppressed] == order.flip(0)[:10].tolist()
