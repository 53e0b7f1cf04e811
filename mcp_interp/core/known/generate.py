"""``mcp-interp generate-rasp --seed N OUT``: a RASP program no one has seen, drawn from a grammar, compiled by tracr.

A known-answer task must not be one an agent (or the model behind it) has read about, so programs are drawn at
random, deterministically by seed, from a grammar of RASP primitives at depth 1–4 (a leaf, ``tokens`` or
``indices``, is depth 0):

* ``Map(f, x)`` and ``SequenceMap(g, x, y)``, with f and g from small tables of functions on the values (``MAPS``,
  ``SEQUENCE_MAPS``);
* categorical ``Aggregate(Select(indices, indices, p), x)`` with a selector that picks one position (the first, the
  previous, the next, the last… ``ONE_HOT``), so each output is one of the values;
* numerical ``Aggregate(Select(x, y, c), indicator(z))`` (the fraction of selected positions where z holds a value),
  read out by a categorical Map (tracr's discretising MLP);
* ``SelectorWidth(Select(x, y, c))`` with c one of RASP's comparisons.

A draw is kept only when tracr compiles it, its output is not constant over the inputs tried, the compiled model's
output at the last position equals tracr's own evaluator wherever the program is defined, and the self-contained
reference implementation written beside it (``reference.py``: the tree and a plain-Python evaluator, no tracr)
equals the evaluator too; otherwise it is redrawn from the next sub-seed, with the reason logged.

The folder is ``compile-rasp``'s (so it serves with its truth hidden the same way) plus ``task.json`` (the input
vocabulary, the length, the seed, the program's shape — its operators without their functions) and ``reference.py``
(``reference(values) -> list``: the program's value at each position, None where it is undefined). Neither names a
node: tracr's own labels (``map_12``) are in ``ground_truth.json`` only.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp_interp.errors import CompileError

log = logging.getLogger(__name__)

VOCAB = (0, 1, 2, 3)
MAX_SEQ_LEN = 5
MAX_ATTEMPTS = 50  # sub-seeds tried per seed before giving up
CHECK_INPUTS = 40  # random inputs on which model, evaluator and reference are compared

# Functions as source text, so reference.py can embed exactly what the compiled program computes.
MAPS = {
    "inc": "lambda x: (x + 1) % 4",
    "dec": "lambda x: (x - 1) % 4",
    "double": "lambda x: (2 * x) % 4",
    "is_zero": "lambda x: 1 if x == 0 else 0",
    "min2": "lambda x: min(x, 2)",
    "parity": "lambda x: x % 2",
}
SEQUENCE_MAPS = {
    "add": "lambda x, y: (x + y) % 4",
    "sub": "lambda x, y: (x - y) % 4",
    "max": "lambda x, y: max(x, y)",
    "min": "lambda x, y: min(x, y)",
    "eq": "lambda x, y: 1 if x == y else 0",
}
ONE_HOT = {  # selectors of one position per query: (key, query) → selected
    "first": "lambda k, q: k == 0",
    "previous": "lambda k, q: k == q - 1 or (q == 0 and k == 0)",
    "next": "lambda k, q: k == q + 1 or (q == 4 and k == 4)",
    "self": "lambda k, q: k == q",
    "second": "lambda k, q: k == 1",
}
COMPARISONS = ("EQ", "LT", "LEQ", "GT", "GEQ", "NEQ", "TRUE")
COMPARISON_SOURCE = {"EQ": "k == q", "LT": "k < q", "LEQ": "k <= q", "GT": "k > q", "GEQ": "k >= q", "NEQ": "k != q",
                     "TRUE": "True"}  # fmt: skip
READOUTS = {"above_half": "lambda x: 1 if x > 0.5 else 0", "any": "lambda x: 1 if x > 0 else 0"}

Tree = dict[str, Any]  # {"op": ..., "fn": name, "args": [trees]} or {"op": "tokens" | "indices"}


def draw_tree(rng: random.Random, depth: int) -> Tree:
    """A program tree of exactly ``depth`` (its deepest path), drawn with ``rng``."""
    if depth == 0:
        return {"op": rng.choice(["tokens", "indices"])}

    def below() -> Tree:
        return draw_tree(rng, rng.randrange(depth))

    op = rng.choice(["Map", "SequenceMap", "Aggregate", "NumericalAggregate", "SelectorWidth"])
    deep = draw_tree(rng, depth - 1)
    if op == "Map":
        return {"op": op, "fn": rng.choice(sorted(MAPS)), "args": [deep]}
    if op == "SequenceMap":
        args = [deep, below()]
        rng.shuffle(args)
        return {"op": op, "fn": rng.choice(sorted(SEQUENCE_MAPS)), "args": args}
    if op == "Aggregate":
        return {"op": op, "fn": rng.choice(sorted(ONE_HOT)), "args": [deep]}
    if op == "NumericalAggregate":
        keys, queries = [deep, below()] if rng.random() < 0.5 else [below(), deep]
        return {"op": op, "fn": rng.choice(COMPARISONS), "value": rng.choice(VOCAB),
                "readout": rng.choice(sorted(READOUTS)), "args": [keys, queries, below()]}  # fmt: skip
    keys, queries = [deep, below()] if rng.random() < 0.5 else [below(), deep]
    return {"op": "SelectorWidth", "fn": rng.choice(COMPARISONS), "args": [keys, queries]}


def shape(tree: Tree) -> str:
    """The tree's operators without their functions: ``Map(Aggregate(tokens))``."""
    if "args" not in tree:
        return str(tree["op"])
    return f"{tree['op']}({', '.join(shape(a) for a in tree['args'])})"


def tree_depth(tree: Tree) -> int:
    return 0 if "args" not in tree else 1 + max(tree_depth(a) for a in tree["args"])


def to_rasp(tree: Tree) -> Any:
    """The RASP expression of a tree (tracr's ``rasp``), every node categorical but the numerical aggregate's."""
    from tracr.rasp import rasp

    op = tree["op"]
    if op == "tokens":
        return rasp.tokens
    if op == "indices":
        return rasp.indices
    args = [to_rasp(a) for a in tree["args"]]
    if op == "Map":
        return rasp.categorical(rasp.Map(eval(MAPS[tree["fn"]]), args[0]))
    if op == "SequenceMap":
        return rasp.categorical(rasp.SequenceMap(eval(SEQUENCE_MAPS[tree["fn"]]), args[0], args[1]))
    if op == "Aggregate":
        select = rasp.Select(rasp.indices, rasp.indices, eval(ONE_HOT[tree["fn"]]))
        return rasp.categorical(rasp.Aggregate(select, args[0]))
    comparison = getattr(rasp.Comparison, tree["fn"])
    if op == "SelectorWidth":
        return rasp.categorical(rasp.SelectorWidth(rasp.Select(args[0], args[1], comparison)))
    value = tree["value"]
    indicator = rasp.numerical(rasp.Map(lambda x: 1 if x == value else 0, args[2]))
    mean = rasp.numerical(rasp.Aggregate(rasp.Select(args[0], args[1], comparison), indicator, default=0))
    return rasp.categorical(rasp.Map(eval(READOUTS[tree["readout"]]), mean))


def pin_labels(program: Any) -> Any:
    """tracr labels a node ``name_<id>`` from one process-wide counter, taken when the label is first read, so one seed
    would be ``map_3`` in one process and ``map_40`` in another (and the residual basis, ordered by label, permuted).
    Each node gets its id from its place in the tree instead (tracr caches ``unique_id`` per instance)."""
    order, stack, seen = [], [program], set()
    while stack:
        expr = stack.pop()
        if id(expr) in seen:
            continue
        seen.add(id(expr))
        order.append(expr)
        stack.extend(reversed(list(expr.children)))
    for number, expr in enumerate(order, start=1):
        vars(expr)["unique_id"] = number  # functools.cached_property's slot: what `label` reads
    return program


REFERENCE = '''"""The function of a generated RASP program (mcp-interp generate-rasp, seed {seed}): its value at each
position of an input, as tracr's evaluator computes it (None where the program is undefined), in plain Python.

    from reference import reference; reference([0, 3, 1])
"""

TREE = {tree}
MAPS = {maps}
SEQUENCE_MAPS = {sequence_maps}
ONE_HOT = {one_hot}
COMPARISON_SOURCE = {comparisons}
READOUTS = {readouts}


def evaluate(tree, xs):
    n, op = len(xs), tree["op"]
    if op == "tokens":
        return list(xs)
    if op == "indices":
        return list(range(n))
    args = [evaluate(a, xs) for a in tree["args"]]
    if op == "Map":
        f = eval(MAPS[tree["fn"]])
        return [None if x is None else f(x) for x in args[0]]
    if op == "SequenceMap":
        g = eval(SEQUENCE_MAPS[tree["fn"]])
        return [None if x is None or y is None else g(x, y) for x, y in zip(args[0], args[1])]
    if op == "Aggregate":
        pick = eval(ONE_HOT[tree["fn"]])
        return [mean([args[0][k] for k in range(n) if pick(k, q)]) for q in range(n)]
    compare = eval("lambda k, q: " + COMPARISON_SOURCE[tree["fn"]])
    keys, queries = args[0], args[1]
    selected = [[k for k in range(n) if compare(keys[k], queries[q])] for q in range(n)]
    if op == "SelectorWidth":
        return [len(s) for s in selected]
    indicator = [1 if z == tree["value"] else 0 for z in args[2]]
    readout = eval(READOUTS[tree["readout"]])
    return [readout(mean([indicator[k] for k in s]) if s else 0) for s in selected]


def mean(values):
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values) if len(set(values)) > 1 else values[0]


def reference(values):
    return evaluate(TREE, list(values))
'''


def reference_source(tree: Tree, seed: int) -> str:
    return REFERENCE.format(
        seed=seed, tree=repr(tree), maps=repr(MAPS), sequence_maps=repr(SEQUENCE_MAPS), one_hot=repr(ONE_HOT),
        comparisons=repr(COMPARISON_SOURCE), readouts=repr(READOUTS),
    )  # fmt: skip


def load_reference(source: str) -> Any:
    """The ``reference`` function of a reference.py's source."""
    names: dict[str, Any] = {}
    exec(compile(source, "reference.py", "exec"), names)
    return names["reference"]


@dataclass(frozen=True)
class Generated:
    seed: int
    attempt: int  # the sub-seed kept
    tree: Tree
    shape: str
    depth: int
    redrawn: list[str]  # why each earlier draw was dropped


def check_draw(tree: Tree, rng: random.Random) -> tuple[Any, str | None]:
    """Compile ``tree`` and compare model, evaluator and reference; (compiled, None) or (None, why it was dropped)."""
    from mcp_interp.core.known.compile import ProgramFile, compile_program

    program = pin_labels(to_rasp(tree))
    try:
        compiled = compile_program(ProgramFile(program, set(VOCAB), MAX_SEQ_LEN, "BOS"), "the drawn program")
    except CompileError as exc:
        return None, f"does not compile: {str(exc)[:160]}"
    reference = load_reference(reference_source(tree, 0))
    outputs = set()
    for _ in range(CHECK_INPUTS):
        xs = [rng.choice(VOCAB) for _ in range(rng.randint(1, MAX_SEQ_LEN))]
        try:
            expected = program(xs)
            ours = reference(xs)
        except Exception as exc:  # a comparison of an undefined value, say: the program has no function there
            return None, f"evaluating it on {xs} raised {type(exc).__name__}: {exc}"
        if ours != list(expected):
            return None, f"the reference differs from tracr's evaluator on {xs}"
        last = expected[-1]
        if last is None:
            continue
        decoded = compiled.assembled.apply([compiled.compiler_bos, *xs]).decoded[-1]
        if decoded != last:
            return None, f"the compiled model gives {decoded!r} where the evaluator gives {last!r} on {xs}"
        outputs.add(last)
    if len(outputs) < 2:
        return None, f"its output at the last position is constant ({sorted(outputs, key=str)}) or undefined"
    return compiled, None


def generate(seed: int) -> tuple[Generated, Any]:
    """The program of ``seed``: depth 1–4 from the seed, redrawn (next sub-seed) until a draw passes ``check_draw``."""
    redrawn: list[str] = []
    for attempt in range(MAX_ATTEMPTS):
        rng = random.Random(f"mcp-interp generate-rasp {seed} {attempt}")
        tree = draw_tree(rng, rng.randint(1, 4))
        compiled, why = check_draw(tree, rng)
        if compiled is not None:
            return Generated(seed, attempt, tree, shape(tree), tree_depth(tree), redrawn), compiled
        log.info("seed %d draw %d (%s) redrawn: %s", seed, attempt, shape(tree), why)
        redrawn.append(f"{shape(tree)}: {why}")
    raise CompileError(f"seed {seed}: no draw of {MAX_ATTEMPTS} compiled and passed the checks; last: {redrawn[-1]}")


def generate_rasp(seed: int, out: Path) -> dict[str, Any]:
    """``generate-rasp``: draw, compile and write ``out`` (compile-rasp's folder, task.json, reference.py)."""
    from mcp_interp.core.known.compile import write_folder

    generated, compiled = generate(seed)
    facts = write_folder(compiled, out)
    task = {"seed": seed, "attempt": generated.attempt, "input_values": list(VOCAB), "max_seq_len": MAX_SEQ_LEN,
            "shape": generated.shape, "depth": generated.depth, "redrawn": generated.redrawn}  # fmt: skip
    (out / "task.json").write_text(json.dumps(task, indent=2) + "\n", encoding="utf-8")
    (out / "reference.py").write_text(reference_source(generated.tree, seed), encoding="utf-8")
    return {**facts, "task": task}
