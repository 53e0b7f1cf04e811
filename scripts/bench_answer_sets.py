"""What an answer set costs against one token per answer, on SmolLM2, measured in the same run (``./run bench
answer_sets``).

A set of single tokens is read from the next-token distribution the call computes anyway (``read_log_probs``: one
pass whatever the set's size); a set with a member of several tokens is scored teacher-forced, one more forward per
member length. Each tool is timed on 8 prompts with one token per answer, with sets of single tokens
(" Paris", " Berlin", " Rome"), and with sets holding a two-token member (" paris"), best of ``--repeats``; the ratio
is against the one-token call. Target (issue 52 §5): a set of single tokens ≤ 1.5× one token.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

PROMPTS = [f"The capital of {c} is" for c in ("France", "Germany", "Italy", "Spain")] * 2
CORRECT = [" Paris", " Berlin", " Rome", " Madrid"] * 2
INCORRECT = [" London"] * 8


def best(session: Any, tool: str, repeats: int, **arguments: Any) -> float:
    session.call(tool, **arguments)  # warm
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        session.call(tool, **arguments)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from mcp_interp.app.api import Session
    from mcp_interp.core.engine.text.answers import resolve_answer_specs

    session = Session(output_dir="/tmp/mcp-interp-bench-answer-sets")
    tokenizer = session.host.wait_loaded().tokenizer
    single = [{"any_of": [c, *(o for o in CORRECT[:4] if o != c)][:3]} for c in CORRECT]  # three capitals, 1 token each
    mixed = [{"any_of": [c, c.lower()]} for c in CORRECT]
    for name, sets, one in (("single", single, True), ("mixed", mixed, False)):
        lengths = {
            len(alt) for a in resolve_answer_specs(tokenizer, sets, len(sets), "correct") for alt in a.alternatives
        }
        assert (lengths == {1}) is one, f"{name}: member lengths {lengths}"
    rows = []
    for tool, extra in (("logit_diff", {"incorrect": INCORRECT}), ("answer_rank", {}),
                        ("ablate_head", {"incorrect": INCORRECT, "heads": "L9H3", "random_draws": 19})):  # fmt: skip
        base = best(session, tool, args.repeats, prompts=PROMPTS, correct=CORRECT, **extra)
        for name, sets in (("single-token sets", single), ("sets with a two-token member", mixed)):
            seconds = best(session, tool, args.repeats, prompts=PROMPTS, correct=sets, **extra)
            rows.append({"tool": tool, "answers": name, "seconds": round(seconds, 3), "one_token_seconds":
                         round(base, 3), "ratio": round(seconds / base, 2)})  # fmt: skip
    session.close()
    for row in rows:
        print(f"{row['tool']:12} {row['answers']:30} {row['seconds']:7.3f} s vs {row['one_token_seconds']:7.3f} s "
              f"one token: {row['ratio']:.2f}x")  # fmt: skip
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
