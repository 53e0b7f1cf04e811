"""A hidden ground truth stays hidden (issue 53 §1): a program whose nodes, file and folder carry telltale names is
compiled, served with its truth hidden, and every tool is called on it; nothing that reaches the client — results,
notes, errors, linked resources, figures' metadata, the resource list, the exported script, notebook and report —
names a node, the program's file or its folder. Revealed, the same names are there (so the grep can find them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import BlobResourceContents, TextResourceContents

from mcp_interp.core.engine.backend.options import LoadOptions
from mcp_interp.host import ModelHost
from mcp_interp.mcp.server import build_server
from mcp_interp.names import HIDDEN_PROGRAM_NAME
from tests.helpers import EXPECTED_TOOLS, png_text

pytestmark = pytest.mark.anyio

TELLTALES = ("zebra", "quokka", "narwhal", "xyzzy")
PROGRAM = """
from tracr.rasp import rasp

quokka_first = rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == 0).named("quokka_first")
zebra_token = rasp.categorical(rasp.Aggregate(quokka_first, rasp.tokens)).named("zebra_token")
program = rasp.categorical(
    rasp.SequenceMap(lambda a, b: 1 if a == b else 0, zebra_token, rasp.tokens)
).named("narwhal_same")
vocab = {0, 1, 2}
max_seq_len = 4
"""
PROMPTS = ["0 1 2 0", "1 0 2 1", "2 1 0 1", "0 2 1 2"]  # the output (same as the first value?) is 1, 1, 0, 0
CORRECT, INCORRECT = ["1", "1", "0", "0"], ["0", "0", "1", "1"]
CORRUPT = ["1 1 2 0", "0 0 2 1", "1 1 0 1", "2 2 1 2"]  # the first value changed: the output flips
PAIR = {"clean_prompts": PROMPTS, "corrupt_prompts": CORRUPT, "correct": CORRECT, "incorrect": INCORRECT}
# The tools that must answer on a compiled program (the rest may refuse; their errors are read all the same).
MUST_ANSWER = {"model_info", "tokenize", "logit_diff", "kl", "answer_rank", "ablate_head", "ablate", "patch_heads",
               "patch", "edge_attribution", "path_patch", "circuit_faithfulness", "find_circuit", "logit_lens", "dla",
               "attention", "explain", "export_investigation", "get_figure", "job_status"}  # fmt: skip


def calls(missing: str) -> dict[str, dict[str, Any]]:
    """One call of every tool; ``missing`` is a path that holds nothing (an SAE, transcoders, a lens)."""
    texts = [" ".join(str((i + j) % 3) for j in range(4)) for i in range(24)]
    return {
        "model_info": {},
        "tokenize": {"texts": PROMPTS},
        "logit_diff": {"prompts": PROMPTS, "correct": CORRECT, "incorrect": INCORRECT},
        "kl": {"prompts": PROMPTS, "intervention": {"ablate": ["L0H0"]}},
        "answer_rank": {"prompts": PROMPTS, "correct": CORRECT},
        "ablate_head": {"prompts": PROMPTS, "heads": "L0H0", "correct": CORRECT, "incorrect": INCORRECT},
        "ablate": {"prompts": PROMPTS, "targets": ["L0MLP"], "correct": CORRECT, "incorrect": INCORRECT},
        "loss": {"texts": PROMPTS},
        "patch_heads": PAIR,
        "patch": {**PAIR, "component": "resid_pre"},
        "edge_attribution": PAIR,
        "path_patch": {**PAIR, "sender": "L0H0", "receivers": "logits"},
        "circuit_faithfulness": {**PAIR, "top_k": 5, "random_circuits": 19},
        "find_circuit": {**PAIR, "random_circuits": 19},
        "probe": {"texts": texts, "labels": [int(t[0] == "0") for t in texts]},
        "sae": {"text": PROMPTS[0], "sae": missing},
        "sae_features": {"texts": PROMPTS, "sae": missing, "features": [0]},
        "feature_examples": {"feature": "L0N0", "texts": PROMPTS},
        "score_explanation": {
            "feature": "L0N0",
            "explanation": "a first value",
            "activating_texts": PROMPTS[:2],
            "non_activating_texts": PROMPTS[2:],
        },
        "attribution_graph": {"prompt": PROMPTS[0], "transcoders": missing},
        "graph_intervene": {
            "prompt": PROMPTS[0],
            "transcoders": missing,
            "features": [{"layer": 0, "position": -1, "feature": 0, "value": 1.0}],
        },
        "logit_lens": {"prompt": PROMPTS[0]},
        "dla": {"prompt": PROMPTS[0], "answer": "1", "baseline": "0"},
        "attention": {"prompt": PROMPTS[0], "layer": 0, "head": 0},
        "induction": {"seq_len": 4, "n_seqs": 2},
        "steer": {"prompt": PROMPTS[0], "coefficient": 1.0, "positive": "0", "negative": "1", "max_new_tokens": 2},
        "explain": {"prompt": PROMPTS[0], "answer": "1", "baseline": "0", "corrupt": CORRUPT[0]},
        "causal_swap_trial": {
            "template": "{} 1 2",
            "source": "0",
            "target": "1",
            "source_answer": "1",
            "target_answer": "0",
            "layer": 0,
            "lens_path": missing,
        },
        "causal_swap_benchmark": {"layers": [0], "lens_path": missing},
        "verify_artifact": {"artifact_json": "{}"},
        "fit_lens": {"texts": PROMPTS},
        "export_investigation": {"format": "md"},
    }


def telltales_in(text: str, folder: Path) -> list[str]:
    lowered = text.lower()
    return [word for word in (*TELLTALES, str(folder).lower(), folder.name) if word in lowered]


async def everything_a_client_sees(client: Client, missing: str) -> tuple[list[str], dict[str, bool], list[str]]:
    """Every text the client gets back from one call of each tool, every resource a result links to (PNG
    metadata decoded), the resource list, and the three exports; with which calls erred and the URIs read."""
    seen: list[str] = []
    erred: dict[str, bool] = {}
    uris: set[str] = set()

    def keep(name: str, result: Any) -> None:
        erred[name] = bool(result.is_error)
        seen.append(f"{name}: " + json.dumps(result.structured_content or {}))
        for block in result.content:
            seen.append(getattr(block, "text", "") or "")
            if getattr(block, "uri", None):
                uris.add(str(block.uri))
        uris.update(u for u in _uris(result.structured_content or {}))

    for name, arguments in calls(missing).items():
        keep(name, await client.call_tool(name, arguments))
    figure = next(u for u in sorted(uris) if u.startswith("figure://"))
    keep("get_figure", await client.call_tool("get_figure", {"uri": figure}))
    background = await client.call_tool("patch_heads", {**PAIR, "background": True})
    job = str((background.structured_content or {})["job"]["job_uri"])
    keep("job_status", await client.call_tool("job_status", {"job": job}))
    keep("job_cancel", await client.call_tool("job_cancel", {"job": job}))
    for form in ("py", "ipynb"):
        keep(f"export_investigation {form}", await client.call_tool("export_investigation", {"format": form}))
    listed = await client.list_resources()
    seen.extend(f"{r.uri} {r.name} {r.description or ''}" for r in listed.resources)
    uris.update(str(r.uri) for r in listed.resources)
    read = []
    for uri in sorted(uris):
        try:
            contents = (await client.read_resource(uri)).contents
        except Exception as exc:  # an evicted or unreadable link still says something: read its error too
            seen.append(f"{uri}: {exc}")
            continue
        read.append(uri)
        for content in contents:
            if isinstance(content, TextResourceContents):
                seen.append(content.text)
            elif isinstance(content, BlobResourceContents):
                import base64

                data = base64.b64decode(content.blob)
                seen.append(json.dumps(png_text(data)) if data[:4] == b"\x89PNG" else data.decode("latin-1"))
    return seen, erred, read


def _uris(value: Any) -> list[str]:
    if isinstance(value, str) and "://" in value and value.split("://")[0].isalpha():
        return [value]
    if isinstance(value, dict):
        return [u for v in value.values() for u in _uris(v)]
    if isinstance(value, list):
        return [u for v in value for u in _uris(v)]
    return []


@pytest.fixture(scope="module")
def telltale_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("tracr", reason="compiling needs mcp-interp[tracr] (in the dev extra)")
    from mcp_interp.app.cli import main

    root = tmp_path_factory.mktemp("hidden")
    source = root / "quokka_zebra_program.py"
    source.write_text(PROGRAM, encoding="utf-8")
    folder = root / "narwhal_xyzzy_compiled"
    assert main(["compile-rasp", str(source), str(folder)]) == 0
    return folder


async def test_nothing_a_client_sees_names_a_node_the_file_or_the_folder(
    telltale_program: Path, tmp_path: Path
) -> None:
    folder, missing = telltale_program, str(tmp_path / "nothing_here")
    host = ModelHost(str(folder), tmp_path / "out")
    async with Client(build_server(host)) as client:
        assert {(t.name) for t in (await client.list_tools()).tools} == EXPECTED_TOOLS
        assert set(calls(missing)) | {"get_figure", "job_status", "job_cancel"} == EXPECTED_TOOLS
        seen, erred, read = await everything_a_client_sees(client, missing)
        script = next(json.loads(s.split(": ", 1)[1]) for s in seen if s.startswith("export_investigation py: "))
        script_text = (await client.read_resource(script["script_uri"])).contents[0]
    assert [name for name in MUST_ANSWER if erred[name]] == []
    assert len(read) >= 10 and any(u.startswith("figure://") for u in read) and any("result://" in u for u in read)
    leaks = {s[:80]: telltales_in(s, folder) for s in seen if telltales_in(s, folder)}
    assert leaks == {}
    assert json.loads(seen[0].split(": ", 1)[1])["name"] == HIDDEN_PROGRAM_NAME
    # The exported script reruns the hidden program from its folder (the recorded name names no folder).
    assert isinstance(script_text, TextResourceContents)
    path = tmp_path / "rerun.py"
    path.write_text(script_text.text, encoding="utf-8")
    refused = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "--model FOLDER" in refused.stderr + refused.stdout
    rerun = subprocess.run([sys.executable, str(path), "--model", str(folder)], capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]


async def test_revealed_the_same_calls_name_the_output_node(telltale_program: Path, tmp_path: Path) -> None:
    """The grep above can find what it looks for: with the truth revealed, model_info names the output node and the
    served name is the folder."""
    host = ModelHost(str(telltale_program), tmp_path / "out", options=LoadOptions(reveal_ground_truth=True))
    async with Client(build_server(host)) as client:
        info = (await client.call_tool("model_info", {})).structured_content or {}
    assert info["name"] == str(telltale_program)
    assert info["program"]["output"].startswith("narwhal_same")
    assert info["program"]["n_nodes"] == len(info["program"]["ground_truth"])
    assert {n["name"] for n in info["program"]["ground_truth"]} >= {"quokka_first", "zebra_token", "narwhal_same"}
    assert telltales_in(json.dumps(info), telltale_program)
