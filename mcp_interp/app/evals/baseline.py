"""The known-answer eval's scripted baseline: the tools, driven by a fixed procedure, no language model.

Over the same MCP stdio server an agent gets (the SDK's client, so it reads the structured results):

1. ``model_info``: the layers, heads, input and output values, the longest prompt;
2. ``PROMPTS`` random prompts of every length in turn, longest first; ``kl`` of the clean run against each head
   and each MLP zero-ablated (``intervention: {"ablate": [c], "method": "zero"}``) at the last position. A
   component is claimed when its mean KL exceeds ``THRESHOLD`` nats: in a compiled program an unused head or MLP
   writes nothing, so its ablation changes no logit, and a used one moves the output distribution (at some length:
   zeroing ``reverse``'s length-counting head leaves every prompt of the longest length unchanged);
3. ``answer_rank``: the model's top-1 at the last position of each prompt; the function submitted is the constant
   that outputs the most frequent one at every position. It says nothing about how the output depends on the input:
   the floor a real account of the function must beat.

Every call is written into the sample's messages as a tool call and its result, so ``inspect view`` shows what the
baseline did and the scorer excludes its prompts from the held-out inputs as it does an agent's.
"""

from __future__ import annotations

import json
import random
import sys
import uuid
from collections import Counter
from typing import Any

from inspect_ai.model import ChatMessageAssistant, ChatMessageTool, ModelOutput
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.tool import ToolCall

from mcp_interp.errors import ToolCallError

PROMPTS = 16
THRESHOLD = 1e-3  # nats


@solver
def ablation_baseline(prompts: int = PROMPTS, threshold: float = THRESHOLD) -> Solver:
    """Ablate each head and MLP; claim the ones that move the output; submit a constant function (module docstring)."""
    from mcp import Client, StdioServerParameters

    from mcp_interp.app.evals.serving import program_of, server_args, server_env

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        program = program_of(state)
        params = StdioServerParameters(command=sys.executable, args=server_args(program), env=server_env())

        async with Client(params, read_timeout_seconds=600) as client:

            async def call(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
                result = await client.call_tool(tool, arguments)
                text = " ".join(getattr(block, "text", "") for block in result.content)
                call_id = uuid.uuid4().hex[:12]
                state.messages.append(ChatMessageAssistant(
                    content="", tool_calls=[ToolCall(id=call_id, function=tool, arguments=arguments)],
                    model="scripted-baseline",
                ))  # fmt: skip
                state.messages.append(ChatMessageTool(content=text[:4000], tool_call_id=call_id, function=tool))
                if result.is_error or result.structured_content is None:
                    raise ToolCallError(tool, f"{tool} failed: {text[:500]}")
                return result.structured_content

            info = await call("model_info", {})
            facts = info["program"]
            rng = random.Random(f"baseline {state.sample_id}")
            longest = facts["max_seq_len"]  # every length: a component can matter only at some (a length count)
            texts = [" ".join(rng.choice(facts["input_values"]) for _ in range(longest - i % longest))
                     for i in range(prompts)]  # fmt: skip
            components = [f"L{layer}H{head}" for layer in range(info["n_layers"]) for head in range(info["n_heads"])]
            components += [f"L{layer}MLP" for layer in range(info["n_layers"])]
            claimed = []
            for component in components:
                ablated = {"ablate": [component], "method": "zero"}
                measured = await call("kl", {"prompts": texts, "intervention": ablated})
                if measured["kl"]["value"] > threshold:
                    claimed.append(component)
            ranks = await call("answer_rank", {"prompts": texts, "correct": facts["output_values"][0]})
            tops = Counter(e["top1_token"] for e in ranks["examples"] if e["top1_token"] is not None)
            constant = tops.most_common(1)[0][0] if tops else None
            function = f"def f(tokens):\n    return [{constant!r}] * len(tokens)\n"
            answer = json.dumps({"components": claimed, "function": function})
            state.output = ModelOutput.from_content(model="scripted-baseline", content=answer)
            state.messages.append(ChatMessageAssistant(content=answer, model="scripted-baseline"))
        return state

    return solve
