"""MCP prompts: workflow templates (``mcp_interp/data/prompt_templates/``) that teach an assistant the traps.

Templates use ``string.Template`` placeholders (``$prompt``) so the braces of JSON examples in
the text need no escaping.
"""

from __future__ import annotations

from string import Template

from mcp_interp.corpora import subject_number, templates_dir
from mcp_interp.mcp.family import Family

family = Family("prompts")


def render(name: str, **values: str) -> str:
    text = (templates_dir() / f"{name}.md").read_text(encoding="utf-8")
    return Template(text).safe_substitute(values)


@family.prompt(name="explain-prediction", description="Explain why the model predicts an answer, with cited numbers.")
def explain_prediction(prompt: str, answer: str, baseline: str) -> str:
    return render("explain-prediction", prompt=prompt, answer=repr(answer), baseline=repr(baseline))


@family.prompt(name="find-circuit", description="Find the heads behind a behaviour from minimal pairs.")
def find_circuit(task: str, pairs: str) -> str:
    return render("find-circuit", task=task, pairs=pairs)


@family.prompt(name="test-causal-claim", description="Test a causal claim about a model component.")
def test_causal_claim(claim: str) -> str:
    return render("test-causal-claim", claim=claim)


@family.prompt(name="trace-prediction", description="Trace a prediction with an attribution graph and test its claims.")
def trace_prediction(prompt: str, transcoders: str) -> str:
    return render("trace-prediction", prompt=repr(prompt), transcoders=transcoders)


@family.prompt(name="probe-property", description="Test whether a property is linearly represented, and used.")
def probe_property(property: str) -> str:
    corpus = subject_number()
    lines = [f"  {text!r} → {label}" for text, label in list(zip(corpus.texts, corpus.labels, strict=True))[:6]]
    return render("probe-property", property=property, example="\n".join([*lines, "  … (400 texts)"]))


@family.prompt(
    name="interpret-feature",
    description="Name a feature (neuron, direction, SAE or transcoder feature) and score the explanation.",
)
def interpret_feature(feature: str) -> str:
    return render("interpret-feature", feature=feature)
