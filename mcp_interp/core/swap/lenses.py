"""Which lens the causal-swap protocol reads concepts with: the logit lens or a fitted Jacobian lens.

Both are TransformerLens ``JacobianLens`` objects, so every downstream step (dictionary,
sparse decomposition, coordinate patch) is the library's own code:

* ``logit`` — J = I at every source layer (blocks 0 … n_layers − 2): the atom of token t is
  the unembedding column ``W_U[:, t]``. Needs no fitting.
* ``jacobian`` — J_ℓ fitted here with ``JacobianLens.fit`` on an offline text corpus (by
  default the 48 paragraphs in ``mcp_interp/data/corpora/lens_corpus.json``, written for this project), one
  prompt at a time so the fit reports progress and can be cancelled; shards are combined with
  ``JacobianLens.merge`` (a prompt-weighted mean, exactly the full fit's average). The result is
  cached on disk, keyed by the model's weight fingerprint, the corpus hash and every fit setting,
  or loaded from a ``.pt`` file the user names (the reference artifact format).

A lens's identity (kind, SHA-256 of its file, corpus and settings) goes into every result and
artifact so a rate can be tied to the exact transport matrices that produced it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Generator, Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from mcp_interp.core.engine.backend import jacobian_lens
from mcp_interp.core.engine.backend.capabilities import require
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import Job
from mcp_interp.core.engine.text.tokens import adds_bos
from mcp_interp.corpora import corpora_dir
from mcp_interp.errors import InputError
from mcp_interp.schemas.swap import FitLensMeasurement, FitSettings, LensInfo
from mcp_interp.state.folders import cache_dir
from mcp_interp.state.paths import client_path

LENS_CORPUS = "lens_corpus"
LENS_FILE_SUFFIX = ".pt"


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no spaces, UTF-8: the byte string every fingerprint in this project hashes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def identity_lens(model: LoadedModel) -> tuple[Any, LensInfo]:
    """The protocol's ``lens="logit"``: a JacobianLens with J = I at every source layer, so atoms are unembedding
    columns. (Not ``core.lens.logit_lens``, the read-out tool that decodes each layer's residual.)"""
    layers = list(range(model.cfg.n_layers - 1))
    lens = jacobian_lens.unit_lens(model.backend, layers)
    info = LensInfo(kind="logit", sha256=None, path=None, source_layers=layers, settings={"J": "identity"})
    return lens, info


# --- fitting ----------------------------------------------------------------------------------


def shipped_texts() -> list[str]:
    data = json.loads((corpora_dir() / f"{LENS_CORPUS}.json").read_text(encoding="utf-8"))
    return [str(t) for t in data["texts"]]


def lens_folder() -> Path:
    return cache_dir() / "jacobian-lens"


class FitLensJob(Job[FitLensMeasurement]):
    """Fit (or find in the cache) a Jacobian lens; ``steps()`` yields once per fitted text."""

    def __init__(
        self,
        *,
        model: LoadedModel,
        settings: FitSettings,
        texts: Sequence[str] | None = None,
        corpus: str | None = None,
        force: bool = False,
    ) -> None:
        require(model.backend, "causal_swap")
        if texts is None:
            texts, corpus = shipped_texts(), LENS_CORPUS
        elif not texts or not all(isinstance(t, str) and t.strip() for t in texts):
            raise InputError("`texts` must be a non-empty list of non-empty strings (omit it for the shipped corpus).")
        if settings.max_seq_len <= settings.skip_first_positions + 1:
            raise InputError(
                f"max_seq_len ({settings.max_seq_len}) must exceed skip_first_positions + 1 "
                f"({settings.skip_first_positions + 1}): no position would be left to fit."
            )
        self.model = model
        self.settings = settings
        self.texts = list(texts)[: settings.max_prompts]
        self.corpus = corpus or "user-texts"
        self.corpus_sha256 = sha256_hex(canonical_json(self.texts))
        self.force = force
        n_layers = model.cfg.n_layers
        layers = settings.source_layers if settings.source_layers is not None else list(range(n_layers - 1))
        bad = [layer for layer in layers if not 0 <= layer < n_layers - 1]
        if not layers or bad:
            raise InputError(f"source_layers must be within 0..{n_layers - 2} (the last block is the target): {bad}.")
        self.layers = sorted(set(layers))
        # Fit on text tokenized by the same rule as every tool (core/engine/tokens.py): the library's fit
        # uses `to_tokens`, which prepends a BOS unless the bridge's default says otherwise.
        self.prepend_bos = adds_bos(model.tokenizer)
        self.path = lens_folder() / f"{model.fingerprint}-{self._key()}{LENS_FILE_SUFFIX}"
        self.info: LensInfo | None = None
        self.from_cache = False
        self.fit_seconds = 0.0
        self.skipped_short = 0

    @property
    def result(self) -> FitLensMeasurement | None:
        """The fitted (or cached) lens and what it cost; None until the last step has run."""
        if self.info is None:
            return None
        return FitLensMeasurement(
            lens=self.info,
            from_cache=self.from_cache,
            fit_seconds=round(self.fit_seconds, 3),
            skipped_short_texts=self.skipped_short,
        )

    def _key(self) -> str:
        settings = self.settings.model_dump() | {"source_layers": self.layers, "prepend_bos": self.prepend_bos}
        versions = {"transformer-lens": metadata.version("transformer-lens")}
        blob = {"corpus_sha256": self.corpus_sha256, "settings": settings, "versions": versions}
        return sha256_hex(canonical_json(blob))[:24]

    def cost(self) -> str:
        """What this fit costs, in words: passes per text and, for the embedded model, the time measured here."""
        d_model = int(self.model.cfg.d_model)
        backward = -(-d_model // self.settings.dim_batch)
        measured = (
            " (about 4 minutes for SmolLM2-135M on 2 CPU cores: 224 s measured)"
            if self.model.source == "embedded"
            else ""
        )
        return f"one forward and {backward} backward passes for each of {len(self.texts)} texts{measured}"

    def total_steps(self) -> int:
        return 1 if self.path.is_file() and not self.force else len(self.texts) + 1

    def steps(self) -> Iterator[str]:
        if self.path.is_file() and not self.force:
            self.from_cache = True
            _, self.info = load_lens_file(self.path, self.model)
            yield f"found a cached lens fitted on the same corpus and settings: {self.path}"
            return
        started = time.perf_counter()
        extra = {
            "mcp_interp": {
                "model_fingerprint": self.model.fingerprint,
                "model_name": self.model.name,
                "corpus_sha256": self.corpus_sha256,
                "prepend_bos": self.prepend_bos,
            }
        }
        merged = yield from self._fit_each(started, extra)
        self.fit_seconds = time.perf_counter() - started
        merged.metadata["mcp_interp"]["fit_seconds"] = round(self.fit_seconds, 1)
        merged.metadata["mcp_interp"]["skipped_short_texts"] = self.skipped_short
        save_lens_atomically(merged, self.path)
        _, self.info = load_lens_file(self.path, self.model)
        yield f"saved {self.path}"

    def _fit_each(self, started: float, extra: dict[str, Any]) -> Generator[str, None, Any]:
        """Fit one text at a time (progress, cancellation) and merge: the prompt-weighted mean."""
        merged: Any = None
        for i, text in enumerate(self.texts):
            try:
                shard = jacobian_lens.fit_shard(
                    self.model.backend,
                    text,
                    prepend_bos=self.prepend_bos,
                    corpus=self.corpus,
                    source_layers=self.layers,
                    dim_batch=self.settings.dim_batch,
                    max_seq_len=self.settings.max_seq_len,
                    skip_first_positions=self.settings.skip_first_positions,
                    metadata=extra,
                )
            except ValueError as exc:
                if "too short" not in str(exc):
                    raise
                self.skipped_short += 1
            else:
                merged = shard if merged is None else jacobian_lens.merge([merged, shard])
            yield f"fitted text {i + 1}/{len(self.texts)} ({time.perf_counter() - started:.0f} s)"
        if merged is None:
            raise InputError(
                f"Every text was too short to fit on: each needs more than {self.settings.skip_first_positions + 1} "
                "tokens (the first skip_first_positions and the last position are not used)."
            )
        return merged


def save_lens_atomically(lens: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=LENS_FILE_SUFFIX, dir=path.parent)
    os.close(fd)
    try:
        lens.save(tmp, dtype=torch.float32)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- loading ----------------------------------------------------------------------------------


def _read_lens(path: str) -> tuple[Any, str]:
    digest = sha256_hex(Path(path).read_bytes())
    return jacobian_lens.load(path), digest


def load_lens_file(path: Path, model: LoadedModel) -> tuple[Any, LensInfo]:
    """A lens from a ``.pt`` file, checked against the loaded model (width, layers, fingerprint)."""
    path = Path(path).expanduser()
    if path.suffix != LENS_FILE_SUFFIX or not path.is_file():
        raise InputError(f"No lens file at {str(path)!r}: pass the path of a .pt Jacobian-lens file (from fit_lens).")
    stat = path.stat()
    key = ("lens", str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    try:  # read once per (file, size, mtime) and kept with the model: a benchmark reuses it for every trial
        lens, digest = model.cache.get_or_load(key, lambda: _read_lens(str(path.resolve())), 2)
    except Exception as exc:  # a file that is no lens (pickle, zip or tensor errors): the client's input
        raise InputError(
            f"{str(path)!r} is not a readable Jacobian-lens file ({type(exc).__name__}: {str(exc)[:120]}); pass a .pt "
            "file written by fit_lens or TransformerLens' JacobianLens.save."
        ) from None
    try:
        jacobian_lens.validate(lens, model.backend)
    except (ValueError, TypeError, RuntimeError, KeyError) as exc:
        raise InputError(f"The lens file {str(path)!r} cannot be used with {model.name}: {exc}") from None
    ours = lens.metadata.get("mcp_interp", {})
    fitted_on = ours.get("model_fingerprint")
    if fitted_on is not None and fitted_on != model.fingerprint:
        raise InputError(
            f"The lens file {str(path)!r} was fitted on weights with fingerprint {fitted_on}, but the loaded model "
            f"{model.name} has {model.fingerprint}: fit a lens for this model with fit_lens."
        )
    settings = {k: v for k, v in lens.metadata.items() if k not in ("corpus", "n_prompts")}
    info = LensInfo(
        kind="jacobian",
        sha256=digest,
        path=str(path),
        source_layers=lens.source_layers,
        corpus=lens.metadata.get("corpus"),
        corpus_sha256=ours.get("corpus_sha256"),
        n_prompts=lens.n_prompts,
        settings=settings,
    )
    return lens, info


def newest_fitted_lens(model: LoadedModel) -> Path | None:
    """The most recently written lens in the cache fitted on exactly these weights."""
    folder = lens_folder()
    if not folder.is_dir():
        return None
    candidates = [p for p in folder.glob(f"{model.fingerprint}-*{LENS_FILE_SUFFIX}") if p.is_file()]
    return max(candidates, key=lambda p: p.stat().st_mtime_ns, default=None)


def default_fit(model: LoadedModel, kind: str, path: str | None = None) -> FitLensJob | None:
    """The fit a causal-swap run needs first: the default Jacobian lens, when ``lens="jacobian"`` names no file and
    none is cached for these weights (then the run fits it, with progress, and every later run reuses it)."""
    if kind == "jacobian" and path is None and newest_fitted_lens(model) is None:
        return FitLensJob(model=model, settings=FitSettings())
    return None


def resolve_lens(model: LoadedModel, kind: str, path: str | None = None) -> tuple[Any, LensInfo]:
    """The lens a causal-swap call asked for; a clear error when no Jacobian lens exists yet."""
    require(model.backend, "causal_swap")
    if kind == "logit":
        if path is not None:
            raise InputError("`lens_path` is only used with lens='jacobian'.")
        return identity_lens(model)
    if kind != "jacobian":
        raise InputError(f"Unknown lens {kind!r}: use 'logit' (no fitting) or 'jacobian'.")
    if path is not None:
        return load_lens_file(client_path(path, "lens_path"), model)
    found = newest_fitted_lens(model)
    if found is None:
        raise InputError(
            f"No Jacobian lens has been fitted for {model.name} (weights {model.fingerprint}) yet. Call `fit_lens` "
            "first (or `mcp-interp fit-lens`; about 4 minutes for the embedded model on 2 CPU cores), or pass "
            "`lens_path` to a lens file; lens='logit' needs no fitting."
        )
    return load_lens_file(found, model)
