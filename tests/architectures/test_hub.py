"""Hub names resolved through the Hugging Face cache, offline: the code path a user with a downloaded model takes.

A tiny model and an SAELens-format SAE are written into a temporary cache in the hub's own layout
(``models--ORG--NAME/refs/main`` naming a snapshot, the snapshot's files relative symlinks into ``blobs/``,
as ``huggingface-cli download`` leaves them) and loaded with ``HF_HUB_OFFLINE=1`` — nothing is contacted.

``huggingface_hub`` reads ``HF_HUB_CACHE`` once, at import, so the model is loaded by the CLI in a fresh
process with the variable set (what a user's ``--model org/name`` does); the SAE, resolved by this project's
own call into ``huggingface_hub``, is tested in-process with the library's constant patched.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from mcp import Client

from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.dictionaries.saelens import load_sae
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.errors import InputError, ModelLoadError
from tests.features.test_sae import random_weights, write_sae
from tests.helpers import IOI_CLEAN, IOI_CORRECT, IOI_INCORRECT, assert_valid_structured, error_text, tools_by_name

COMMIT = "0123456789abcdef0123456789abcdef01234567"
ROOT = Path(__file__).resolve().parents[2]


def write_hub_repo(cache: Path, repo: str, files: Path, subfolder: str = "") -> Path:
    """Put the files of folder ``files`` (under ``subfolder`` of the repo) into ``cache`` in the hub's layout;
    returns the snapshot folder."""
    org, name = repo.split("/")
    root = cache / f"models--{org}--{name}"
    snapshot = root / "snapshots" / COMMIT
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)
    for source in sorted(p for p in files.rglob("*") if p.is_file()):
        data = source.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        target = snapshot / subfolder / source.relative_to(files)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(os.path.relpath(blob, target.parent))
    return snapshot


def test_a_hub_name_loads_from_the_cache_offline(
    arch_folder: Callable[[str], Path], arch_model: Callable[[str], LoadedModel], tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    write_hub_repo(cache, "tiny-org/tiny-neox", arch_folder("neox"))
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "MCP_INTERP_OUTPUT": str(tmp_path / "out"),
        "PYTHONPATH": str(ROOT),
    }
    arguments = {"prompts": IOI_CLEAN[:2], "correct": IOI_CORRECT[:2], "incorrect": IOI_INCORRECT[:2]}
    command = [sys.executable, "-m", "mcp_interp", "call", "--model", "tiny-org/tiny-neox", "logit_diff"]
    done = subprocess.run([*command, "--args", json.dumps(arguments)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    local = arch_model("neox")  # the same files, loaded as a local folder in this process
    assert result["model"]["source"] == "hub" and result["model"]["name"] == "tiny-org/tiny-neox"
    assert result["model"]["fingerprint"] == local.fingerprint
    tok = local.tokenizer
    with torch.no_grad():
        logits = local.bridge(encode(tok, IOI_CLEAN[:2]).input_ids)[:, -1].double()
    good, bad = ([tok.convert_tokens_to_ids(w) for w in words] for words in (IOI_CORRECT[:2], IOI_INCORRECT[:2]))
    by_hand = [float(logits[i, good[i]] - logits[i, bad[i]]) for i in range(2)]
    assert result["logit_diff"]["per_example"] == pytest.approx(by_hand, abs=1e-6)


def test_an_uncached_hub_model_is_a_load_error_with_a_fix() -> None:
    with pytest.raises(ModelLoadError, match=r"'tiny-org/not-cached' is not available \(HF_HUB_OFFLINE=1 is set\)"):
        load_model("tiny-org/not-cached")


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_an_sae_hub_id_resolves_through_the_cache(tiny: LoadedModel, hub_cache: Path, tmp_path: Path) -> None:
    folder = Path(write_sae(tmp_path / "local" / "layer_1", random_weights(16, seed=3)))
    snapshot = write_hub_repo(hub_cache, "sae-org/tiny-saes", folder.parent)
    from_hub, local = load_sae("sae-org/tiny-saes/layer_1", tiny), load_sae(str(folder), tiny)
    assert Path(from_hub.folder) == (snapshot / "layer_1").resolve()
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        assert torch.equal(getattr(from_hub, name), getattr(local, name)), name
    assert (from_hub.site, from_hub.layer) == ("resid_post", 1)
    top = write_hub_repo(hub_cache, "sae-org/one-sae", folder)  # an SAE at the repository's top level
    assert Path(load_sae("sae-org/one-sae", tiny).folder) == top.resolve()


def test_an_uncached_sae_id_says_how_to_download_it(tiny: LoadedModel, hub_cache: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"`huggingface-cli download sae-org/absent --include 'layer_1/\*'`"):
        load_sae("sae-org/absent/layer_1", tiny)
    folder = Path(write_sae(tmp_path / "local" / "layer_1", random_weights(16, seed=3)))
    write_hub_repo(hub_cache, "sae-org/tiny-saes", folder.parent)
    with pytest.raises(InputError, match=r"no cfg\.json .* in 'layer_7'.*subfolders with an SAE: \['layer_1'\]"):
        load_sae("sae-org/tiny-saes/layer_7", tiny)


@pytest.mark.anyio
async def test_the_sae_tools_take_a_hub_id(tiny_client: Client, hub_cache: Path, tmp_path: Path) -> None:
    folder = Path(write_sae(tmp_path / "local" / "layer_1", random_weights(16, seed=3)))
    write_hub_repo(hub_cache, "sae-org/tiny-saes", folder.parent)
    tools = await tools_by_name(tiny_client)
    text = IOI_CLEAN[0]
    by_id = await tiny_client.call_tool("sae", {"text": text, "sae": "sae-org/tiny-saes/layer_1"})
    by_folder = await tiny_client.call_tool("sae", {"text": text, "sae": str(folder)})
    hub, local = (assert_valid_structured(tools["sae"], r) for r in (by_id, by_folder))
    assert hub["fraction_variance_explained"] == local["fraction_variance_explained"]
    assert hub["l0"] == local["l0"] and hub["per_token"] == local["per_token"]
    absent = await tiny_client.call_tool("sae", {"text": text, "sae": "sae-org/absent/layer_1"})
    assert "huggingface-cli download sae-org/absent --include 'layer_1/*'" in error_text(absent)
