"""Regenerate tests/golden/smollm2_transformer_lens.json: TransformerLens' patching references on SmolLM2.

The tests of the heads and localize families compare mcp-interp's patching with these numbers instead of
rerunning TransformerLens' one-forward-per-cell patchers on every run (minutes on a laptop); the file records
the library versions, the weights' fingerprint and the inputs it was made from, and the tests refuse a file
made on other weights. Run it (``./run golden``) after upgrading TransformerLens, transformers or torch.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mcp_interp.core.engine.backend.loader.load import load_model  # noqa: E402
from tests.smollm2_references import GOLDEN, compute_all  # noqa: E402


def main() -> int:
    model = load_model("smollm2-135m")
    started = time.perf_counter()
    data = compute_all(model)
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    cells = sum(len(r["values"]) for r in data["references"].values())
    print(
        f"{GOLDEN.relative_to(ROOT)}: {cells} reference values in {time.perf_counter() - started:.0f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
