"""Helpers shared by the tests: prompts in `tiny`'s vocabulary, MCP clients (in-process and stdio), schema checks."""

from __future__ import annotations

import json
import sys
from typing import Any

import jsonschema
import torch
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, Tool

from mcp_interp.core.engine.backend.model import LoadedModel

EXPECTED_TOOLS = {
    "model_info",
    "tokenize",
    "logit_diff",
    "kl",
    "answer_rank",
    "ablate_head",
    "patch_heads",
    "patch",
    "ablate",
    "loss",
    "edge_attribution",
    "path_patch",
    "circuit_faithfulness",
    "find_circuit",
    "probe",
    "sae",
    "sae_features",
    "feature_examples",
    "score_explanation",
    "get_figure",
    "logit_lens",
    "dla",
    "attention",
    "induction",
    "steer",
    "explain",
    "causal_swap_trial",
    "causal_swap_benchmark",
    "verify_artifact",
    "export_investigation",
    "fit_lens",
    "job_status",
    "job_cancel",
    "attribution_graph",
    "graph_intervene",
}
# fit_lens and the causal-swap tools write a lens to the cache folder (and the benchmark its artifact); job_cancel
# stops a job; score_explanation files quizzes and scores and marks a quiz scored (it cannot be scored twice). Every
# other tool is read-only.
WRITING_TOOLS = {"fit_lens", "causal_swap_trial", "causal_swap_benchmark", "job_cancel", "score_explanation"}

# Three IOI-style minimal pairs in `tiny`'s word-level vocabulary, all of equal length (14 tokens).
IOI_CLEAN = [
    "when mary and john went to the store , john gave a drink to",
    "when tom and james went to the park , james gave a ball to",
    "when dan and sid went to the shop , sid gave an apple to",
]
IOI_CORRUPT = [
    "when mary and john went to the store , mary gave a drink to",
    "when tom and james went to the park , tom gave a ball to",
    "when dan and sid went to the shop , dan gave an apple to",
]
IOI_CORRECT, IOI_INCORRECT = ["mary", "tom", "dan"], ["john", "james", "sid"]

TINY_PROMPTS = [
    "When Mary and John went to the store, John gave a drink to",
    "When Tom and James went to the park, James gave a ball to",
]


def stdio_params(model: str, env: dict[str, str]) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "mcp_interp", "serve", "--model", model], env=env)


async def tools_by_name(client: Client) -> dict[str, Tool]:
    return {tool.name: tool for tool in (await client.list_tools()).tools}


def assert_valid_structured(tool: Tool, result: CallToolResult) -> dict[str, Any]:
    """The call succeeded and its structured content validates against the tool's outputSchema."""
    assert not result.is_error, result.content
    assert tool.output_schema is not None, f"{tool.name} has no outputSchema"
    assert result.structured_content is not None
    jsonschema.validate(result.structured_content, tool.output_schema)
    return result.structured_content


async def complete_result(client: Client, data: dict[str, Any]) -> dict[str, Any]:
    """The complete result behind a returned one: its ``result_uri`` read (``patch``'s and ``patch_heads``' grids live
    only there), or the returned result itself when nothing was cut."""
    if data.get("result_uri") is None:
        return data
    return json.loads((await client.read_resource(data["result_uri"])).contents[0].text)


def error_text(result: CallToolResult) -> str:
    assert result.is_error, f"expected a tool error, got {result.structured_content}"
    return "\n".join(getattr(block, "text", "") for block in result.content)


TEMPLATE = "The capital of {arg} is the city of"
CONCEPTS = ["France", "Canada", "China", "Egypt"]


def top_word(model: LoadedModel, template: str, concept: str) -> str:
    ids = model.tokenizer(template.replace("{arg}", concept))["input_ids"]
    with torch.no_grad():
        logits = model.bridge(torch.tensor([ids]), return_type="logits")[0, -1]
    return str(model.tokenizer.decode([int(logits.argmax())])).strip()


def tiny_corpus(model: LoadedModel) -> dict[str, Any]:
    """One function the tiny model 'knows' (its own top-1s), one it does not, one with an unknown word."""
    return {
        "name": "tiny-capitals",
        "concepts": CONCEPTS,
        "functions": [
            {"name": "own", "template": TEMPLATE, "answers": {c: top_word(model, TEMPLATE, c) for c in CONCEPTS}},
            {"name": "wrong", "template": "the city of {arg} is", "answers": dict.fromkeys(CONCEPTS, "mary")},
            {
                "name": "unknown",
                "template": "when {arg} went to",
                "answers": {"France": "zzqx", "Canada": "john", "China": "tom", "Egypt": "mary"},
            },
        ],
    }


def png_text(data: bytes) -> dict[str, str]:
    """The tEXt/iTXt chunks of a PNG, parsed by hand from the chunk layout (length, type, data, CRC)."""
    import struct
    import zlib

    out, at = {}, 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        if kind == b"tEXt":
            key, value = body.split(b"\0", 1)
            out[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"iTXt":
            key, rest = body.split(b"\0", 1)
            compressed, rest = rest[0], rest[2:]
            _, rest = rest.split(b"\0", 1)  # language tag
            _, text = rest.split(b"\0", 1)  # translated keyword
            out[key.decode("latin-1")] = (zlib.decompress(text) if compressed else text).decode("utf-8")
        at += 12 + length
    return out


def teacher_forced_reference(
    model: LoadedModel, clean: list[str], corrupt: list[str], correct: list[str], incorrect: list[str], patcher: Any
) -> torch.Tensor:
    """A TransformerLens patcher (e.g. ``patching.get_act_patch_resid_pre``) run on the teacher-forced rows of
    two-token answers "to <name>": for each pair the corrupt prompt and the corrupt prompt + "to", with the metric
    written here — mean over pairs of Σ log P(correct tokens) − Σ log P(incorrect tokens). The reference for
    patching with answers of several tokens."""
    tok = model.tokenizer
    rows, reads = [], []  # reads: (row, token, sign)
    for i in range(len(clean)):
        prompts = tok(clean[i])["input_ids"], tok(corrupt[i])["input_ids"]
        to, good, bad = (tok.convert_tokens_to_ids(w) for w in ("to", correct[i].split()[-1], incorrect[i].split()[-1]))
        rows.append(prompts)
        reads += [(len(rows) - 1, to, +1), (len(rows) - 1, to, -1)]
        rows.append(([*prompts[0], to], [*prompts[1], to]))
        reads += [(len(rows) - 1, good, +1), (len(rows) - 1, bad, -1)]
    width = max(len(r[0]) for r in rows)
    clean_ids = torch.tensor([r[0] + [0] * (width - len(r[0])) for r in rows])
    corrupt_ids = torch.tensor([r[1] + [0] * (width - len(r[1])) for r in rows])
    last = [len(r[0]) - 1 for r in rows]

    def metric(logits: torch.Tensor) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float64)
        for row, token, sign in reads:
            total = total + sign * torch.log_softmax(logits[row, last[row]].double(), dim=-1)[token]
        return total / len(clean)

    _, cache = model.bridge.run_with_cache(clean_ids)
    return patcher(model.bridge, corrupt_ids, cache, metric).double()  # type: ignore[no-any-return]


def assert_inline_grid(inline: Any, full: Any) -> None:
    """A grid returned inline is the complete result's grid, whole, to 3 decimals: same shape, same nulls, each value
    within 5e-4 of the full-precision one and with at most 3 decimals."""
    if isinstance(full, list):
        assert isinstance(inline, list) and len(inline) == len(full)
        for a, b in zip(inline, full, strict=True):
            assert_inline_grid(a, b)
    elif full is None:
        assert inline is None
    else:
        assert abs(inline - full) <= 5e-4 and abs(inline * 1000 - round(inline * 1000)) < 1e-6
