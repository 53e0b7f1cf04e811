"""A field whose name reads as a number is a number: in every tool's published outputSchema (tools/list of the
in-process server on `tiny`) and in the results the tools return (the results are checked where every tool is
already called once, ``tests/server/test_surface.py``, with ``non_numeric_values`` from here).

A name reads as numeric when it is one of NUMERIC_NAMES, ends in one of NUMERIC_SUFFIXES or starts with ``n_``. Its
schema must then be a number or integer (nullable allowed), an array of such, or a Score-like object (a ``$ref``
whose definition has a numeric ``value``) — never a string, as ``first_top1_layer`` was ("27")."""

from __future__ import annotations

import re
from typing import Any

import pytest
from mcp import Client

pytestmark = pytest.mark.anyio

NUMERIC_NAMES = {"layer", "score", "fraction", "p_value", "count", "kl", "prob", "probability", "rank", "norm"}
NUMERIC_NAMES |= {"loss", "logit", "margin", "logit_diff"}
NUMERIC_SUFFIXES = ("_layer", "_norm", "_score", "_fraction", "_p_value", "_count", "_kl", "_prob", "_probability")
NUMERIC_SUFFIXES += ("_rank", "_loss", "_logit", "_index", "_seconds", "_s", "_diff", "_gap")
NUMERIC = re.compile(rf"^(n_.+|{'|'.join(map(re.escape, sorted(NUMERIC_NAMES)))}|.+({'|'.join(NUMERIC_SUFFIXES)}))$")


# Names that read as numeric but are not numbers, each for a reason.
NOT_NUMBERS = {
    "attention_post_norm": "a flag: whether the block normalises after attention",
    "by_layer": "a list of per-layer summaries, each checked in its own definition",
}
# Objects a numeric-looking name may hold: their numbers are checked in their own definitions.
SCORED_OBJECTS = {"AnswerScore": "an answer's token, logit, rank and margin (ControlDraw.score)"}


def reads_as_numeric(name: str) -> bool:
    return name not in NOT_NUMBERS and NUMERIC.match(name) is not None


def numeric_schema(schema: dict[str, Any], defs: dict[str, Any]) -> bool:
    """Whether ``schema`` admits only numbers (and null): a number/integer type, an array of those, a union of those,
    or a reference to an object with a numeric ``value`` (Score, AnswerScore)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        value = defs.get(name, {}).get("properties", {}).get("value")
        return name in SCORED_OBJECTS or (value is not None and numeric_schema(value, defs))
    if "anyOf" in schema:
        branches = [b for b in schema["anyOf"] if b != {"type": "null"}]
        return bool(branches) and all(numeric_schema(branch, defs) for branch in branches)
    types = schema.get("type")
    kinds = set(types if isinstance(types, list) else [types]) - {"null"}
    if kinds == {"array"}:
        items = schema.get("items")
        return isinstance(items, dict) and numeric_schema(items, defs)
    if kinds == {"object"}:  # a mapping of names to numbers (stage_seconds)
        values = schema.get("additionalProperties")
        return isinstance(values, dict) and numeric_schema(values, defs)
    return bool(kinds) and kinds <= {"number", "integer"}


def numeric_looking_properties(schema: Any, path: str = "$") -> list[tuple[str, dict[str, Any]]]:
    """Every property (at the root, nested, in ``$defs``) whose name reads as numeric, with its schema."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(schema, dict):
        for key, sub in schema.items():
            if key in ("properties", "$defs") and isinstance(sub, dict):
                for name, prop in sub.items():
                    where = f"{path}.{name}" if key == "properties" else f"$defs.{name}"
                    if key == "properties" and isinstance(prop, dict) and reads_as_numeric(name):
                        found.append((where, prop))
                    found += numeric_looking_properties(prop, where)
            elif isinstance(sub, dict | list):
                found += numeric_looking_properties(sub, path)
    elif isinstance(schema, list):
        for item in schema:
            found += numeric_looking_properties(item, path)
    return found


def non_numeric_fields(schema: dict[str, Any]) -> list[str]:
    """Where a property whose name reads as numeric has a schema that admits something else."""
    defs = schema.get("$defs", {})
    return [f"{where}: {sub}" for where, sub in numeric_looking_properties(schema) if not numeric_schema(sub, defs)]


def numeric_value(value: Any) -> bool:
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return True
    if isinstance(value, list):
        return all(numeric_value(item) for item in value)
    if isinstance(value, dict):  # a Score-like object (its value), a scored answer (its logit) or names → numbers
        if "value" in value or "logit" in value:
            return numeric_value(value.get("value", value.get("logit")))
        return all(numeric_value(item) for item in value.values())
    return False


def non_numeric_values(value: Any, path: str = "$") -> list[str]:
    """Where a result holds a non-number under a key whose name reads as numeric."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if reads_as_numeric(key) and not numeric_value(item):
                found.append(f"{path}.{key} = {item!r}")
            found += non_numeric_values(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += non_numeric_values(item, f"{path}[{i}]")
    return found


def test_the_rule_catches_a_layer_written_as_a_string() -> None:
    """The checks themselves can fail: the old logit_lens schema and result (layers as strings) are caught."""
    old = {
        "properties": {
            "first_top1_layer": {"type": ["string", "null"]},
            "layers": {"type": "array", "items": {"$ref": "#/$defs/LensLayer"}},
            "clean_logit_diff": {"$ref": "#/$defs/Score"},
            "answer": {"type": "string"},
        },
        "$defs": {
            "LensLayer": {"properties": {"layer": {"type": "string"}, "target_rank": {"type": "integer"}}},
            "Score": {"properties": {"value": {"type": "number"}}},
        },
    }
    assert non_numeric_fields(old) == [
        "$.first_top1_layer: {'type': ['string', 'null']}",
        "$defs.LensLayer.layer: {'type': 'string'}",
    ]
    result = {"first_top1_layer": "27", "layers": [{"layer": "embed"}, {"layer": 0}], "n_layers": 3, "answer": "x"}
    assert non_numeric_values(result) == ["$.first_top1_layer = '27'", "$.layers[0].layer = 'embed'"]
    assert non_numeric_values({"score": True, "per_example_score": [0.5, None], "kl": {"value": 0.1}}) == [
        "$.score = True"
    ]
    assert reads_as_numeric("elapsed_s") and reads_as_numeric("n_layers") and not reads_as_numeric("status")


async def test_every_numeric_looking_output_field_is_published_as_a_number(tiny_client: Client) -> None:
    tools = (await tiny_client.list_tools()).tools
    problems, checked = [], 0
    for tool in tools:
        schema = tool.output_schema or {}
        checked += len(numeric_looking_properties(schema))
        problems += [f"{tool.name} {where}" for where in non_numeric_fields(schema)]
    assert problems == [], "\n".join(problems)
    assert checked > 150  # the walk saw the schemas (173 numeric-looking properties when written), not none
