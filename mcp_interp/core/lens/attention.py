"""One head's attention pattern on one prompt, and what the answer position attends to."""

from __future__ import annotations

import torch

from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.points import hook_pattern
from mcp_interp.core.engine.text.components import resolve_head
from mcp_interp.core.engine.text.conventions import FirstKeyAttention, attention_sink_note
from mcp_interp.core.engine.text.tokens import token_strings
from mcp_interp.core.lens.reading import CORRELATIONAL, read_run, single_prompt
from mcp_interp.schemas.lens import AttendedToken, AttentionMeasurement


def attention(
    model: LoadedModel, prompt: str, layer: int | None, head: int | str, top_k: int = 5
) -> AttentionMeasurement:
    """One head's pattern: ``head`` is ``"L9H3"`` (``layer`` then optional) or an index within ``layer``."""
    require(model.backend, "attention")
    cfg = model.cfg
    chosen = resolve_head(head, layer, cfg.n_layers, cfg.n_heads)
    layer, head = chosen.layer, chosen.head
    batch = single_prompt(model, prompt)
    names = [hook_pattern(other) for other in range(cfg.n_layers)]  # every layer's, to see where the sink sits
    _, cache = read_run(model, batch.input_ids, names, logits=False)
    pattern = cache[hook_pattern(layer)][0, head].to(torch.float64)  # [query, key]
    ids = batch.ids(0)
    tokens = token_strings(model.tokenizer, ids)
    sink = FirstKeyAttention(cfg.n_layers)
    for name in names:
        sink.add(cache[name])
    fix = "Much of any head's attention to it is the sink, not content; a neutral prefix before the prompt moves it."
    sink_note = attention_sink_note(model.tokenizer, *sink.share(batch.lengths), tokens[0], fix)
    pos = int(batch.answer_positions[0])
    row = pattern[pos]
    top = torch.topk(row, min(top_k, row.shape[0]))
    return AttentionMeasurement(
        prompt=prompt,
        layer=layer,
        head=head,
        tokens=tokens,
        pattern=[[round(float(v), 6) for v in r] for r in pattern],
        answer_position=pos,
        top_attended=[
            AttendedToken(position=int(i), token=tokens[int(i)], weight=float(w))
            for w, i in zip(top.values, top.indices, strict=True)
        ],
        notes=[CORRELATIONAL.format(what="An attention pattern"), *([sink_note] if sink_note is not None else [])],
    )
