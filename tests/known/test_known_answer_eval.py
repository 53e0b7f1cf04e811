"""The Inspect task ``mcp_interp/known_answer`` end to end: Inspect's own MCP client serving a compiled program,
a scripted model's tool calls and submission, the scorer's numbers by hand; the baseline through the ``inspect``
command line, found through the package's entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai")
pytest.importorskip("tracr", reason="the eval compiles RASP programs (the eval extra)")

from inspect_ai import eval as inspect_eval
from inspect_ai.log import read_eval_log
from inspect_ai.model import ChatMessageTool, ModelOutput, ModelUsage, get_model

HISTOGRAM = "def f(tokens):\n    return [str(tokens.count(t)) for t in tokens]\n"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("known_answer")
    saved = {k: os.environ.get(k) for k in ("MCP_INTERP_EVAL_CACHE", "MCP_INTERP_OUTPUT")}
    os.environ["MCP_INTERP_EVAL_CACHE"] = str(root / "cache")
    os.environ["MCP_INTERP_OUTPUT"] = str(root / "out")
    yield root
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_an_agent_over_inspects_mcp_client_is_scored_against_the_hidden_truth(cache: Path) -> None:
    """histogram (one head and one MLP in layer 0). The scripted model asks model_info and answer_rank on "a b c",
    then submits the true answer (L0H0, L0MLP; each value's count): every score 1; "a b c" is not among the held-out
    inputs. (Wrong claims' arithmetic: test_agent_score.)"""
    from mcp_interp.app.evals.known_answer import known_answer

    submission = json.dumps({"components": ["l0h0", "L0 MLP"], "function": HISTOGRAM})
    outputs = [
        ModelOutput.for_tool_call("mockllm/model", "model_info", {}),
        ModelOutput.for_tool_call("mockllm/model", "answer_rank", {"prompts": ["a b c"], "correct": "1"}),
        ModelOutput.for_tool_call("mockllm/model", "submit", {"answer": submission}),
    ]
    for output in outputs:  # set, so that mockllm does not count tokens with tiktoken (a download: no network here)
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    model = get_model("mockllm/model", custom_outputs=outputs)
    task = known_answer(count=1)  # the first shipped program by name: histogram
    [log] = inspect_eval(task, model=model, log_dir=str(cache / "logs"), display="none")
    assert log.status == "success", log.error
    [sample] = read_eval_log(log.location).samples or []
    assert sample.id == "shipped-histogram"
    seen = [m for m in sample.messages if isinstance(m, ChatMessageTool)]
    info = json.loads(seen[0].text.strip().splitlines()[-1])  # --json-text: the structured result, as the model read it
    assert (info["n_layers"], info["n_heads"]) == (1, 1)
    assert info["program"]["input_values"] == ["a", "b", "c"]
    rank = json.loads(seen[1].text.strip().splitlines()[-1])
    assert rank["examples"][0]["prompt"] == "a b c" and rank["examples"][0]["top1_token"] == "1"
    assert all("histogram" not in m.text for m in seen)  # the program's name does not reach the agent
    score = sample.scores["known_answer_scorer"]
    assert score.value == {"overall": 1.0, "f1": 1.0, "precision": 1.0, "recall": 1.0, "iou": 1.0, "agreement": 1.0,
                           "exact": 1.0}  # fmt: skip
    assert score.metadata["truth"] == ["L0H0", "L0MLP"] and score.metadata["held_out"] == 60
    assert score.metadata["seen_inputs"] == 1


def test_the_baseline_through_the_inspect_command_line(cache: Path) -> None:
    """``inspect eval mcp_interp/known_answer -T solver=baseline --limit 1`` (``count=1``: the dataset is built, and its
    programs compiled, before ``--limit`` applies), offline: the entry point resolves; on
    histogram (the first sample) its
    ablations find exactly L0H0 and L0MLP; its constant function is right only where every position's count is
    that constant, which the scorer's agreement must equal when recomputed here from the held-out cases."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    inspect = Path(sys.executable).with_name("inspect")
    done = subprocess.run(
        [str(inspect), "eval", "mcp_interp/known_answer", "-T", "solver=baseline", "-T", "count=1", "--limit", "1",
         "--model", "mockllm/model", "--log-dir", str(cache / "cli-logs"), "--display", "none"],
        capture_output=True, text=True, timeout=900, env=env, cwd=cache,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    [location] = list((cache / "cli-logs").glob("*.eval"))
    [sample] = read_eval_log(str(location)).samples or []
    score = sample.scores["known_answer_scorer"]
    assert score.metadata["claimed"] == ["L0H0", "L0MLP"] and score.value["f1"] == 1.0
    answer = json.loads(sample.output.completion)
    names: dict = {}
    exec(answer["function"], names)
    constant = names["f"](["a"])[0]
    scoring = json.loads(Path(sample.metadata["scoring"]).read_text())
    seen = {tuple(p.split()) for m in sample.messages if m.role == "assistant" for c in m.tool_calls or []
            for p in c.arguments.get("prompts", [])}  # fmt: skip
    cases = [c for c in scoring["cases"] if tuple(c["input"]) not in seen][:60]
    by_hand = sum(sum(e == constant for e in c["expected"]) / len(c["expected"]) for c in cases) / len(cases)
    assert score.value["agreement"] == pytest.approx(by_hand)
    assert 0 < by_hand < 1
    assert all(0 <= score.value[k] <= 1 for k in score.value)
