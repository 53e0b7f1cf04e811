"""The loaded model: the backend every measurement runs through, what a result says about where its numbers came from,
and what is cached with it (``ModelCache``). Built by ``loader``; every family receives one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mcp_interp.core.engine.backend.base import Backend
from mcp_interp.core.engine.backend.options import LoadOptions
from mcp_interp.schemas.common import ModelSource

T = TypeVar("T")


class ModelCache:
    """What is loaded for one model and lives as long as it (SAEs, transcoders, lenses), least recently used
    evicted first within each kind (a key's first element), thread-safe.

    Why here and not module-global: a cached dictionary is only valid for the weights and device it was
    loaded for, so the cache belongs to the model — and the session, which owns the model, owns it.
    """

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[Hashable, ...], Any] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_load(self, key: tuple[Hashable, ...], load: Callable[[], T], max_entries: int) -> T:
        """The entry under ``key``, loaded with ``load()`` on a miss; keeps at most ``max_entries`` of its kind."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        value = load()
        with self._lock:
            self._entries[key] = value
            same_kind = [k for k in self._entries if k[0] == key[0]]
            for stale in same_kind[: max(0, len(same_kind) - max_entries)]:
                del self._entries[stale]
        return value

    def peek(self, key: tuple[Hashable, ...]) -> Any:
        """The entry under ``key`` (now the most recently used), or None; never loads."""
        with self._lock:
            if key not in self._entries:
                return None
            self._entries.move_to_end(key)
            return self._entries[key]

    def put(self, key: tuple[Hashable, ...], value: Any, max_entries: int) -> None:
        """Keep ``value`` under ``key`` (what ``get_or_load`` does after a load, for values built step by step)."""
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            same_kind = [k for k in self._entries if k[0] == key[0]]
            for stale in same_kind[: max(0, len(same_kind) - max_entries)]:
                del self._entries[stale]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


@dataclass
class LoadedModel:
    """A booted model plus what a result needs to say where its numbers came from, and what is cached with it.

    ``backend`` is the seam every measurement runs the model through (``core/engine/backend``): the package never
    touches the TransformerBridge itself. ``bridge`` is that bridge, for tests and reference implementations.
    """

    name: str
    source: ModelSource
    backend: Backend
    tokenizer: Any  # transformers.PreTrainedTokenizerBase
    device: str
    dtype: str
    load_seconds: float
    fingerprint: str
    cache: ModelCache = field(default_factory=ModelCache, compare=False, repr=False)
    options: LoadOptions = field(default_factory=LoadOptions, compare=False)

    @property
    def bridge(self) -> Any:
        """The TransformerLens bridge behind the backend (for tests and references, never for measurements)."""
        return self.backend.bridge

    @property
    def cfg(self) -> Any:
        """TransformerLens' config of the model: ``n_layers``, ``n_heads``, ``d_model``, ``d_mlp``, ``d_vocab``…"""
        return self.backend.cfg
