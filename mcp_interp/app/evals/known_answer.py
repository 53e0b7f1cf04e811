"""``inspect eval mcp_interp/known_answer``: an agent given this server over MCP, scored against a known circuit.

Each sample serves one compiled RASP program with its truth hidden (``mcp-interp serve --model FOLDER --json-text``
over stdio, through Inspect's own ``mcp_server_stdio``), hands the agent its tools and the task statement, and asks
it to submit, through the submit tool, a JSON object:

    {"components": ["L0H1", "L1MLP", ...], "function": "def f(tokens):\\n    ..."}

The scorer (``core.known.agent_score``) scores the components by precision, recall, F1 and IoU against
``ground_truth.json``, and the function by running it in the task's sandbox (``local`` by default) on held-out
inputs — ``held_out`` (default 60) of a pool of random inputs that the agent never sent to a tool — against the
program's reference. ``overall`` is the mean of F1 and agreement.

Options (``-T name=value``): ``programs`` (``shipped``: the eight of ``examples/rasp``; ``generated``: programs
drawn by ``generate-rasp``, seeds ``first_seed`` … ``first_seed + count − 1``), ``count`` (default: all 8 shipped,
or 20 generated), ``solver`` (``react``, Inspect's ReAct agent on ``--model``; ``baseline``, the scripted
ablation solver of ``baseline.py``, no language model), ``message_limit`` (default 80), ``token_limit``, ``held_out``.

``--json-text`` because Inspect hands a model the text content of a tool result, and this server's text is a short
summary with the numbers in its structured content.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Literal

from inspect_ai import Task, task
from inspect_ai.agent import AgentSubmit, as_solver, react
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessageAssistant
from inspect_ai.scorer import Score, Target, mean, scorer, stderr
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.tool import mcp_server_stdio
from inspect_ai.util import sandbox

from mcp_interp.app.evals.programs import Program, generated, shipped, shipped_names
from mcp_interp.app.evals.serving import program_of, server_args, server_env
from mcp_interp.core.known.agent_score import (
    RUNNER,
    FunctionScore,
    overall,
    parse_claims,
    read_runner_output,
    runner_input,
    runner_timeout_s,
    score_components,
    score_function,
    seen_inputs,
)
from mcp_interp.core.known.agent_score import held_out as held_out_cases

DEFAULT_GENERATED = 20
MIN_HELD_OUT = 50

STATEMENT = """\
You are investigating a small transformer through the mcp-interp tools. It was compiled by tracr from a program \
you do not know: at every position it outputs one value, computed from the whole input (its attention is \
bidirectional, so a position can read positions after it).

Prompts are input values separated by spaces, e.g. "{example}"; the tokenizer prepends the token {bos}, so the \
values sit at positions 1, 2, ... Input values: {values}; at most {max_seq_len} per prompt. Output values: \
whatever the model puts top-1 at a position (model_info lists them; `tokenize` with `top_k` shows the output at \
every position, null where it has none).

Find out, with the tools:
(a) which attention heads and MLPs compute the output. Name heads "L<layer>H<head>" and MLPs "L<layer>MLP". \
Leave out components that do nothing: wrong claims cost precision.
(b) the function it computes: a Python function `f(tokens)` that takes the input values as a list of strings \
(without {bos}; e.g. {example_list}) and returns a list of the same length, the output value at each position (None \
where the model has no value). It will be run on inputs you never sent to a tool, in plain Python without imports \
beyond the standard library.

When you are done, call the submit tool once, with a JSON object as its answer:
{{"components": ["L0H0", "L0MLP"], "function": "def f(tokens):\\n    return [t for t in tokens]"}}
"""


def _sample(program: Program) -> Sample:
    scoring = program.load_scoring()
    values = scoring["input_values"]
    example = values[: min(3, scoring["max_seq_len"])]
    statement = STATEMENT.format(
        example=" ".join(example), example_list=json.dumps(example), bos=scoring["bos"], values=", ".join(values),
        max_seq_len=scoring["max_seq_len"],
    )  # fmt: skip
    metadata = {"kind": program.kind, "key": program.key, "model": str(program.model), "scoring": str(program.scoring)}
    return Sample(id=f"{program.kind}-{program.key}", input=statement, metadata=metadata)


@solver
def investigator() -> Solver:
    """Inspect's ReAct agent with this server's tools, one server per sample."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        server = mcp_server_stdio(name="mcp-interp", command=sys.executable, args=server_args(program_of(state)),
                                  env=server_env())  # fmt: skip
        agent = react(
            name="investigator",
            description="Investigates a compiled transformer with the mcp-interp tools.",
            tools=[server],
            submit=AgentSubmit(answer_only=True, keep_in_messages=True),
        )
        return await as_solver(agent)(state, generate)

    return solve


def parse_submission(completion: str) -> tuple[dict[str, Any], str | None]:
    """The submitted JSON object (code fences and text around it tolerated), and what was wrong with it."""
    text = completion.strip()
    fenced = re.search(r"```(?:json)?\s*(\{.*\})\s*```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1)
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return {}, "the answer holds no JSON object"
    try:
        answer = json.loads(text[start : end + 1])
    except ValueError as exc:
        return {}, f"the answer is not valid JSON: {exc}"
    if not isinstance(answer, dict):
        return {}, "the answer is not a JSON object"
    return answer, None


def tool_arguments(state: TaskState) -> list[Any]:
    """Every tool call's arguments in the conversation (the scripted baseline's calls are in it too)."""
    return [
        call.arguments
        for message in state.messages
        if isinstance(message, ChatMessageAssistant)
        for call in message.tool_calls or []
    ]


@scorer(metrics={k: [mean(), stderr()] for k in ("overall", "f1", "precision", "recall", "iou", "agreement", "exact")})
def known_answer_scorer(held_out_count: int = 60):
    """Components against the ground truth, the function on held-out inputs in the sandbox (module docstring)."""

    async def score(state: TaskState, target: Target) -> Score:
        scoring = program_of(state).load_scoring()
        answer, problem = parse_submission(state.output.completion)
        claimed = answer.get("components") or []
        claims = parse_claims(claimed if isinstance(claimed, list) else [claimed], scoring["n_layers"],
                              scoring["n_heads"])  # fmt: skip
        components = score_components(claims, set(scoring["truth"]))
        seen = seen_inputs(tool_arguments(state), scoring["input_values"], scoring["bos"], scoring["max_seq_len"])
        cases = held_out_cases(scoring["cases"], seen, held_out_count)
        source = answer.get("function")
        notes = [problem] if problem else []
        if len(cases) < MIN_HELD_OUT:
            notes.append(f"only {len(cases)} held-out inputs were left (the agent sent {len(seen)} of the pool's)")
        if isinstance(source, str) and cases:
            try:
                run = await sandbox().exec(["python3", "-c", RUNNER], input=runner_input(source, cases),
                                           timeout=runner_timeout_s(len(cases)))  # fmt: skip
                outputs, why = read_runner_output(run.stdout, len(cases))
                if why:
                    notes.append(why if run.success else f"{why}; stderr: {run.stderr[-300:]}")
            except TimeoutError:
                outputs = [None] * len(cases)
                notes.append(f"the submission ran over {runner_timeout_s(len(cases))} s in the sandbox")
            function = score_function(cases, outputs)
        else:
            if not isinstance(source, str):
                notes.append("no function was submitted")
            function = FunctionScore(0.0, 0.0, len(cases))
        value = {"overall": overall(components, function), "f1": components.f1, "precision": components.precision,
                 "recall": components.recall, "iou": components.iou, "agreement": function.agreement,
                 "exact": function.exact}  # fmt: skip
        explanation = (
            f"components: claimed {components.claimed + components.unknown}, truth {components.truth}; "
            f"function: {function.agreement:.3f} of positions on {function.n_inputs} held-out inputs"
            + (f" ({'; '.join(notes)})" if notes else "")
        )
        metadata = {"truth": components.truth, "claimed": components.claimed, "unknown": components.unknown,
                    "held_out": function.n_inputs, "seen_inputs": len(seen), "failures": function.failures,
                    "notes": notes}  # fmt: skip
        return Score(value=value, answer=json.dumps(answer)[:2000], explanation=explanation, metadata=metadata)

    return score


def programs_for(kind: str, count: int | None, first_seed: int) -> list[Program]:
    if kind == "shipped":
        names = shipped_names()
        return [shipped(name) for name in names[: count if count is not None else len(names)]]
    if kind == "generated":
        n = DEFAULT_GENERATED if count is None else count
        return [generated(seed) for seed in range(first_seed, first_seed + n)]
    raise ValueError(f"programs must be 'shipped' or 'generated', not {kind!r}")


@task
def known_answer(
    programs: Literal["shipped", "generated"] = "shipped",
    count: int | None = None,
    first_seed: int = 0,
    solver: Literal["react", "baseline"] = "react",
    message_limit: int = 80,
    token_limit: int | None = None,
    held_out: int = 60,
) -> Task:
    """Interpret a compiled transformer over MCP: find its components and its function (module docstring)."""
    from mcp_interp.app.evals.baseline import ablation_baseline

    if solver not in ("react", "baseline"):
        raise ValueError(f"solver must be 'react' (an agent on --model) or 'baseline' (scripted), not {solver!r}")
    dataset = [_sample(program) for program in programs_for(programs, count, first_seed)]
    return Task(
        dataset=dataset,
        solver=investigator() if solver == "react" else ablation_baseline(),
        scorer=known_answer_scorer(held_out),
        sandbox="local",
        message_limit=message_limit,
        token_limit=token_limit,
        metadata={"programs": programs, "solver": solver},
    )
