"""TransformerLens' Jacobian lens tools, called with the model they need: the causal-swap protocol's lenses.

The library's ``JacobianLens`` fits transport matrices by running the model forward and backward, and reads its
dictionary of lens vectors from the model's unembedding; ``solve_coordinate_patch`` edits an activation in that
dictionary. They take the bridge itself, so they are called here, inside the seam, with the local backend's
bridge: the swap family keeps using the library's own code without ever holding the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def unit_lens(backend: Any, layers: Sequence[int]) -> Any:
    """A ``JacobianLens`` with J = I at ``layers``: its atom of token t is the unembedding column ``W_U[:, t]``."""
    from transformer_lens.tools.analysis.jacobian_lens import JacobianLens

    d_model = int(backend.cfg.d_model)
    return JacobianLens(dict.fromkeys(layers, torch.eye(d_model)), n_prompts=0, d_model=d_model)


def fit_shard(backend: Any, text: str, *, prepend_bos: bool, **settings: Any) -> Any:
    """``JacobianLens.fit`` on one text (``settings``: corpus, source_layers, dim_batch, max_seq_len,
    skip_first_positions, metadata), with the bridge's BOS default set to ``prepend_bos`` for the fit (the library
    tokenizes with ``to_tokens``) and restored after."""
    from transformer_lens.tools.analysis.jacobian_lens import JacobianLens

    cfg = backend.lens_bridge().cfg
    saved = cfg.default_prepend_bos
    cfg.default_prepend_bos = prepend_bos
    try:
        return JacobianLens.fit(backend.lens_bridge(), [text], show_progress=False, **settings)
    finally:
        cfg.default_prepend_bos = saved


def merge(lenses: Sequence[Any]) -> Any:
    """``JacobianLens.merge``: the prompt-weighted mean of fitted shards."""
    from transformer_lens.tools.analysis.jacobian_lens import JacobianLens

    return JacobianLens.merge(list(lenses))


def load(path: str) -> Any:
    from transformer_lens.tools.analysis.jacobian_lens import JacobianLens

    return JacobianLens.load(path)


def validate(lens: Any, backend: Any) -> None:
    """The library's check that ``lens`` fits the model (width, layers); raises what it raises."""
    lens.validate_model(backend.lens_bridge())


def dictionary(lens: Any, backend: Any, layer: int) -> torch.Tensor:
    """The lens vectors of every token at ``layer``, ``[vocab, d_model]``."""
    return lens.lens_vector_dictionary(backend.lens_bridge(), layer)


def decompose(lens: Any, backend: Any, x: torch.Tensor, layer: int, k: int) -> Any:
    """The library's sparse decomposition of activation ``x`` in the lens vectors of ``layer`` (``k`` atoms)."""
    return lens.decompose(backend.lens_bridge(), x, layer, k=k)


def coordinate_patch(x: torch.Tensor, vectors: torch.Tensor, source: int, target: int, **settings: Any) -> Any:
    """``solve_coordinate_patch``: the edit moving ``x``'s coordinate on ``source`` to ``target``."""
    from transformer_lens.tools.analysis.jacobian_lens_coordinate_patch import solve_coordinate_patch

    return solve_coordinate_patch(x, vectors, source, target, **settings)
