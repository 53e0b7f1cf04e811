"""The edit vocabulary: what each edit does to a value (by hand), and that the remote engine (TransformerLens'
RemoteBridge on Inspect's HF provider) runs every edit — the four RemoteBridge operations sent as they are, the rest
materialised — to the local engine's numbers, with a hand-written TransformerLens hook as the reference."""

from __future__ import annotations

import pytest
import torch

from mcp_interp.core.engine.backend.edits import Add, Project, Rewrite, Scale, Set, SetSlice, Suppress, observe
from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.options import LoadOptions
from mcp_interp.errors import Unsupported

VALUES = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)  # [batch, seq, width]


def test_each_edit_changes_exactly_what_it_names() -> None:
    mask = torch.tensor([[True, False, False], [False, False, True]])
    expected = VALUES.clone()
    expected[0, 0] = 0
    expected[1, 2] = 0
    assert torch.equal(Suppress("p", pos=mask).apply(VALUES), expected)
    expected = VALUES.clone()
    expected[:, 1] *= 3
    assert torch.equal(Scale("p", 3.0, pos=1).apply(VALUES), expected)
    assert torch.equal(Add("p", torch.ones(4)).apply(VALUES), VALUES + 1)
    expected = VALUES.clone()
    expected[:, [0, 2]] = torch.tensor([[9.0] * 4, [8.0] * 4])  # a [len(pos), width] value, per position
    assert torch.equal(Set("p", torch.tensor([[9.0] * 4, [8.0] * 4]), pos=[0, 2]).apply(VALUES), expected)
    per_row = torch.stack([torch.full((3, 4), 5.0), torch.full((3, 4), 6.0)])  # a leading batch dimension
    assert torch.equal(Set("p", per_row).apply(VALUES), per_row)
    heads = VALUES.reshape(2, 3, 2, 2)  # [batch, seq, heads, d_head]
    sliced = SetSlice("p", channels=(1,), value=0.0, pos=[2]).apply(heads)
    expected_heads = heads.clone()
    expected_heads[:, 2, 1] = 0
    assert torch.equal(sliced, expected_heads)
    unit = torch.tensor([0.6, 0.8, 0.0, 0.0])
    projected = Project("p", direction=unit).apply(VALUES)
    assert torch.allclose(projected @ unit, torch.zeros(2, 3), atol=1e-5)
    assert torch.allclose(projected - VALUES, -(VALUES @ unit).unsqueeze(-1) * unit, atol=1e-5)
    seen: list[torch.Tensor] = []
    assert observe("p", seen.append).apply(VALUES) is None and torch.equal(seen[0], VALUES)
    assert (Suppress("p").remote_op, SetSlice("p").remote_op, Rewrite("p", is_pure=False).pure) == (
        "suppress",
        None,
        False,
    )


@pytest.fixture(scope="module")
def remote_tiny() -> LoadedModel:
    return load_model("tiny", options=LoadOptions(backend="inspect"))


IDS = torch.tensor([[5, 9, 14, 22, 31, 7], [8, 8, 40, 11, 2, 3]])


def edits_of(model: LoadedModel) -> list[list]:  # type: ignore[type-arg]
    d = int(model.cfg.d_model)
    unit = torch.nn.functional.normalize(torch.arange(d, dtype=torch.float32), dim=0)
    mask = torch.tensor([[False, True, True, False, False, False], [False, False, False, False, True, True]])
    return [
        [Suppress("blocks.1.hook_attn_out", pos=[2])],
        [Scale("blocks.0.hook_out", 0.5, pos=mask)],
        [Add("blocks.1.hook_in", torch.linspace(-1, 1, d))],
        [SetSlice("blocks.1.attn.hook_z", channels=(0, 3), value=0.0)],  # per-head: materialised
        [Project("blocks.2.hook_out", direction=unit, pos=mask)],  # a projection: materialised
        [Rewrite("blocks.0.hook_mlp_out", lambda v: v.flip(0))],  # a batch-aware pure rewrite: materialised
        [Add("blocks.0.hook_out", torch.ones(d)), Scale("blocks.0.hook_out", 2.0)],  # two at one point
        [SetSlice("blocks.2.attn.hook_z", channels=(1,), value=1.0), Suppress("blocks.0.hook_attn_out", pos=[0])],
    ]


def test_the_remote_engine_runs_every_edit_to_the_local_numbers(tiny: LoadedModel, remote_tiny: LoadedModel) -> None:
    for edits in edits_of(tiny):
        local = tiny.backend.run(IDS, edits=edits, capture=["blocks.2.hook_out"])
        remote = remote_tiny.backend.run(IDS, edits=edits, capture=["blocks.2.hook_out"])
        assert local.logits is not None and remote.logits is not None
        assert (remote.logits - local.logits).abs().max() <= 1e-5, edits
        assert (remote.acts["blocks.2.hook_out"] - local.acts["blocks.2.hook_out"]).abs().max() <= 1e-5
        assert (local.logits - tiny.backend.logits(IDS)).abs().max() > 1e-3, ("the edit must change something", edits)


def test_a_per_head_set_equals_a_hand_written_hook(tiny: LoadedModel, remote_tiny: LoadedModel) -> None:
    """The reference is TransformerLens itself: a hook zeroing heads 0 and 3 of layer 1's z."""

    def zero_heads(z: torch.Tensor, hook: object) -> torch.Tensor:
        z = z.clone()
        z[:, :, [0, 3]] = 0
        return z

    with torch.inference_mode():
        reference = tiny.bridge.run_with_hooks(IDS, fwd_hooks=[("blocks.1.attn.hook_z", zero_heads)])
    remote = remote_tiny.backend.logits(IDS, [SetSlice("blocks.1.attn.hook_z", channels=(0, 3), value=0.0)])
    assert (remote - reference).abs().max() <= 1e-5


def test_what_a_remote_engine_cannot_run_is_refused_by_name(remote_tiny: LoadedModel) -> None:
    with pytest.raises(Unsupported, match=r"gradients .*inspect backend.*--backend transformers"):
        remote_tiny.backend.run(IDS, mode="grad")
    with pytest.raises(Unsupported, match="only a local model runs"):
        remote_tiny.backend.run(IDS, edits=[Rewrite("blocks.0.hook_out", lambda v: v, is_pure=False)])
    with pytest.raises(Unsupported, match="only reads"):
        remote_tiny.backend.run(IDS, edits=[Set("blocks.1.hook_resid_mid", 0.0)])
    with pytest.raises(Unsupported, match="weights"):
        remote_tiny.backend.logits_from_residual(torch.zeros(1, 64))
    with pytest.raises(Unsupported, match="single block calls"):
        remote_tiny.backend.trace(IDS)
