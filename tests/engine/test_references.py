"""References (direction://, SAE and transcoder folders) are resolved by one resolver on the model thread, in the same
pass that parses an intervention's typed targets; parsing alone does no I/O, and every tool that takes an intervention
accepts every reference."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcp_interp.core.engine.ablation.targets import FeaturesTarget, parse_target
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.dictionaries import saelens
from mcp_interp.core.engine.references import resolve_intervention
from mcp_interp.schemas.common import Intervention
from tests.features.test_probe import places
from tests.features.test_sae import random_weights, write_sae
from tests.helpers import assert_valid_structured, tools_by_name

TEXT = "when mary and john went to the store , john gave a drink to mary"


def test_parsing_an_unresolved_sae_reference_is_refused_without_reading_it(
    tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_sae(tmp_path / "sae", random_weights(16, seed=1), hook="blocks.1.hook_resid_post")
    spec = Intervention(ablate=[{"sae": str(folder), "features": [3]}])  # type: ignore[list-item]
    reads: list[str] = []
    real = saelens._read
    monkeypatch.setattr(saelens, "_read", lambda *a, **k: reads.append("read") or real(*a, **k))
    with pytest.raises(TypeError, match="resolve_target"):
        parse_target(spec.ablate[0], tiny)  # type: ignore[arg-type]
    assert reads == []  # parsing reads nothing
    parsed = resolve_intervention(spec, tiny)
    assert parsed is not None and isinstance(parsed.targets[0], FeaturesTarget)
    assert parsed.targets[0].features == (3,) and parsed.targets[0].sae.d_sae == 16
    assert reads == ["read"]


@pytest.mark.anyio
async def test_every_reference_is_loaded_once_on_the_model_thread(
    tiny_client: Client, tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`steer` (a job) and `logit_diff` (a measurement) load their SAE on the model thread, once per call: never on
    the event loop, where a large load would stall every other request."""
    folder = str(write_sae(tmp_path / "sae", random_weights(16, seed=2), hook="blocks.1.hook_resid_post"))
    threads: list[str] = []
    real = saelens._read

    def reading(path: Path, device: str) -> Any:
        threads.append(threading.current_thread().name)
        return real(path, device)

    monkeypatch.setattr(saelens, "_read", reading)
    tools = await tools_by_name(tiny_client)
    steered = await tiny_client.call_tool(
        "steer", {"prompt": TEXT, "coefficient": 2.0, "sae": folder, "feature": 5, "max_new_tokens": 2}
    )
    assert_valid_structured(tools["steer"], steered)
    ablated = await tiny_client.call_tool(
        "logit_diff",
        {
            "prompts": [TEXT],
            "correct": "mary",
            "incorrect": "john",
            "intervention": {"ablate": [{"sae": folder, "features": [1, 2]}]},
        },
    )
    assert_valid_structured(tools["logit_diff"], ablated)
    assert threads and all(name.startswith("mcp-interp-model") for name in threads), threads
    # the SAE cache keeps one load per folder for the model: the second call reads nothing
    assert len(threads) == 1


@pytest.mark.anyio
async def test_loss_takes_a_stored_direction_like_any_intervention(tiny_client: Client) -> None:
    """`loss` is a job: its intervention is resolved inside it with the server's store, so `direction://` works there
    too and gives the numbers of the same vector passed by value."""
    tools = await tools_by_name(tiny_client)
    texts, labels = places()
    probed = assert_valid_structured(
        tools["probe"], await tiny_client.call_tool("probe", {"texts": texts, "labels": labels, "layers": [1]})
    )
    uri = probed["layers"][0]["direction_uri"]
    stored = await tiny_client.read_resource(uri)
    import json

    vector = json.loads(stored.contents[0].text)["vector"]  # type: ignore[union-attr]
    by_uri = assert_valid_structured(
        tools["loss"],
        await tiny_client.call_tool(
            "loss", {"texts": [TEXT], "intervention": {"ablate": [{"layer": 1, "direction": uri}]}}
        ),
    )
    by_value = assert_valid_structured(
        tools["loss"],
        await tiny_client.call_tool(
            "loss", {"texts": [TEXT], "intervention": {"ablate": [{"layer": 1, "direction": vector}]}}
        ),
    )
    assert by_uri["mean_loss"] == by_value["mean_loss"]
    assert by_uri["mean_loss"] != by_uri["clean_mean_loss"]
