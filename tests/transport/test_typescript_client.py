"""The official TypeScript SDK client (which validates every structured result against the tool's outputSchema)
over stdio: every tool once with a typical call, every stored resource kind read, completions answered.
``./run test`` installs the SDK (``.tsclient``) and, when the machine's Node is older than 20, a local Node."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from mcp_interp.core.engine.backend.model import LoadedModel
from tests.features.test_sae import random_weights, write_sae
from tests.graphs.common import plt_weights, write_plt
from tests.helpers import EXPECTED_TOOLS
from tests.server.test_surface import typical_calls

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("ts_client.mjs")


def node_and_sdk() -> tuple[str, Path]:
    sdk = Path(os.environ.get("MCP_INTERP_TS_SDK", ROOT / ".tsclient" / "node_modules"))
    node = os.environ.get("MCP_INTERP_NODE") or shutil.which("node")
    if node is None or not (sdk / "@modelcontextprotocol" / "sdk").is_dir():
        raise RuntimeError(
            f"The TypeScript SDK client needs Node ≥ 20 and @modelcontextprotocol/sdk in {sdk}: ./run test installs "
            "them (or set MCP_INTERP_NODE and MCP_INTERP_TS_SDK)."
        )
    return node, sdk


def test_every_tool_through_the_typescript_sdk(tiny: LoadedModel, tmp_path: Path) -> None:
    node, sdk = node_and_sdk()
    sae = write_sae(tmp_path / "sae", random_weights(32, seed=1), hook="blocks.1.hook_resid_post")
    transcoders = write_plt(tmp_path / "transcoders", plt_weights(3, 64, 32, seed=1))
    typical = typical_calls(tiny, sae, transcoders)
    calls = [{"tool": name, "arguments": arguments} for name, arguments in typical.items()]
    calls.append({"tool": "patch_heads", "arguments": {**typical["patch_heads"], "background": True}})
    env = {
        "HF_HUB_OFFLINE": "1",
        "MCP_INTERP_CACHE": str(tmp_path / "cache"),
    }
    plan = {
        "command": sys.executable,
        "args": ["-m", "mcp_interp", "serve", "--model", "tiny", "--output-dir", str(tmp_path / "out")],
        "env": env,
        "calls": calls,
        "prompt": {"name": "find-circuit", "argument": {"name": "task", "value": "i"}},
    }
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    # ES modules resolve bare imports from the script's own folder up (NODE_PATH is ignored): run a copy placed
    # beside the SDK's node_modules.
    script = sdk.parent / SCRIPT.name
    shutil.copyfile(SCRIPT, script)
    run = subprocess.run(
        [node, str(script), str(plan_file)], capture_output=True, text=True, timeout=1800, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(report["tools"]) == EXPECTED_TOOLS
    failed = [c for c in report["calls"] if not c["ok"] or not c["structured"]]
    assert not failed, failed
    assert {c["tool"] for c in report["calls"]} == EXPECTED_TOOLS  # the plan's calls and the handle followers
    read_kinds = {r["kind"] for r in report["reads"] if r["ok"]}
    assert {"figure", "result", "artifact", "report", "direction", "circuit", "job"} <= read_kinds, report["reads"]
    assert all(r["ok"] for r in report["reads"]), report["reads"]
    assert "ioi" in report["completions"]["prompt"]
    assert report["completions"]["figure"], "figure ids complete"
    assert report["capabilities"]["completions"] == {} and report["capabilities"]["resources"]["listChanged"]
