"""Where the clean−corrupt gap sits, position by position: read off ``patch``'s layer × position maps.

Patching the residual stream (resid_pre) of one position at one layer with its clean value recovers some
fraction of the gap; a position whose residual recovers a large fraction at a layer *carries* the
information there. The position that carries the most changes only where attention moves information
between positions, so the layer where it changes names a move, and the attn_out map at the new position
says which block made it. mlp_out cells with large fractions are where MLPs write the information.
Fractions are those ``patch`` returns: 1 = the cell alone restores the whole gap, negative = works against it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from mcp_interp.schemas.explain import Carrier, Move
from mcp_interp.schemas.localize import PatchCell, PatchMeasurement

CARRIES = 0.2  # a position carries the gap at a layer when patching its resid_pre there recovers at least this
DOMINATES = 0.3  # the position carrying the most at a layer counts for moves only when it recovers at least this
MAPPED = 0.1  # positions whose resid_pre recovers at least this somewhere get the attn_out / mlp_out maps
MAX_MAPPED = 4  # at most this many positions (by their largest resid_pre fraction) get them, and the answer position
STAYS = 2  # a change of dominant position is a move only if the new one stays dominant this many layers
ATTENDS = 0.1  # an attn_out cell names the block that made a move only if it recovers at least this

Grid = Sequence[Sequence[float | None]]


@dataclass(frozen=True)
class Reading:
    """The three maps and what is read off them, as ``ExplainMeasurement`` fields and as sentences."""

    tokens: list[str]  # 'clean/corrupt' where the pair differs
    resid: list[list[float | None]]
    attn: list[list[float | None]] | None
    mlp: list[list[float | None]] | None
    carriers: list[Carrier]
    moves: list[Move]
    top_mlps: list[PatchCell]
    top_attention: list[PatchCell]

    def fields(self) -> dict[str, Any]:
        return {
            "map_tokens": self.tokens,
            "resid_pre_map": self.resid,
            "attn_out_map": self.attn,
            "mlp_out_map": self.mlp,
            "carriers": self.carriers,
            "moves": self.moves,
            "top_mlps": self.top_mlps,
            "top_attention": self.top_attention,
        }

    def findings(self) -> list[str]:
        found = [carrier_finding(self.carriers), *(move_finding(m) for m in self.moves)]
        for what, kind, cells in (
            ("MLPs that write it", "MLP", self.top_mlps),
            ("Attention outputs that carry it", "attn", self.top_attention),
        ):
            if sentence := cells_finding(what, kind, cells):
                found.append(sentence)
        return found


def read_maps(
    resid: PatchMeasurement, attn: PatchMeasurement | None, mlp: PatchMeasurement | None, top_k: int
) -> Reading:
    """The reading of ``patch``'s resid_pre, attn_out and mlp_out results on one pair (attn_out and mlp_out are
    None when no position reached ``MAPPED``: nothing to map them at)."""
    assert resid.scores is not None
    tokens = [t.clean_token for t in resid.tokens]
    attn_scores = attn.scores if attn is not None else None
    differing = [t.position for t in resid.tokens if t.differs_in_pairs]
    return Reading(
        tokens=[
            t.clean_token if not t.differs_in_pairs else f"{t.clean_token}/{t.corrupt_token}" for t in resid.tokens
        ],
        resid=resid.scores,
        attn=attn_scores,
        mlp=mlp.scores if mlp is not None else None,
        carriers=carriers(resid.scores, tokens),
        moves=moves(resid.scores, attn_scores, tokens, differing),
        top_mlps=mlp.cells[:top_k] if mlp is not None else [],
        top_attention=attn.cells[:top_k] if attn is not None else [],
    )


def mapped_positions(resid: Grid) -> list[int]:
    """Positions worth patching attn_out and mlp_out at: up to ``MAX_MAPPED`` whose resid_pre reaches ``MAPPED``, and
    the answer position (the last) whenever any does. The answer position always, because resid_pre maps the input
    of each layer only: what the last layer's blocks write there (a one-layer model's MLP reading what its heads
    moved) shows in no resid_pre cell, so a map chosen from resid_pre alone read that MLP as +0.00."""
    best = _best_per_position(resid)
    chosen = sorted((p for p, v in best.items() if v >= MAPPED), key=lambda p: -best[p])[:MAX_MAPPED]
    n_positions = len(resid[0]) if resid else 0
    if chosen and n_positions - 1 not in chosen:
        chosen.append(n_positions - 1)
    return sorted(chosen)


def carriers(resid: Grid, tokens: Sequence[str]) -> list[Carrier]:
    """Runs of consecutive layers where a position's resid_pre recovers ≥ ``CARRIES``, largest fraction first."""
    runs: list[Carrier] = []
    n_positions = len(resid[0]) if resid else 0
    for position in range(n_positions):
        start: int | None = None
        values: list[float] = []
        for layer in range(len(resid) + 1):
            value = resid[layer][position] if layer < len(resid) else None
            if value is not None and value >= CARRIES:
                start = layer if start is None else start
                values.append(value)
                continue
            if start is not None:
                runs.append(
                    Carrier(
                        position=position,
                        token=tokens[position],
                        from_layer=start,
                        to_layer=layer - 1,
                        min_fraction=min(values),
                        max_fraction=max(values),
                    )
                )
                start, values = None, []
    return sorted(runs, key=lambda run: (-run.max_fraction, run.from_layer))


def dominant_positions(resid: Grid) -> list[int | None]:
    """Per layer: the position whose resid_pre recovers the most, if that is at least ``DOMINATES`` (else None)."""
    dominant: list[int | None] = []
    for row in resid:
        scored = [(v, p) for p, v in enumerate(row) if v is not None]
        value, position = max(scored, default=(None, None))
        dominant.append(position if value is not None and value >= DOMINATES else None)
    return dominant


def moves(resid: Grid, attn: Grid | None, tokens: Sequence[str], differing: Collection[int]) -> list[Move]:
    """Every layer where the dominant position changes to a *later* one and stays for ``STAYS`` layers (or to the
    last layer), with the earlier attn_out cell at the new position that recovers the most (≥ ``ATTENDS``).

    Information only flows forward in a causal model, so a change to an earlier position is not a move; a flip that
    does not last is a near tie, not a move. When the new position's own token is the same in both prompts
    (not in ``differing``), the difference can only have reached it through attention; otherwise the new
    position may carry it from its own token (``to_position_differs``)."""
    found: list[Move] = []
    dominant = dominant_positions(resid)
    previous: int | None = None
    for layer, position in enumerate(dominant):
        if position is None or position == previous:
            continue
        if previous is not None and any(p != position for p in dominant[layer : layer + STAYS]):
            continue  # a near tie flipping back: no move, and the earlier position stays the current one
        if previous is not None and position > previous:
            attention_layer, fraction = _best_attention(attn, position, before=layer)
            found.append(
                Move(
                    from_position=previous,
                    from_token=tokens[previous],
                    to_position=position,
                    to_token=tokens[position],
                    to_position_differs=position in differing,
                    layer=layer,
                    attention_layer=attention_layer,
                    attention_fraction=fraction,
                )
            )
        previous = position
    return found


def carrier_finding(runs: Sequence[Carrier], shown: int = 4) -> str:
    if not runs:
        return (
            f"No single position's residual stream recovers {CARRIES:.0%} of the gap at any layer: the information "
            "is spread over positions (see resid_pre_map)."
        )
    parts = [
        f"position {r.position} ({r.token!r}) at layers {r.from_layer}–{r.to_layer} ({_range(r)})" for r in runs[:shown]
    ]
    return (
        "Patching the residual stream (resid_pre) position by position, the gap is carried by " + "; ".join(parts) + "."
    )


def move_finding(move: Move) -> str:
    change = (
        f"the position carrying the most changes from {move.from_position} ({move.from_token!r}) to "
        f"{move.to_position} ({move.to_token!r}) by the input of layer {move.layer}"
    )
    if move.to_position_differs:
        sentence = (
            f"In resid_pre, {change}; {move.to_token!r} itself differs between the prompts, so this need not be "
            "information moving"
        )
    else:
        sentence = (
            f"Information moves from position {move.from_position} to {move.to_position}: {change}, and "
            f"{move.to_token!r} is the same token in both prompts, so the difference reached it through attention"
        )
    if move.attention_layer is None or move.attention_fraction is None:
        return sentence + f" (no single earlier attn_out there recovers {ATTENDS:.0%} of the gap)."
    return (
        sentence + f"; patching layer {move.attention_layer}'s attn_out at {move.to_token!r} recovers "
        f"{move.attention_fraction:+.2f} of the gap."
    )


def cells_finding(what: str, kind: str, cells: Sequence[PatchCell]) -> str | None:
    listed = [
        f"L{c.layer} {kind} at {c.token!r} (position {c.position}) {c.score:+.2f}" for c in cells if c.score is not None
    ]
    if not listed:
        return None
    return f"{what} (recovered fraction of patching each layer's output at one position): " + ", ".join(listed) + "."


def _range(run: Carrier) -> str:
    if run.from_layer == run.to_layer:
        return f"{run.max_fraction:+.2f}"
    return f"{run.min_fraction:+.2f} to {run.max_fraction:+.2f}"


def _best_per_position(grid: Grid) -> dict[int, float]:
    best: dict[int, float] = {}
    for row in grid:
        for position, value in enumerate(row):
            if value is not None:
                best[position] = max(best.get(position, value), value)
    return best


def _best_attention(attn: Grid | None, position: int, before: int) -> tuple[int | None, float | None]:
    if attn is None:
        return None, None
    scored = [(value, layer) for layer in range(before) if (value := attn[layer][position]) is not None]
    if not scored or max(scored)[0] < ATTENDS:
        return None, None
    value, layer = max(scored)
    return layer, value
