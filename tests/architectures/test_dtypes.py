"""Reduced precision on CPU: ``--dtype bfloat16`` and ``float16`` against float32 on the same weights.

The readouts, exact patching, attribution and circuit tools run on `tiny` (Llama, grouped-query attention) and
on the tiny GPT-NeoX (parallel block) loaded in each dtype; every number is compared with the float32 run, key
by key (heads, cells, edges, receivers by name). Metrics, sums and differences are accumulated in float32 or
float64, so what is left is the model's own rounding. Stated tolerances, on metrics of scale ≲ 2 (logit
differences), about twice the largest difference measured on these models:

* bfloat16 (8 significant bits): 0.05 — measured ≤ 2.0e-2 (the logit difference itself on `tiny`);
* float16 (11 significant bits): 0.01 — measured ≤ 2.7e-3.

OLMo-2 is refused below float32 at load: TransformerLens 4.3's attention bridge fails on its first forward.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from mcp import Client

from mcp_interp.core.circuits.faithfulness_job import CircuitFaithfulnessJob
from mcp_interp.core.circuits.job import EdgeAttributionJob
from mcp_interp.core.circuits.path import PathPatchJob
from mcp_interp.core.engine.backend.loader.load import load_model
from mcp_interp.core.engine.backend.model import LoadedModel
from mcp_interp.core.engine.jobs import drain
from mcp_interp.core.engine.text.tokens import encode
from mcp_interp.core.heads.patch_heads import PatchHeadsJob
from mcp_interp.core.localize.patch import PatchJob
from mcp_interp.core.readouts import predictions
from mcp_interp.errors import ModelLoadError
from mcp_interp.host import ModelHost
from mcp_interp.mcp.server import build_server
from tests.helpers import IOI_CLEAN, IOI_CORRECT, IOI_CORRUPT, IOI_INCORRECT, assert_valid_structured, tools_by_name

TOLERANCE = {"bfloat16": 0.05, "float16": 0.01}
CLEAN, CORRUPT, GOOD, BAD = IOI_CLEAN[:2], IOI_CORRUPT[:2], IOI_CORRECT[:2], IOI_INCORRECT[:2]
PAIRS = {"clean_prompts": CLEAN, "corrupt_prompts": CORRUPT, "correct": GOOD, "incorrect": BAD}


@pytest.fixture(scope="module")
def models(arch_folder: Callable[[str], Path]) -> Callable[[str, str], LoadedModel]:
    loaded: dict[tuple[str, str], LoadedModel] = {}

    def model(arch: str, dtype: str) -> LoadedModel:
        if (arch, dtype) not in loaded:
            loaded[(arch, dtype)] = load_model("tiny" if arch == "tiny" else str(arch_folder(arch)), dtype=dtype)
        return loaded[(arch, dtype)]

    return model


def measurements(model: LoadedModel, circuit: list[dict[str, str]]) -> dict[str, float]:
    """Every number compared, by a name that does not depend on ranking (which rounding may reorder)."""
    out: dict[str, float] = {}
    kw: dict[str, Any] = {"model": model, **PAIRS}
    diff = predictions.logit_diff(model, CLEAN, GOOD, BAD).logit_diff.per_example
    out |= {f"logit_diff {i}": v for i, v in enumerate(diff)}
    out |= {f"kl {i}": v for i, v in enumerate(predictions.kl(model, CLEAN, CORRUPT).kl.per_example)}
    log_probs = predictions.answer_rank(model, CLEAN, GOOD).log_prob.per_example
    out |= {f"log P {i}": v for i, v in enumerate(log_probs)}
    heads = drain(PatchHeadsJob(**kw)).patched_logit_diff
    out |= {
        f"patch_heads L{layer}H{h}": v for layer, row in enumerate(heads) for h, v in enumerate(row) if v is not None
    }
    for method in ("exact", "attribution"):
        grid = drain(PatchJob(**kw, component="resid_pre", method=method)).patched
        assert grid is not None
        out |= {f"resid_pre {method} {layer} {p}": v for layer, row in enumerate(grid) for p, v in enumerate(row)}
    edges = drain(EdgeAttributionJob(**kw, top_k=2000)).edges
    out |= {f"eap {e.writer}→{e.reader}": e.score for e in edges}
    receivers = drain(PathPatchJob(**kw, sender="L0H0")).receivers
    out |= {f"path L0H0→{r.receiver}": r.patched_logit_diff for r in receivers}
    faithful = drain(CircuitFaithfulnessJob(**kw, edges=circuit, random_circuits=19))
    clean, corrupt = faithful.clean_logit_diff.value, faithful.corrupt_logit_diff.value
    # The circuit's ablated metric (the recovered fraction's numerator + corrupt): a fraction divides the rounding
    # by the clean−corrupt gap, the metric itself is on the scale the tolerances are stated for.
    out["circuit metric"] = corrupt + faithful.faithfulness.value * (clean - corrupt)
    return out


@pytest.fixture(scope="module")
def reference(
    models: Callable[[str, str], LoadedModel],
) -> Callable[[str], tuple[list[dict[str, str]], dict[str, float]]]:
    """Per architecture, once: the float32 run's top-20 circuit (judged in every dtype) and its measurements."""
    done: dict[str, tuple[list[dict[str, str]], dict[str, float]]] = {}

    def of(arch: str) -> tuple[list[dict[str, str]], dict[str, float]]:
        if arch not in done:
            full = models(arch, "float32")
            top = drain(EdgeAttributionJob(model=full, **PAIRS, top_k=20)).edges
            circuit = [{"writer": e.writer, "reader": e.reader} for e in top]
            done[arch] = circuit, measurements(full, circuit)
        return done[arch]

    return of


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("arch", ["tiny", "neox"])
def test_reduced_precision_matches_float32(
    arch: str,
    dtype: str,
    models: Callable[[str, str], LoadedModel],
    reference: Callable[[str], tuple[list[dict[str, str]], dict[str, float]]],
) -> None:
    reduced = models(arch, dtype)
    assert next(reduced.bridge.parameters()).dtype == getattr(torch, dtype) and reduced.dtype == dtype
    circuit, expected = reference(arch)
    measured = measurements(reduced, circuit)
    assert set(measured) == set(expected)
    differences = {key: abs(measured[key] - expected[key]) for key in expected}
    worst = max(differences, key=lambda key: differences[key])
    assert differences[worst] < TOLERANCE[dtype], (worst, expected[worst], measured[worst])
    assert max(abs(v) for v in expected.values()) > 0.3, "the compared numbers must not all be ~0"
    assert differences[worst] > 0.0, "a reduced-precision run that equals float32 exactly was not reduced"


@pytest.mark.anyio
async def test_the_result_says_the_dtype(models: Callable[[str, str], LoadedModel], tmp_path: Path) -> None:
    model = models("neox", "bfloat16")
    session = ModelHost(model.name, tmp_path / "out", dtype="bfloat16", loader=lambda name, device, dtype: model)
    async with Client(build_server(session)) as client:
        tools = await tools_by_name(client)
        result = assert_valid_structured(tools["patch_heads"], await client.call_tool("patch_heads", PAIRS))
        info = assert_valid_structured(tools["model_info"], await client.call_tool("model_info", {}))
    assert result["model"]["dtype"] == "bfloat16" and info["dtype"] == "bfloat16"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_olmo2_below_float32_is_refused_at_load(dtype: str, arch_folder: Callable[[str], Path]) -> None:
    with pytest.raises(ModelLoadError, match=rf"--dtype {dtype} is not supported for olmo2 .* --dtype float32"):
        load_model(str(arch_folder("olmo2")), dtype=dtype)


def test_why_olmo2_is_refused_the_bridge_fails_in_bfloat16(arch_folder: Callable[[str], Path]) -> None:
    """Booted without the refusal, the first forward fails inside TransformerLens: when this test fails, the bug
    is fixed upstream and ``models.FLOAT32_ONLY`` can lose its OLMo-2 entry."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = str(arch_folder("olmo2"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="eager").eval()
    bridge = TransformerBridge.boot_transformers(folder, hf_model=hf, tokenizer=tokenizer, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="same dtype"), torch.no_grad():
        bridge(encode(tokenizer, CLEAN[:1]).input_ids)
