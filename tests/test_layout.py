"""The package's layout: imports point down the layers of DESIGN.md, no two modules import each other,
the MCP adapters stay thin, and ``core/`` is one engine plus one folder per tool family.

Walks every import statement (including ones inside functions) with ``ast``, so a lazy import that
reaches upward is caught too. Layers, lowest first:

    schemas  <  base utilities  <  models  <  core  <  session  <  mcp (adapters)  <  entry points

A module may import its own layer or lower. ``schemas/`` imports nothing else from the project;
neither ``schemas/`` nor ``core/`` imports the MCP SDK.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mcp_interp"

LAYERS: list[tuple[str, ...]] = [
    ("mcp_interp.schemas",),
    (
        "mcp_interp",
        "mcp_interp.errors",
        "mcp_interp.limits",
        "mcp_interp.names",
        "mcp_interp.corpora",
        "mcp_interp.store",
        "mcp_interp.figures",
    ),
    ("mcp_interp.models", "mcp_interp.paths"),
    ("mcp_interp.core",),
    ("mcp_interp.session",),
    ("mcp_interp.mcp",),
    (
        "mcp_interp.http",
        "mcp_interp.stdio",
        "mcp_interp.doctor",
        "mcp_interp.embedded_setup",
        "mcp_interp.cli",
        "mcp_interp.__main__",
    ),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """The layer of the longest prefix that names ``module`` (``mcp_interp.core.swap.stats`` → core); the bare
    package ``mcp_interp`` (its ``__init__``) covers only itself, so a new top-level module must be placed."""
    best = (-1, -1)
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            covers = module == prefix or (prefix != "mcp_interp" and module.startswith(prefix + "."))
            if covers and len(prefix) > best[1]:
                best = (rank, len(prefix))
    if best[0] < 0:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {Path(__file__).name}")
    return best[0]


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, absolute, with relative imports resolved."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            # `from mcp_interp.core.lens import dla` imports the module mcp_interp.core.lens.dla
            found.update(f"{base}.{alias.name}" for alias in node.names if is_module(f"{base}.{alias.name}"))
    return found


def is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {name: {m for m in imports_of(path) if m in MODULES and m != name} for name, path in MODULES.items()}


def upward_imports() -> list[str]:
    return [
        f"{name} (layer {layer_of(name)}) imports {target} (layer {layer_of(target)})"
        for name, targets in GRAPH.items()
        for target in sorted(targets)
        if layer_of(target) > layer_of(name)
    ]


def cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in GRAPH:
        if node not in index:
            visit(node)
    return found


def test_the_walk_sees_the_imports_it_must_judge() -> None:
    # The checks below are only as good as the graph: make sure it has the edges we know exist.
    assert "mcp_interp.core.engine.numbers.metrics" in GRAPH["mcp_interp.core.readouts.predictions"]
    assert "mcp_interp.schemas.common" in GRAPH["mcp_interp.core.engine.numbers.metrics"]
    assert "mcp_interp.mcp.toolkit" in GRAPH["mcp_interp.mcp.server"]
    assert "mcp_interp.session" in GRAPH["mcp_interp.mcp.toolkit"]
    bridge = "mcp_interp.core.engine.backend.bridge"
    assert layer_of("mcp_interp.schemas.swap") < layer_of(bridge) < layer_of("mcp_interp.mcp.lens")


def test_no_module_imports_a_higher_layer() -> None:
    assert upward_imports() == []


def test_no_import_cycles() -> None:
    assert cycles() == []


@pytest.mark.parametrize("layer", ["mcp_interp.schemas", "mcp_interp.core"])
def test_science_and_schemas_do_not_import_the_mcp_sdk(layer: str) -> None:
    offenders = [
        f"{name} imports {target}"
        for name, path in MODULES.items()
        if name.startswith(layer)
        for target in imports_of(path)
        if target == "mcp" or target.startswith("mcp.")
    ]
    assert offenders == []


def test_schemas_import_nothing_else_from_the_project() -> None:
    offenders = [
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        if name.startswith("mcp_interp.schemas")
        for target in targets
        if not target.startswith("mcp_interp.schemas")
    ]
    assert offenders == []


def test_the_checks_catch_a_planted_violation() -> None:
    # A known-bad graph must be reported, so a green run means something.
    saved = {k: set(v) for k, v in GRAPH.items()}
    try:
        GRAPH["mcp_interp.schemas.common"].add("mcp_interp.core.engine.numbers.metrics")
        GRAPH["mcp_interp.core.engine.numbers.metrics"].add("mcp_interp.mcp.toolkit")
        assert any("schemas.common" in line for line in upward_imports())
        assert any("core.engine.numbers.metrics" in line and "mcp.toolkit" in line for line in upward_imports())
        assert any({"mcp_interp.core.engine.numbers.metrics", "mcp_interp.schemas.common"} <= set(c) for c in cycles())
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


def test_adapter_functions_stay_small() -> None:
    # The adapters are thin: a tool body that outgrows this has science or bookkeeping that belongs in core/.
    sizes = {
        f"{name}.{node.name}": node.end_lineno - node.lineno + 1
        for name, path in MODULES.items()
        if name.startswith("mcp_interp.mcp")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None
    }
    assert "mcp_interp.mcp.swap.causal_swap_benchmark" in sizes
    assert {name: n for name, n in sizes.items() if n >= 80} == {}


CORE = "mcp_interp.core"
ENGINE = f"{CORE}.engine"
# A family may import the engine and itself; explain composes the lens, heads and localize families' stages.
FAMILY_MAY_ALSO_IMPORT = {"explain": {"lens", "heads", "localize"}}


def core_place(module: str) -> str | None:
    """``engine`` or the family folder a core module lives in; None for a module outside core."""
    if not module.startswith(CORE + "."):
        return None
    return module[len(CORE) + 1 :].split(".")[0]


def family_violations(graph: dict[str, set[str]]) -> list[str]:
    """Core imports that cross the engine/family boundary the wrong way."""
    found = []
    for name, targets in graph.items():
        here = core_place(name)
        if here is None:
            continue
        for target in sorted(targets):
            there = core_place(target)
            if there is None or there == here:
                continue
            if here == "engine":
                found.append(f"{name}: the engine imports the family module {target}")
            elif there != "engine" and there not in FAMILY_MAY_ALSO_IMPORT.get(here, set()):
                found.append(f"{name}: family {here!r} imports family {there!r} ({target})")
    return found


def test_every_core_module_lives_in_the_engine_or_one_family_folder() -> None:
    loose = [name for name in MODULES if name.startswith(CORE + ".") and name.count(".") < 3 and name != CORE]
    assert [name for name in loose if not (PACKAGE / "core" / name.split(".")[2] / "__init__.py").is_file()] == []
    families = {core_place(name) for name in MODULES if core_place(name) is not None}
    assert {"engine", "readouts", "heads", "localize", "lens", "explain", "circuits", "features", "swap"} <= families


def test_the_engine_imports_no_family_and_families_import_only_the_engine() -> None:
    assert family_violations(GRAPH) == []


def test_the_family_rule_catches_planted_violations() -> None:
    planted = {
        f"{ENGINE}.metrics": {f"{CORE}.circuits.edge_graph", "mcp_interp.schemas.common"},
        f"{CORE}.lens.steer": {f"{CORE}.features.probe", f"{ENGINE}.bridge", f"{CORE}.lens.reading"},
        f"{CORE}.explain.job": {f"{CORE}.lens.dla", f"{CORE}.heads.patch_heads"},  # allowed
    }
    assert family_violations(planted) == [
        f"{ENGINE}.metrics: the engine imports the family module {CORE}.circuits.edge_graph",
        f"{CORE}.lens.steer: family 'lens' imports family 'features' ({CORE}.features.probe)",
    ]


def top_level_names(path: Path) -> set[str]:
    """Names a module defines at its top level (functions, classes, assigned constants and type aliases)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names - {"__all__", "family", "log"}


def names_defined_twice(modules: dict[str, set[str]]) -> dict[str, list[str]]:
    where: dict[str, list[str]] = {}
    for module, names in modules.items():
        for name in names:
            where.setdefault(name, []).append(module)
    return {name: sorted(places) for name, places in where.items() if len(places) > 1}


def test_no_top_level_name_is_defined_twice_across_core_and_schemas() -> None:
    # One vocabulary: a type the engine, the families and the results share (AblationMethod, AnswerKind, Capability)
    # is defined once, in schemas/, and imported by core.
    shared = ("mcp_interp.schemas.", CORE + ".")
    core = {name: top_level_names(path) for name, path in MODULES.items() if name.startswith(shared)}
    assert names_defined_twice(core) == {}
    planted = {**core, "planted.one": {"finite"}, "planted.two": {"finite"}}
    assert list(names_defined_twice(planted)) == ["finite"]
