"""Helpers shared by the MCP-level tests (in-process and stdio)."""

from __future__ import annotations

import sys
from typing import Any

import jsonschema
import torch
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, Tool

from mcp_interp.models import LoadedModel

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
    "fit_lens",
}
WRITING_TOOLS = {"fit_lens"}  # writes its lens to the cache folder; every other tool is read-only

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
