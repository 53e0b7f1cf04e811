"""Sparse autoencoders (SAEs) in SAELens' on-disk format, read without SAELens (the math is ``dictionary``).

Why not SAELens itself: it pins ``transformer-lens < 4``, and this server runs TransformerLens 4's
``TransformerBridge``. The format is small enough to read with ``safetensors`` directly. The
reference is SAELens 6.18 (``sae_lens/saes/{sae,standard_sae,jumprelu_sae,topk_sae}.py``,
``sae_lens/loading/pretrained_sae_loaders.py``). A folder holds two files:

``cfg.json`` — the fields read (SAELens ≥ 6 name; older names, as renamed by SAELens'
``handle_pre_6_0_config``, in brackets). SAELens 6 keeps the model-related fields in a ``metadata``
object; older versions keep them at the top level; both places are read.

* ``architecture`` — ``"standard"``, ``"jumprelu"`` or ``"topk"`` (missing = ``"standard"``, as
  before 6.0). Refused: ``"gated"``, the transcoders, and training-only architectures.
* ``activation_fn`` [``activation_fn_str``] — before 6.0 the activation lived here: ``"relu"``, or
  ``"topk"`` with ``activation_fn_kwargs.k`` (read as architecture ``"topk"``); anything else is refused.
* ``d_in``, ``d_sae`` — the activation's width and the number of features.
* ``k`` [``activation_fn_kwargs.k``] — topk: features kept per token.
* ``rescale_acts_by_decoder_norm`` — topk: pre-activations are multiplied by each feature's ‖W_dec
  row‖ before the top-k and divided by it before decoding; folded into the weights at load (W_enc,
  b_enc × norm, W_dec ÷ norm), which is the same function.
* ``apply_b_dec_to_input`` — subtract b_dec from x before encoding (missing = true).
* ``normalize_activations`` — only ``"none"`` (or null/false) is accepted: the other modes need a
  scale that cfg.json does not carry (``expected_average_only_in``) or a per-token rescaling that
  makes decoding depend on the encoded input (``constant_norm_rescale``, ``layer_norm``).
* ``hook_name`` [``hook_point``] — the HookedTransformer hook the SAE was trained on, e.g.
  ``blocks.12.hook_resid_post``; mapped to this server's bridge hook (``bridge.site_hook``).
* ``hook_head_index`` [``hook_point_head_index``] — must be null (single-head SAEs are refused).
* ``model_name`` — compared with the loaded model's names; a mismatch is a note, not an error
  (hub and local names of one model differ), while a d_in or layer mismatch is an error.
* ``prepend_bos`` — whether training texts started with BOS; a note when this server's rule differs.
* ``dtype`` — ignored: weights are computed in float32 whatever their stored dtype.

``sae_weights.safetensors`` — ``W_enc`` [d_in, d_sae], ``b_enc`` [d_sae], ``W_dec`` [d_sae, d_in],
``b_dec`` [d_in]; JumpReLU adds ``threshold`` [d_sae] (a training checkpoint's ``log_threshold`` is
exponentiated, as SAELens does when saving); a pre-6.0 ``scaling_factor`` [d_sae]
(``finetuning_scaling_factor``) multiplies the activations before decoding and is folded into W_dec.

Where an SAE comes from: a local folder, or a Hugging Face hub id ``org/repo`` or ``org/repo/subfolder`` (a
repository of SAELens-format folders, one SAE per subfolder, as SAELens' releases are published) that is already
in the Hugging Face cache (``HF_HUB_CACHE``, the hub's own layout: ``models--org--repo/refs/main`` naming a
snapshot). A tool call never downloads: an id that is not cached is refused with the command that fetches it.
Loaded SAEs are cached with the model (``LoadedModel.cache``: it lives as long as the model, and the session
owns the model), keyed by the folder, the files' modification times and the device.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.backend.points import site_hook
from mcp_interp.core.engine.backend.sites import Site
from mcp_interp.core.engine.dictionaries.sae import ARCHITECTURES, SparseAutoencoder
from mcp_interp.core.engine.text.tokens import adds_bos
from mcp_interp.errors import InputError
from mcp_interp.state.paths import client_path, existing_inside

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
MAX_CACHED = 4  # SAEs kept in memory (a 16k-feature SAE on d_model 2304 is ~300 MB in float32)

# SAELens hook names (HookedTransformer's) → this project's patching sites. These strings are the
# format being parsed; the bridge's own hook names come from ``bridge.site_hook``.
_SAELENS_HOOK = re.compile(
    r"^blocks\.(\d+)\.(hook_resid_pre|hook_resid_mid|hook_resid_post|hook_attn_out|hook_mlp_out|attn\.hook_z"
    r"|mlp\.hook_post)$"
)
_SITE_OF: dict[str, Site] = {
    "hook_resid_pre": "resid_pre",
    "hook_resid_mid": "resid_mid",
    "hook_resid_post": "resid_post",
    "hook_attn_out": "attn_out",
    "hook_mlp_out": "mlp_out",
    "attn.hook_z": "z",
    "mlp.hook_post": "mlp_post",
}
# Sites some architectures or engines lack (``engine.capabilities``): no resid_mid in a parallel block, no neurons in
# an MoE; vLLM's driver serves neither z nor a block's input.
SITE_NEEDS = {"resid_mid": "sae_resid_mid", "mlp_post": "sae_mlp_post", "z": "sae_z", "resid_pre": "sae_resid_pre"}
_REFUSED_ARCHITECTURES = {
    "gated": "gated SAEs (separate gate and magnitude paths) are not implemented here",
    "transcoder": "a transcoder reads one hook and writes another; this tool reconstructs one activation",
    "skip_transcoder": "a transcoder reads one hook and writes another; this tool reconstructs one activation",
    "jumprelu_transcoder": "a transcoder reads one hook and writes another; this tool reconstructs one activation",
    "batchtopk": "batchtopk is a training architecture; SAELens saves trained BatchTopK SAEs as 'jumprelu'",
    "matryoshka_batchtopk": "a training architecture; SAELens saves trained BatchTopK SAEs as 'jumprelu'",
}


def load_sae(folder: str, model: LoadedModel) -> SparseAutoencoder:
    """The SAE in ``folder`` (SAELens format), checked against ``model``, on the model's device.

    Errors (``InputError``, naming the cfg.json field or file): not a local folder, a missing file,
    an unsupported architecture or setting, a hook this model lacks, a ``d_in`` that is not the
    hook's width. A ``model_name`` that does not look like the loaded model's is a note in ``notes``.
    Repeated loads of an unchanged folder come from the model's cache.
    """
    require(model.backend, "dictionaries")
    path = resolve_folder(folder)
    cfg_path, weights_path = path / CFG_FILE, path / WEIGHTS_FILE
    cfg_stat, weights_stat = cfg_path.stat(), weights_path.stat()
    key = ("sae", str(path), cfg_stat.st_mtime_ns, weights_stat.st_mtime_ns, weights_stat.st_size, str(model.device))

    def read() -> SparseAutoencoder:
        try:
            return _read(path, model.device)
        except OSError as exc:
            raise InputError(f"`sae` {folder!r}: its files cannot be read ({exc.strerror or exc}).") from None

    sae = model.cache.get_or_load(key, read, MAX_CACHED)
    return replace(sae, notes=tuple(_check_against(sae, model)))


def resolve_folder(folder: str) -> Path:
    """The SAE folder as an absolute path, or an InputError saying what to pass instead (also for a path the
    server may not read: permissions are the client's problem to fix, not an internal error)."""
    try:
        return _resolve_folder(folder)
    except OSError as exc:
        raise InputError(f"`sae` {folder!r} cannot be read on this machine ({exc.strerror or exc}).") from None


# A hub id: org/repo, optionally /subfolder/… (names as the hub allows them). No part may be "." or "..": the
# subfolder is joined to the cached snapshot, and must stay inside it.
_HUB_ID = re.compile(r"^(?!.*(^|/)\.{1,2}(/|$))[A-Za-z0-9][\w.-]*/[\w.-]+(/[\w.-]+)*$")


def download_command(repo: str, subfolder: str) -> str:
    """The shell command that puts hub SAE ``repo``/``subfolder`` into the Hugging Face cache."""
    include = f" --include '{subfolder}/*'" if subfolder else ""
    return f"huggingface-cli download {repo}{include}"


def hub_cached_folder(spec: str) -> Path:
    """The cached snapshot folder of hub id ``org/repo[/subfolder]`` holding the SAE's files; an InputError
    with the download command when it is not in the Hugging Face cache. Never contacts the hub."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    parts = spec.strip("/").split("/")
    repo, subfolder = "/".join(parts[:2]), "/".join(parts[2:])
    fix = (
        f"Download it where there is internet with `{download_command(repo, subfolder)}` (into the cache this server "
        f"reads, HF_HUB_CACHE = {constants.HF_HUB_CACHE}), then call again; or pass a local folder in SAELens' format "
        f"({CFG_FILE} + {WEIGHTS_FILE}). A SAELens release name is not a hub repository: SAELens' "
        "`SAE.from_pretrained(release, sae_id).save_model(folder)` writes such a folder."
    )
    patterns = [f"{subfolder}/*"] if subfolder else None
    try:
        snapshot = Path(snapshot_download(repo, allow_patterns=patterns, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        raise InputError(
            f"`sae` {spec!r} is neither a folder on this machine nor a hub repository in the Hugging Face cache "
            f"(the server never downloads during a call). {fix}"
        ) from None
    path = snapshot / subfolder if subfolder else snapshot
    if not path.resolve().is_relative_to(snapshot.resolve()):  # a symlink pointing out of the snapshot
        raise InputError(f"`sae` {spec!r}: the subfolder leaves the cached snapshot of {repo}; name one inside it.")
    if not (path / CFG_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
        inner = _folders_with_cfg(path if path.is_dir() else snapshot)
        hint = f" Its cached subfolders with an SAE: {inner}." if inner else ""
        raise InputError(
            f"`sae` {spec!r}: the cached snapshot of {repo} has no {CFG_FILE} and {WEIGHTS_FILE} "
            f"{'in ' + repr(subfolder) if subfolder else 'at its top level'}.{hint} {fix}"
        )
    return path


def _resolve_folder(folder: str) -> Path:
    if not isinstance(folder, str) or not folder.strip():
        raise InputError(
            f"`sae` must be a local SAE folder (SAELens format) or a cached hub id 'org/repo[/subfolder]', got "
            f"{folder!r}."
        )
    if _HUB_ID.match(folder.strip()) and existing_inside(folder) is None:  # no look outside the roots
        return hub_cached_folder(folder.strip()).resolve()  # the hub cache: an allowed root
    path = client_path(folder, "sae")  # outside the allowed roots: one refusal, whatever is there
    if path.is_file():
        known = path.name in (CFG_FILE, WEIGHTS_FILE)
        hint = f" Pass the folder that contains it: {str(path.resolve().parent)!r}." if known else ""
        raise InputError(
            f"`sae` {folder!r} is a file; it must be a folder holding {CFG_FILE} and {WEIGHTS_FILE} (SAELens' "
            f"format).{hint}"
        )
    if not path.is_dir():
        raise InputError(
            f"`sae` {folder!r} is not a folder on this machine, nor a hub id 'org/repo[/subfolder]'. Pass a local "
            f"folder in SAELens' format ({CFG_FILE} + {WEIGHTS_FILE}) or a hub id already in the Hugging Face cache "
            "(e.g. after `huggingface-cli download <org/repo> --include '<subfolder>/*'`, or SAELens' "
            "`SAE.from_pretrained(release, sae_id).save_model(folder)`)."
        )
    path = path.resolve()
    if not (path / CFG_FILE).is_file():
        inner = _folders_with_cfg(path)
        hint = (
            f" Its subfolders {inner} have one: pass one of them (a hub repository holds one SAE per subfolder)."
            if inner
            else f" An SAE folder in SAELens' format holds {CFG_FILE} and {WEIGHTS_FILE}."
        )
        raise InputError(f"SAE folder {str(path)!r} has no {CFG_FILE}.{hint}")
    if not (path / WEIGHTS_FILE).is_file():
        others = sorted(p.name for p in path.glob("*.safetensors"))[:5]
        hint = (
            f" It has {others}: that is not SAELens' format (EleutherAI's sparsify saves 'sae.safetensors'); load it "
            "with its own library and save it with SAELens' `save_model`."
            if others
            else ""
        )
        raise InputError(f"SAE folder {str(path)!r} has {CFG_FILE} but no {WEIGHTS_FILE} (the weights).{hint}")
    return path


def _folders_with_cfg(path: Path) -> list[str]:
    found: list[str] = []
    for i, child in enumerate(sorted(path.iterdir())):
        if i >= 500 or len(found) >= 5:
            break
        if child.is_dir() and (child / CFG_FILE).is_file():
            found.append(child.name)
    return found


def _read(path: Path, device: str) -> SparseAutoencoder:
    cfg = _read_cfg(path / CFG_FILE)
    where = f"{path / CFG_FILE}"
    architecture, k = _architecture(cfg, where)
    d_in, d_sae = _positive_int(cfg, "d_in", where), _positive_int(cfg, "d_sae", where)
    if k is not None and not 1 <= k <= d_sae:
        raise InputError(f"{where}: topk `k` = {k} must be between 1 and d_sae = {d_sae}.")
    normalize = cfg.get("normalize_activations", "none")
    if normalize not in ("none", None, False):
        raise InputError(
            f"{where}: `normalize_activations` = {normalize!r} is not supported (only 'none'): "
            + (
                "its scale factor is not stored in cfg.json. Fold it into the weights (SAELens: "
                "`sae.fold_activation_norm_scaling_factor(f)`), save, and pass that folder."
                if normalize in ("expected_average_only_in", True)
                else "the SAE rescales each token before encoding, so decoding depends on the input; "
                "this tool only runs SAEs that act on the raw activation."
            )
        )
    head_index = _meta(cfg, "hook_head_index", "hook_point_head_index")
    if head_index is not None:
        raise InputError(
            f"{where}: `hook_head_index` = {head_index!r}: SAEs trained on a single attention head are not supported "
            "(use an SAE on a whole hook, e.g. blocks.L.attn.hook_z or blocks.L.hook_resid_post)."
        )
    hook = _meta(cfg, "hook_name", "hook_point")
    if not isinstance(hook, str):
        raise InputError(f"{where}: `hook_name` (or `hook_point`) is missing or not a string ({hook!r}).")
    match = _SAELENS_HOOK.match(hook)
    if match is None:
        raise InputError(
            f"{where}: `hook_name` = {hook!r} is not a hook this tool can map to the model. Supported: "
            "blocks.L.hook_resid_pre, blocks.L.hook_resid_mid, blocks.L.hook_resid_post, blocks.L.hook_attn_out, "
            "blocks.L.hook_mlp_out, blocks.L.attn.hook_z, blocks.L.mlp.hook_post."
        )
    reshape = cfg.get("reshape_activations", "none")
    if reshape not in ("none", None, "hook_z"):
        raise InputError(f"{where}: `reshape_activations` = {reshape!r} is not supported ('none' or 'hook_z').")
    layer, site = int(match.group(1)), _SITE_OF[match.group(2)]
    apply_b_dec = cfg.get("apply_b_dec_to_input", True)
    if not isinstance(apply_b_dec, bool):
        raise InputError(f"{where}: `apply_b_dec_to_input` = {apply_b_dec!r} must be true or false.")
    model_name = _meta(cfg, "model_name")
    prepend_bos = _meta(cfg, "prepend_bos")

    weights = _read_weights(path / WEIGHTS_FILE, architecture)
    shapes = {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_in), "b_dec": (d_in,)}
    if architecture == "jumprelu":
        shapes["threshold"] = (d_sae,)
    if "scaling_factor" in weights:
        shapes["scaling_factor"] = (d_sae,)
    for name, shape in shapes.items():
        if tuple(weights[name].shape) != shape:
            raise InputError(
                f"{path / WEIGHTS_FILE}: tensor `{name}` has shape {list(weights[name].shape)} but cfg.json's d_in = "
                f"{d_in}, d_sae = {d_sae} make it {list(shape)}. The two files do not belong together."
            )
        if not bool(torch.isfinite(weights[name]).all()):
            raise InputError(f"{path / WEIGHTS_FILE}: tensor `{name}` has NaN or infinite entries.")
    W_enc, b_enc, W_dec, b_dec = weights["W_enc"], weights["b_enc"], weights["W_dec"], weights["b_dec"]
    if "scaling_factor" in weights:  # decode(a · s) = decode'(a) with W_dec' = diag(s) W_dec
        W_dec = W_dec * weights["scaling_factor"].unsqueeze(1)
    if architecture == "topk" and cfg.get("rescale_acts_by_decoder_norm", False):
        norms = W_dec.norm(dim=1)
        W_enc, b_enc = W_enc * norms, b_enc * norms
        W_dec = W_dec / torch.where(norms > 0, norms, torch.ones_like(norms)).unsqueeze(1)
    extra: dict[str, Any] = {}
    if architecture == "jumprelu":
        extra["threshold"] = weights["threshold"].to(device)
    if architecture == "topk":
        extra["k"] = k
    return ARCHITECTURES[architecture](
        folder=str(path),
        saelens_hook=hook,
        site=site,
        layer=layer,
        hook_name=site_hook(site, layer),
        d_in=d_in,
        d_sae=d_sae,
        W_enc=W_enc.contiguous().to(device),
        b_enc=b_enc.to(device),
        W_dec=W_dec.contiguous().to(device),
        b_dec=b_dec.to(device),
        apply_b_dec_to_input=apply_b_dec,
        model_name=model_name if isinstance(model_name, str) else None,
        prepend_bos=prepend_bos if isinstance(prepend_bos, bool) else None,
        **extra,
    )


def _read_cfg(path: Path) -> dict[str, Any]:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path} is not valid JSON ({error}); it must be SAELens' cfg.json.") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path} must hold a JSON object (SAELens' cfg.json), got {type(cfg).__name__}.")
    return cfg


def _meta(cfg: dict[str, Any], name: str, older: str | None = None) -> Any:
    """A model-related field: SAELens ≥ 6 keeps it in ``metadata``, older versions at the top level."""
    metadata = cfg.get("metadata")
    for source in (metadata if isinstance(metadata, dict) else {}, cfg):
        for key in (name, older):
            if key is not None and source.get(key) is not None:
                return source[key]
    return None


def _positive_int(cfg: dict[str, Any], name: str, where: str) -> int:
    value = cfg.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{where}: `{name}` must be a positive integer, got {value!r}.")
    return value


def _architecture(cfg: dict[str, Any], where: str) -> tuple[str, int | None]:
    """The architecture and topk's k, with pre-6.0 configs (activation in ``activation_fn[_str]``) mapped."""
    architecture = cfg.get("architecture", "standard")
    activation = cfg.get("activation_fn", cfg.get("activation_fn_str", "relu"))
    kwargs = cfg.get("activation_fn_kwargs") or {}
    if architecture == "standard" and activation == "topk" and isinstance(kwargs, dict) and "k" in kwargs:
        architecture = "topk"
    if architecture in _REFUSED_ARCHITECTURES:
        raise InputError(
            f"{where}: `architecture` = {architecture!r} is not supported ({_REFUSED_ARCHITECTURES[architecture]}). "
            "Supported: 'standard' (ReLU), 'jumprelu', 'topk'."
        )
    if architecture not in ARCHITECTURES:
        raise InputError(
            f"{where}: unknown `architecture` = {architecture!r}. Supported: 'standard' (ReLU), 'jumprelu', 'topk'."
        )
    if architecture == "standard" and activation not in ("relu", None):
        raise InputError(
            f"{where}: `activation_fn` = {activation!r} is not supported for a standard SAE (only 'relu', or 'topk' "
            "with activation_fn_kwargs.k)."
        )
    if architecture != "topk":
        return architecture, None
    k = cfg.get("k", kwargs.get("k") if isinstance(kwargs, dict) else None)
    if isinstance(k, float) and k.is_integer():
        k = int(k)
    if isinstance(k, bool) or not isinstance(k, int):
        raise InputError(f"{where}: a topk SAE needs an integer `k` (features per token), got {k!r}.")
    return "topk", k


def _read_weights(path: Path, architecture: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError, safe_open

    wanted = ["W_enc", "b_enc", "W_dec", "b_dec"]
    weights: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            present = set(f.keys())
            if architecture == "jumprelu" and "threshold" not in present:
                if "log_threshold" not in present:
                    raise InputError(
                        f"{path}: a jumprelu SAE needs the tensor `threshold` [d_sae]; the file has "
                        f"{sorted(present)[:12]}."
                    )
                weights["threshold"] = torch.exp(f.get_tensor("log_threshold").to(torch.float32))
            elif architecture == "jumprelu":
                wanted.append("threshold")
            missing = [name for name in wanted if name not in present]
            if missing:
                raise InputError(
                    f"{path}: tensor `{missing[0]}` is missing (SAELens' format has W_enc [d_in, d_sae], "
                    f"b_enc [d_sae], W_dec [d_sae, d_in], b_dec [d_in]); the file has {sorted(present)[:12]}."
                )
            for name in wanted:
                weights[name] = f.get_tensor(name).to(torch.float32)
            if "scaling_factor" in present:
                scale = f.get_tensor("scaling_factor").to(torch.float32)
                if not bool((scale == 1).all()):  # all ones: SAELens drops it too
                    weights["scaling_factor"] = scale
    except SafetensorError as error:
        raise InputError(f"{path} could not be read as a safetensors file ({error}).") from None
    return weights


def hook_width(model: LoadedModel, site: Site) -> tuple[int, str]:
    """The width of a site's activation on ``model`` and what it is, e.g. (576, 'd_model')."""
    cfg = model.cfg
    if site == "z":
        return int(cfg.n_heads) * int(cfg.d_head), "n_heads × d_head"
    if site == "mlp_post":
        return int(cfg.d_mlp), "d_mlp"
    return int(cfg.d_model), "d_model"


def _check_against(sae: SparseAutoencoder, model: LoadedModel) -> list[str]:
    """Errors for an SAE that cannot run on ``model``; the notes for one that can."""
    if sae.site in SITE_NEEDS:
        require(model.backend, SITE_NEEDS[sae.site])
    trained_on = f" (cfg.json says it was trained on {sae.model_name!r})" if sae.model_name else ""
    n_layers = int(model.cfg.n_layers)
    if not 0 <= sae.layer < n_layers:
        raise InputError(
            f"The SAE's `hook_name` {sae.saelens_hook!r} names layer {sae.layer}, but the loaded model "
            f"{model.name!r} has layers 0..{n_layers - 1}: the SAE was trained for another model{trained_on}. Use an "
            "SAE trained on this model."
        )
    width, what = hook_width(model, sae.site)
    if sae.d_in != width:
        raise InputError(
            f"The SAE's `d_in` = {sae.d_in} but {sae.saelens_hook} on the loaded model {model.name!r} has width "
            f"{width} ({what}): the SAE was trained for another model{trained_on}. Use an SAE trained on this model."
        )
    notes = []
    if sae.model_name and not same_model(sae.model_name, model):
        notes.append(
            f"The SAE's cfg.json names model {sae.model_name!r}, which does not look like the loaded model "
            f"{model.name!r}. Hub and local names of one model differ, so this is not an error; but if the SAE "
            "belongs to another model (e.g. a base model's SAE on an instruct model), its features mean little here: "
            "check fraction_variance_explained and loss_recovered."
        )
    if sae.prepend_bos and not adds_bos(model.tokenizer):
        notes.append(
            "The SAE was trained on texts that start with a BOS token (prepend_bos in cfg.json), but this server's "
            "tokenization adds none for this model: the first tokens may be off the SAE's training distribution."
        )
    return notes


def _normalise_name(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.rsplit("/", 1)[-1].lower())


def same_model(sae_model: str, model: LoadedModel) -> bool:
    """Whether a dictionary's recorded model name looks like the loaded model's (case and punctuation ignored)."""
    config = model.backend.hf_config()
    names = [model.name, getattr(model.cfg, "model_name", None), getattr(config, "_name_or_path", None)]
    wanted = _normalise_name(sae_model)
    return any(isinstance(n, str) and n and _normalise_name(n) == wanted for n in names)
