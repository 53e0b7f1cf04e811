"""Artifact fingerprints (SHA-256 of canonical JSON, recomputed here with hashlib) and tamper detection."""

from __future__ import annotations

import copy
import hashlib
import json

from mcp_interp.core.swap import artifact


def sample() -> dict:
    manifest = {"corpus": {"name": "c", "concepts": ["Ä", "B"]}, "settings": {"alpha": 1.0, "k": 25}}
    results = {
        "summary": {"real": {"successes": 1, "n": 2}},
        "exclusions": [{"kind": "prompt", "reason": "not capable"}],
        "trials": [{"status": "executed", "real": {"top1": True}}, {"status": "executed", "real": {"top1": False}}],
    }
    return artifact.build(manifest, results)


def test_fingerprints_are_sha256_of_sorted_compact_json() -> None:
    document = sample()
    expected = hashlib.sha256(
        b'{"corpus":{"concepts":["\xc3\x84","B"],"name":"c"},"settings":{"alpha":1.0,"k":25}}'
    ).hexdigest()
    assert document["fingerprints"]["manifest"] == expected
    trials = json.dumps(document["results"]["trials"], sort_keys=True, separators=(",", ":")).encode()
    assert document["fingerprints"]["results.trials"] == hashlib.sha256(trials).hexdigest()
    assert document["schema_version"] == artifact.SCHEMA_VERSION


def test_a_faithful_copy_verifies_whatever_its_layout() -> None:
    document = sample()
    for text in (artifact.encode(document).decode(), json.dumps(document), json.dumps(document, indent=4)):
        check = artifact.verify(text)
        assert check.valid and check.altered == [], check.message
        assert len(check.checks) == 5


def test_editing_one_trial_names_the_trials_block() -> None:
    document = copy.deepcopy(sample())
    document["results"]["trials"][1]["real"]["top1"] = True
    check = artifact.verify(json.dumps(document))
    assert not check.valid
    assert check.altered == ["results", "results.trials"]
    assert "results.trials" in check.message


def test_editing_the_manifest_or_a_fingerprint_is_caught() -> None:
    document = copy.deepcopy(sample())
    document["manifest"]["settings"]["alpha"] = 2.0
    assert artifact.verify(document).altered == ["manifest"]
    document = copy.deepcopy(sample())
    document["fingerprints"]["results.summary"] = "0" * 64
    assert artifact.verify(document).altered == ["results.summary"]


def test_schema_and_garbage_are_reported_not_raised() -> None:
    document = sample()
    assert "version" in artifact.verify({**document, "schema_version": 99}).message
    assert "Unknown schema" in artifact.verify({**document, "schema": "other"}).message
    assert "Not JSON" in artifact.verify("{not json").message
    assert not artifact.verify("[1, 2]").valid
    missing = {k: v for k, v in document.items() if k != "fingerprints"}
    assert not artifact.verify(missing).valid


def test_a_nan_smuggled_into_an_artifact_is_reported() -> None:
    text = json.dumps(sample()).replace('"alpha": 1.0', '"alpha": NaN')
    check = artifact.verify(text)
    assert not check.valid and "altered" in check.message
