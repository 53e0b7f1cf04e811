"""Artifact fingerprints (SHA-256 of canonical JSON, recomputed here with hashlib) and tamper detection."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from mcp_interp.core.swap import artifact

DEFINED = {"success_definition": "s", "baseline_definition": "b", "rank_definition": "r"}


def sample() -> dict:
    protocol = {"corpus": {"name": "c", "concepts": ["Ä", "B"]}, "settings": {"alpha": 1.0, "k": 25}, **DEFINED}
    run = {"created": "2026-11-29T18:00:00+00:00", "device": "cpu"}
    results = {
        "summary": {"real": {"successes": 1, "n": 2}},
        "exclusions": [{"kind": "prompt", "reason": "not capable"}],
        "trials": [{"status": "executed", "real": {"top1": True}}, {"status": "executed", "real": {"top1": False}}],
    }
    return artifact.build(protocol, run, results)


def test_fingerprints_are_sha256_of_sorted_compact_json() -> None:
    document = sample()
    expected = hashlib.sha256(
        b'{"baseline_definition":"b","corpus":{"concepts":["\xc3\x84","B"],"name":"c"},"rank_definition":"r",'
        b'"settings":{"alpha":1.0,"k":25},"success_definition":"s"}'
    ).hexdigest()
    assert document["fingerprints"]["protocol"] == expected
    trials = json.dumps(document["results"]["trials"], sort_keys=True, separators=(",", ":")).encode()
    assert document["fingerprints"]["results.trials"] == hashlib.sha256(trials).hexdigest()
    assert document["schema_version"] == artifact.SCHEMA_VERSION


def test_a_faithful_copy_verifies_whatever_its_layout() -> None:
    document = sample()
    for text in (artifact.encode_artifact(document).decode(), json.dumps(document), json.dumps(document, indent=4)):
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


def test_editing_the_protocol_or_a_fingerprint_is_caught_but_the_run_block_is_not_hashed() -> None:
    document = copy.deepcopy(sample())
    document["protocol"]["settings"]["alpha"] = 2.0
    assert artifact.verify(document).altered == ["protocol"]
    document = copy.deepcopy(sample())
    document["run"]["created"] = "2027-01-01T00:00:00+00:00"
    document["run"]["device"] = "cuda:0"
    assert artifact.verify(document).valid
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


def test_removing_a_result_block_with_its_fingerprint_and_rehashing_is_caught() -> None:
    document = copy.deepcopy(sample())
    del document["results"]["trials"]
    del document["fingerprints"]["results.trials"]
    document["fingerprints"]["results"] = artifact.fingerprint(document["results"])
    check = artifact.verify(document)
    assert not check.valid and check.altered == ["results.trials"]
    assert "Missing: results.trials" in check.message


def test_the_definitions_are_required_on_build_and_on_verify() -> None:
    document = sample()
    with pytest.raises(ValueError, match="rank_definition"):
        artifact.build(
            {k: v for k, v in document["protocol"].items() if k != "rank_definition"}, {}, document["results"]
        )
    stripped = copy.deepcopy(document)
    del stripped["protocol"]["success_definition"]
    stripped["fingerprints"]["protocol"] = artifact.fingerprint(stripped["protocol"])
    check = artifact.verify(stripped)
    assert not check.valid and "success_definition" in check.message
    assert "0-based" in artifact.DEFINITIONS["rank_definition"] and "1-based" in artifact.DEFINITIONS["rank_definition"]
