"""The computational graph edge attribution scores: writers, readers, and which writer feeds which reader.

Writers are what adds to the residual stream: the embeddings (``embed``), every head's output
(``L5H1``) and every MLP's output (``L5MLP``). Readers are what reads it: every query head's query
input (``L5H1.q``), the key and value inputs of every **key/value group** (``L5KV0.k``, ``L5KV0.v``),
every MLP's input (``L5MLP.in``) and the logits (``logits``). Under grouped-query attention a key or
value input is shared by the query heads of its group — group g serves heads g·H/G … (g+1)·H/G − 1 —
so it is one reader, not one per head; with G = H (multi-head attention) the graph is the usual one.

An edge goes from a writer to a reader downstream of it: the embeddings feed every reader; a head
feeds the readers of later layers, its own layer's MLP (unless attention and MLP run in parallel)
and the logits; an MLP feeds later layers and the logits. A reader's input is the sum of the writes
of every writer with an edge into it (plus constant biases), which is what makes an edge's
contribution well defined.
"""

from __future__ import annotations

from dataclasses import dataclass

MLP_ROW = -1.5  # the figure's row for the embeddings, the MLPs and the logits


@dataclass(frozen=True)
class Writer:
    kind: str  # "embed" | "head" | "mlp"
    layer: int = -1  # the embeddings write before layer 0
    index: int = 0  # head index for "head"

    def __str__(self) -> str:
        if self.kind == "embed":
            return "embed"
        return f"L{self.layer}H{self.index}" if self.kind == "head" else f"L{self.layer}MLP"

    def place(self, n_heads: int) -> tuple[float, float]:
        """Where the graph figure draws it: x = 1 + 2·layer for attention, 2 + 2·layer for the MLP; the
        embeddings, MLPs and logits on a row above the heads (y = −1.5), key/value groups below them."""
        if self.kind == "embed":
            return 0.0, MLP_ROW
        if self.kind == "head":
            return 1.0 + 2 * self.layer, float(self.index)
        return 2.0 + 2 * self.layer, MLP_ROW


@dataclass(frozen=True)
class Reader:
    kind: str  # "q" | "k" | "v" | "mlp" | "logits"
    layer: int
    index: int = 0  # query head for "q", key/value group for "k"/"v"

    def __str__(self) -> str:
        if self.kind == "logits":
            return "logits"
        if self.kind == "mlp":
            return f"L{self.layer}MLP.in"
        if self.kind == "q":
            return f"L{self.layer}H{self.index}.q"
        return f"L{self.layer}KV{self.index}.{self.kind}"

    def component(self) -> str:
        """The node the figure draws the reader as: its head, its key/value group, its MLP, or the logits."""
        name = str(self)
        return name.rsplit(".", 1)[0] if "." in name else name

    def place(self, n_heads: int, n_layers: int) -> tuple[float, float]:
        if self.kind == "logits":
            return 2.0 * n_layers + 1, MLP_ROW
        if self.kind == "mlp":
            return 2.0 + 2 * self.layer, MLP_ROW
        if self.kind == "q":
            return 1.0 + 2 * self.layer, float(self.index)
        return 1.0 + 2 * self.layer, n_heads + 0.5 + self.index  # key/value groups below the heads


@dataclass(frozen=True)
class Graph:
    writers: list[Writer]
    readers: list[Reader]
    edges: list[tuple[int, int]]  # (writer index, reader index)
    n_heads: int
    n_kv_heads: int

    def heads_of_group(self, group: int) -> list[int]:
        """The query heads sharing key/value group ``group``."""
        per = self.n_heads // self.n_kv_heads
        return list(range(group * per, (group + 1) * per))


def build_graph(n_layers: int, n_heads: int, n_kv_heads: int, parallel_attn_mlp: bool = False) -> Graph:
    writers: list[Writer] = [Writer("embed")]
    readers: list[Reader] = []
    edges: list[tuple[int, int]] = []
    available = [0]  # writer indices upstream of the current point

    def read(reader: Reader, sources: list[int]) -> None:
        readers.append(reader)
        edges.extend((w, len(readers) - 1) for w in sources)

    for layer in range(n_layers):
        for head in range(n_heads):
            read(Reader("q", layer, head), available)
        for kind in ("k", "v"):
            for group in range(n_kv_heads):
                read(Reader(kind, layer, group), available)
        heads = list(range(len(writers), len(writers) + n_heads))
        writers.extend(Writer("head", layer, head) for head in range(n_heads))
        read(Reader("mlp", layer), available if parallel_attn_mlp else available + heads)
        available = available + heads + [len(writers)]
        writers.append(Writer("mlp", layer))
    read(Reader("logits", n_layers - 1), available)
    return Graph(writers, readers, edges, n_heads, n_kv_heads)
