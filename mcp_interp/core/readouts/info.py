"""The measurements behind ``model_info`` and ``tokenize``: what is loaded and how text becomes tokens."""

from __future__ import annotations

from collections.abc import Sequence

import torch

import mcp_interp.state.limits as limits
from mcp_interp.core.engine.backend.capabilities import capabilities
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.numbers.metrics import top_ties
from mcp_interp.core.engine.text.tokens import adds_bos, encode, token_ids, token_strings
from mcp_interp.errors import InputError
from mcp_interp.schemas.readouts import (
    BlockFacts,
    CompiledProgramFacts,
    ModelInfoMeasurement,
    TokenizedText,
    TokenizeMeasurement,
    TopToken,
)


def tokenization_rule(model: LoadedModel) -> str:
    program = model.backend.program
    if program is not None:
        return (
            f"A compiled RASP program: a prompt is up to {program.max_seq_len} input values separated by spaces "
            f"('{' '.join(program.input_values[:4])}'), BOS prepended. Attention is bidirectional; padding is masked. "
            "Each position's output is the program's value there; the answer position is the last value. An answer "
            "is one output value (' 2' or '2')."
        )
    bos = "a BOS token is prepended" if adds_bos(model.tokenizer) else "no BOS token is prepended"
    return (
        "The model's own Hugging Face tokenizer with its default special tokens "
        f"(add_special_tokens=True): {bos}. Prompts in one call are right-padded; each prompt's "
        "answer position is its last real token. Answers are tokenized without special tokens: one "
        "token is read from the answer position; several are scored by their teacher-forced log-probability "
        "(answer_kind 'sequence'; tools that need one token refuse them, naming the count); {'any_of': [...]} is a "
        "set, scored by its summed probability (answer_kind 'set')."
    )


def block_facts(model: LoadedModel) -> BlockFacts:
    backend, layers = model.backend, range(model.cfg.n_layers)
    return BlockFacts(
        parallel_attn_mlp=bool(getattr(model.cfg, "parallel_attn_mlp", False)),
        attention_post_norm=any(backend.attention_write_norm(layer) is not None for layer in layers),
        mixture_of_experts=any(backend.mixture_of_experts(layer) for layer in layers),
        final_logit_softcap=backend.final_logit_softcap(),
    )


def model_info(model: LoadedModel) -> ModelInfoMeasurement:
    cfg = model.cfg
    config = model.backend.hf_config()
    n_kv = getattr(config, "num_key_value_heads", None) or cfg.n_heads
    return ModelInfoMeasurement(
        name=model.name,
        source=model.source,
        architecture=model.backend.architecture(),
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        n_kv_heads=int(n_kv),
        d_model=cfg.d_model,
        d_head=cfg.d_head,
        d_mlp=int(cfg.d_mlp or 0),
        d_vocab=cfg.d_vocab,
        n_ctx=cfg.n_ctx,
        dtype=model.dtype,
        device=model.device,
        backend=model.backend.name,
        device_map=model.backend.placement(),
        fingerprint=model.fingerprint,
        load_seconds=round(model.load_seconds, 3),
        prepends_bos=adds_bos(model.tokenizer),
        tokenization_rule=tokenization_rule(model),
        block=block_facts(model),
        capabilities=capabilities(model.backend),
        program=program_facts(model),
        notes=info_notes(model),
    )


def info_notes(model: LoadedModel) -> list[str]:
    if model.source == "tiny":
        return [
            "This is the random-weight `tiny` model: its predictions mean nothing; use it to try the protocol, not to "
            "draw conclusions."
        ]
    program = model.backend.program
    if program is None:
        return []
    truth = program.truth
    output = f" (output {truth.output_label})" if truth is not None else ""  # a hidden truth names no node
    return [
        f"A RASP program compiled by tracr{output}: its mechanism is fixed by construction. "
        "The logit of the output value is about 1 and of every other output value about 0; tokens that are not "
        "output values have logit 0. Tools that need text or a trained model's features are refused (capabilities)."
    ]


def program_facts(model: LoadedModel) -> CompiledProgramFacts | None:
    """A compiled program's facts; its output node and ground truth only when the server was started with
    --reveal-ground-truth (hidden, an assistant can be scored on finding them)."""
    program = model.backend.program
    if program is None:
        return None
    truth = program.truth
    return CompiledProgramFacts(
        output=truth.output_label if truth is not None else None,
        max_seq_len=program.max_seq_len,
        input_values=list(program.input_values),
        output_values=list(program.output_values),
        n_nodes=truth.n_nodes if truth is not None else None,
        ground_truth=truth.nodes if truth is not None else None,
    )


MOST_PREDICTIONS = 20


def tokenize(model: LoadedModel, texts: Sequence[str], top_k: int = 0) -> TokenizeMeasurement:
    """Each text's tokens; with ``top_k`` ≥ 1 also one forward pass and, at every position, the model's top-k tokens
    and probabilities (a language model's next token; a compiled program's output at that position, attention being
    bidirectional there) and its top-1, null where the top logit is tied within ``LOGIT_TIE_TOLERANCE`` (a flat
    output has no value: an argmax there would be float noise)."""
    if not texts:
        raise InputError("No texts were given: pass a non-empty list of strings.")
    limits.check("max_prompts", len(texts), "Number of texts")
    if isinstance(top_k, bool) or not 0 <= top_k <= MOST_PREDICTIONS:
        raise InputError(f"top_k must be an integer from 0 (tokens only) to {MOST_PREDICTIONS}; got {top_k!r}.")
    rows = []
    for text in texts:
        ids = token_ids(model.tokenizer, text)
        rows.append(TokenizedText(text=text, ids=ids, tokens=token_strings(model.tokenizer, ids), n_tokens=len(ids)))
    result = TokenizeMeasurement(texts=rows, tokenization_rule=tokenization_rule(model))
    if top_k:
        _predict_every_position(model, rows, top_k)
        flat = sum(p is None for row in rows for p in row.predicted or [])
        if flat:
            result.notes.append(f"{flat} positions have a tied top logit (a flat output, no value): predicted null.")
    return result


def _predict_every_position(model: LoadedModel, rows: list[TokenizedText], top_k: int) -> None:
    batch = encode(model.tokenizer, [row.text for row in rows])
    with torch.inference_mode():
        logits = model.backend.logits(batch.input_ids).to(torch.float64)
    for i, row in enumerate(rows):
        at = logits[i, : batch.lengths[i]]
        probs = torch.softmax(at, dim=-1)
        values, indices = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
        strings = [token_strings(model.tokenizer, [int(t) for t in position]) for position in indices]
        row.top = [[TopToken(token=t, prob=float(p)) for t, p in zip(ts, ps, strict=True)]
                   for ts, ps in zip(strings, values, strict=True)]  # fmt: skip
        tied = top_ties(at)
        row.predicted = [strings[k][0] if int(tied[k]) == 1 else None for k in range(len(strings))]
