"""Versioned, tamper-evident JSON artifacts of a causal-swap benchmark.

An artifact has three blocks:

* ``protocol`` — what defines the experiment and nothing else: the model (name, weight
  fingerprint, dtype), the lens identity, the full corpus, every setting, the layers, the
  mechanism and the definitions of success, baseline and rank. Its SHA-256 is the *protocol
  fingerprint*: two runs of the same protocol share it, a changed setting changes it;
* ``run`` — when, where and with what it ran (creation time, device, host, library versions,
  mcp-interp version): recorded, never hashed, so it cannot make equal protocols differ;
* ``results`` — ``summary``, ``exclusions`` and ``trials`` (every trial, every control draw),
  each also fingerprinted on its own, so a check can say *which* part was altered — or is missing.

Fingerprints are SHA-256 of canonical JSON (sorted keys, no spaces, UTF-8; ``swap.lenses.canonical_json``).

``benchmark_document`` assembles both blocks from a finished benchmark job; ``verify``
recomputes every fingerprint and names each block whose content no longer matches.
"""

from __future__ import annotations

import json
import platform
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from mcp_interp.core.swap.lenses import canonical_json, sha256_hex
from mcp_interp.schemas.common import ModelRef
from mcp_interp.schemas.swap import BlockCheck, VerifyArtifactResult

if TYPE_CHECKING:
    from mcp_interp.core.swap.benchmark import SwapBenchmarkJob

SCHEMA_NAME = "mcp-interp/causal-swap-benchmark"
SCHEMA_VERSION = 2
RESULT_BLOCKS = ("summary", "exclusions", "trials")
FINGERPRINTED = ("protocol", "results", *(f"results.{name}" for name in RESULT_BLOCKS))

DEFINITIONS = {
    "success_definition": "A trial succeeds when the target's answer token is the strict top-1 of the next-token "
    "logits after the edit: its logit exceeds every other token's (margin > 0); a tie for first is not a success. "
    "An answer of several tokens succeeds when each of its tokens is the strict top-1 given the prompt and the "
    "answer's earlier tokens (teacher forcing, the edit applied throughout): greedy decoding produces it; its "
    "margin is the smallest over its tokens.",
    "baseline_definition": "A prompt is capable when, unedited, its own answer token is the strict top-1 at the last "
    "position (every token of a several-token answer, teacher-forced); incapable prompts (and, with "
    "require_target_known, trials whose target prompt is incapable) are excluded before any edit and listed in the "
    "exclusion ledger.",
    "rank_definition": "rank = number of tokens with a strictly larger logit, so ranks are 0-based: 0 = top-1 (a tie "
    "for first also gives 0). The reference protocol's ranks are 1-based (1 = top-1): add 1 to compare.",
}


def fingerprint(block: Any) -> str:
    return sha256_hex(canonical_json(block))


def build(protocol: dict[str, Any], run: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    missing = [name for name in RESULT_BLOCKS if name not in results]
    missing += [name for name in DEFINITIONS if not isinstance(protocol.get(name), str) or not protocol[name]]
    if missing:
        raise ValueError(f"an artifact needs {missing}")
    return {
        "schema": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "protocol": protocol,
        "run": run,
        "results": results,
        "fingerprints": _fingerprints(protocol, results),
    }


def benchmark_document(
    job: SwapBenchmarkJob, model_ref: ModelRef, version: str, run_extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The artifact of a finished benchmark job run on ``model_ref`` by mcp-interp ``version``."""
    if job.result is None:
        raise ValueError("the benchmark job has not finished: run its steps first")
    settings = job.settings
    protocol = {
        "model": {"name": model_ref.name, "fingerprint": model_ref.fingerprint, "dtype": model_ref.dtype},
        "corpus": job.corpus.model_dump(mode="json"),
        "lens": job.lens_info.model_dump(mode="json"),
        "settings": settings.model_dump(mode="json"),
        "layers": job.layers,
        "mechanism": settings.mechanism,
        **DEFINITIONS,
    }
    run = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "mcp_interp_version": version,
        "model": model_ref.model_dump(mode="json"),
        "host": platform.node(),
        **(run_extra or {}),
    }
    results = {
        "summary": job.result.summary.model_dump(mode="json"),
        "exclusions": [e.model_dump(mode="json") for e in job.result.exclusions],
        "trials": [t.model_dump(mode="json") for t in job.trials],
    }
    return build(protocol, run, results)


def _fingerprints(protocol: Any, results: Any) -> dict[str, str]:
    prints = {"protocol": fingerprint(protocol), "results": fingerprint(results)}
    if isinstance(results, dict):
        for name in RESULT_BLOCKS:
            if name in results:
                prints[f"results.{name}"] = fingerprint(results[name])
    return prints


def encode_artifact(artifact: dict[str, Any]) -> bytes:
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
    if not isinstance(recorded, dict) or not isinstance(artifact.get("protocol"), dict) or "results" not in artifact:
        return _invalid("The artifact lacks its protocol, results or fingerprints block.", name, version)
    undefined = [d for d in DEFINITIONS if not isinstance(artifact["protocol"].get(d), str)]
    if undefined:
        return _invalid(f"The protocol lacks {undefined}: an artifact must say what its numbers mean.", name, version)
    try:
        actual = _fingerprints(artifact["protocol"], artifact["results"])
    except ValueError as exc:  # NaN or Infinity: never written by this server, so the artifact was altered
        return _invalid(
            f"The artifact holds a value canonical JSON cannot encode ({exc}): it was altered.", name, version
        )
    # Every block is required: removing a result block together with its fingerprint (and re-hashing
    # `results`) must not pass as a smaller, valid artifact.
    checks = [
        BlockCheck(
            block=block,
            expected=recorded.get(block),
            actual=actual.get(block, "missing"),
            ok=block in actual and recorded.get(block) == actual[block],
        )
        for block in FINGERPRINTED
    ]
    altered = [c.block for c in checks if not c.ok]
    if altered:
        missing = [c.block for c in checks if c.actual == "missing"]
        message = f"Altered: {', '.join(altered)} no longer match(es) the recorded SHA-256 fingerprint(s)." + (
            f" Missing: {', '.join(missing)}." if missing else ""
        )
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
