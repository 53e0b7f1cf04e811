"""A compiled RASP program (``mcp-interp compile-rasp``'s folder) booted as a TransformerBridge.

The weights are TransformerLens' own conversion of tracr's (``transformer_lens.utilities.tracr``, done at compile
time); here they are loaded into ``TransformerBridge.boot_native`` with the bridge config the compiler wrote: no
model of our own. Attention is bidirectional, as tracr compiles it.

What differs from a language model, and where it is handled:

* prompts are the program's input values separated by spaces, BOS prepended (the tokenizer's template); a value
  outside the input vocabulary and a prompt longer than ``max_seq_len`` values are refused by the shared
  tokenization rule (``ProgramVocabulary``), naming the values;
* answers are output values, one token each (" 2" or "2"): the rule refuses anything else;
* a batch's padding is masked out of attention (``CompiledBackend``): the model is not causal, so a real position
  would otherwise read the padding after it;
* the ground truth (``ground_truth.json``: every node's label, its components, the program's file name) is read only
  when revealed (``--reveal-ground-truth``). Hidden, the program is served as ``HIDDEN_PROGRAM_NAME``: no result,
  note or error names its folder or a node, so an agent scored against the truth cannot read it off a call.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mcp_interp.core.engine.backend.compiled import CompiledBackend
from mcp_interp.core.engine.backend.loader.fingerprints import weights_fingerprint
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.options import LoadOptions, parse_dtype
from mcp_interp.errors import ModelLoadError
from mcp_interp.names import HIDDEN_PROGRAM_NAME

MARKER = "compiled_program.json"
BRIDGE_FIELDS = ("n_layers", "d_model", "d_head", "n_ctx", "d_mlp", "n_heads", "act_fn", "attention_dir",
                 "normalization_type")  # fmt: skip


@dataclass(frozen=True)
class ProgramVocabulary:
    """What the tokenization rule needs to know of a compiled program's vocabulary."""

    input_ids: frozenset[int]  # ids a prompt may hold (BOS and the input values)
    output_ids: frozenset[int]  # ids an answer may be (the output values)
    input_values: tuple[str, ...]
    output_values: tuple[str, ...]
    max_values: int  # max_seq_len: values per prompt, BOS not counted
    unk_id: int
    pad_id: int


@dataclass(frozen=True)
class GroundTruth:
    """What a scorer needs and a hidden serve never reads: the output node and every node's components."""

    output_label: str
    output_name: str
    output_components: tuple[str, ...]
    n_nodes: int
    nodes: list[dict[str, Any]]


@dataclass(frozen=True)
class CompiledProgram:
    """The facts of a compiled program the server states (model_info); ``truth`` only when it was revealed."""

    max_seq_len: int
    input_values: tuple[str, ...]
    output_values: tuple[str, ...]
    tracr: str
    truth: GroundTruth | None = None  # --reveal-ground-truth: model_info carries it


def tracr_bridge_weights(
    assembled: Any, output_label: str, tokens: Sequence[str]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """TransformerLens' conversion of a tracr model (``transformer_lens.utilities.tracr``: the bridge config's fields
    and the ``boot_native`` state dict), with the token embedding's and the unembedding's rows placed at the ids of
    ``tokens`` (one vocabulary for prompts and answers: a token outside tracr's input space embeds to 0, one outside
    its output space has no unembedding row, logit 0)."""
    from transformer_lens.utilities.tracr import (
        make_tracr_transformer_bridge_config,
        make_tracr_transformer_bridge_state_dict,
    )

    ids = {token: i for i, token in enumerate(tokens)}
    cfg = make_tracr_transformer_bridge_config(assembled)
    fields = {name: getattr(cfg, name) for name in BRIDGE_FIELDS}
    fields["d_vocab"] = fields["d_vocab_out"] = len(tokens)
    state = make_tracr_transformer_bridge_state_dict(assembled, output_label=output_label)
    embed, head = state["tok_embed.weight"], state["head.weight"]
    new_embed = torch.zeros(len(tokens), embed.shape[1], dtype=embed.dtype)
    for value, i in assembled.input_encoder.encoding_map.items():
        new_embed[ids[str(value)]] = embed[i]
    new_head = torch.zeros(len(tokens), head.shape[1], dtype=head.dtype)
    for value, i in assembled.output_encoder.encoding_map.items():
        new_head[ids[str(value)]] = head[i]
    state["tok_embed.weight"], state["head.weight"] = new_embed, new_head
    state["head.bias"] = torch.zeros(len(tokens), dtype=head.dtype)
    return fields, {k: v.contiguous() for k, v in state.items()}


def is_compiled_program(path: Path) -> bool:
    return path.is_dir() and (path / MARKER).is_file()


def served_name(name: str, reveal: bool) -> str:
    """The name a model is served under: a compiled program's folder is hidden unless its truth is revealed."""
    return name if reveal or not is_compiled_program(Path(name).expanduser()) else HIDDEN_PROGRAM_NAME


def read_program(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The folder's bridge config and program facts, and its vocabulary: all a hidden serve reads."""
    facts = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    vocabulary = json.loads((folder / "vocabulary.json").read_text(encoding="utf-8"))
    return facts, vocabulary


def read_ground_truth(folder: Path) -> GroundTruth:
    """``ground_truth.json``: read by the scorer and by a revealed serve only."""
    truth = json.loads((folder / "ground_truth.json").read_text(encoding="utf-8"))
    output = truth["output"]
    return GroundTruth(
        output_label=str(output["label"]),
        output_name=str(output["name"]),
        output_components=tuple(output["components"]),
        n_nodes=int(truth["n_nodes"]),
        nodes=list(truth["nodes"]),
    )


def load_tokenizer(folder: Path, vocabulary: dict[str, Any], max_seq_len: int) -> Any:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    ids = {token: i for i, token in enumerate(vocabulary["tokens"])}
    tokenizer.program_vocabulary = ProgramVocabulary(
        input_ids=frozenset([ids[vocabulary["bos"]], *(ids[v] for v in vocabulary["input"])]),
        output_ids=frozenset(ids[v] for v in vocabulary["output"]),
        input_values=tuple(vocabulary["input"]),
        output_values=tuple(vocabulary["output"]),
        max_values=max_seq_len,
        unk_id=ids[vocabulary["unk"]],
        pad_id=ids[vocabulary["pad"]],
    )
    return tokenizer


def boot_program(
    folder: Path, device: str = "cpu", dtype: torch.dtype = torch.float32, reveal: bool = False
) -> tuple[Any, Any, CompiledProgram]:
    """(bridge, tokenizer, CompiledProgram) for a compile-rasp folder."""
    from safetensors.torch import load_file
    from transformer_lens.config.transformer_bridge_config import TransformerBridgeConfig
    from transformer_lens.model_bridge.sources import boot_native  # TransformerBridge.boot_native

    facts, vocabulary = read_program(folder)
    program = facts["program"]
    tokenizer = load_tokenizer(folder, vocabulary, int(program["max_seq_len"]))
    cfg = TransformerBridgeConfig(**facts["bridge_config"])
    shown = served_name(str(folder), reveal)
    tokenizer.name_or_path = shown  # the folder's path would otherwise travel with the tokenizer
    bridge = boot_native(cfg, tokenizer=tokenizer, device=device, dtype=dtype, model_name=shown)
    state = {k: v.to(device=device, dtype=dtype) for k, v in load_file(str(folder / "model.safetensors")).items()}
    result = bridge.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"weights the bridge does not know: {result.unexpected_keys[:5]}")
    bridge.eval()
    compiled = CompiledProgram(
        max_seq_len=int(program["max_seq_len"]),
        input_values=tuple(vocabulary["input"]),
        output_values=tuple(vocabulary["output"]),
        tracr=str(program.get("tracr", "unknown")),
        truth=read_ground_truth(folder) if reveal else None,
    )
    return bridge, tokenizer, compiled


def load_program(name: str, folder: Path, device: str, dtype: str, options: LoadOptions | None = None) -> LoadedModel:
    """A compile-rasp folder as a ``LoadedModel`` on the compiled backend (the transformers backend, one device)."""
    options = options or LoadOptions()
    reveal = options.reveal_ground_truth
    where = str(folder) if reveal else "The compiled program"  # a hidden program's path names no node, nor its folder
    if options.backend != "transformers" or options.placed:
        raise ModelLoadError(
            f"{where} is a compiled RASP program: it runs on the transformers backend on one device (it is a few "
            "kilobytes); drop --backend, --device-map, --max-memory and --offload-folder."
        )
    started = time.perf_counter()
    try:
        bridge, tokenizer, program = boot_program(folder, device, parse_dtype(dtype), reveal)
    except (OSError, KeyError, ValueError, json.JSONDecodeError) as exc:
        detail = f"{type(exc).__name__}: {exc}" if reveal else type(exc).__name__
        raise ModelLoadError(
            f"{where} looks like a compiled RASP program ({MARKER}) but cannot be loaded: {detail}. Compile it again "
            "with `mcp-interp compile-rasp PROGRAM.py OUT`."
        ) from exc
    return LoadedModel(
        name=served_name(name, reveal),
        source="local",  # a local folder; model_info.program says it is a compiled program
        backend=CompiledBackend(bridge, device, int(tokenizer.pad_token_id), program),
        tokenizer=tokenizer,
        device=device,
        dtype=dtype,
        load_seconds=time.perf_counter() - started,
        fingerprint=weights_fingerprint(bridge.original_model),
        options=options,
    )
