"""The demo: what an MCP client sees from mcp-interp with the embedded SmolLM2 model.

Spawns ``python -m mcp_interp serve`` as a stdio subprocess — exactly as Claude Code or Cursor
would — and calls ``model_info``, ``tokenize``, ``logit_diff`` and ``answer_rank`` on the IOI
pairs shipped in ``mcp_interp/data/corpora/ioi.json``, ``patch`` (the layer × position map of the
residual stream), ``logit_diff`` with a two-token answer, then ``explain`` on the first pair, one
controlled ``causal_swap_trial`` (France→Canada), and a ``probe`` of subject number whose direction
is then ablated (against random directions), printing the numbers a client receives.

Usage: ``python scripts/demo.py [--model smollm2-135m]`` (``./run demo`` sets everything up first).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from mcp_interp.corpora import ioi_pairs, subject_number


def structured(result: Any) -> dict[str, Any]:
    if result.is_error:
        text = "\n".join(getattr(block, "text", "") for block in result.content)
        raise SystemExit(f"tool error: {text}")
    return result.structured_content


async def demo(model: str) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_interp", "serve", "--model", model],
        env={**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")},
    )
    pairs = ioi_pairs()
    prompts = [p.clean for p in pairs]
    started = time.perf_counter()

    async def progress(value: float, total: float | None, message: str | None) -> None:
        print(f"  … {message}", flush=True)

    print(f"$ spawning `{sys.executable} -m mcp_interp serve --model {model}` over stdio")
    async with Client(params, read_timeout_seconds=900) as client:
        tools = (await client.list_tools()).tools
        print(f"connected in {time.perf_counter() - started:.1f} s; tools: {', '.join(t.name for t in tools)}\n")

        info = structured(await client.call_tool("model_info", {}, progress_callback=progress))
        print(f"model_info (first answer {time.perf_counter() - started:.1f} s after spawn):")
        print(
            f"  {info['name']} [{info['source']}] {info['architecture']}: {info['n_layers']} layers, "
            f"{info['n_heads']} heads ({info['n_kv_heads']} KV heads), d_model {info['d_model']}, "
            f"vocab {info['d_vocab']}, {info['dtype']} on {info['device']}"
        )
        print(f"  fingerprint {info['fingerprint']}, loaded in {info['load_seconds']:.1f} s")
        print(f"  tokenization: {info['tokenization_rule']}\n")

        tok = structured(await client.call_tool("tokenize", {"texts": [prompts[0], pairs[0].correct, "Mary"]}))
        print("tokenize:")
        for row in tok["texts"]:
            print(f"  {row['text']!r} -> {row['n_tokens']} tokens {row['tokens']} ids {row['ids']}")
        print()

        args = {"prompts": prompts, "correct": [p.correct for p in pairs], "incorrect": [p.incorrect for p in pairs]}
        ld = structured(await client.call_tool("logit_diff", args))
        print(f"logit_diff on {len(prompts)} IOI prompts (logit(correct) - logit(incorrect); > 0 = right):")
        for ex in ld["examples"]:
            print(f"  {ex['logit_diff']:+7.3f}  top-1 {ex['top1_token']!r:10} {ex['prompt']!r} -> {ex['correct']!r}")
        print(f"  mean {ld['logit_diff']['value']:+.3f}   ({ld['elapsed_s'] * 1000:.0f} ms, run {ld['run_id'][:8]})")
        for note in ld["notes"]:
            print(f"  note: {note}")
        print()

        rank = structured(await client.call_tool("answer_rank", {"prompts": prompts, "correct": args["correct"]}))
        print("answer_rank (0 = the correct name is the model's top-1):")
        for ex in rank["examples"]:
            print(f"  rank {ex['rank']:>3}  P = {ex['prob']:.3f}  log P = {ex['log_prob']:+.3f}  {ex['correct']!r}")
        print(f"  mean rank {rank['rank']['value']:.2f}, mean log P {rank['log_prob']['value']:+.3f}")
        for note in rank["notes"]:
            print(f"  note: {note}")

        started_patch = time.perf_counter()
        patch_args = {
            "clean_prompts": prompts,
            "corrupt_prompts": [p.corrupt for p in pairs],
            "correct": args["correct"],
            "incorrect": args["incorrect"],
            "component": "resid_pre",
        }
        mapped = structured(await client.call_tool("patch", patch_args))
        print(
            f"patch resid_pre, every layer × position ({time.perf_counter() - started_patch:.1f} s; "
            f"{len(mapped['skipped_positions'])} positions before the first differing token scored 0 unrun; "
            f"heatmap {mapped['figure_uri']}):"
        )
        for cell in mapped["cells"][:4]:
            print(f"  {cell['score']:+.2f}  {cell['label']}")

        north = structured(
            await client.call_tool(
                "logit_diff",
                {"prompts": ["The United States is a country in"], "correct": " North America", "incorrect": " Europe"},
            )
        )
        example = north["examples"][0]
        print(
            f"\nlogit_diff with a two-token answer ({north['answer_kind']}): log P({example['correct']}) = "
            f"{example['correct_log_prob']:+.3f}, log P({example['incorrect']}) = {example['incorrect_log_prob']:+.3f}"
        )

        started_explain = time.perf_counter()
        explain_args = {
            "prompt": pairs[0].clean,
            "answer": pairs[0].correct,
            "baseline": pairs[0].incorrect,
            "corrupt": pairs[0].corrupt,
            "top_k": 3,
        }
        explained = structured(await client.call_tool("explain", explain_args))
        print(f"\nexplain ({time.perf_counter() - started_explain:.1f} s; report {explained['report_uri']}):")
        for finding in explained["findings"]:
            print(f"  - {finding}")

        swap_args = {
            "template": "The capital of {arg} is the city of",
            "source": "France",
            "target": "Canada",
            "source_answer": "Paris",
            "target_answer": "Ottawa",
            "layer": 15,
            "position": "concept",
            "lens": "logit",  # no fit needed; the default Jacobian lens is fitted (about 4 min) on first use
        }
        swap = structured(await client.call_tool("causal_swap_trial", swap_args))
        trial = swap["trial"]
        base = trial["baseline"]["source_answer"]
        print(
            f"\ncausal_swap_trial France→Canada at layer 15 "
            f"({swap['lens']['kind']} lens, edit at {trial['position_token']!r}):"
        )
        print(
            f"  baseline: {base['token']!r} rank {base['rank']}, margin {base['margin']:+.2f}; status {trial['status']}"
        )
        if trial["real"] is not None:
            wins = sum(c["score"]["top1"] for c in trial["controls"])
            print(
                f"  real edit: ' Ottawa' rank {trial['real']['rank']}; controls top-1 {wins}/{len(trial['controls'])}"
            )
        else:
            print(f"  {trial['detail']}")
        for note in swap["notes"]:
            print(f"  note: {note}")

        corpus = subject_number()
        # six layers, not all 30: each layer's sequential controls refit the probe up to 200 times
        probe_args = {"texts": corpus.texts, "labels": corpus.labels, "layers": [0, 3, 6, 12, 18, 24]}
        probed = structured(await client.call_tool("probe", probe_args))
        print(
            f"\nprobe ({probed['method']}, {probed['n_texts']} texts of the subject_number corpus, "
            f"{' vs '.join(probed['labels'])}, read at the last token; {probed['elapsed_s']:.1f} s):"
        )
        for row in probed["layers"]:
            print(
                f"  layer {row['layer']:>2}: held-out accuracy {row['accuracy']:.3f} [{row['ci_low']:.3f}, "
                f"{row['ci_high']:.3f}], {probed['control_kind']} control {row['control_accuracy']:.3f}, "
                f"selectivity {row['selectivity']:+.3f}"
            )
        layer = 3
        direction_uri = next(row["direction_uri"] for row in probed["layers"] if row["layer"] == layer)
        agreement = ["The keys to the cabinet", "The dogs near the river", "The teachers of the school"]
        ablate_args = {
            "prompts": agreement,
            "targets": [{"layer": layer, "direction": direction_uri}],
            "correct": " are",
            "incorrect": " is",
        }
        removed = structured(await client.call_tool("ablate", ablate_args))
        baseline = removed["random_baseline"]
        draws = sorted(baseline["draws"])
        before, after = removed["before"]["logit_diff"]["value"], removed["after"]["logit_diff"]["value"]
        print(
            f"ablate that direction ({direction_uri[:20]}…, layer {layer}) on plural subjects, ' are' vs ' is': "
            f"logit diff {before:+.2f} -> {after:+.2f}; {len(draws)} random directions removing the same energy "
            f"({baseline['energy']:.3g}) change it by {draws[0]:+.2f} to {draws[-1]:+.2f}: "
            f"p = {baseline['p_value']:.3f}"
        )
        print(f"  verdict: the direction {baseline['verdict']}\n")

        bad = await client.call_tool(
            "patch", {**patch_args, "component": "mlp_neurons", "layers": [28], "neurons": [5000]}
        )
        print("\na deliberately bad call (a neuron that does not exist) returns a tool error the assistant can act on:")
        print("  isError:", bad.is_error)
        print("  " + "\n  ".join(getattr(block, "text", "") for block in bad.content))
    print(f"\ndemo done in {time.perf_counter() - started:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("MCP_INTERP_MODEL", "smollm2-135m"))
    anyio.run(demo, parser.parse_args().model)


if __name__ == "__main__":
    main()
