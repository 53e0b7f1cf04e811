"""The GPU check (not run in CI: no GPU there): the vllm and transformers engines on one model, one table.

On a model folder of 1–8B parameters it runs, through the server's own MCP tools (an in-process client), the same
calls on ``--backend vllm`` and on ``--backend transformers --device cuda`` (both in ``--dtype`` bfloat16 by default):

* ``logit_diff``, ``ablate_head`` and exact ``patch_heads`` on 8 IOI pairs — parity between the two engines, to the
  tolerance stated below for bfloat16, with seconds per call and peak GPU memory. vLLM's driver has no per-head
  point (``attn.hook_z`` sits inside its fused kernels), so the two head tools are refused there by name — printed
  as such, and a refusal ``model_info`` did not announce fails the check — and ``ablate`` of whole attention layers
  and MLPs and ``patch`` of each layer's attention output give the parity on the points it serves;
* the CPU bars on cuda: every call of ``tests/server/test_backends.py`` on ``--backend transformers`` in float32 on
  cuda against the same on the CPU, to the CI's 1e-4 (TF32 matmuls off, so cuda and CPU compute in float32).

bfloat16 keeps 8 bits of mantissa (~2.4 significant digits), and the two engines sum in different orders (vLLM's
fused kernels, CUDA graphs), so a logit difference of magnitude x agrees to about |Δ| ≤ 0.05 + 0.02·|x|: that is
the stated bar (``BF16_ABS``, ``BF16_REL``). A failure prints the worst number and exits 1.

``--remote inspect --device cpu --model tiny`` runs the same code without a GPU (what the test suite does to keep
this script working); on a GPU machine, ``scripts/gpu_check.sh MODEL_DIR`` installs the vllm extra and runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BF16_ABS, BF16_REL = 0.05, 0.02
CPU_BAR = 1e-4


def ioi(n: int) -> tuple[list[str], list[str], list[str], list[str]]:
    from mcp_interp.corpora import ioi_pairs

    pairs = ioi_pairs()[:n]
    return (
        [p.clean for p in pairs],
        [p.corrupt for p in pairs],
        [p.correct for p in pairs],
        [p.incorrect for p in pairs],
    )


def parity_calls(n_pairs: int) -> list[tuple[str, dict[str, Any]]]:
    clean, corrupt, good, bad = ioi(n_pairs)
    return [
        ("logit_diff", {"prompts": clean, "correct": good, "incorrect": bad}),
        (
            "ablate_head",
            {"prompts": clean, "heads": ["L0H0", "L1H1"], "correct": good, "incorrect": bad, "random_draws": 19},
        ),
        ("patch_heads", {"clean_prompts": clean, "corrupt_prompts": corrupt, "correct": good, "incorrect": bad}),
        # what vLLM's driver serves of the same questions (it has no per-head point, so the two above are refused
        # there): whole attention layers and MLPs ablated, and every layer's attention output patched
        (
            "ablate",
            {"prompts": clean, "targets": ["L0ATTN", "L1MLP"], "correct": good, "incorrect": bad, "random_draws": 19},
        ),
        (
            "patch",
            {
                "clean_prompts": clean,
                "corrupt_prompts": corrupt,
                "correct": good,
                "incorrect": bad,
                "component": "attn_out",
            },
        ),
    ]


def numbers(value: Any, path: str = "") -> dict[str, float]:
    skip = {"run_id", "elapsed_s", "model", "notes", "engine", "figure_uri", "result_uri", "job", "capabilities",
            "engine_requests", "rows"}  # fmt: skip  # how a remote engine was driven, not what it measured
    out: dict[str, float] = {}
    if isinstance(value, dict):
        for key, sub in value.items():
            if key not in skip:
                out |= numbers(sub, f"{path}.{key}")
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        # a ranked list: entries by what names them (head, layer, position…), so near-ties ordered differently on
        # two engines still compare entry with entry; its length compared too
        out[f"{path}.length"] = float(len(value))
        for sub in value:
            name = sorted((k, v) for k, v in sub.items() if isinstance(v, str | int) and not isinstance(v, bool))
            out |= numbers(sub, f"{path}[{name!r}]")
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            out |= numbers(sub, f"{path}[{i}]")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        out[path] = float(value)
    return out


def run_calls(model: str, device: str, dtype: str, backend: str, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    """Each call through an in-process MCP client of a fresh server: (structured result, seconds, peak GPU MB)."""
    import torch
    from mcp import Client

    from mcp_interp.core.engine.backend.options import LoadOptions
    from mcp_interp.host import ModelHost
    from mcp_interp.mcp.server import build_server

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    options = LoadOptions(backend=backend, gpu_memory_utilization=0.4)  # type: ignore[arg-type]
    session = ModelHost(model, Path("/tmp/mcp-interp-gpu-check"), device=device, dtype=dtype, options=options)

    async def go() -> list[tuple[dict[str, Any] | str, float, float]]:
        out: list[tuple[dict[str, Any] | str, float, float]] = []
        async with Client(build_server(session)) as client:
            info = (await client.call_tool("model_info", {})).structured_content or {}  # the model is loaded
            refused = {tool for c in info.get("capabilities", []) if not c["available"] and not c["option"]
                       for tool in c["tools"]}  # fmt: skip
            for name, args in calls:
                if torch.cuda.is_available():
                    torch.cuda.reset_peak_memory_stats()
                started = time.perf_counter()
                result = await client.call_tool(name, args)
                seconds = time.perf_counter() - started
                if result.is_error:
                    text = " ".join(getattr(part, "text", "") for part in result.content)
                    if name not in refused:  # a refusal model_info did not announce is a failure too
                        raise SystemExit(f"{backend} {device}: {name} failed: {text}")
                    out.append((text, seconds, 0.0))
                    continue
                peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else 0.0
                out.append((result.structured_content or {}, seconds, peak))
        return out

    return asyncio.run(go())


def gpu_memory_used_mb() -> float | None:
    """Device memory in use now (nvidia-smi, which also sees vLLM's worker processes), or None without it."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             check=True, capture_output=True, text=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    return sum(float(line) for line in out.split())


def compare(a: dict[str, Any], b: dict[str, Any], absolute: float, relative: float) -> tuple[bool, float, str]:
    x, y = numbers(a), numbers(b)
    worst, where, ok = 0.0, "", True
    for key in x.keys() & y.keys():
        gap = abs(x[key] - y[key])
        if gap > absolute + relative * abs(y[key]):
            ok = False
        if gap > worst:
            worst, where = gap, key
    # only entries of a top-N list cut among ties may be in one result alone (the lengths are compared)
    alone = {key for key in x.keys() ^ y.keys() if "[[" not in key}
    return ok and not alone, worst, where if not alone else f"{where}; in one result only: {sorted(alone)[:3]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="A local model folder (1–8B), or 'tiny' for a dry run.")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--remote", default="vllm", choices=["vllm", "inspect"])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--skip-cpu-bars", action="store_true")
    args = parser.parse_args()
    calls = parity_calls(args.pairs)
    local = run_calls(args.model, args.device, args.dtype, "transformers", calls)
    before = gpu_memory_used_mb()
    remote = run_calls(args.model, "cpu" if args.remote == "inspect" else args.device, args.dtype, args.remote, calls)
    after = gpu_memory_used_mb()
    failed = False
    print(f"model {args.model}, {args.dtype}: {args.remote} against transformers on {args.device}")
    remote_time = f"s ({args.remote})"
    print(f"{'call':<14}{'parity':>8}{'max |Δ|':>11}{'s (transformers)':>18}{remote_time:>12}{'peak GPU MB':>13}")
    for (name, _), (ours, t_local, peak), (theirs, t_remote, _) in zip(calls, local, remote, strict=True):
        if isinstance(ours, str):
            raise SystemExit(f"transformers {args.device}: {name} refused: {ours}")
        if isinstance(theirs, str):  # refused by name, as model_info's capabilities announced
            reason = theirs.split(" needs ", 1)[-1].split(",")[0]
            print(f"{name:<14}{'refused':>8}{'':>11}{t_local:18.2f}{'':>12}{peak:13.0f}  needs {reason}")
            continue
        ok, worst, where = compare(theirs, ours, BF16_ABS, BF16_REL)
        failed |= not ok
        print(f"{name:<14}{'ok' if ok else 'FAIL':>8}{worst:11.2e}{t_local:18.2f}{t_remote:12.2f}{peak:13.0f}  {where}")
    if before is not None and after is not None:
        print(f"GPU memory in use with the {args.remote} engine loaded: {after:.0f} MB (nvidia-smi)")
    print(f"bar: |Δ| ≤ {BF16_ABS} + {BF16_REL}·|x| (bfloat16)")
    if not args.skip_cpu_bars:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.server.test_backends import calls as ci_calls
        from tests.server.test_backends import folders_at

        info = run_calls(args.model, "cpu", "float32", "transformers", [("model_info", {})])[0][0]
        shape = {"n_layers": info["n_layers"], "n_heads": info["n_heads"], "d_model": info["d_model"]}
        root = Path("/tmp/mcp-interp-gpu-check/folders")
        table = ci_calls(folders_at(root, shape["d_model"], shape["n_layers"]), **shape)
        on_cuda = run_calls(args.model, args.device, "float32", "transformers", table)
        on_cpu = run_calls(args.model, "cpu", "float32", "transformers", table)
        print(
            f"\nthe CPU bars on {args.device} (float32, transformers): {len(table)} calls against the CPU ≤ {CPU_BAR}"
        )
        for (name, _), (gpu, _, _), (cpu, _, _) in zip(table, on_cuda, on_cpu, strict=True):
            ok, worst, where = compare(gpu, cpu, CPU_BAR, 0.0)
            failed |= not ok
            print(f"  {name:<22}{'ok' if ok else 'FAIL':>6}{worst:11.2e}  {where}")
    print(json.dumps({"failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
