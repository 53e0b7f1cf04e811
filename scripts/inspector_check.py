"""Drive mcp-interp with the official MCP Inspector CLI and check what it sees.

Run by ``./run inspector`` (which installs Node 22 and the Inspector into ``.inspector/`` when
the machine's Node is older) and by CI. Against ``mcp-interp serve --model tiny``:

* ``tools/list`` — every tool has an ``outputSchema``;
* ``tools/call`` of ``model_info`` and ``logit_diff`` — structured content present and valid
  against the tool's schema;
* ``resources/templates/list`` and ``prompts/list``;
* a deliberately bad call (a neuron that does not exist) — the Inspector must exit with its tool-error
  code 5 and show our error text.

Usage: ``python scripts/inspector_check.py INSPECTOR_BIN`` (the ``mcp-inspector`` executable).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import jsonschema

TOOL_ERROR_EXIT = 5


def main() -> int:
    inspector = sys.argv[1]
    server = [sys.executable, "-m", "mcp_interp", "serve", "--model", "tiny"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.setdefault("MCP_INTERP_OUTPUT", tempfile.mkdtemp(prefix="mcp-interp-inspector-"))

    def inspect(*args: str, expect: int = 0) -> dict:
        command = [inspector, "--cli", *server, *args]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        if done.returncode != expect:
            detail = f"{done.stdout}\n{done.stderr[-2000:]}"
            raise SystemExit(f"FAIL {' '.join(args)}: exit {done.returncode}, expected {expect}\n{detail}")
        print(f"ok   {' '.join(args)} (exit {done.returncode})")
        return json.loads(done.stdout)

    tools = {tool["name"]: tool for tool in inspect("--method", "tools/list")["tools"]}
    missing = [name for name, tool in tools.items() if not tool.get("outputSchema")]
    assert not missing, f"tools without outputSchema: {missing}"
    print(f"     {len(tools)} tools, every one with an outputSchema")

    info = inspect("--method", "tools/call", "--tool-name", "model_info")
    jsonschema.validate(info["structuredContent"], tools["model_info"]["outputSchema"])
    assert info["structuredContent"]["source"] == "tiny"

    ld = inspect(
        "--method",
        "tools/call",
        "--tool-name",
        "logit_diff",
        "--tool-arg",
        'prompts=["when mary and john went to the store , john gave a drink to"]',
        "--tool-arg",
        "correct=mary",
        "--tool-arg",
        "incorrect=john",
    )
    jsonschema.validate(ld["structuredContent"], tools["logit_diff"]["outputSchema"])
    value = ld["structuredContent"]["logit_diff"]["value"]
    assert ld["structuredContent"]["logit_diff"]["per_example"] == [value]
    print(f"     logit_diff structured content valid (value {value:+.4f})")

    templates = inspect("--method", "resources/templates/list")["resourceTemplates"]
    assert {t["uriTemplate"] for t in templates} >= {"figure://{figure_id}", "report://{report_id}"}
    prompts = inspect("--method", "prompts/list")["prompts"]
    names = {"explain-prediction", "find-circuit", "test-causal-claim", "probe-property", "trace-prediction"}
    names |= {"interpret-feature"}
    assert {p["name"] for p in prompts} == names

    # MCP Apps: linked tools carry _meta.ui.resourceUri; each ui:// resource reads back as an app's HTML.
    linked = {name: tool["_meta"]["ui"]["resourceUri"] for name, tool in tools.items() if "ui" in tool.get("_meta", {})}
    assert linked.get("patch_heads") == "ui://mcp-interp/heads-heatmap", linked
    for uri in sorted(set(linked.values())):
        content = inspect("--method", "resources/read", "--uri", uri)["contents"][0]
        assert content["mimeType"] == "text/html;profile=mcp-app" and content["text"].startswith("<!doctype html>")
    print(f"     {len(linked)} tools linked to {len(set(linked.values()))} MCP Apps views, each read back as HTML")

    bad = inspect(
        "--method",
        "tools/call",
        "--tool-name",
        "patch",
        "--tool-arg",
        'clean_prompts=["when mary and john went to the store , john gave a drink to"]',
        "--tool-arg",
        'corrupt_prompts=["when mary and john went to the store , mary gave a drink to"]',
        "--tool-arg",
        "component=mlp_neurons",
        "--tool-arg",
        "neurons=[9999]",
        "--tool-arg",
        "metric=kl",
        expect=TOOL_ERROR_EXIT,
    )
    assert bad.get("isError") is True and "out of range" in bad["content"][0]["text"]
    print("Inspector checks passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
