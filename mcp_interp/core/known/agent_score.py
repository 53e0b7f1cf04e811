"""Scoring an agent's account of a compiled program against its known answer (the ``mcp_interp/known_answer`` eval).

An agent that investigated a served program submits (a) the components it claims compute the program, heads and
MLPs by layer, and (b) the program's function as Python. Both are scored against what is known by construction:

* **components**: precision, recall, F1 and IoU of the claimed set against ``ground_truth.json``'s — every
  component that computes a node (``components``; the embeddings, which every program uses, are not claimable). A
  name that is not a component of the model (``L7H0`` in a two-layer model, ``attention``) is a false positive, and
  listed, so a scatter of guesses costs precision. An empty claim scores F1 0.
* **function**: ``f(tokens)`` takes the input tokens as strings (``["3", "1", "2"]`` for the prompt ``3 1 2``; the
  BOS token is not included) and returns the program's output at every position. It is run on held-out inputs the
  agent never sent to a tool (``seen_inputs``), and compared with the program's reference at each position where the
  program is defined. ``agreement`` (0–1) is the mean over inputs of the fraction of those positions matched;
  ``exact`` the fraction of inputs matched at all of them.

``overall`` is the mean of component F1 and function agreement (0–1, 1 = both right). Nothing here imports Inspect:
the task wraps these functions (``mcp_interp.app.evals``) and runs the submission in its sandbox with ``RUNNER``.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_HEAD = re.compile(r"^L(\d+)H(\d+)$")
_MLP = re.compile(r"^L(\d+)MLP$")
_ATTN = re.compile(r"^L(\d+)(?:ATTN|ATTENTION)$")


def truth_components(nodes: Iterable[Mapping[str, Any]]) -> set[str]:
    """Every head and MLP that computes a node of the program (``ground_truth.json``'s ``nodes``)."""
    return {c for node in nodes for c in node.get("components", []) if c != "embed"}


@dataclass(frozen=True)
class Claims:
    components: set[str]  # normalized names: "L0H1", "L1MLP"
    unknown: list[str]  # what was claimed but names no component of the model (each one a false positive)


def parse_claims(claimed: Iterable[Any], n_layers: int, n_heads: int) -> Claims:
    """The claimed names, normalized (case and spaces ignored; "L1ATTN" = every head of layer 1; a ``{"layer",
    "head"}`` object = that head). A name outside the model's layers and heads is kept in ``unknown``."""
    found: set[str] = set()
    unknown: list[str] = []
    for item in claimed:
        if isinstance(item, Mapping) and isinstance(item.get("layer"), int):
            head = item.get("head")
            name = f"L{item['layer']}MLP" if head is None else f"L{item['layer']}H{head}"
        else:
            name = re.sub(r"[\s._]", "", str(item)).upper()
        head_match, mlp_match, attn_match = _HEAD.match(name), _MLP.match(name), _ATTN.match(name)
        if head_match and int(head_match[1]) < n_layers and int(head_match[2]) < n_heads:
            found.add(f"L{int(head_match[1])}H{int(head_match[2])}")
        elif mlp_match and int(mlp_match[1]) < n_layers:
            found.add(f"L{int(mlp_match[1])}MLP")
        elif attn_match and int(attn_match[1]) < n_layers:
            found.update(f"L{int(attn_match[1])}H{h}" for h in range(n_heads))
        else:
            unknown.append(str(item))
    return Claims(found, unknown)


@dataclass(frozen=True)
class ComponentScore:
    precision: float
    recall: float
    f1: float
    iou: float
    claimed: list[str]
    truth: list[str]
    unknown: list[str]


def score_components(claims: Claims, truth: set[str]) -> ComponentScore:
    """Precision, recall, F1 and IoU (0–1) of ``claims`` against ``truth``; unknown names count as false positives."""
    claimed = claims.components
    n_claimed = len(claimed) + len(claims.unknown)
    hit = len(claimed & truth)
    precision = hit / n_claimed if n_claimed else 0.0
    recall = hit / len(truth) if truth else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    union = len(claimed | truth) + len(claims.unknown)
    iou = hit / union if union else 0.0
    return ComponentScore(precision, recall, f1, iou, sorted(claimed), sorted(truth), list(claims.unknown))


# --- held-out inputs ------------------------------------------------------------------------------------------


def seen_inputs(arguments: Iterable[Any], input_values: Sequence[str], bos: str, max_seq_len: int) -> set[tuple]:
    """Every input an agent sent to a tool: each string anywhere in the tool calls' arguments whose space-separated
    tokens (BOS dropped) are all input values, at most ``max_seq_len`` of them."""
    allowed = set(input_values)
    seen: set[tuple] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            tokens = [t for t in value.split() if t != bos]
            if 0 < len(tokens) <= max_seq_len and all(t in allowed for t in tokens):
                seen.add(tuple(tokens))
        elif isinstance(value, Mapping):
            for v in value.values():
                walk(v)
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v)

    for value in arguments:
        walk(value)
    return seen


def candidate_inputs(input_values: Sequence[str], max_seq_len: int, count: int, seed: int) -> list[tuple[str, ...]]:
    """Up to ``count`` distinct random inputs (a length drawn uniformly from 1…max_seq_len, then each token), the
    same for the same seed; fewer when the input space is smaller."""
    rng = random.Random(f"mcp-interp known_answer {seed}")
    space = sum(len(input_values) ** n for n in range(1, max_seq_len + 1))
    out: dict[tuple[str, ...], None] = {}
    for _ in range(50 * count):
        if len(out) >= min(count, space):
            break
        n = rng.randint(1, max_seq_len)
        out.setdefault(tuple(rng.choice(list(input_values)) for _ in range(n)), None)
    return list(out)


def held_out(cases: Sequence[Mapping[str, Any]], seen: set[tuple], count: int) -> list[Mapping[str, Any]]:
    """The first ``count`` of ``cases`` (``{"input": [...], "expected": [...]}``) whose input the agent never sent."""
    return [case for case in cases if tuple(case["input"]) not in seen][:count]


# --- the function ---------------------------------------------------------------------------------------------


def same_value(got: Any, expected: str) -> bool:
    """A submitted value equals an output token: as a string, or as the same number (1, 1.0 and "1" are one value)."""
    if got is None or isinstance(got, bool):
        return got is not None and str(got) == expected
    if str(got) == expected:
        return True
    try:
        a, b = float(got), float(expected)
    except (TypeError, ValueError):
        return False
    return math.isfinite(a) and a == b


@dataclass
class FunctionScore:
    agreement: float  # mean over inputs of the fraction of defined positions matched, 0–1
    exact: float  # fraction of inputs matched at every defined position
    n_inputs: int
    failures: list[dict[str, Any]] = field(default_factory=list)  # the first few mismatches, for the log


def score_function(cases: Sequence[Mapping[str, Any]], outputs: Sequence[Any], keep_failures: int = 5) -> FunctionScore:
    """``outputs[i]`` is what the submission returned on ``cases[i]["input"]`` (a list, or None when it raised or
    returned something else); ``cases[i]["expected"]`` the reference, token strings and None where undefined."""
    fractions: list[float] = []
    failures: list[dict[str, Any]] = []
    exact = 0
    for case, got in zip(cases, outputs, strict=True):
        positions = [i for i, e in enumerate(case["expected"]) if e is not None]
        if not positions:
            continue
        values = got if isinstance(got, list) and len(got) == len(case["expected"]) else None
        matched = sum(values is not None and same_value(values[i], case["expected"][i]) for i in positions)
        fractions.append(matched / len(positions))
        exact += matched == len(positions)
        if matched < len(positions) and len(failures) < keep_failures:
            failures.append({"input": list(case["input"]), "expected": case["expected"], "got": got})
    n = len(fractions)
    return FunctionScore(sum(fractions) / n if n else 0.0, exact / n if n else 0.0, n, failures)


def overall(components: ComponentScore, function: FunctionScore) -> float:
    """The mean of component F1 and function agreement, 0–1."""
    return (components.f1 + function.agreement) / 2


# The submission runs in the sandbox as ``python3 -c RUNNER`` with {"source", "inputs"} on stdin; it prints
# {"outputs": [...]} or {"error": ...} as its last line. Each input gets None when the function raised (SystemExit
# included), ran over ``PER_INPUT_S`` seconds (a loop), or returned something that is not a list; what the
# submission prints goes to stderr, so it cannot garble the answer.
PER_INPUT_S = 2.0
RUNNER = r"""
import json, signal, sys
job = json.load(sys.stdin)
answer_out, sys.stdout = sys.stdout, sys.stderr

def too_slow(signum, frame):
    raise TimeoutError("over the time allowed per input")

signal.signal(signal.SIGALRM, too_slow)
names = {}
try:
    signal.setitimer(signal.ITIMER_REAL, job["per_input_s"])
    exec(compile(job["source"], "submission.py", "exec"), names)
    signal.setitimer(signal.ITIMER_REAL, 0)
    f = names["f"]
except BaseException as exc:
    signal.setitimer(signal.ITIMER_REAL, 0)
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), file=answer_out)
    sys.exit(0)
outputs = []
for tokens in job["inputs"]:
    try:
        signal.setitimer(signal.ITIMER_REAL, job["per_input_s"])
        value = f(list(tokens))
        signal.setitimer(signal.ITIMER_REAL, 0)
        if isinstance(value, (list, tuple)):
            value = [None if v is None else (v if isinstance(v, (int, float, str, bool)) else str(v)) for v in value]
        else:
            value = None
    except BaseException:
        signal.setitimer(signal.ITIMER_REAL, 0)
        value = None
    outputs.append(value)
print(json.dumps({"outputs": outputs}), file=answer_out)
"""


def runner_timeout_s(n_inputs: int) -> int:
    """The sandbox's limit on the whole run: every input at its limit, and the definition's."""
    return int(PER_INPUT_S * (n_inputs + 1)) + 30


def runner_input(source: str, cases: Sequence[Mapping[str, Any]]) -> str:
    inputs = [list(case["input"]) for case in cases]
    return json.dumps({"source": source, "inputs": inputs, "per_input_s": PER_INPUT_S})


def read_runner_output(stdout: str, n: int) -> tuple[list[Any], str | None]:
    """The runner's outputs (None for each input when the submission did not define ``f``), and why not."""
    try:
        answer = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [None] * n, f"the runner printed no result: {stdout[-300:]!r}"
    if "error" in answer:
        return [None] * n, f"the submission does not define f(tokens): {answer['error']}"
    outputs = answer.get("outputs")
    if not isinstance(outputs, list) or len(outputs) != n:
        return [None] * n, "the runner's result has the wrong number of outputs"
    return outputs, None
