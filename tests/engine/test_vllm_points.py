"""What the vLLM engine can run, decided from the points TransformerLens' vLLM driver serves, without booting vLLM
(which runs in .venv-vllm: tests/vllm runs every tool on it for real).

The hook points are TransformerLens' own vLLM overlay's (``DecoderOnlyOverlay.capture_specs``, the list the driver
serves as ``supported_hook_points``), and the backend built on them must (a) map a block's input to the previous
block's output and block 0's to the embedding, which it may write, (b) refuse exactly the tools and options whose
points or features that list lacks, and (c) send a value that differs between positions to vLLM as token rows of its
per-position buffers (its driver's specs carry one vector per point), to Inspect as one value per position."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformer_lens.model_bridge.sources.vllm.overlays.decoder_only import DecoderOnlyOverlay
from transformers import LlamaConfig

from mcp_interp.core.engine.backend.capabilities import capabilities
from mcp_interp.core.engine.backend.remote import RemoteBackend, Write

N_LAYERS, D_MODEL = 4, 64


@pytest.fixture(scope="module")
def vllm_backend() -> RemoteBackend:
    config = LlamaConfig(num_hidden_layers=N_LAYERS, hidden_size=D_MODEL, num_attention_heads=4, vocab_size=100)
    served = DecoderOnlyOverlay().capture_specs(config)
    driver = SimpleNamespace(supported_hook_points=frozenset(served))
    cfg = SimpleNamespace(n_layers=N_LAYERS, d_model=D_MODEL, positional_embedding_type="rotary")
    bridge = SimpleNamespace(hook_dict={}, _driver=driver, cfg=cfg)
    return RemoteBackend(bridge, "vllm", config)


def test_block_inputs_are_the_previous_blocks_output_and_block_0s_the_embedding(vllm_backend: RemoteBackend) -> None:
    assert vllm_backend.canonical("blocks.0.hook_in") == "embed.hook_out"
    assert vllm_backend.canonical("blocks.3.hook_in") == "blocks.2.hook_out"
    assert vllm_backend.has_point("blocks.2.attn.hook_out")
    assert not vllm_backend.has_point("blocks.2.attn.hook_z")  # inside vLLM's fused kernels
    assert not vllm_backend.has_point("blocks.2.mlp.hook_post")


# Hand-made from the overlay's list (embedding, each block's output, attention output and MLP output, the final norm)
# and what a RemoteBridge is (no gradients, no local weights, no block calls): the uses vLLM must refuse, with the
# feature each refusal names.
VLLM_REFUSES = {
    ("ablate_head", None): "attn.hook_z",
    ("patch_heads", None): "attn.hook_z",
    ("ablate", "head targets 'L9H3'"): "attn.hook_z",
    ("patch", "component='heads_by_pos'"): "attn.hook_z",
    ("sae", "an SAE on blocks.L.attn.hook_z"): "attn.hook_z",
    ("logit_lens", None): "weights",
    ("dla", None): "weights",
    ("explain", None): "weights",
    ("attention", None): "attention patterns",
    ("induction", None): "attention patterns",
    ("edge_attribution", None): "gradients",
    ("path_patch", None): "per-head writes",
    ("circuit_faithfulness", None): "per-head writes",
    ("find_circuit", None): "gradients",
    ("attribution_graph", None): "gradients",
    ("causal_swap_trial", None): "Jacobian-lens",
    ("patch", "method='attribution'"): "gradients",
    ("patch", "component='resid_mid'"): "resid_mid",
    ("patch", "component='mlp_neurons'"): "mlp.hook_post",
    ("ablate", "neuron targets 'L1N0,3'"): "mlp.hook_post",
    ("feature_examples", "neuron features 'L1N0'"): "mlp.hook_post",
    ("sae", "an SAE on blocks.L.hook_resid_mid"): "resid_mid",
    ("sae", "an SAE on blocks.L.mlp.hook_post"): "mlp.hook_post",
    ("ablate", "transcoder features {transcoders, layer, features}"): "edits that only a local model runs",
    ("patch", "noise corruption"): "single block calls",
}


def test_vllm_refuses_exactly_what_its_driver_lacks(vllm_backend: RemoteBackend) -> None:
    refused = {
        (c.tools[0], c.option): f"{c.missing_feature} {c.reason}" for c in capabilities(vllm_backend) if not c.available
    }
    assert refused.keys() == VLLM_REFUSES.keys()
    for key, feature in VLLM_REFUSES.items():
        assert feature in refused[key] and "--backend transformers" in refused[key], (key, refused[key])
    available = {t for c in capabilities(vllm_backend) if c.available and c.option is None for t in c.tools}
    for tool in ("logit_diff", "kl", "answer_rank", "loss", "ablate", "patch", "steer", "probe", "sae"):
        assert tool in available
    # what the resid_pre option maps to: block 0's input is the embedding the overlay captures
    assert ("patch", "component='resid_pre'") not in refused


def test_a_value_that_differs_between_positions_goes_to_vllm_as_token_rows(vllm_backend: RemoteBackend) -> None:
    same = np.tile(np.arange(D_MODEL, dtype=np.float32), (3, 1))
    differing = same + np.arange(3, dtype=np.float32)[:, None]
    one_vector = Write("set", [1, 2, 4], vllm_backend._wire(torch.from_numpy(same), "blocks.1.hook_out"))
    varying = Write("set", [1, 2, 4], vllm_backend._wire(torch.from_numpy(differing), "blocks.1.hook_out"))
    assert one_vector.value is not None and one_vector.value.shape == (D_MODEL,)  # the same at every position
    specs, staged = vllm_backend._specs({"blocks.1.hook_out": one_vector, "blocks.2.hook_out": varying})
    assert specs["blocks.1.hook_out"]["pos"] == [1, 2, 4] and not set(staged) - {"blocks.2.hook_out"}
    assert "blocks.2.hook_out" not in specs  # the driver's spec would broadcast one vector
    (rows,) = staged["blocks.2.hook_out"]
    assert rows.rows == [1, 2, 4] and np.array_equal(rows.values, differing)
    vllm_backend.name = "inspect"  # Inspect's provider takes one value per position
    try:
        specs, staged = vllm_backend._specs({"blocks.2.hook_out": varying})
        assert not staged and np.array_equal(specs["blocks.2.hook_out"]["value"], differing)
    finally:
        vllm_backend.name = "vllm"


def test_block_0s_input_is_written_at_the_embedding(vllm_backend: RemoteBackend) -> None:
    assert vllm_backend.can_write("blocks.0.hook_in") and vllm_backend.can_write("embed.hook_out")
    assert not vllm_backend.can_write("ln_final.hook_normalized")
