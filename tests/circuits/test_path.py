"""Exact direct path patching: equal to TransformerLens' direct-path patcher, per key/value group, and an
MLP's path to the logits equal to its direct effect."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from mcp import Client

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.tokens import encode
from tests.circuits.common import CLEAN, CORRUPT

# --- path_patch ----------------------------------------------------------------------------------


def run_path(model: LoadedModel, sender: str, component: str = "q", receivers: Any = None) -> Any:
    from mcp_interp.core.circuits.path import PathPatchJob
    from mcp_interp.core.engine.jobs import drain

    job = PathPatchJob(
        model=model,
        clean_prompts=CLEAN * 2,
        corrupt_prompts=CORRUPT * 2,
        correct="mary",
        incorrect="john",
        sender=sender,
        receivers=receivers,
        component=component,
    )
    drain(job)
    assert job.result is not None
    return job.result


@pytest.mark.parametrize("component", ["q", "k", "v"])
def test_path_patching_equals_transformer_lens_direct_path(multi_head: LoadedModel, component: str) -> None:
    from transformer_lens import patching

    ours = run_path(multi_head, "L0H1", component)
    for receiver in ours.receivers:
        assert len(receiver.per_example_patched) == 2
        assert sum(receiver.per_example_patched) / 2 == pytest.approx(receiver.patched_logit_diff)
    tok = multi_head.tokenizer
    clean_ids, corrupt_ids = encode(tok, CLEAN * 2).input_ids, encode(tok, CORRUPT * 2).input_ids
    good, bad = tok.convert_tokens_to_ids("mary"), tok.convert_tokens_to_ids("john")
    _, clean_cache = multi_head.bridge.run_with_cache(clean_ids)
    _, corrupt_cache = multi_head.bridge.run_with_cache(corrupt_ids)
    reference = patching.get_act_patch_direct_path(
        multi_head.bridge,
        corrupt_ids,
        clean_cache,
        corrupt_cache,
        lambda logits: (logits[:, -1, good] - logits[:, -1, bad]).mean(),
        0,
        1,
        component,  # type: ignore[arg-type]
        verbose=False,
    ).double()
    grid = torch.tensor([[v if v is not None else 0.0 for v in row] for row in ours.patched_logit_diff[1:]])
    assert (grid.double() - reference[1:]).abs().max().item() < 1e-4
    assert ours.patched_logit_diff[0] == [None] * 4  # not after the sender


def test_grouped_query_key_paths_are_per_group_and_match_a_loop(tiny: LoadedModel) -> None:
    ours = run_path(tiny, "L0H2", "k")
    assert len(ours.patched_logit_diff[1]) == 2  # two key/value groups
    tok = tiny.tokenizer
    clean_ids, corrupt_ids = encode(tok, CLEAN * 2).input_ids, encode(tok, CORRUPT * 2).input_ids
    good, bad = tok.convert_tokens_to_ids("mary"), tok.convert_tokens_to_ids("john")
    tiny.bridge.set_use_attn_result(True)
    tiny.bridge.set_use_split_qkv_input(True)
    try:
        _, clean_cache = tiny.bridge.run_with_cache(clean_ids)
        _, corrupt_cache = tiny.bridge.run_with_cache(corrupt_ids)
        delta = (clean_cache["blocks.0.attn.hook_result"] - corrupt_cache["blocks.0.attn.hook_result"])[:, :, 2]
        for layer in (1, 2):
            for group in (0, 1):

                def add(values: torch.Tensor, hook: object, group: int = group) -> torch.Tensor:
                    values = values.clone()
                    values[:, :, group] += delta
                    return values

                with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_k_input", add)]):
                    final = tiny.bridge(corrupt_ids)[:, -1].double()
                expected = float((final[:, good] - final[:, bad]).mean())
                assert ours.patched_logit_diff[layer][group] == pytest.approx(expected, abs=1e-5)
    finally:
        tiny.bridge.set_use_attn_result(False)
        tiny.bridge.set_use_split_qkv_input(False)


def test_an_mlp_path_to_the_logits_is_its_direct_effect(tiny: LoadedModel) -> None:
    ours = run_path(tiny, "L1MLP", receivers="logits")
    tok = tiny.tokenizer
    clean_ids, corrupt_ids = encode(tok, CLEAN * 2).input_ids, encode(tok, CORRUPT * 2).input_ids
    good, bad = tok.convert_tokens_to_ids("mary"), tok.convert_tokens_to_ids("john")
    _, clean_cache = tiny.bridge.run_with_cache(clean_ids)
    _, corrupt_cache = tiny.bridge.run_with_cache(corrupt_ids)
    delta = clean_cache["blocks.1.hook_mlp_out"] - corrupt_cache["blocks.1.hook_mlp_out"]

    def add(values: torch.Tensor, hook: object) -> torch.Tensor:
        return values + delta

    with torch.no_grad(), tiny.bridge.hooks(fwd_hooks=[("blocks.2.hook_resid_post", add)]):
        final = tiny.bridge(corrupt_ids)[:, -1].double()
    assert ours.receivers[0].receiver == "logits"
    assert ours.receivers[0].patched_logit_diff == pytest.approx(
        float((final[:, good] - final[:, bad]).mean()), abs=1e-5
    )


def test_path_patch_bad_input_says_how_to_fix_it(tiny: LoadedModel) -> None:
    from mcp_interp.errors import InputError

    for sender, receivers, component, message in [
        ("L9H0", None, "q", "does not exist"),
        ("head 3", None, "q", "'L5H1' or an MLP"),
        ("L1H0", ["L0H2"], "q", "not after the sender"),
        ("L0H0", ["L1KV0"], "q", "key/value group"),
        ("L0H0", ["L1H9"], "q", "does not exist"),
        ("L0H0", None, "z", "'q', 'k' or 'v'"),
    ]:
        with pytest.raises(InputError, match=message):
            run_path(tiny, sender, component, receivers)
    # A query head named as a key receiver means its group.
    grouped = run_path(tiny, "L0H0", "k", ["L1H3", "L1KV1"])
    assert [r.receiver for r in grouped.receivers] == ["L1KV1.k"]


@pytest.mark.anyio
async def test_path_patch_over_mcp(tiny_client: Client) -> None:
    import base64

    from mcp_interp.figures import heatmap_size, png_size
    from tests.helpers import assert_valid_structured, error_text, tools_by_name

    arguments = {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT, "correct": "mary", "incorrect": "john"}
    tools = await tools_by_name(tiny_client)
    result = assert_valid_structured(
        tools["path_patch"],
        await tiny_client.call_tool("path_patch", {**arguments, "sender": "L0H1", "component": "v"}),
    )
    figure = await tiny_client.read_resource(result["figure_uri"])
    backwards = await tiny_client.call_tool("path_patch", {**arguments, "sender": "L2H0", "receivers": ["L1H0"]})
    assert png_size(base64.b64decode(figure.contents[0].blob)) == heatmap_size(3, 2)  # type: ignore[union-attr]
    assert [len(row) for row in result["recovered"]] == [2, 2, 2] and result["recovered"][0] == [None, None]
    assert len(result["receivers"]) == 4 and result["receivers"][0]["receiver"].endswith(".v")
    assert "not after the sender" in error_text(backwards)
