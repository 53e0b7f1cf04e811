"""The command line: `call` prints the structured result; `doctor` checks for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mcp_interp.core.engine.backend.model import LoadedModel


def run_cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MCP_INTERP_OUTPUT": str(tmp_path / "out")}
    return subprocess.run(
        [sys.executable, "-m", "mcp_interp", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_call_prints_structured_json(tmp_path: Path, tiny: LoadedModel) -> None:
    arguments = {
        "prompts": ["when mary and john went to the store , john gave a drink to"],
        "correct": "mary",
        "incorrect": "john",
    }
    done = run_cli("call", "--model", "tiny", "logit_diff", "--args", json.dumps(arguments), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["model"]["fingerprint"] == tiny.fingerprint
    assert len(result["logit_diff"]["per_example"]) == 1


def test_call_tool_error_exits_nonzero_with_message(tmp_path: Path) -> None:
    done = run_cli(
        "call", "--model", "tiny", "kl", "--args", '{"prompts": ["a b"], "compare_prompts": ["a"]}', tmp_path=tmp_path
    )
    assert done.returncode == 1
    assert "same number of tokens" in done.stderr
    assert done.stdout == ""


def test_call_rejects_bad_json(tmp_path: Path) -> None:
    done = run_cli("call", "--model", "tiny", "tokenize", "--args", "{not json", tmp_path=tmp_path)
    assert done.returncode == 2 and "not valid JSON" in done.stderr


def test_doctor_loads_the_model_and_reports(tmp_path: Path) -> None:
    done = run_cli("doctor", "--model", "tiny", tmp_path=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "model tiny: ok" in done.stdout and "torch" in done.stdout


def test_doctor_fails_with_a_fix_for_an_unavailable_model(tmp_path: Path) -> None:
    done = run_cli("doctor", "--model", "no-such-org/no-such-model", tmp_path=tmp_path)
    assert done.returncode == 1
    assert "smollm2-135m" in done.stdout and "FAILED" in done.stdout


def test_call_prints_only_its_json_while_libraries_print(tmp_path: Path) -> None:
    """Libraries that print to stdout while the model loads and runs (a thread writing to sys.stdout and to descriptor
    1 from the moment torch is imported, as vLLM's logs and worker processes do) reach stderr, not the answer."""
    from tests.transport.test_stdout_purity import NOISE

    (tmp_path / "sitecustomize.py").write_text(NOISE)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "MCP_INTERP_OUTPUT": str(tmp_path / "out"),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "mcp_interp", "call", "--model", "tiny", "tokenize", "--args", '{"texts": ["a b"]}'],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "library chatter" in done.stderr  # the noise ran, and went to stderr
    assert json.loads(done.stdout)["texts"][0]["tokens"]  # stdout is the JSON and nothing else
