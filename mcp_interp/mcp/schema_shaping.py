"""The tools' published schemas, shaped: equivalent for validation, in fewer bytes, and admitting a job handle.

``tools/list`` is read into an assistant's context, so every tool's schemas are published compacted
(``compact_tool_schemas``): no pydantic ``title`` keywords, optional arguments optional by absence, shared and nested
types by shape only. A tool that can run in the background publishes an output schema that also admits the job
handle a background call returns (``admit_job_handles``). The SDK has no public setter for either schema: the reaches
into its tool records are ``sdk_internals``'.
"""

from __future__ import annotations

from typing import Any

from mcp.server import MCPServer
from pydantic import Field, create_model

from mcp_interp.mcp.sdk_internals import (
    input_schema,
    output_model,
    output_schema,
    publish_input_schema,
    publish_output_schema,
    validate_output_with,
)


def compact_schema(schema: Any, shared: frozenset[str] = frozenset(), output: bool = False) -> Any:
    """A JSON schema, equivalent for validation, in fewer bytes: without pydantic's ``title`` keywords (they restate
    the property names); ``anyOf`` of plain types as one ``type`` list (``{"type": ["number", "null"]}``); in an
    output schema without ``default`` (a result states every value) and, inside the definitions named in ``shared``,
    without descriptions (shared output types are described once, in the server's instructions and docs/conventions.md).
    Property *names* are kept whatever they are called, "title" included."""
    if isinstance(schema, list):
        return [compact_schema(item, shared, output) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if (key == "title" and not isinstance(value, dict)) or (output and key == "default"):
            continue
        if key == "properties":
            out[key] = {name: compact_schema(sub, shared, output) for name, sub in value.items()}
        elif key == "$defs":
            out[key] = {
                name: compact_schema(_undescribed(sub) if name in shared else sub, shared, output)
                for name, sub in value.items()
            }
        else:
            out[key] = compact_schema(value, shared, output)
    branches = out.get("anyOf")
    if isinstance(branches, list) and branches and all(isinstance(b, dict) and set(b) == {"type"} for b in branches):
        types: list[Any] = []
        for branch in branches:
            types += branch["type"] if isinstance(branch["type"], list) else [branch["type"]]
        out.pop("anyOf")
        out["type"] = types
    elif isinstance(branches, list) and len(branches) == 2 and {"type": "null"} in branches:
        out = _nullable(out, next(b for b in branches if b != {"type": "null"}))
    return out


def _nullable(schema: dict[str, Any], branch: Any) -> dict[str, Any]:
    """``{"anyOf": [T, {"type": "null"}], ...}`` as T admitting null, when T is a plain typed schema (an array of
    something, an enum of strings): ``{"type": ["array", "null"], "items": …}`` validates the same values in fewer
    bytes (``items`` and ``properties`` apply to arrays and objects only). A ``$ref`` or a union stays as it is."""
    if not isinstance(branch, dict) or "type" not in branch or set(branch) & {"$ref", "anyOf", "oneOf", "const"}:
        return schema
    if set(branch) & set(schema) - {"anyOf"}:
        return schema  # a keyword on both levels (a description, say): merging would change one
    types = branch["type"] if isinstance(branch["type"], list) else [branch["type"]]
    merged = {key: value for key, value in schema.items() if key != "anyOf"} | branch | {"type": [*types, "null"]}
    if "enum" in branch:
        merged["enum"] = [*branch["enum"], None]
    return merged


def optional_by_absence(schema: dict[str, Any]) -> dict[str, Any]:
    """An input schema whose optional arguments (``default: null``) are optional by being absent: the ``null``
    branch and the default go (an argument left out is None; the server still accepts an explicit null)."""
    properties = {}
    for name, sub in schema.get("properties", {}).items():
        if isinstance(sub, dict) and "default" in sub and sub["default"] is None and "anyOf" in sub:
            branches = [b for b in sub["anyOf"] if b != {"type": "null"}]
            sub = {k: v for k, v in sub.items() if k not in ("anyOf", "default")}
            sub = {**branches[0], **sub} if len(branches) == 1 else {"anyOf": branches, **sub}
        elif isinstance(sub, dict) and sub.get("default", 0) is None and isinstance(sub.get("type"), list):
            sub = {k: v for k, v in sub.items() if k != "default"}  # a shape given by hand: {"type": [..., "null"]}
            sub["type"] = [t for t in sub["type"] if t != "null"]
        properties[name] = sub
    return {**schema, "properties": properties}


def _shape_only(schema: Any) -> Any:
    """A nested output type by shape only: its properties' types, without descriptions, ``required`` lists (they
    restate field names) or the ``"type": "object"`` beside ``properties`` (which name it an object already). A
    client validating a result checks every property's type; the server has validated the result against its full
    model before sending it (the SDK, against the tool's result type)."""
    if isinstance(schema, list):
        return [_shape_only(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        key: {name: _shape_only(sub) for name, sub in value.items()}
        if key in ("properties", "$defs")
        else _shape_only(value)
        for key, value in schema.items()
        if key not in ("description", "required")
        and not (key == "type" and value == "object" and "properties" in schema)
    }


def _inlined(schema: Any, ref: str, shape: dict[str, Any]) -> Any:
    """``schema`` with every ``{"$ref": ref}`` replaced by ``shape`` (a reference longer than what it names)."""
    if isinstance(schema, list):
        return [_inlined(item, ref, shape) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("$ref") == ref:
        return {**shape, **{key: value for key, value in schema.items() if key != "$ref"}}
    return {key: _inlined(value, ref, shape) for key, value in schema.items()}


def _undescribed(schema: Any) -> Any:
    """``schema`` without its ``description`` keywords (property names are kept, whatever they are called)."""
    if isinstance(schema, list):
        return [_undescribed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        key: {name: _undescribed(sub) for name, sub in value.items()}
        if key in ("properties", "$defs")
        else _undescribed(value)
        for key, value in schema.items()
        if key != "description"
    }


SHARED_OUTPUT_TYPES = frozenset({"Score", "FigureInfo", "DirectionProjection", "SearchStep"})
# Fields every result has, described once in the server's instructions, not in each tool's output schema.
COMMON_RESULT_FIELDS = frozenset({"notes", "result_uri", "run_id", "elapsed_s", "figure_uri", "answer_kind", "job"})
MODEL_REF_SHAPE = {"type": "object"}  # where a result's `model` is published by shape (inlined: shorter than a $ref)
# Every result carries the ModelRef of the weights that produced it; its shape is published once, in model_info's
# schema (and in docs/conventions.md), and elsewhere as an object.
MODEL_REF = {"type": "object", "description": "Which weights produced this (name, source, fingerprint, dtype, "
             "device, versions), as in model_info."}  # fmt: skip


def compact_tool_schemas(server: MCPServer[Any], name: str) -> None:
    """Publish ``name``'s input and output schemas compacted (``compact_schema``); ``tests/server/test_surface.py``
    fails if it stops taking effect."""
    publish_input_schema(server, name, compact_schema(optional_by_absence(input_schema(server, name))))
    published = output_schema(server, name)
    if published is not None:
        schema = compact_schema(published, SHARED_OUTPUT_TYPES, output=True)
        if name != "model_info" and "ModelRef" in schema.get("$defs", {}):
            schema["$defs"]["ModelRef"] = MODEL_REF
        for field_name in COMMON_RESULT_FIELDS & set(schema.get("properties", {})):
            schema["properties"][field_name].pop("description", None)
        # A result's own fields keep their descriptions; the nested types (rows, cells, nodes) are published by shape
        # only: they were half of tools/list, and their meanings are in mcp_interp/schemas and docs/.
        defs = schema.get("$defs", {})
        for def_name in defs:
            if not (name == "model_info" and def_name == "ModelRef"):
                defs[def_name] = _shape_only(defs[def_name])
        if name != "model_info" and defs.pop("ModelRef", None) is not None:
            schema = _inlined(schema, "#/$defs/ModelRef", MODEL_REF_SHAPE)
        publish_output_schema(server, name, schema)


def admit_job_handles(server: MCPServer[Any], name: str) -> None:
    """Let the tool's result be a job handle too: a background call returns only ``job`` and ``notes``, a foreground
    one the full result. The published schema is the result's own with nothing required at its root and a ``job``
    object; results are validated against the result's model with every field optional (the fields' own types are
    unchanged, so a foreground result is still checked field by field)."""
    model = output_model(server, name)
    assert model is not None, name
    schema = dict(output_schema(server, name) or {})
    schema.pop("required", None)
    schema["properties"] = {**schema.get("properties", {}), "job": {"type": "object"}}  # described in the instructions
    fields: dict[str, Any] = {
        field_name: (info.annotation | None, Field(default=None)) for field_name, info in model.model_fields.items()
    }
    fields["job"] = (dict[str, Any] | None, Field(default=None))
    validate_output_with(server, name, create_model(f"{model.__name__}OrJob", **fields))
    publish_output_schema(server, name, schema)
