"""TransformerLens' own patching on SmolLM2: the references the heads and localize families are held to.

Computed with TransformerLens' ``patching`` functions on the bridge directly — no mcp-interp engine code —
so they are independent of what they check. ``scripts/make_golden.py`` runs every reference once and stores
the numbers (with the versions, the weights' fingerprint and the inputs) in ``tests/golden/``; the tests
compare against that file, and one live comparison per family (marker ``live_reference``) reruns
TransformerLens on a slice so a drift in either library is still caught.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from transformer_lens import patching

from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.corpora import ioi_pairs

GOLDEN = Path(__file__).resolve().parent / "golden" / "smollm2_transformer_lens.json"
PAIRS = ioi_pairs()[:2]  # two pairs keep TransformerLens' one forward per cell affordable
CLEAN, CORRUPT = [p.clean for p in PAIRS], [p.corrupt for p in PAIRS]
CORRECT, INCORRECT = [p.correct for p in PAIRS], [p.incorrect for p in PAIRS]
HEADS_BY_POS_LAYERS = [0, 14, 29]
RESID_MID_LAYERS = [3, 20]
TOLERANCE = 1e-4  # max |patched logit difference − TransformerLens'|, float32 on CPU


@dataclass
class Setting:
    """The pairs tokenized exactly as TransformerLens sees them, the metric, and both runs' caches."""

    corrupt_ids: torch.Tensor
    metric: Any
    clean_cache: Any
    corrupt_cache: Any
    first: int  # first position where any pair differs
    width: int


def setting(
    model: LoadedModel,
    clean_texts: list[str] = CLEAN,
    corrupt_texts: list[str] = CORRUPT,
    correct: list[str] = CORRECT,
    incorrect: list[str] = INCORRECT,
) -> Setting:
    """The reference pairs (the first two IOI pairs unless others are given), as TransformerLens sees them."""
    tokenizer = model.tokenizer
    clean = [tokenizer(text).input_ids for text in clean_texts]
    corrupt = [tokenizer(text).input_ids for text in corrupt_texts]
    assert len({len(ids) for ids in clean + corrupt}) == 1, "the reference pairs are unpadded"
    clean_ids, corrupt_ids = torch.tensor(clean), torch.tensor(corrupt)
    good = torch.tensor([tokenizer(c, add_special_tokens=False).input_ids[0] for c in correct])
    bad = torch.tensor([tokenizer(c, add_special_tokens=False).input_ids[0] for c in incorrect])

    def metric(logits: torch.Tensor) -> torch.Tensor:
        final = logits[:, -1]
        return (final.gather(1, good[:, None]) - final.gather(1, bad[:, None])).mean()

    _, clean_cache = model.bridge.run_with_cache(clean_ids)
    _, corrupt_cache = model.bridge.run_with_cache(corrupt_ids)
    first = int((clean_ids != corrupt_ids).any(dim=0).nonzero().min())
    return Setting(corrupt_ids, metric, clean_cache, corrupt_cache, first, clean_ids.shape[1])


def cells(s: Setting, layers: list[int], n_heads: int = 0) -> pd.DataFrame:
    """(layer, pos[, head]) rows from the first differing position on: the only cells patching runs
    (earlier ones are no-ops, scored 0 without a run; checked on `tiny` against all positions)."""
    rows = [
        (layer, pos, *((head,) if n_heads else ()))
        for layer in layers
        for pos in range(s.first, s.width)
        for head in (range(n_heads) if n_heads else [None])
    ]
    return pd.DataFrame(rows, columns=["layer", "pos", "head"] if n_heads else ["layer", "pos"])


BLOCK_FUNCTIONS = {
    "resid_pre": patching.get_act_patch_resid_pre,
    "attn_out": patching.get_act_patch_attn_out,
    "mlp_out": patching.get_act_patch_mlp_out,
}


def block_reference(model: LoadedModel, s: Setting, component: str, layers: list[int]) -> tuple[list, list]:  # type: ignore[type-arg]
    index = cells(s, layers)
    values = BLOCK_FUNCTIONS[component](
        model.bridge, s.corrupt_ids, s.clean_cache, s.metric, index_axis_names=None, index_df=index
    )
    return index.values.tolist(), values.double().tolist()


def heads_by_pos_reference(model: LoadedModel, s: Setting, layers: list[int]) -> tuple[list, list]:  # type: ignore[type-arg]
    index = cells(s, layers, model.bridge.cfg.n_heads)
    values = patching.get_act_patch_attn_head_out_by_pos(
        model.bridge, s.corrupt_ids, s.clean_cache, s.metric, index_axis_names=None, index_df=index
    )
    return index.values.tolist(), values.double().tolist()


def resid_mid_reference(model: LoadedModel, s: Setting, layers: list[int]) -> tuple[list, list]:  # type: ignore[type-arg]
    """resid_mid carried on, through TransformerLens' own patcher: attn_out := clean resid_mid − corrupt resid_pre
    (the bridge's hook_resid_mid only feeds the MLP, so a value written there would not reach the stream)."""
    wanted = {
        f"blocks.{layer}.hook_attn_out": s.clean_cache[f"blocks.{layer}.hook_resid_mid"]
        - s.corrupt_cache[f"blocks.{layer}.hook_resid_pre"]
        for layer in layers
    }
    index = pd.concat([cells(s, [layer]) for layer in layers])
    values = patching.generic_activation_patch(
        model.bridge, s.corrupt_ids, wanted, s.metric,  # type: ignore[arg-type]
        patch_setter=patching.layer_pos_patch_setter, activation_name="attn_out", index_df=index,
    )  # fmt: skip
    return index.values.tolist(), values.double().tolist()


def heads_all_positions_reference(model: LoadedModel, s: Setting, layers: list[int] | None = None) -> tuple[list, list]:  # type: ignore[type-arg]
    """Each head's output patched at every position: rows (layer, head)."""
    cfg = model.bridge.cfg
    chosen = range(cfg.n_layers) if layers is None else layers
    index = pd.DataFrame([(layer, head) for layer in chosen for head in range(cfg.n_heads)], columns=["layer", "head"])
    values = patching.get_act_patch_attn_head_out_all_pos(
        model.bridge, s.corrupt_ids, s.clean_cache, s.metric, index_axis_names=None, index_df=index
    )
    return index.values.tolist(), values.double().tolist()


def versions() -> dict[str, str]:
    return {name: metadata.version(name) for name in ("transformer-lens", "transformers", "torch")}


def compute_all(model: LoadedModel) -> dict[str, Any]:
    """Every reference, as the golden file stores it."""
    s = setting(model)
    n_layers = list(range(model.bridge.cfg.n_layers))
    references = {component: block_reference(model, s, component, n_layers) for component in BLOCK_FUNCTIONS}
    references["heads_by_pos"] = heads_by_pos_reference(model, s, HEADS_BY_POS_LAYERS)
    references["resid_mid"] = resid_mid_reference(model, s, RESID_MID_LAYERS)
    references["heads_all_positions"] = heads_all_positions_reference(model, s)
    return {
        "about": "TransformerLens patching references on SmolLM2 for tests/heads and tests/localize; "
        "regenerate with `./run golden` (scripts/make_golden.py).",
        "versions": versions(),
        "model": {"name": model.name, "fingerprint": model.fingerprint, "dtype": model.dtype},
        "inputs": {"clean": CLEAN, "corrupt": CORRUPT, "correct": CORRECT, "incorrect": INCORRECT},
        "references": {name: {"index": index, "values": values} for name, (index, values) in references.items()},
    }


def golden(model: LoadedModel) -> dict[str, Any]:
    """The stored references, checked to belong to these weights and these inputs."""
    data = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert data["model"]["fingerprint"] == model.fingerprint, (
        f"{GOLDEN.name} was made on weights {data['model']['fingerprint']}, not the loaded {model.fingerprint}: "
        "regenerate it with `./run golden`."
    )
    assert data["inputs"] == {"clean": CLEAN, "corrupt": CORRUPT, "correct": CORRECT, "incorrect": INCORRECT}
    return data["references"]  # type: ignore[no-any-return]
