"""What the circuits tests share: the pair on `tiny`, the multi-head variant, and EAP and TransformerLens readers."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import torch

from mcp_interp.core.circuits.attribution import EdgeAttribution, EdgeScores
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.text.tokens import encode

CLEAN = ["when mary and john went to the store , john gave a drink to"]
CORRUPT = ["when mary and john went to the store , mary gave a drink to"]


def run_eap(model: LoadedModel, ig_steps: int = 1, integrated: bool = False) -> EdgeScores:
    tok = model.tokenizer
    good, bad = tok.convert_tokens_to_ids("mary"), tok.convert_tokens_to_ids("john")

    def metric(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return (logits[:, good] - logits[:, bad]).to(torch.float64)

    job = EdgeAttribution(
        backend=model.backend,
        clean=encode(tok, CLEAN),
        corrupt=encode(tok, CORRUPT),
        metric=metric,
        ig_steps=ig_steps,
        integrated=integrated,
    )
    steps = list(job.steps())
    assert len(steps) == job.total_steps()
    assert job.result is not None
    return job.result


def tl_metric(model: LoadedModel) -> Any:
    tok = model.tokenizer
    good, bad = tok.convert_tokens_to_ids("mary"), tok.convert_tokens_to_ids("john")
    return lambda logits: logits[0, -1, good] - logits[0, -1, bad]


def tl_name(node: Any) -> str:
    if node.kind == "embed":
        return "embed"
    if node.kind == "attn_head_out":
        return f"L{node.layer}H{node.head}"
    if node.kind == "mlp_out":
        return f"L{node.layer}MLP"
    if node.kind == "logits":
        return "logits"
    if node.kind == "mlp_in":
        return f"L{node.layer}MLP.in"
    if node.kind == "q_input":
        return f"L{node.layer}H{node.head}.q"
    return f"L{node.layer}KV{node.head}.{node.kind[0]}"


def run_eap_on(model: LoadedModel, pairs: Any) -> EdgeScores:
    """EAP on prepared ``Pairs`` (their logit-difference readout), all steps run."""
    job = EdgeAttribution(
        backend=model.backend, clean=pairs.clean, corrupt=pairs.corrupt, metric=pairs.readout.from_logits
    )
    list(job.steps())
    assert job.result is not None
    return job.result


def sequential_p(real: float, draws: list[float], most: int, h: int = 10) -> float:
    """Besag–Clifford's p by hand from the draws in the order made: h/n when the h-th draw scoring ≥ the circuit came
    at draw n (which must be the last one listed), else (1 + #draws ≥ the circuit)/(most + 1) after all ``most``."""
    count = 0
    for n, draw in enumerate(draws, start=1):
        count += draw >= real
        if count == h:
            assert n == len(draws), "drawing went on after the h-th draw at least as good"
            return h / n
    assert len(draws) == most, "drawing stopped before h draws at least as good and before the cap"
    return (1 + count) / (most + 1)


def distinct_draws(pool: int, k: int, seed: int, n: int) -> list[tuple[int, ...]]:
    """The documented draw of random circuits, by hand: k of the ``pool`` candidates (by index, the circuit being the
    first k), never the circuit itself nor a repeat — all of them shuffled by numpy's ``default_rng(seed)`` when there
    are fewer than 200, else ``choice(range(pool), k, replace=False)`` sorted, redrawn on a repeat. The first ``n``."""
    generator = np.random.default_rng(seed)
    real = tuple(range(k))
    if math.comb(pool, k) - 1 < 200:
        every = [c for c in itertools.combinations(range(pool), k) if c != real]
        return [every[i] for i in generator.permutation(len(every))][:n]
    out: list[tuple[int, ...]] = []
    while len(out) < n:
        subset = tuple(sorted(int(i) for i in generator.choice(tuple(range(pool)), k, replace=False)))
        if subset != real and subset not in out:
            out.append(subset)
    return out
