"""Versioned, tamper-evident JSON artifacts of a causal-swap benchmark.

An artifact has two blocks, each fingerprinted with SHA-256 of its canonical JSON (sorted keys,
no spaces, UTF-8; ``swap.lenses.canonical_json``):

* ``manifest`` — everything needed to rerun: the full corpus, the model (name, weight
  fingerprint, dtype, library versions), the lens identity, every setting, the mechanism;
* ``results`` — ``summary``, ``exclusions`` and ``trials`` (every trial, every control draw),
  each also fingerprinted on its own, so a check can say *which* part was altered.

``benchmark_document`` assembles both blocks from a finished benchmark job; ``verify``
recomputes every fingerprint and names each block whose content no longer matches.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from mcp_interp.core.swap.lenses import canonical_json, sha256_hex
from mcp_interp.schemas.common import ModelRef
from mcp_interp.schemas.swap import BlockCheck, VerifyArtifactResult

if TYPE_CHECKING:
    from mcp_interp.core.swap.benchmark import SwapBenchmarkJob

SCHEMA_NAME = "mcp-interp/causal-swap-benchmark"
SCHEMA_VERSION = 1
RESULT_BLOCKS = ("summary", "exclusions", "trials")


def fingerprint(block: Any) -> str:
    return sha256_hex(canonical_json(block))


def build(manifest: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    missing = [name for name in RESULT_BLOCKS if name not in results]
    if missing:
        raise ValueError(f"results lack blocks {missing}")
    return {
        "schema": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "manifest": manifest,
        "results": results,
        "fingerprints": _fingerprints(manifest, results),
    }


def benchmark_document(job: SwapBenchmarkJob, model_ref: ModelRef, version: str) -> dict[str, Any]:
    """The artifact of a finished benchmark job run on ``model_ref`` by mcp-interp ``version``."""
    if job.result is None:
        raise ValueError("the benchmark job has not finished: run its steps first")
    settings = job.settings
    manifest = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "mcp_interp_version": version,
        "model": model_ref.model_dump(mode="json"),
        "corpus": job.corpus.model_dump(mode="json"),
        "lens": job.lens_info.model_dump(mode="json"),
        "settings": settings.model_dump(mode="json"),
        "layers": job.layers,
        "mechanism": settings.mechanism,
    }
    results = {
        "summary": job.result.summary.model_dump(mode="json"),
        "exclusions": [e.model_dump(mode="json") for e in job.result.exclusions],
        "trials": [t.model_dump(mode="json") for t in job.trials],
    }
    return build(manifest, results)


def _fingerprints(manifest: Any, results: Any) -> dict[str, str]:
    prints = {"manifest": fingerprint(manifest), "results": fingerprint(results)}
    if isinstance(results, dict):
        for name in RESULT_BLOCKS:
            if name in results:
                prints[f"results.{name}"] = fingerprint(results[name])
    return prints


def encode(artifact: dict[str, Any]) -> bytes:
    """Readable JSON on disk (indented); fingerprints are over canonical JSON, so layout is free."""
    return json.dumps(artifact, indent=1, ensure_ascii=False, allow_nan=False).encode()


def verify(artifact_json: str | dict[str, Any]) -> VerifyArtifactResult:
    """Check schema and fingerprints; ``altered`` names every block that no longer matches."""
    try:
        artifact = json.loads(artifact_json) if isinstance(artifact_json, str) else artifact_json
    except json.JSONDecodeError as exc:
        return _invalid(f"Not JSON: {exc}. Pass the artifact's text exactly as read from artifact://….")
    if not isinstance(artifact, dict):
        return _invalid("An artifact is a JSON object with schema, manifest, results and fingerprints.")
    name, version = artifact.get("schema"), artifact.get("schema_version")
    if name != SCHEMA_NAME:
        return _invalid(f"Unknown schema {name!r}: expected {SCHEMA_NAME!r}.", name, version)
    if version != SCHEMA_VERSION:
        return _invalid(
            f"Schema version {version!r} is not supported: this server reads version {SCHEMA_VERSION}.", name, version
        )
    recorded = artifact.get("fingerprints")
    if not isinstance(recorded, dict) or "manifest" not in artifact or "results" not in artifact:
        return _invalid("The artifact lacks its manifest, results or fingerprints block.", name, version)
    try:
        actual = _fingerprints(artifact["manifest"], artifact["results"])
    except ValueError as exc:  # NaN or Infinity: never written by this server, so the artifact was altered
        return _invalid(
            f"The artifact holds a value canonical JSON cannot encode ({exc}): it was altered.", name, version
        )
    checks = [
        BlockCheck(block=block, expected=recorded.get(block), actual=digest, ok=recorded.get(block) == digest)
        for block, digest in actual.items()
    ]
    altered = [c.block for c in checks if not c.ok]
    if altered:
        message = f"Altered: {', '.join(altered)} no longer match(es) the recorded SHA-256 fingerprint(s)."
    else:
        message = f"Valid: schema {SCHEMA_NAME} v{SCHEMA_VERSION}; all {len(checks)} fingerprints match."
    return VerifyArtifactResult(
        valid=not altered, schema_name=name, schema_version=version, checks=checks, altered=altered, message=message
    )


def _invalid(message: str, name: Any = None, version: Any = None) -> VerifyArtifactResult:
    return VerifyArtifactResult(
        valid=False,
        schema_name=name if isinstance(name, str) else None,
        schema_version=version if isinstance(version, int) else None,
        checks=[],
        altered=[],
        message=message,
    )
