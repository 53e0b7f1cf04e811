"""Transcoders in circuit-tracer's on-disk format, read without circuit-tracer (the math is ``transcoders``).

Why not circuit-tracer itself: it pins ``transformers ≤ 4.57`` and its TransformerLens backend subclasses
``HookedTransformer``, which TransformerLens 4 removed. The reference is circuit-tracer 0.5 / upstream
``decoderesearch/circuit-tracer`` (``utils/hf_utils.py``, ``transcoder/single_layer_transcoder.py``,
``transcoder/cross_layer_transcoder.py``). A transcoder set is a folder (or a hub repository, or a subfolder
of one) holding ``config.yaml``:

* ``model_kind`` — ``transcoder_set`` (one transcoder per layer) or ``cross_layer_transcoder``.
* ``feature_input_hook`` / ``feature_output_hook`` — TransformerLens hook names relative to ``blocks.{l}.``:
  inputs ``mlp.hook_in`` (the MLP's normalised input), ``hook_resid_mid``, ``ln2.hook_normalized``;
  outputs ``hook_mlp_out``, ``mlp.hook_out`` (the same on blocks without a post-MLP norm). Mapped onto the
  bridge's hooks of the same meaning (``bridge.hook_mlp_input`` …); anything else is refused.
* ``model_name`` — compared with the loaded model's names (a mismatch is a note).
* ``activation`` (``relu`` | ``topk``, optional: without it JumpReLU when the files hold a threshold, else
  ReLU), ``k`` (topk).
* ``transcoders`` (optional, PLT) — one file per layer: ``hf://org/repo/path?revision=r`` URIs (looked up
  in the Hugging Face cache) or paths (relative ones from the folder).

Per-layer files ``layer_{i}.safetensors`` hold ``W_enc`` [d_transcoder, d_model], ``b_enc`` [d_transcoder],
``W_dec`` [d_transcoder, d_model], ``b_dec`` [d_model], optionally ``activation_function.threshold``
[d_transcoder] (JumpReLU) and ``W_skip`` [d_model, d_model] (skip = x · W_skipᵀ). Also read, as
circuit-tracer's special loaders do: Gemma Scope 2 files (lowercase ``w_enc`` [d_model, d_transcoder],
``w_dec``, ``b_enc``, ``b_dec``, ``threshold``, ``affine_skip_connection``) and Gemma Scope's ``params.npz``
(``W_enc`` [d_model, d_transcoder], ``threshold``). A cross-layer transcoder's folder holds, per layer i,
``W_enc_{i}.safetensors`` (``W_enc_{i}`` [d_transcoder, d_model], ``b_enc_{i}``, ``b_dec_{i}`` — the decoder
bias of output layer i — and optionally ``threshold_{i}``) and ``W_dec_{i}.safetensors`` (``W_dec_{i}``
[d_transcoder, n_layers − i, d_model]).

A hub id (``org/repo``, ``org/repo/sub/folder``, ``…@revision``, the aliases ``gemma`` and ``llama``) is read
from circuit-tracer's own cache (``CIRCUIT_TRACER_CACHE_DIR`` or ``~/.cache/circuit_tracer/<ref>``) or the
Hugging Face cache, never downloaded: the server runs offline. Weights become float32 on the model's device.
Loaded sets are cached with the model (``LoadedModel.cache``), keyed by the files, their modification times
and sizes, and the device.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.points import (
    hook_mlp_input,
    hook_mlp_norm_normalized,
    hook_mlp_out,
    hook_mlp_output,
    hook_resid_mid,
)
from mcp_interp.core.engine.dictionaries.saelens import same_model
from mcp_interp.core.engine.dictionaries.transcoders import TRANSCODER_KINDS, ActivationName, Transcoders
from mcp_interp.errors import InputError
from mcp_interp.state.paths import client_path, existing_inside

CONFIG_FILE = "config.yaml"
MAX_CACHED_SETS = 2  # transcoder sets kept in memory (30 × 1024 features on d_model 576 is ~140 MB)
ALIASES = {"gemma": "mwhanna/gemma-scope-transcoders", "llama": "mntss/transcoder-Llama-3.2-1B"}

# circuit-tracer's hook names (HookedTransformer's, relative to blocks.{l}.) → the bridge's hooks of the same
# meaning. These strings are the format being parsed; the bridge's names come from ``bridge``.
INPUT_HOOKS: dict[str, Callable[[int], str]] = {
    "mlp.hook_in": hook_mlp_input,
    "hook_resid_mid": hook_resid_mid,
    "ln2.hook_normalized": hook_mlp_norm_normalized,
}
OUTPUT_HOOKS: dict[str, Callable[[int], str]] = {"hook_mlp_out": hook_mlp_out, "mlp.hook_out": hook_mlp_output}
_PLT_FILE = re.compile(r"^layer_(\d+)\.safetensors$")
_CLT_FILE = re.compile(r"^W_enc_(\d+)\.safetensors$")


@dataclass(frozen=True)
class Location:
    """Where a transcoder set's files are: its folder, circuit-tracer's ``scan`` for it, and how it was found."""

    folder: Path
    scan: str
    found: str  # "folder", "circuit-tracer cache" or "Hugging Face cache"


def load_transcoders(source: str, model: LoadedModel) -> Transcoders:
    """The transcoder set ``source`` (a folder or a hub id), checked against ``model``, on its device.

    Errors (``InputError``, naming the field or file and what to do): nothing found at ``source``, a hub id not
    in the local caches, an unknown ``model_kind`` or hook, a layer count or width that is not the model's, a
    missing or misshapen tensor. A ``model_name`` unlike the loaded model's is a note in ``notes``. Repeated loads
    of unchanged files come from the model's cache.
    """
    require(model.backend, "dictionaries")
    location = resolve_source(source)
    try:
        cfg = read_config(location.folder)
        files = weight_files(cfg, location)
        stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in [location.folder / CONFIG_FILE, *files])
    except OSError as exc:
        raise InputError(f"`transcoders` {source!r}: its files cannot be read ({exc.strerror or exc}).") from None
    key = ("transcoders", str(location.folder), stamp, str(model.device))

    def read() -> Transcoders:
        try:
            return _read_set(source, location, cfg, files, model)
        except OSError as exc:
            raise InputError(f"`transcoders` {source!r}: its files cannot be read ({exc.strerror or exc}).") from None

    transcoders = model.cache.get_or_load(key, read, MAX_CACHED_SETS)
    return replace(transcoders, source=source, notes=tuple(_model_notes(transcoders, model)))


# --- finding the files ------------------------------------------------------------------------------


def resolve_source(source: str) -> Location:
    """The folder of ``source``: a local folder, else a hub id found in circuit-tracer's or the HF cache."""
    if not isinstance(source, str) or not source.strip():
        raise InputError(
            "`transcoders` must be a local folder in circuit-tracer's format (config.yaml + layer files) or a hub id "
            f"such as 'mntss/transcoder-Llama-3.2-1B', got {source!r}."
        )
    if not source.startswith(("/", ".", "~")) and existing_inside(source) is None:
        return _hub_location(ALIASES.get(source, source))  # not a folder this server may read: a hub id
    path = client_path(source, "transcoders")  # outside the allowed roots: one refusal, whatever is there
    try:
        is_file, is_dir = path.is_file(), path.is_dir()
    except (OSError, ValueError) as exc:  # ValueError: a path the OS cannot represent (a NUL byte)
        raise InputError(f"`transcoders` {source!r} cannot be read on this machine ({exc}).") from None
    if is_file:
        hint = f" Pass the folder that contains it: {str(path.resolve().parent)!r}." if path.suffix else ""
        raise InputError(f"`transcoders` {source!r} is a file; it must be a folder holding {CONFIG_FILE}.{hint}")
    if is_dir:
        try:
            return Location(_config_folder(path.resolve()), str(path.resolve()), "folder")
        except OSError as exc:
            raise InputError(f"`transcoders` {source!r} cannot be read on this machine ({exc}).") from None
    raise InputError(
        f"`transcoders` {source!r} is not a folder on this machine. Pass a local folder in circuit-tracer's format "
        "or a hub id ('org/repo', 'org/repo/subfolder') that is in the local Hugging Face cache."
    )


def _config_folder(path: Path) -> Path:
    if (path / CONFIG_FILE).is_file():
        return path
    inner = [c.name for i, c in enumerate(sorted(path.iterdir())) if i < 500 and (c / CONFIG_FILE).is_file()][:5]
    hint = (
        f" Its subfolders {inner} have one: pass one of them."
        if inner
        else " circuit-tracer's format is config.yaml (model_kind, feature_input_hook, feature_output_hook) next to "
        "layer_{i}.safetensors (per-layer transcoders) or W_enc_{i}/W_dec_{i}.safetensors (a cross-layer transcoder)."
    )
    raise InputError(f"Transcoder folder {str(path)!r} has no {CONFIG_FILE}.{hint}")


def parse_hub_ref(ref: str) -> tuple[str, str | None, str | None]:
    """``org/repo[/sub/folder][@revision]`` or ``hf://org/repo/sub?revision=r`` → (repo_id, subfolder, revision),
    as circuit-tracer's ``HfUri.from_str``."""
    if ref.startswith("hf://"):
        body, _, query = ref[len("hf://") :].partition("?")
        revision = dict(p.split("=", 1) for p in query.split("&") if "=" in p).get("revision") or None
    else:
        body, _, revision_text = ref.partition("@")
        revision = revision_text or None
    parts = [p for p in body.split("/") if p]
    if len(parts) < 2 or any(p in (".", "..") for p in parts):
        raise InputError(
            f"`transcoders` {ref!r} is neither a folder on this machine nor a hub id ('org/repo', "
            "'org/repo/subfolder', optionally '@revision')."
        )
    return "/".join(parts[:2]), "/".join(parts[2:]) or None, revision


def _hub_location(ref: str) -> Location:
    repo_id, subfolder, revision = parse_hub_ref(ref)
    scan = (repo_id if subfolder is None else f"{repo_id}//{subfolder}") + (f"@{revision}" if revision else "")
    normalized = repo_id + (f"/{subfolder}" if subfolder else "") + (f"@{revision}" if revision else "")
    ct_cache = Path(os.environ.get("CIRCUIT_TRACER_CACHE_DIR") or Path.home() / ".cache" / "circuit_tracer")
    if (ct_cache / normalized / CONFIG_FILE).is_file():
        return Location(ct_cache / normalized, scan, "circuit-tracer cache")
    from huggingface_hub import snapshot_download

    prefix = f"{subfolder}/" if subfolder else ""
    try:
        root = snapshot_download(
            repo_id,
            revision=revision,
            local_files_only=True,
            allow_patterns=[f"{prefix}*.yaml", f"{prefix}*.safetensors"],
        )
    except Exception:  # huggingface_hub raises several kinds (not cached, offline, bad id)
        root = None
    folder = Path(root) / (subfolder or "") if root else None
    if folder is None or not (folder / CONFIG_FILE).is_file():
        include = f"'{subfolder}/*'" if subfolder else "'config.yaml' '*.safetensors'"
        raise InputError(
            f"`transcoders` {ref!r}: {CONFIG_FILE} of hub repository {repo_id!r}"
            + (f" (subfolder {subfolder!r})" if subfolder else "")
            + " is not in this machine's Hugging Face cache, and the server never downloads (it runs offline). "
            f"Where there is internet run `hf download {repo_id} --include {include}` (or circuit-tracer's "
            "`save_transcoders_to_cache`), copy the cache or the folder here, and pass the hub id again or the "
            "folder's path."
        )
    return Location(folder, scan, "Hugging Face cache")


def read_config(folder: Path) -> dict[str, Any]:
    import yaml

    path = folder / CONFIG_FILE
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise InputError(
            f"{path} is not valid YAML ({str(error)[:200]}); it must be circuit-tracer's config.yaml."
        ) from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path} must hold a YAML mapping (circuit-tracer's config.yaml), got {type(cfg).__name__}.")
    kind = cfg.get("model_kind")
    if kind not in TRANSCODER_KINDS:
        raise InputError(
            f"{path}: `model_kind` = {kind!r}; circuit-tracer's formats are 'transcoder_set' (one transcoder per "
            "layer) and 'cross_layer_transcoder'."
        )
    return cfg


def weight_files(cfg: dict[str, Any], location: Location) -> list[Path]:
    """The weight files in layer order (PLT: one per layer; CLT: W_enc_i then W_dec_i for each i)."""
    folder, where = location.folder, location.folder / CONFIG_FILE
    if cfg["model_kind"] == "cross_layer_transcoder":
        layers = sorted(int(m.group(1)) for p in folder.glob("W_enc_*.safetensors") if (m := _CLT_FILE.match(p.name)))
        _check_contiguous(layers, folder, "W_enc_{i}.safetensors")
        files = []
        for i in layers:
            for name in (f"W_enc_{i}.safetensors", f"W_dec_{i}.safetensors"):
                if not (folder / name).is_file():
                    raise InputError(f"Cross-layer transcoder folder {str(folder)!r} has no {name}.")
                files.append(folder / name)
        return files
    listed = cfg.get("transcoders")
    if listed is not None:
        if not isinstance(listed, list) or not listed or not all(isinstance(p, str) for p in listed):
            raise InputError(
                f"{where}: `transcoders` must be a list of file references (one per layer: 'hf://org/repo/file' or a "
                f"path), got {str(listed)[:200]!r}."
            )
        return [_layer_file(ref, folder, where) for ref in listed]
    layers = sorted(int(m.group(1)) for p in folder.glob("layer_*.safetensors") if (m := _PLT_FILE.match(p.name)))
    _check_contiguous(layers, folder, "layer_{i}.safetensors")
    return [folder / f"layer_{i}.safetensors" for i in layers]


def _check_contiguous(layers: list[int], folder: Path, pattern: str) -> None:
    if not layers:
        raise InputError(f"Transcoder folder {str(folder)!r} has {CONFIG_FILE} but no {pattern} files.")
    missing = sorted(set(range(max(layers) + 1)) - set(layers))
    if missing:
        raise InputError(
            f"Transcoder folder {str(folder)!r} lacks {pattern.replace('{i}', str(missing[0]))}: every layer from 0 "
            "on needs its file."
        )


def _layer_file(ref: str, folder: Path, where: Path) -> Path:
    if ref.startswith("hf://"):
        repo_id, path, revision = parse_hub_ref(ref)
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(repo_id, path or "", revision=revision) if path else None
        if not isinstance(cached, str):
            raise InputError(
                f"{where}: {ref!r} is not in this machine's Hugging Face cache, and the server never downloads. "
                f"Where there is internet run `hf download {repo_id} {path}`, then copy the cache here."
            )
        return Path(cached)
    local = Path(ref).expanduser()
    local = local if local.is_absolute() else folder / local
    if not local.is_file():
        raise InputError(f"{where}: the layer file {ref!r} does not exist ({str(local)!r}).")
    return local


# --- reading the tensors ----------------------------------------------------------------------------


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file (or Gemma Scope's params.npz) as float32 on the CPU."""
    if path.suffix == ".npz":
        import numpy as np

        try:
            with np.load(path) as npz:
                return {k: torch.from_numpy(np.asarray(npz[k], dtype=np.float32)) for k in npz.files}
        except (ValueError, OSError) as error:
            raise InputError(f"{path} could not be read as a .npz file ({error}).") from None
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {k: f.get_tensor(k).to(torch.float32) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    except SafetensorError as error:
        raise InputError(f"{path} could not be read as a safetensors file ({error}).") from None


def _plt_layer(path: Path) -> dict[str, torch.Tensor]:
    """One layer's tensors in circuit-tracer's orientation: W_enc/W_dec [F, d], and the skip as x → x · S."""
    raw = _tensors(path)
    out: dict[str, torch.Tensor] = {}
    if "w_enc" in raw:  # Gemma Scope 2: lowercase names, w_enc [d_model, d_transcoder]
        renames = {"w_enc": "W_enc", "w_dec": "W_dec", "b_enc": "b_enc", "b_dec": "b_dec", "threshold": "threshold"}
        out = {new: raw[old] for old, new in renames.items() if old in raw}
        out["W_enc"] = out["W_enc"].T
        if "affine_skip_connection" in raw:
            out["skip"] = raw["affine_skip_connection"]  # circuit-tracer: W_skip = affineᵀ, skip = x @ W_skipᵀ
    else:
        renames = {"W_enc": "W_enc", "b_enc": "b_enc", "W_dec": "W_dec", "b_dec": "b_dec"}
        renames["threshold" if path.suffix == ".npz" else "activation_function.threshold"] = "threshold"
        out = {new: raw[old] for old, new in renames.items() if old in raw}
        if path.suffix == ".npz" and "W_enc" in out:  # Gemma Scope's params.npz: W_enc [d_model, d_transcoder]
            out["W_enc"] = out["W_enc"].T
        if "W_skip" in raw:
            out["skip"] = raw["W_skip"].T  # circuit-tracer: skip = x @ W_skip.T
    missing = [k for k in ("W_enc", "b_enc", "W_dec", "b_dec") if k not in out]
    if missing:
        raise InputError(
            f"{path}: tensor `{missing[0]}` is missing (circuit-tracer's layer files hold W_enc [d_transcoder, "
            f"d_model], b_enc, W_dec [d_transcoder, d_model], b_dec); the file has {sorted(raw)[:12]}."
        )
    return out


def _clt_layer(enc_path: Path, dec_path: Path, i: int) -> dict[str, torch.Tensor]:
    enc, dec = _tensors(enc_path), _tensors(dec_path)
    out: dict[str, torch.Tensor] = {}
    for name, source in ((f"W_enc_{i}", enc), (f"b_enc_{i}", enc), (f"b_dec_{i}", enc), (f"W_dec_{i}", dec)):
        if name not in source:
            file = enc_path if source is enc else dec_path
            raise InputError(f"{file}: tensor `{name}` is missing; the file has {sorted(source)[:12]}.")
        out[name.rsplit("_", 1)[0]] = source[name]
    if f"threshold_{i}" in enc:
        out["threshold"] = enc[f"threshold_{i}"].reshape(-1)
    return out


def _activation(
    cfg: dict[str, Any], has_threshold: bool, d_transcoder: int, where: Path
) -> tuple[ActivationName, int | None]:
    name = cfg.get("activation")
    if name is None:
        return ("jumprelu" if has_threshold else "relu"), None
    if name == "relu":
        return "relu", None
    if name in ("jumprelu", "jump_relu"):
        if not has_threshold:
            raise InputError(f"{where}: `activation` = {name!r} but the layer files hold no threshold.")
        return "jumprelu", None
    if name == "topk":
        k = cfg.get("k")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d_transcoder:
            raise InputError(f"{where}: a topk transcoder needs an integer `k` from 1 to {d_transcoder}, got {k!r}.")
        return "topk", k
    raise InputError(f"{where}: `activation` = {name!r} is not supported ('relu', 'topk' with `k`, or absent).")


def _hooks(
    cfg: dict[str, Any], model: LoadedModel, n_layers: int, where: Path
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    found = []
    for field_name, table in (("feature_input_hook", INPUT_HOOKS), ("feature_output_hook", OUTPUT_HOOKS)):
        name = cfg.get(field_name)
        if name not in table:
            raise InputError(
                f"{where}: `{field_name}` = {name!r} is not a hook this server maps onto the model. Supported: "
                f"{', '.join(repr(k) for k in table)} (TransformerLens names relative to blocks.{{l}}.)."
            )
        hooks = tuple(table[name](layer) for layer in range(n_layers))
        absent = [h for h in hooks if not model.backend.has_point(h)]
        if absent:
            raise InputError(
                f"{where}: `{field_name}` = {name!r} maps to {absent[0]}, which the loaded model {model.name!r} "
                "does not have (its architecture has no such point): these transcoders do not fit this model."
            )
        found.append(hooks)
    return found[0], found[1]


def _read_set(
    source: str, location: Location, cfg: dict[str, Any], files: list[Path], model: LoadedModel
) -> Transcoders:
    where = location.folder / CONFIG_FILE
    kind = cfg["model_kind"]
    n_model_layers, d_model = int(model.cfg.n_layers), int(model.cfg.d_model)
    if kind == "cross_layer_transcoder":
        layers = [_clt_layer(files[2 * i], files[2 * i + 1], i) for i in range(len(files) // 2)]
    else:
        layers = [_plt_layer(path) for path in files]
    n_layers = len(layers)
    if n_layers != n_model_layers:
        raise InputError(
            f"{location.folder}: {n_layers} layers of transcoders, but the loaded model {model.name!r} has "
            f"{n_model_layers} layers: these transcoders were made for another model"
            + (f" (config.yaml says {cfg['model_name']!r})" if cfg.get("model_name") else "")
            + ". Use a set with one transcoder per layer of this model."
        )
    d_transcoder = int(layers[0]["b_enc"].shape[0])
    for i, layer in enumerate(layers):
        expected = {"W_enc": (d_transcoder, d_model), "b_enc": (d_transcoder,), "b_dec": (d_model,)}
        expected["W_dec"] = (
            (d_transcoder, n_layers - i, d_model) if kind == "cross_layer_transcoder" else (d_transcoder, d_model)
        )
        if "threshold" in layer:
            expected["threshold"] = (d_transcoder,)
        if "skip" in layer:
            expected["skip"] = (d_model, d_model)
        for name, shape in expected.items():
            actual = tuple(layer[name].shape)
            if actual != shape:
                why = (
                    f"the loaded model {model.name!r} has d_model = {d_model}"
                    if d_model not in actual and name in ("W_enc", "b_dec")
                    else f"layer 0 has {d_transcoder} features"
                )
                raise InputError(
                    f"{location.folder}, layer {i}: tensor `{name}` has shape {list(actual)} but must be {list(shape)} "
                    f"({why}). The transcoders do not fit this model or their files do not belong together."
                )
            if not bool(torch.isfinite(layer[name]).all()):
                raise InputError(f"{location.folder}, layer {i}: tensor `{name}` has NaN or infinite entries.")
    thresholds = ["threshold" in layer for layer in layers]
    skips = ["skip" in layer for layer in layers]
    if len(set(thresholds)) > 1 or len(set(skips)) > 1:
        raise InputError(f"{location.folder}: some layers have a threshold (or a skip connection) and others not.")
    activation, k = _activation(cfg, thresholds[0], d_transcoder, where)
    input_hooks, output_hooks = _hooks(cfg, model, n_layers, where)
    device = model.device

    def stack(name: str) -> torch.Tensor:
        return torch.stack([layer[name] for layer in layers]).contiguous().to(device)

    if kind == "cross_layer_transcoder":
        decoders: Any = tuple(layer["W_dec"].contiguous().to(device) for layer in layers)
    else:
        decoders = stack("W_dec")
    model_name = cfg.get("model_name")
    cls: Any = TRANSCODER_KINDS[kind]  # each kind adds its own W_dec layout
    return cls(
        source=source,
        folder=str(location.folder),
        scan=str(cfg.get("scan") or location.scan),
        feature_input_hook=cfg["feature_input_hook"],
        feature_output_hook=cfg["feature_output_hook"],
        input_hooks=input_hooks,
        output_hooks=output_hooks,
        n_layers=n_layers,
        d_model=d_model,
        d_transcoder=d_transcoder,
        activation=activation,
        W_enc=stack("W_enc"),
        b_enc=stack("b_enc"),
        b_dec=stack("b_dec"),
        W_dec=decoders,
        threshold=stack("threshold") if thresholds[0] else None,
        k=k,
        W_skip=stack("skip") if skips[0] else None,
        model_name=model_name if isinstance(model_name, str) else None,
    )


def _model_notes(transcoders: Transcoders, model: LoadedModel) -> list[str]:
    notes = []
    if transcoders.model_name and not same_model(transcoders.model_name, model):
        notes.append(
            f"The transcoders' config.yaml names model {transcoders.model_name!r}, which does not look like the loaded "
            f"model {model.name!r}. Hub and local names of one model differ, so this is not an error; but transcoders "
            "of another model fit this one badly: check replacement_score and the error nodes' share."
        )
    return notes
