"""Clean/corrupt families on a compiled program, each with its known circuit, and how a method's answer is scored.

A family changes the input at one position: its pairs are random clean inputs of one length, each with a corrupt
twin that differs there only and whose output at the answer position (the last) differs. The answers of a pair are
the program's outputs there (``correct`` on the clean input, ``incorrect`` on the corrupt one). The family's known
circuit is the union of its pairs' (``circuit.known_circuit``), in the model's terms through ``ground_truth.json``.

Scores of a method against it (sets of cells, components or edges): precision |found ∩ known| / |found| (1 when
nothing is found: nothing wrong was claimed), recall |found ∩ known| / |known|. ``rasp_cell_scores`` is what exact
patching of each cell must give, from RASP-level patching alone: the recovered fraction of the logit-difference gap,
a ratio of means over the pairs as the patching tools report it, with logit(correct) − logit(incorrect) read as 1 when
the patched output is the clean answer, −1 when it is the corrupt one and 0 otherwise (tracr's categorical outputs
are one-hot).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mcp_interp.core.known.circuit import KnownCircuit, ModelCircuit, known_circuit, output, rasp_patch, to_model


@dataclass
class PairFamily:
    """Pairs differing at one input position, their answers and their known circuit."""

    position: int  # input position changed (the model's is position + 1)
    clean: list[list[Any]]
    corrupt: list[list[Any]]
    correct: list[str]
    incorrect: list[str]
    circuit: KnownCircuit
    model: ModelCircuit

    @property
    def clean_prompts(self) -> list[str]:
        return [" ".join(str(v) for v in xs) for xs in self.clean]

    @property
    def corrupt_prompts(self) -> list[str]:
        return [" ".join(str(v) for v in xs) for xs in self.corrupt]

    def inputs(self) -> dict[str, Any]:
        """The four arguments every pair-taking tool and job takes."""
        return {"clean_prompts": self.clean_prompts, "corrupt_prompts": self.corrupt_prompts,
                "correct": self.correct, "incorrect": self.incorrect}  # fmt: skip


def make_family(
    program: Any, vocab: Sequence[Any], length: int, position: int, truth: Sequence[Mapping[str, Any]],
    pairs: int = 6, seed: int = 0, tries: int = 400,
) -> PairFamily | None:  # fmt: skip
    """Up to ``pairs`` random pairs of ``length`` values changed at ``position`` (None when fewer than 2 are found in
    ``tries`` draws: no change there reaches the answer)."""
    rng = random.Random(seed)
    values = sorted(vocab, key=str)
    clean: list[list[Any]] = []
    corrupt: list[list[Any]] = []
    seen: set[tuple[Any, ...]] = set()
    circuits: list[KnownCircuit] = []
    answers: list[tuple[str, str]] = []
    for _ in range(tries):
        if len(clean) == pairs:
            break
        a = [rng.choice(values) for _ in range(length)]
        b = list(a)
        b[position] = rng.choice([v for v in values if v != a[position]])
        key = (*a, *b)
        if key in seen:
            continue
        seen.add(key)
        try:  # a pair on which the compiled program is undefined is no known answer
            out_a, out_b = output(program, a), output(program, b)
            pair = known_circuit(program, a, b)
        except ValueError:
            continue
        if out_a is None or out_b is None or out_a == out_b:
            continue
        clean.append(a)
        corrupt.append(b)
        circuits.append(pair)
        answers.append((str(out_a), str(out_b)))
    if len(clean) < 2:
        return None
    circuit = KnownCircuit()
    for pair in circuits:
        circuit = circuit.union(pair)
    return PairFamily(
        position=position,
        clean=clean,
        corrupt=corrupt,
        correct=[good for good, _ in answers],
        incorrect=[bad for _, bad in answers],
        circuit=circuit,
        model=to_model(circuit, truth),
    )


def precision_recall(found: Iterable[Any], known: Iterable[Any]) -> tuple[float, float]:
    found, known = set(found), set(known)
    hit = len(found & known)
    precision = hit / len(found) if found else 1.0
    recall = hit / len(known) if known else 1.0
    return precision, recall


def cell_units(truth: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], list[str]]:
    """(half, layer) → the labels of the nodes its sublayer computes ('attn' for any head of the layer)."""
    out: dict[tuple[str, int], list[str]] = {}
    for entry in truth:
        for component in entry["components"]:
            if component == "embed":
                continue
            layer = int(component[1:].split("H")[0].split("M")[0])
            half = "mlp" if component.endswith("MLP") else "attn"
            out.setdefault((half, layer), []).append(entry["label"])
    return out


def head_units(truth: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Head name → the labels of the nodes it helps compute."""
    out: dict[str, list[str]] = {}
    for entry in truth:
        for component in entry["components"]:
            if component != "embed" and not component.endswith("MLP"):
                out.setdefault(component, []).append(entry["label"])
    return out


def rasp_score(program: Any, family: PairFamily, labels: Sequence[str], model_position: int) -> float | None:
    """What exact denoising patching must give for the cell computing ``labels`` at ``model_position`` (see the
    module docstring); 0 at BOS (position 0), which the RASP program has no value for. None when the patched values
    leave the program undefined: a categorical Aggregate then selects several different values (RASP raises; the
    model averages their one-hot vectors), so nothing is predicted for that cell."""
    if model_position == 0 or not labels:
        return 0.0
    p = model_position - 1
    patched, clean_ld, corrupt_ld = [], [], []
    for a, b, good, bad in zip(family.clean, family.corrupt, family.correct, family.incorrect, strict=True):
        try:
            out = str(rasp_patch(program, b, a, [(label, p) for label in labels])[-1])
        except ValueError:
            return None
        patched.append((out == good) - (out == bad))
        clean_ld.append(1.0)
        corrupt_ld.append(-1.0)
    n = len(patched)
    gap = sum(clean_ld) / n - sum(corrupt_ld) / n
    return (sum(patched) / n - sum(corrupt_ld) / n) / gap


def induced_edges(graph_edges: Iterable[tuple[str, str]], components: Iterable[str]) -> set[tuple[str, str]]:
    """The edges among a set of components (embeddings and logits always in): what a node-level answer claims, so
    that its faithfulness is measured by the same exact circuit ablation as an edge-level one."""
    nodes = set(components) | {"embed", "logits"}
    return {(w, r) for w, r in graph_edges if w in nodes and r.rsplit(".", 1)[0] in nodes | _groups(nodes)}


def _groups(nodes: set[str]) -> set[str]:
    """A head's key/value group names ('L3H0' → 'L3KV0'): with one key/value head per query head, the same index."""
    return {n.replace("H", "KV", 1) for n in nodes if "H" in n and not n.endswith("MLP") and n != "embed"}
