"""The MCP server: one ``MCPServer`` with every tool family, resource and prompt registered.

Adding a family is one import and one entry in ``FAMILIES``; adding a tool touches only its family's
module (plus its schema and core modules).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from mcp.server import MCPServer

from mcp_interp.host import ModelHost
from mcp_interp.mcp import (
    circuits,
    explain,
    features,
    graphs,
    heads,
    investigation,
    jobs,
    lens,
    localize,
    prompts,
    protocol,
    readouts,
    stored,
    swap,
    views,
)
from mcp_interp.mcp.argument_errors import Server
from mcp_interp.mcp.family import Family
from mcp_interp.mcp.toolkit import Toolkit
from mcp_interp.schemas.common import TARGET_FORMS
from mcp_interp.version import __version__

INSTRUCTIONS_TEMPLATE = """\
mcp-interp runs mechanistic-interpretability measurements on a transformer loaded in this server.
Start with `model_info` (the model, its layers and heads, how text is tokenized) and `tokenize`.

Conventions, the same in every tool:
- Answers: a string is its tokens under the model's tokenizer, without special tokens (GPT-2-style
  tokenizers want the leading space, ' Mary'); one token is read from the logits, several tokens or
  {"any_of": [...]} by teacher-forced log-probability (`answer_kind` in the result says which:
  token, sequence or set; null where no answer is scored).
  `prompts` are read at each prompt's last token. Minimal pairs: `clean_prompts` show the behaviour,
  `corrupt_prompts` give one per clean prompt of the same token length.
- Components: {components}.
- Interventions (`intervention`, and `ablate`'s fields): {"ablate": [components], "method": "zero" |
  "mean" (the prompts' mean at the same distance from the end; `reference_prompts` to average others) |
  "resample" (another prompt's, seeded; of `reference_prompts` if given), "positions": "all" | "last" (the
  answer) | [indices], "seed"}.
- `seed` seeds every random draw (resampling, splits, random baselines): a call repeats exactly.
- Every result has `notes` (read them before citing a number), `model` (which weights), `run_id`,
  `elapsed_s`; a Score is {value: the mean, per_example}. Figures are `figure_uri` (figure://, PNG).
- Results fit a context window: ranked lists keep the top `top` items (default 20); when anything is
  cut, `result_uri` (result://…) holds the complete result, one resources/read away.
- Handles are accepted back: direction:// (probe) in interventions and `steer`, circuit://
  (find_circuit) in `circuit_faithfulness`, artifact:// in `verify_artifact`; graph:// is the full
  attribution graph (Neuronpedia JSON). An evicted handle says so.
- Long tools take `background: true`: they return only `job` (a job:// handle) at once; `job_status` reports state,
  progress and, when done, the result; `job_cancel` stops it within 2 s (best result so far in `partial`).
- Verdicts come from p-values: a direction, SAE feature, steering vector or circuit is ranked among
  random stand-ins matched on what matters, p = (1 + #{random ≥ real}) / (n + 1).
"""
INSTRUCTIONS = INSTRUCTIONS_TEMPLATE.replace(
    "{components}", "; ".join(f"{form} ({gloss})" for form, gloss in TARGET_FORMS.items())
)

FAMILIES: tuple[Family, ...] = (
    readouts.family,
    heads.family,
    localize.family,
    circuits.family,
    features.family,
    graphs.family,
    lens.family,
    explain.family,
    swap.family,
    stored.family,
    investigation.family,
    jobs.family,
    views.family,
    prompts.family,
)


def build_server(host: ModelHost, json_text: bool = False) -> MCPServer[Toolkit]:
    """A server over ``host``; the model starts loading when the server starts (its lifespan), so
    ``initialize`` and ``tools/list`` answer at once while the weights load. ``json_text``: every result's structured
    content is also its last text block (``serve --json-text``, for clients that show a model only text)."""
    toolkit = Toolkit(host)

    @asynccontextmanager
    async def lifespan(_: MCPServer[Toolkit]) -> AsyncIterator[Toolkit]:
        host.start_loading()
        try:
            yield toolkit
        finally:  # the server is stopping: no background job outlives it half-run
            await toolkit.workspaces.shutdown()

    server = Server("mcp-interp", version=__version__, instructions=INSTRUCTIONS, lifespan=lifespan)
    server.recording_toolkit = toolkit
    server.json_text = json_text
    for family in FAMILIES:
        family.register(server)
    protocol.install(server, toolkit)
    return server
