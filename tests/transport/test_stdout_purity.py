"""Raw stdio: every byte `mcp-interp serve` writes to stdout is JSON-RPC, even while the process
is full of libraries printing — simulated by a sitecustomize thread that prints to stdout
(Python-level and raw file descriptor 1) from the moment torch is imported, for the whole
session: model loading, a patching scan, explain, a tool error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

NOISE = textwrap.dedent(
    """
    import os, sys, threading, time
    def _noise():
        # Libraries start talking once they are imported: wait for the first heavy one.
        while "torch" not in sys.modules:
            time.sleep(0.0005)
        n = 0
        while True:
            n += 1
            print(f"library chatter {n}", flush=True)
            os.write(1, b"\\r[=====>     ] 50% progress bar\\n")
            time.sleep(0.01)
    threading.Thread(target=_noise, daemon=True).start()
    """
)


def rpc(request_id: int | None, method: str, params: dict | None = None) -> bytes:
    message: dict = {"jsonrpc": "2.0", "method": method}
    if request_id is not None:
        message["id"] = request_id
    if params is not None:
        message["params"] = params
    return (json.dumps(message) + "\n").encode()


def test_stdout_is_pure_json_rpc_while_libraries_print(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(NOISE)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "MCP_INTERP_OUTPUT": str(tmp_path / "out"),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "mcp_interp", "serve", "--model", "tiny"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert process.stdin is not None and process.stdout is not None
    prompt = "when mary and john went to the store , john gave a drink to"
    corrupt = "when mary and john went to the store , mary gave a drink to"
    messages = [
        rpc(
            1,
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
        ),
        rpc(None, "notifications/initialized"),
        rpc(2, "tools/list"),
        rpc(
            3,
            "tools/call",
            {
                "name": "patch_heads",
                "arguments": {
                    "clean_prompts": [prompt],
                    "corrupt_prompts": [corrupt],
                    "correct": "mary",
                    "incorrect": "john",
                },
                "_meta": {"progressToken": 3},
            },
        ),
        rpc(
            4, "tools/call", {"name": "explain", "arguments": {"prompt": prompt, "answer": "mary", "baseline": "john"}}
        ),
        rpc(
            5,
            "tools/call",
            {"name": "logit_diff", "arguments": {"prompts": [prompt], "correct": "mary john", "incorrect": "john"}},
        ),
    ]
    for message in messages:
        process.stdin.write(message)
        process.stdin.flush()
        time.sleep(0.05)
    answered: set[int] = set()
    lines = []
    deadline = time.monotonic() + 180
    while answered != {1, 2, 3, 4, 5} and time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        message = json.loads(line)  # every line must be JSON ...
        assert message.get("jsonrpc") == "2.0", line  # ... and JSON-RPC
        if ("id" in message and "result" in message) or "error" in message:
            answered.add(message["id"])
    process.stdin.close()
    process.wait(timeout=60)
    stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
    assert answered == {1, 2, 3, 4, 5}, stderr[-3000:]
    assert "library chatter" in stderr and "progress bar" in stderr, "the noise must have been diverted to stderr"
    for line in lines:
        assert b"chatter" not in line and b"progress bar" not in line
