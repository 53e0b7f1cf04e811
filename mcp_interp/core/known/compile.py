"""``mcp-interp compile-rasp PROGRAM.py OUT``: a RASP program compiled by tracr into a folder the server boots.

tracr (Lindner et al. 2023) compiles a RASP program into transformer weights: each Aggregate becomes attention
heads, each Map or SequenceMap an MLP, a SelectorWidth a head and an MLP. Its mechanism is known by construction, so
the folder also says, for every RASP node, which components compute it and which residual dimensions hold its value
(``ground_truth.json``): the answer interpretability methods should find.

The steps are tracr's own ``compile_rasp_to_model``, run one by one so that the compiler's graph (each node's
``MODEL_BLOCK`` and ``OUTPUT_BASIS``) is kept; the weights are converted by TransformerLens' tracr utilities
(``make_tracr_transformer_bridge_config``, ``make_tracr_transformer_bridge_state_dict``). Only the vocabulary is
re-indexed: the server's tokenizer has one vocabulary for prompts and answers, so the token embedding's rows and the
unembedding's rows are placed at the tokens' ids (a token outside the input space embeds to 0; one outside the
output space has no unembedding row, logit 0). Output values come first, in the output encoder's order, so the
argmax of an all-zero output row is tracr's own decoding (the first output value).

The folder: ``model.safetensors`` (TransformerLens' native state dict), ``compiled_program.json`` (the bridge config
and what a served program may state: its length and special tokens), ``tokenizer.json`` and its config,
``vocabulary.json`` (input and output values), and ``ground_truth.json``: the output node, every node's label, its
components and residual dimensions, and the program's file name. Only the ground truth names a node or the program,
so a serve with the truth hidden (the default) never reads it; the program source is not copied at all. Serving needs
TransformerLens only, not tracr.
"""

from __future__ import annotations

import json
import runpy
import shutil
import tempfile
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mcp_interp.core.engine.backend.loader.program import MARKER, tracr_bridge_weights
from mcp_interp.errors import CompileError

FORMAT = "mcp-interp compiled RASP program"
FORMAT_VERSION = 1
DEFAULT_BOS = "BOS"
PAD = "PAD"
UNK = "UNK"


@dataclass
class Compiled:
    """tracr's assembled model with the compiler's graph and craft model it came from."""

    assembled: Any  # tracr.compiler.assemble.AssembledTransformerModel
    graph: Any  # networkx.DiGraph of RASP nodes (tracr.compiler.nodes keys)
    craft_model: Any  # tracr.craft.transformers.SeriesWithResiduals
    program: Any  # the RASP expression (the sink)
    vocab: set[Any]
    max_seq_len: int
    compiler_bos: str
    compiler_pad: str


@dataclass(frozen=True)
class ProgramFile:
    program: Any
    vocab: set[Any]
    max_seq_len: int
    compiler_bos: str


def read_program_file(path: Path) -> ProgramFile:
    """The names a program file defines: ``program`` (a RASP SOp), ``vocab`` (a set of input values),
    ``max_seq_len`` (an int) and optionally ``compiler_bos`` (default "BOS")."""
    from tracr.rasp import rasp

    if not path.is_file():
        raise CompileError(f"{path}: no such file. Pass a Python file defining `program`, `vocab` and `max_seq_len`.")
    try:
        names = runpy.run_path(str(path))
    except Exception as exc:
        raise CompileError(f"{path} failed to run: {type(exc).__name__}: {exc}") from exc
    missing = [n for n in ("program", "vocab", "max_seq_len") if n not in names]
    if missing:
        raise CompileError(
            f"{path} does not define {', '.join(missing)}: a program file defines `program` (a RASP expression), "
            "`vocab` (a set of input values), `max_seq_len` (an int) and optionally `compiler_bos`."
        )
    program, vocab, max_seq_len = names["program"], names["vocab"], names["max_seq_len"]
    if not isinstance(program, rasp.SOp):
        raise CompileError(f"{path}: `program` is a {type(program).__name__}, not a RASP SOp (e.g. rasp.Map(...)).")
    if not isinstance(vocab, set | frozenset | list | tuple) or not vocab:
        raise CompileError(f"{path}: `vocab` must be a non-empty set of input values, e.g. {{0, 1, 2, 3}}.")
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise CompileError(f"{path}: `max_seq_len` must be a positive int, got {max_seq_len!r}.")
    bos = names.get("compiler_bos", DEFAULT_BOS)
    if not isinstance(bos, str) or not bos or any(c.isspace() for c in bos):
        raise CompileError(f"{path}: `compiler_bos` must be a non-empty string without spaces, got {bos!r}.")
    return ProgramFile(program, set(vocab), max_seq_len, bos)


def _failing_node(exc: BaseException) -> str | None:
    """The RASP node a compiler pass was working on when it raised: the innermost frame of the traceback holding a
    RASP expression in a local variable (tracr's passes loop over the graph's nodes with ``expr`` in hand)."""
    from tracr.rasp import rasp

    found = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        for name in ("expr", "sop", "sel_expr"):
            value = frame.f_locals.get(name)
            if isinstance(value, rasp.RASPExpr):
                found = value
                break
    return None if found is None else found.label


def compile_program(source: ProgramFile, origin: str = "the program") -> Compiled:
    """tracr's ``compile_rasp_to_model`` step by step (non-causal, as tracr compiles by default), keeping the graph.
    A failure is a CompileError naming the node."""
    from tracr.compiler import (
        basis_inference,
        craft_graph_to_model,
        craft_model_to_transformer,
        expr_to_craft_graph,
        rasp_to_graph,
        validating,
    )
    from tracr.craft import bases
    from tracr.rasp import rasp

    program, vocab, max_seq_len, bos = source.program, source.vocab, source.max_seq_len, source.compiler_bos
    if bos in {str(v) for v in vocab} or PAD in {str(v) for v in vocab}:
        raise CompileError(f"{origin}: the input values may not include the BOS token {bos!r} or {PAD!r}.")
    if not rasp.is_categorical(program):
        raise CompileError(
            f"{origin}: the output node {program.label} is numerical; the server unembeds categorical outputs only "
            "(TransformerLens' make_tracr_categorical_unembed). Make the last node categorical, e.g. "
            "rasp.categorical(rasp.Map(lambda x: round(x, 2), out))."
        )
    unsupported = validating.static_validate(program)
    if unsupported:
        detail = "; ".join(f"node {e.expr.label}: {e.reason}" for e in unsupported)
        raise CompileError(f"{origin} uses RASP that tracr cannot compile: {detail}")
    try:
        extracted = rasp_to_graph.extract_rasp_graph(program)
        graph, sources, sink = extracted.graph, extracted.sources, extracted.sink
        basis_inference.infer_bases(graph, sink, vocab, max_seq_len)
        expr_to_craft_graph.add_craft_components_to_rasp_graph(
            graph, bos_dir=bases.BasisDirection(rasp.tokens.label, bos), mlp_exactness=100
        )
        craft_model = craft_graph_to_model.craft_graph_to_model(graph, sources)
        assembled = craft_model_to_transformer.craft_model_to_transformer(
            craft_model=craft_model, graph=graph, sink=sink, max_seq_len=max_seq_len, causal=False,
            compiler_bos=bos, compiler_pad=PAD,
        )  # fmt: skip
    except Exception as exc:
        node = _failing_node(exc)
        where = f" at node {node}" if node else ""
        raise CompileError(f"tracr could not compile {origin}{where}: {type(exc).__name__}: {exc}") from exc
    return Compiled(assembled, graph, craft_model, program, vocab, max_seq_len, bos, PAD)


# --- the ground truth -----------------------------------------------------------------------------------------


def block_layers(craft_model: Any) -> list[tuple[int, str]]:
    """Each craft block's transformer layer and half ('attn' | 'mlp'), by assemble's own rule (its module names)."""
    from tracr.compiler import assemble

    _, names = assemble._get_model_config_and_module_names(craft_model)
    return [(int(name.split("/")[1].removeprefix("layer_")), name.split("/")[2]) for name in names]


def ground_truth(compiled: Compiled) -> list[dict[str, Any]]:
    """Per RASP node: label, name, kind, encoding, the components computing it (``L{l}H{h}``, ``L{l}MLP``; ``embed``
    for tokens and indices), the ones writing its value (``writes``: a SelectorWidth's head writes a hidden
    dimension its MLP reads), its residual dimensions and their labels, the nodes it reads and its value set."""
    from tracr.compiler import nodes
    from tracr.craft import transformers
    from tracr.rasp import rasp

    labels = [str(label) for label in compiled.assembled.residual_labels]
    index = {label: i for i, label in enumerate(labels)}
    heads: dict[int, str] = {}
    mlps: list[tuple[int, set[Any]]] = []
    for block, (layer, half) in zip(compiled.craft_model.blocks, block_layers(compiled.craft_model), strict=True):
        if half == "attn":
            for h, head in enumerate(block.as_multi().heads()):
                heads[id(head)] = f"L{layer}H{h}"
        else:
            mlps.append((layer, set(block.snd.output_space.basis)))

    def mlp_name(mlp: Any) -> str:
        out = set(mlp.snd.output_space.basis)
        layers = [layer for layer, basis in mlps if out <= basis]
        if len(layers) != 1:
            raise RuntimeError(f"cannot place an MLP writing {sorted(map(str, out))[:3]}… in one layer")
        return f"L{layers[0]}MLP"

    def components(block: Any) -> list[str]:
        if isinstance(block, transformers.AttentionHead):
            return [heads[id(block)]]
        if isinstance(block, transformers.MultiAttentionHead):
            return [heads[id(head)] for head in block.heads()]
        if isinstance(block, transformers.MLP):
            return [mlp_name(block)]
        if isinstance(block, transformers.SeriesWithResiduals):
            return [name for part in block.blocks for name in components(part)]
        raise RuntimeError(f"unknown craft block {type(block).__name__}")

    def writers(block: Any) -> list[str]:
        if isinstance(block, transformers.SeriesWithResiduals):
            return writers(block.blocks[-1])
        return components(block)

    out = []
    for node_id in compiled.graph.nodes:
        node = compiled.graph.nodes[node_id]
        expr = node[nodes.EXPR]
        block = node.get(nodes.MODEL_BLOCK)
        entry: dict[str, Any] = {
            "label": expr.label,
            "name": expr.name,
            "kind": type(expr).__name__,
            "encoding": rasp.get_encoding(expr).value if isinstance(expr, rasp.SOp) else None,
            "components": [],
            "writes": [],
            "residual_dims": [],
            "residual_labels": [],
            "reads": sorted(compiled.graph.predecessors(node_id)),
            "value_set": None,
        }
        if isinstance(expr, rasp.SOp):
            basis = [str(d) for d in node.get(nodes.OUTPUT_BASIS) or []]
            entry["residual_labels"] = basis
            entry["residual_dims"] = [index[label] for label in basis]
            values = node.get(nodes.VALUE_SET)
            entry["value_set"] = sorted(str(v) for v in values) if values is not None else None
        if block is not None:
            entry["components"], entry["writes"] = components(block), writers(block)
        elif expr.label in (rasp.tokens.label, rasp.indices.label):
            entry["components"], entry["writes"] = ["embed"], ["embed"]
        entry["output"] = expr.label == compiled.program.label
        out.append(entry)
    return out


def written_dims(state_dict: dict[str, torch.Tensor], n_layers: int, n_heads: int, d_head: int) -> dict[str, set[int]]:
    """The residual dimensions each sublayer writes, read from the weights: the rows of head h's output projection
    and of each MLP's down projection that are not all zero (what ``ground_truth.json`` is checked against)."""
    out: dict[str, set[int]] = {}
    for layer in range(n_layers):
        w_o = state_dict[f"layers.{layer}.attn.o.weight"]  # [d_model, n_heads * d_head]
        for h in range(n_heads):
            rows = w_o[:, h * d_head : (h + 1) * d_head].abs().sum(dim=1)
            out[f"L{layer}H{h}"] = {int(i) for i in torch.nonzero(rows > 0).flatten()}
        down = state_dict[f"layers.{layer}.mlp.fc_out.weight"]  # [d_model, d_mlp]
        out[f"L{layer}MLP"] = {int(i) for i in torch.nonzero(down.abs().sum(dim=1) > 0).flatten()}
    return out


def check_against_weights(truth: Sequence[dict[str, Any]], written: dict[str, set[int]]) -> None:
    """Each node's residual dimensions are written by the components the compiler's graph names and by no other
    sublayer: the graph and the weights agree (a RuntimeError says where they do not)."""
    for entry in truth:
        dims = set(entry["residual_dims"])
        if not dims or entry["writes"] == ["embed"]:
            continue
        by = {name for name, rows in written.items() if rows & dims}
        if by != set(entry["writes"]):
            raise RuntimeError(
                f"node {entry['label']}: the compiler's graph says {entry['writes']} write its dimensions, the weights "
                f"say {sorted(by)}"
            )


# --- the vocabulary and the weights ---------------------------------------------------------------------------


def value_tokens(values: Sequence[Any], what: str) -> list[str]:
    """Values as the tokenizer's tokens (``str``), refused when two print alike or one holds whitespace."""
    strings = [str(v) for v in values]
    bad = [s for s in strings if not s or any(c.isspace() for c in s)]
    if bad:
        raise CompileError(f"{what} value {bad[0]!r} is empty or holds whitespace: prompts split values at spaces.")
    seen: dict[str, Any] = {}
    for value, s in zip(values, strings, strict=True):
        if s in seen and seen[s] != value:
            raise CompileError(f"{what} values {seen[s]!r} and {value!r} both print as {s!r}: rename one.")
        seen[s] = value
    return strings


@dataclass(frozen=True)
class Vocabulary:
    tokens: list[str]  # id → token: output values, input-only values, BOS, PAD, UNK
    input_values: list[str]  # in the input encoder's order (without BOS and PAD)
    output_values: list[str]  # in the output encoder's order
    bos: str
    pad: str
    unk: str

    def id(self, token: str) -> int:
        return self.tokens.index(token)


def vocabulary(compiled: Compiled) -> Vocabulary:
    assembled = compiled.assembled
    inputs = sorted(assembled.input_encoder.encoding_map.items(), key=lambda kv: kv[1])
    outputs = sorted(assembled.output_encoder.encoding_map.items(), key=lambda kv: kv[1])
    specials = {compiled.compiler_bos, compiled.compiler_pad}
    input_values = value_tokens([v for v, _ in inputs if v not in specials], "input")
    output_values = value_tokens([v for v, _ in outputs], "output")
    clash = {compiled.compiler_bos, PAD, UNK} & set(output_values)
    if clash:
        raise CompileError(f"output value {sorted(clash)[0]!r} is a special token's name; rename it.")
    tokens = [*output_values, *[v for v in input_values if v not in output_values]]
    tokens += [compiled.compiler_bos, PAD, UNK]
    return Vocabulary(tokens, input_values, output_values, compiled.compiler_bos, PAD, UNK)


def bridge_weights(compiled: Compiled, vocab: Vocabulary) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """TransformerLens' bridge config fields and state dict for the program, the vocabulary re-indexed (see the
    module docstring; the conversion itself is the loader's, ``loader.program.tracr_bridge_weights``)."""
    return tracr_bridge_weights(compiled.assembled, compiled.program.label, vocab.tokens)


def build_tokenizer(vocab: Vocabulary) -> Any:
    """A word-level tokenizer: values split at whitespace, BOS prepended (``add_special_tokens=True``), an unknown
    value → UNK (refused by the server's tokenization rule, which names the program's values)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    ids = {token: i for i, token in enumerate(vocab.tokens)}
    core = Tokenizer(models.WordLevel(vocab=ids, unk_token=vocab.unk))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(
        single=f"{vocab.bos} $A", special_tokens=[(vocab.bos, ids[vocab.bos])]
    )
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=vocab.bos, pad_token=vocab.pad, unk_token=vocab.unk,
        model_max_length=10**6, padding_side="right",
    )  # fmt: skip


# --- the folder -----------------------------------------------------------------------------------------------


def tracr_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tracr-pypi")
    except PackageNotFoundError:
        return "unknown"


def write_folder(compiled: Compiled, out: Path, program_file: Path | None = None) -> dict[str, Any]:
    """Write ``out`` (see the module docstring) atomically: built in a sibling temporary folder, then renamed; an
    existing ``out`` that is a compiled program is replaced, anything else refused. Returns the folder's facts and the
    ground truth's summary (output node, node count, program file) for the one who compiled it."""
    from safetensors.torch import save_file

    vocab = vocabulary(compiled)
    fields, state = bridge_weights(compiled, vocab)
    truth = ground_truth(compiled)
    check_against_weights(truth, written_dims(state, fields["n_layers"], fields["n_heads"], fields["d_head"]))
    output = next(entry for entry in truth if entry["output"])
    facts = {  # what a hidden serve reads: nothing here names a node or the program
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "bridge_config": fields,
        "program": {
            "max_seq_len": compiled.max_seq_len,
            "compiler_bos": compiled.compiler_bos,
            "compiler_pad": compiled.compiler_pad,
            "tracr": tracr_version(),
        },
    }
    ground = {  # the scorer's and a revealed serve's only
        "output": {"label": compiled.program.label, "name": compiled.program.name, "components": output["writes"]},
        "n_nodes": len(truth),
        "program_file": program_file.name if program_file is not None else None,
        "nodes": truth,
    }
    if out.exists() and not (out / MARKER).is_file():
        raise CompileError(f"{out} exists and is not a compiled program: pass a new folder (or remove it).")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        save_file(state, str(staging / "model.safetensors"))
        build_tokenizer(vocab).save_pretrained(str(staging))
        (staging / MARKER).write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
        vocabulary_json = {"input": vocab.input_values, "output": vocab.output_values, "tokens": vocab.tokens,
                           "bos": vocab.bos, "pad": vocab.pad, "unk": vocab.unk}  # fmt: skip
        (staging / "vocabulary.json").write_text(json.dumps(vocabulary_json, indent=2) + "\n", encoding="utf-8")
        (staging / "ground_truth.json").write_text(json.dumps(ground, indent=2) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {**facts, "ground_truth": {k: v for k, v in ground.items() if k != "nodes"}}


def compile_rasp(program_file: Path, out: Path) -> dict[str, Any]:
    """``compile-rasp``: read, compile and write; a CompileError says what went wrong."""
    source = read_program_file(program_file)
    compiled = compile_program(source, origin=str(program_file))
    return write_folder(compiled, out, program_file)


def tracr_reference(compiled: Compiled, values: Sequence[Any]) -> tuple[list[Any], list[np.ndarray]]:
    """tracr's own forward on BOS + ``values``: its decoded outputs (BOS position included) and every residual
    (after each attention and MLP half-layer), for comparisons with the bridge."""
    out = compiled.assembled.apply([compiled.compiler_bos, *values])
    return list(out.decoded), [np.asarray(r[0]) for r in out.residuals]
