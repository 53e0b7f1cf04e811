"""The circuit a method should find on a compiled program, derived from the RASP program itself.

For a clean and a corrupt input of equal length, every RASP node is evaluated on both (tracr's own evaluator,
``rasp.DefaultRASPEvaluator``). A *unit* is a node at one input position. The known circuit is the set of units whose
value differs between the two inputs and from which a chain of differing units reaches the program's output at the
answer position (the last one), following what each node reads at each position:

* a Map or SequenceMap at position q reads its inputs at q;
* an Aggregate at q reads its selector's queries at q, its keys at every position, and its values at the positions
  the selector selects for q (in the clean or the corrupt run);
* a SelectorWidth at q reads its selector's queries at q and its keys at every position.

Each unit maps to the model through ``ground_truth.json``: the cells (component × layer × position) that compute it,
the components, and the edges (writer → reader) its value travels along. ``rasp_patch`` is RASP-level activation
patching: the program evaluated on the corrupt input with some units set to their clean values — what exact
patching of the components computing them must find (tracr's weights implement the program exactly on its value
sets), computed without the transformer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NodeAt = tuple[str, int]  # (node label, input position; the model's position is this + 1, after BOS)


def _evaluator(overrides: Mapping[str, Mapping[int, Any]] | None = None) -> Any:
    """tracr's evaluator, memoised per label for one input, with some units' values replaced."""
    from tracr.rasp import rasp

    class Evaluator(rasp.DefaultRASPEvaluator):
        def __init__(self) -> None:
            super().__init__()
            self.memo: dict[str, Any] = {}

        def eval_aggregate(self, sop: Any, xs: Sequence[Any]) -> Any:
            """tracr compiles a categorical Aggregate only for a selector picking one value (or equal ones); RASP's
            own evaluator would average several numbers, which the compiled head does not compute, so it is
            undefined here (a ValueError, as RASP raises for non-numbers)."""
            if rasp.is_categorical(sop):
                values = self.evaluate(sop.sop, xs)
                for row in self.evaluate(sop.selector, xs):
                    if len({v for chosen, v in zip(row, values, strict=True) if chosen}) > 1:
                        raise ValueError(f"{sop.label}: a categorical Aggregate selects several different values")
            return super().eval_aggregate(sop, xs)

        def evaluate(self, expr: Any, xs: Sequence[Any]) -> Any:
            if expr.label in self.memo:
                return self.memo[expr.label]
            value = super().evaluate(expr, xs)
            if overrides and expr.label in overrides:
                value = list(value)
                for position, new in overrides[expr.label].items():
                    value[position] = new
            self.memo[expr.label] = value
            return value

    return Evaluator()


def nodes_of(program: Any) -> dict[str, Any]:
    """Every RASP expression the program is built from, by label."""
    found: dict[str, Any] = {}
    stack = [program]
    while stack:
        expr = stack.pop()
        if expr.label in found:
            continue
        found[expr.label] = expr
        stack.extend(expr.children)
    return found


def evaluate_all(
    program: Any, xs: Sequence[Any], overrides: Mapping[str, Mapping[int, Any]] | None = None
) -> dict[str, Any]:
    """Every node's value (a list per position; a selector's, a query × key matrix) on ``xs``; a ValueError where the
    program is undefined as compiled (a categorical Aggregate over several different values)."""
    evaluator = _evaluator(overrides)
    evaluator.evaluate(program, list(xs))
    return dict(evaluator.memo)


def output(program: Any, xs: Sequence[Any]) -> Any:
    """The program's value at the last position of ``xs`` as compiled (``evaluate_all``'s ValueError when undefined)."""
    return evaluate_all(program, xs)[program.label][-1]


def rasp_patch(program: Any, base: Sequence[Any], source: Sequence[Any], units: Iterable[NodeAt]) -> list[Any]:
    """The program's output on ``base`` with ``units`` set to their values on ``source`` (RASP-level patching)."""
    source_values = evaluate_all(program, source)
    overrides: dict[str, dict[int, Any]] = {}
    for label, position in units:
        overrides.setdefault(label, {})[position] = source_values[label][position]
    return list(evaluate_all(program, base, overrides)[program.label])


def _selector_sops(selector: Any) -> tuple[list[Any], list[Any]]:
    """The SOps a selector reads as keys and as queries (through And/Or/Not)."""
    from tracr.rasp import rasp

    if isinstance(selector, rasp.Select):
        return [selector.keys], [selector.queries]
    if isinstance(selector, rasp.SelectorAnd | rasp.SelectorOr):
        k1, q1 = _selector_sops(selector.fst)
        k2, q2 = _selector_sops(selector.snd)
        return k1 + k2, q1 + q2
    if isinstance(selector, rasp.SelectorNot):
        return _selector_sops(selector.inner)
    return [], []


def reads(expr: Any, q: int, n: int, selected: Sequence[set[int]]) -> list[tuple[Any, int, str]]:
    """What node ``expr`` reads at position ``q``: (expression, position, role), role 'q' | 'k' | 'v' (attention) or
    'in' (an MLP's input). ``selected[q]``: the key positions its selector picks for q in either run."""
    from tracr.rasp import rasp

    if isinstance(expr, rasp.Aggregate | rasp.SelectorWidth):
        keys, queries = _selector_sops(expr.selector)
        out = [(sop, q, "q") for sop in queries] + [(sop, p, "k") for sop in keys for p in range(n)]
        if isinstance(expr, rasp.Aggregate):
            out += [(expr.sop, p, "v") for p in sorted(selected[q])]
        return out
    if isinstance(expr, rasp.Map):
        return [(expr.inner, q, "in")]
    if isinstance(expr, rasp.SequenceMap):
        return [(expr.fst, q, "in"), (expr.snd, q, "in")]
    return []


def _differs(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is None or b is None or abs(float(a) - float(b)) > 1e-9
    return bool(a != b)


@dataclass
class KnownCircuit:
    """The known circuit of one clean/corrupt pair (or the union over a family's pairs)."""

    units: set[NodeAt] = field(default_factory=set)
    node_edges: set[tuple[str, str, str]] = field(default_factory=set)  # (reader's input node, node, role)
    answer: NodeAt | None = None

    def union(self, other: KnownCircuit) -> KnownCircuit:
        return KnownCircuit(self.units | other.units, self.node_edges | other.node_edges, self.answer or other.answer)

    @property
    def nodes(self) -> set[str]:
        return {label for label, _ in self.units}


def known_circuit(program: Any, clean: Sequence[Any], corrupt: Sequence[Any]) -> KnownCircuit:
    """The known circuit of a pair (see the module docstring); empty when the output at the answer position does not
    differ."""
    from tracr.rasp import rasp

    if len(clean) != len(corrupt) or not clean:
        raise ValueError("a clean/corrupt pair must be two non-empty inputs of equal length")
    n = len(clean)
    exprs = nodes_of(program)
    a, b = evaluate_all(program, clean), evaluate_all(program, corrupt)
    answer = (program.label, n - 1)
    circuit = KnownCircuit(answer=answer)
    if not _differs(a[program.label][n - 1], b[program.label][n - 1]):
        return circuit

    def selected(expr: Any) -> list[set[int]]:
        if not isinstance(expr, rasp.Aggregate):
            return [set() for _ in range(n)]
        rows_a, rows_b = a[expr.selector.label], b[expr.selector.label]
        return [{p for p in range(n) if rows_a[q][p] or rows_b[q][p]} for q in range(n)]

    frontier, seen = [answer], {answer}
    circuit.units.add(answer)
    while frontier:
        label, q = frontier.pop()
        expr = exprs[label]
        for source, p, role in reads(expr, q, n, selected(expr)):
            if not _differs(a[source.label][p], b[source.label][p]):
                continue
            circuit.node_edges.add((source.label, label, role))
            unit = (source.label, p)
            if unit not in seen:
                seen.add(unit)
                circuit.units.add(unit)
                frontier.append(unit)
    return circuit


# --- the circuit in the model's terms -------------------------------------------------------------------------


def _component_layer(component: str) -> int:
    return int(component[1:].split("H")[0].split("M")[0])


@dataclass(frozen=True)
class ModelCircuit:
    """A known circuit in the model's terms (positions are the model's: input position + 1, after BOS)."""

    cells: frozenset[tuple[str, int, int]]  # ('attn' | 'mlp' | 'embed', layer, position); embed has layer -1
    head_cells: frozenset[tuple[str, int]]  # ('L2H0', position)
    components: frozenset[str]  # 'L2H0', 'L1MLP'
    edges: frozenset[tuple[str, str]]  # (writer, reader) in the edge graph's names ('L0MLP', 'L3H0.q', 'logits')


def to_model(circuit: KnownCircuit, truth: Sequence[Mapping[str, Any]]) -> ModelCircuit:
    """Map a known circuit onto cells, components and edges through ``ground_truth.json``'s entries."""
    by_label = {entry["label"]: entry for entry in truth}
    cells, head_cells, components, edges = set(), set(), set(), set()
    for label, p in circuit.units:
        for component in by_label[label]["components"]:
            if component == "embed":
                cells.add(("embed", -1, p + 1))
                continue
            components.add(component)
            layer = _component_layer(component)
            if component.endswith("MLP"):
                cells.add(("mlp", layer, p + 1))
            else:
                cells.add(("attn", layer, p + 1))
                head_cells.add((component, p + 1))
    circuit_nodes = circuit.nodes
    for source, target, role in circuit.node_edges:
        for writer in by_label[source]["writes"]:
            for reader in readers(by_label[target], role):
                edges.add((writer, reader))
    for label in circuit_nodes:  # a SelectorWidth's head feeds its own MLP
        entry = by_label[label]
        heads = [c for c in entry["components"] if not c.endswith("MLP") and c != "embed"]
        mlps = [c for c in entry["components"] if c.endswith("MLP")]
        edges.update((head, f"{mlp}.in") for head in heads for mlp in mlps)
        if entry.get("output"):
            edges.update((writer, "logits") for writer in entry["writes"])
    return ModelCircuit(frozenset(cells), frozenset(head_cells), frozenset(components), frozenset(edges))


def readers(entry: Mapping[str, Any], role: str) -> list[str]:
    """The edge graph's reader names for a node's input of this role ('q' → 'L3H0.q', 'k' → 'L3KV0.k', 'in' → the
    MLP's 'L1MLP.in'; a SelectorWidth's selector inputs go to its head)."""
    heads = [c for c in entry["components"] if not c.endswith("MLP") and c != "embed"]
    mlps = [c for c in entry["components"] if c.endswith("MLP")]
    if role == "in":
        return [f"{mlp}.in" for mlp in mlps]
    out = []
    for head in heads:
        layer, index = head[1:].split("H")
        out.append(f"{head}.q" if role == "q" else f"L{layer}KV{index}.{role}")
    return out
