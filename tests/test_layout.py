"""The package's layout: imports point down the floors of docs/layout.md, no module imports the package root but the
entry points, no circle (lazy imports counted), the MCP adapters stay thin, and ``core/`` is one engine plus one folder
per tool family.

Walks every import (statements inside functions too, and ``importlib.import_module("…")`` strings), so a lazy import
that reaches upward or closes a circle is caught. Floors, lowest first, each a package or a set of top-level modules:

    schemas  <  base utilities  <  core/engine  <  core/<family>  <  host  <  mcp (adapters)  <  app (entry points)

A module may import its own floor or lower. ``schemas/`` imports nothing else from the project; neither ``schemas/`` nor
``core/`` imports the MCP SDK. In ``mcp/``, no module imports a family's adapter (the modules ``server.py`` registers in
``FAMILIES``) but ``server.py``, only a family's own adapter imports its ``core/<family>/``, and only
``sdk_internals.py`` reaches into the SDK's internals.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mcp_interp"
ROOT = "mcp_interp"

FLOORS: list[tuple[str, ...]] = [
    ("mcp_interp.schemas",),
    (  # base utilities: no model, no MCP
        "mcp_interp.version",
        "mcp_interp.errors",
        "mcp_interp.names",
        "mcp_interp.corpora",
        "mcp_interp.figures",
        "mcp_interp.state",  # the state a server keeps: folders, paths, limits, store, ledger, turns
        "mcp_interp.investigation",
    ),
    ("mcp_interp.core.engine",),
    ("mcp_interp.core",),
    ("mcp_interp.host",),
    ("mcp_interp.mcp",),
    ("mcp_interp.app", ROOT, "mcp_interp.__main__"),
]
ENTRY_POINTS = ("cli", "stdio", "http", "doctor", "embedded_setup", "api", "rerun")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """The floor of the longest prefix that names ``module`` (``mcp_interp.core.swap.stats`` → core); the bare
    package ``mcp_interp`` (its ``__init__``) covers only itself, so a new top-level module must be placed."""
    best = (-1, -1)
    for rank, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            covers = module == prefix or (prefix != ROOT and module.startswith(prefix + "."))
            if covers and len(prefix) > best[1]:
                best = (rank, len(prefix))
    if best[0] < 0:
        raise AssertionError(f"{module} is on no floor: add it to FLOORS in {Path(__file__).name}")
    return best[0]


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, absolute, with relative imports resolved."""
    return imports_in(path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py")


def imports_in(source: str, here: str, is_package: bool = False) -> set[str]:
    """Every module ``source`` (the module ``here``) imports: import statements anywhere (inside functions too), with
    relative imports resolved, and the constant names given to ``importlib.import_module`` (a lazy import is an
    import). ``from mcp_interp import x`` imports the module ``mcp_interp.x`` when there is one, else the root."""
    package = here if is_package else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if name == "import_module" and node.args and isinstance(node.args[0], ast.Constant):
                found.add(str(node.args[0].value))
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from mcp_interp.core.lens import dla` imports the module mcp_interp.core.lens.dla (and its package)
            modules = {f"{base}.{alias.name}" for alias in node.names if is_module(f"{base}.{alias.name}")}
            found.update(modules)
            if len(modules) < len(node.names) or base != ROOT:
                found.add(base)  # a name defined in `base` itself: `from mcp_interp import __version__` is the root
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


def cycles(graph: dict[str, set[str]] | None = None) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), of the module graph unless told."""
    graph = GRAPH if graph is None else graph
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
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

    for node in graph:
        if node not in index:
            visit(node)
    return found


def package_of(module: str) -> str:
    """The package a module sits in (a package's ``__init__`` is the package itself)."""
    path = PACKAGE.parent.joinpath(*module.split("."))
    return module if (path / "__init__.py").is_file() else module.rpartition(".")[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Which package imports which, a package's own subpackages and parents left out (``core.engine`` may use
    ``core.engine.text``): a circle here is two packages leaning on each other, even when no module circle closes."""
    found: dict[str, set[str]] = {}
    for name, targets in graph.items():
        here = package_of(name)
        for target in targets:
            there = package_of(target)
            if not (here == there or here.startswith(there + ".") or there.startswith(here + ".")):
                found.setdefault(here, set()).add(there)
    return found


def test_the_walk_sees_the_imports_it_must_judge() -> None:
    # The checks below are only as good as the graph: make sure it has the edges we know exist.
    assert "mcp_interp.core.engine.numbers.metrics" in GRAPH["mcp_interp.core.readouts.predictions"]
    assert "mcp_interp.schemas.common" in GRAPH["mcp_interp.core.engine.numbers.metrics"]
    assert "mcp_interp.mcp.toolkit" in GRAPH["mcp_interp.mcp.server"]
    assert "mcp_interp.host" in GRAPH["mcp_interp.mcp.toolkit"]
    bridge = "mcp_interp.core.engine.backend.bridge"
    assert layer_of("mcp_interp.schemas.swap") < layer_of(bridge) < layer_of("mcp_interp.mcp.lens")


def test_no_module_imports_a_higher_layer() -> None:
    assert upward_imports() == []


def test_no_import_cycles() -> None:
    assert cycles() == []


def test_no_cycles_between_packages() -> None:
    assert cycles(package_graph(GRAPH)) == []
    limits = "mcp_interp.state.limits"
    planted = {**GRAPH, limits: {*GRAPH[limits], "mcp_interp.investigation.script"}}
    assert ["mcp_interp.investigation", "mcp_interp.state"] in cycles(package_graph(planted))


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


# --- the seam: only core/engine/backend/ (its loader boots the model) runs the model --------------------------------

SEAM = f"{ENGINE}.backend"
# What families and the rest of the engine may import from the seam: its vocabulary and results, never its internals.
# The loaded model and its loader are public too: the host loads the model, families receive it.
SEAM_PUBLIC = {
    f"{SEAM}.{name}"
    for name in ("points", "sites", "edits", "forward", "capabilities", "jacobian_lens", "model", "options", "loader")
}
# Calls that run the model or reach into it: installing hooks, TransformerLens' caching runs, autograd.
RUNS_THE_MODEL = {
    "run_with_cache",
    "run_with_hooks",
    "hooks",
    "add_hook",
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_full_backward_hook",
    "register_hook",
}


def is_public(name: str) -> bool:
    """Whether ``name`` is one of the seam's public modules or inside one (the loader is a package)."""
    return any(name == public or name.startswith(public + ".") for public in SEAM_PUBLIC)


def in_seam(module: str) -> bool:
    return module == SEAM or module.startswith(SEAM + ".")


def seam_violations(source: str, module: str) -> list[str]:
    """Where ``module``'s ``source`` runs or reaches the model outside the seam: a hook call, a TransformerLens
    import, the bridge itself (``.bridge``), autograd (``torch.autograd``, ``x.backward()`` on anything but the
    backend), or an import of the seam's internals."""
    if in_seam(module):
        return []
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name, receiver = node.func.attr, node.func.value
            backend = isinstance(receiver, ast.Name | ast.Attribute) and ast.unparse(receiver).endswith("backend")
            if name in RUNS_THE_MODEL or (name == "backward" and not backend):
                found.append(f"{module}:{line} calls .{name}()")
        if isinstance(node, ast.Attribute) and node.attr in ("bridge", "autograd"):
            found.append(f"{module}:{line} reaches .{node.attr}")
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.module == SEAM:
                names = [f"{SEAM}.{a.name}" for a in node.names]
            for name in names:
                if name.split(".")[0] == "transformer_lens":
                    found.append(f"{module}:{line} imports transformer_lens")
                elif name.startswith(SEAM + ".") and not any(
                    name == p or name.startswith(p + ".") for p in SEAM_PUBLIC
                ):
                    found.append(f"{module}:{line} imports the seam's internals ({name})")
    return found


def test_only_the_seam_runs_the_model() -> None:
    found = [v for name, path in MODULES.items() for v in seam_violations(path.read_text(encoding="utf-8"), name)]
    assert found == []


def test_the_seam_check_catches_planted_violations() -> None:
    planted = (
        "import torch\n"
        "from transformer_lens import HookedTransformer\n"
        "from mcp_interp.core.engine.backend.local import LocalBackend\n"
        "from mcp_interp.core.engine.backend import bridge\n"
        "def f(model, loss):\n"
        "    with model.bridge.hooks(fwd_hooks=[]):\n"
        "        model.backend.run(None)\n"
        "    loss.backward()\n"
        "    model.backend.backward(loss, [])\n"
        "    return torch.autograd.grad(loss, [])\n"
    )
    found = seam_violations(planted, f"{CORE}.lens.planted")
    assert sorted(found) == sorted(
        [
            f"{CORE}.lens.planted:2 imports transformer_lens",
            f"{CORE}.lens.planted:3 imports the seam's internals ({SEAM}.local)",
            f"{CORE}.lens.planted:4 imports the seam's internals ({SEAM}.bridge)",
            f"{CORE}.lens.planted:6 calls .hooks()",
            f"{CORE}.lens.planted:6 reaches .bridge",
            f"{CORE}.lens.planted:8 calls .backward()",
            f"{CORE}.lens.planted:10 reaches .autograd",
        ]
    )
    assert seam_violations(planted, f"{SEAM}.local") == []


MCP = "mcp_interp.mcp"
SERVER = f"{MCP}.server"
SDK_INTERNALS = f"{MCP}.sdk_internals"


def family_adapters() -> set[str]:
    """The adapter modules ``server.py`` registers: its ``FAMILIES = (readouts.family, heads.family, …)``."""
    for node in ast.parse(MODULES[SERVER].read_text(encoding="utf-8")).body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "FAMILIES" for t in targets):
                assert isinstance(node.value, ast.Tuple)
                elements = node.value.elts
                names = [e.value.id for e in elements if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name)]
                assert len(names) == len(elements), "FAMILIES lists <module>.family entries"
                return {f"{MCP}.{name}" for name in names}
    raise AssertionError(f"{SERVER} defines no FAMILIES")


ADAPTERS = family_adapters()


def adapter_violations(graph: dict[str, set[str]], adapters: set[str]) -> list[str]:
    """mcp/ modules that import a family's adapter other than themselves (only server.py registers them)."""
    return [
        f"{name} imports the adapter {target}"
        for name, targets in graph.items()
        if name.startswith(MCP + ".") and name != SERVER
        for target in sorted(targets)
        if target in adapters and target != name
    ]


def mcp_family_violations(graph: dict[str, set[str]], adapters: set[str]) -> list[str]:
    """mcp/ modules that import a family's core other than the family's own adapter (``mcp/<family>.py`` may import
    ``core/<family>/``; any mcp/ module may import the engine)."""
    return [
        f"{name} imports family {there!r} ({target})"
        for name, targets in graph.items()
        if name.startswith(MCP + ".")
        for target in sorted(targets)
        if (there := core_place(target)) not in (None, "engine") and not (name == f"{MCP}.{there}" and name in adapters)
    ]


def test_the_family_adapters_are_read_from_server_py() -> None:
    families = ("readouts", "heads", "localize", "lens", "explain", "circuits", "features", "graphs", "swap")
    assert {f"{MCP}.{family}" for family in families} <= ADAPTERS
    assert set(MODULES) >= ADAPTERS and SERVER not in ADAPTERS and f"{MCP}.toolkit" not in ADAPTERS


def test_no_mcp_module_imports_another_familys_adapter() -> None:
    assert adapter_violations(GRAPH, ADAPTERS) == []


def test_only_a_familys_own_adapter_imports_its_core() -> None:
    assert mcp_family_violations(GRAPH, ADAPTERS) == []


def test_the_adapter_rules_catch_planted_violations() -> None:
    adapters = {f"{MCP}.heads", f"{MCP}.lens", f"{MCP}.explain"}
    planted = {
        f"{MCP}.explain": {f"{MCP}.heads", f"{MCP}.toolkit", f"{CORE}.explain.job", f"{CORE}.lens.figures"},
        f"{MCP}.toolkit": {f"{CORE}.features.directions", f"{ENGINE}.jobs"},
        f"{MCP}.lens": {f"{MCP}.lens", f"{CORE}.lens.dla", f"{ENGINE}.directions"},  # allowed
        SERVER: {f"{MCP}.heads", f"{MCP}.lens", f"{MCP}.explain"},  # allowed: it registers them
    }
    assert adapter_violations(planted, adapters) == [f"{MCP}.explain imports the adapter {MCP}.heads"]
    assert mcp_family_violations(planted, adapters) == [
        f"{MCP}.explain imports family 'lens' ({CORE}.lens.figures)",
        f"{MCP}.toolkit imports family 'features' ({CORE}.features.directions)",
    ]


PUBLIC_UNDERSCORED = {"os._exit"}


def reaches_in(source: str) -> list[str]:
    """Reaches into another object's internals: ``x._private`` (x not ``self`` or ``cls``), ``x.fn_metadata`` (the
    SDK's private record of a tool function) and ``x.__dict__``, with their line numbers. ``os._exit`` is public (the
    standard library's documented exit without finalization), not a reach."""
    found = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and ((node.attr.startswith("_") and not node.attr.startswith("__")) or node.attr in ("fn_metadata", "__dict__"))
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        and ast.unparse(node) not in PUBLIC_UNDERSCORED
    ]
    return [
        f"line {node.lineno}: {ast.unparse(node)}" for node in sorted(found, key=lambda n: (n.lineno, n.col_offset))
    ]


def test_only_sdk_internals_reaches_into_the_sdk() -> None:
    # Outside core/ (whose reaches into TransformerLens live in the engine's bridge), every reach into an object's
    # internals is a reach into the MCP SDK's, and they live in one module, one named function each.
    reaches = {
        name: found
        for name, path in MODULES.items()
        if not name.startswith(CORE + ".") and (found := reaches_in(path.read_text(encoding="utf-8")))
    }
    assert list(reaches) == [SDK_INTERNALS]
    assert any("_tool_manager" in reach for reach in reaches[SDK_INTERNALS])


def test_the_sdk_rule_catches_a_planted_reach() -> None:
    planted = (
        "def f(server, tool, self):\n"
        "    self._registrations.append(server._tool_manager.get_tool('x'))\n"
        "    tool.fn_metadata.output_schema = {}\n"
        "    tool.__dict__.pop('output_schema', None)\n"
    )
    assert reaches_in(planted) == [
        "line 2: server._tool_manager",
        "line 3: tool.fn_metadata",
        "line 4: tool.__dict__",
    ]


def test_parsing_and_scoring_do_no_io() -> None:
    # Scoring an answer depends on no weight-file reader, and parsing an intervention reads no file: the dictionaries'
    # loaders are called only by the one resolver of references.
    loaders = {f"{ENGINE}.dictionaries.saelens", f"{ENGINE}.dictionaries.transcoder_format"}
    assert not GRAPH[f"{ENGINE}.text.answers"] & {f"{ENGINE}.ablation.targets", *loaders}
    assert not GRAPH[f"{ENGINE}.ablation.targets"] & loaders
    assert loaders <= GRAPH[f"{ENGINE}.references"]


# --- the house: entry points on top, the loader in the engine, one resolver, one place for errors and types ---------


def test_nothing_but_the_entry_points_imports_the_package_root() -> None:
    importers = sorted(name for name, targets in GRAPH.items() if ROOT in targets)
    assert [name for name in importers if layer_of(name) < layer_of(ROOT)] == []


def test_the_walk_counts_lazy_and_function_level_imports() -> None:
    planted = (
        "import importlib\n"
        "def later():\n"
        "    from mcp_interp.app import api\n"
        "    return importlib.import_module('mcp_interp.host')\n"
        "from mcp_interp import __version__\n"
    )
    found = imports_in(planted, "mcp_interp.core.graphs.planted")
    assert {"mcp_interp.app.api", "mcp_interp.host", ROOT} <= found
    saved = {k: set(v) for k, v in GRAPH.items()}
    try:  # a circle closed only by a lazy import is still a circle
        GRAPH["mcp_interp.core.engine.jobs"].add("mcp_interp.app.api")
        assert any({"mcp_interp.core.engine.jobs", "mcp_interp.app.api"} <= set(c) for c in cycles())
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


def loose_top_level_modules(modules: set[str]) -> list[str]:
    """Top-level modules that are neither base utilities nor the host nor the root's own ``__init__``/``__main__``:
    an entry point or a loader left loose at the top."""
    allowed = {*FLOORS[1], "mcp_interp.host", ROOT, "mcp_interp.__main__"}
    return sorted(
        m for m in modules if m.count(".") == 1 and m not in allowed and (PACKAGE / m.split(".")[1]).suffix == ""
    )


def test_the_entry_points_live_together_and_the_loader_inside_the_engine() -> None:
    assert {f"mcp_interp.app.{name}" for name in ENTRY_POINTS} <= set(MODULES)
    top = {m for m in MODULES if m.count(".") == 1 and not (PACKAGE / m.split(".")[1]).is_dir()}  # modules, not folders
    assert loose_top_level_modules(top) == []
    assert "mcp_interp.core.engine.backend.loader.load" in MODULES
    assert not {"mcp_interp.models", "mcp_interp.engines", "mcp_interp.session", "mcp_interp.cli"} & set(MODULES)
    # the state a server keeps lives in one package: a store, a ledger or limits at the top would be loose again
    assert loose_top_level_modules({"mcp_interp.cli", "mcp_interp.models", "mcp_interp.store"}) == [
        "mcp_interp.cli",
        "mcp_interp.models",
        "mcp_interp.store",
    ]
    state = {"store", "ledger", "paths", "limits", "folders", "turns"}
    assert {f"mcp_interp.state.{name}" for name in state} <= set(MODULES)
    assert not {f"mcp_interp.{name}" for name in state} & set(MODULES)


EXCEPTION_BASES = {"Exception", "BaseException", "ValueError", "RuntimeError", "LookupError", "TypeError", "KeyError"}


def exceptions_outside_errors(modules: dict[str, str]) -> list[str]:
    """Classes deriving from an exception (a builtin one, or one named ``…Error``) outside ``errors.py``."""
    found = []
    for name, source in modules.items():
        if name == "mcp_interp.errors":
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
                if bases & EXCEPTION_BASES or any(b.endswith(("Error", "Exception")) for b in bases):
                    found.append(f"{name}.{node.name}")
    return found


def test_exceptions_live_in_errors_py() -> None:
    sources = {name: path.read_text(encoding="utf-8") for name, path in MODULES.items()}
    assert exceptions_outside_errors(sources) == []
    planted = {"mcp_interp.state.store": "class NotFound(LookupError): ...\nclass Bad(InputError): ...\nclass Ok: ..."}
    assert exceptions_outside_errors(planted) == ["mcp_interp.state.store.NotFound", "mcp_interp.state.store.Bad"]


def type_definitions(source: str) -> set[str]:
    """Classes and type aliases a module defines at its top level (``X = Literal[...]``, ``X = A | B``,
    ``X = Annotated[...]``)."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Subscript | ast.BinOp):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = ast.unparse(node.value)
            if value.startswith(("Literal[", "Annotated[")) or isinstance(node.value, ast.BinOp):
                names.update(t.id for t in targets if isinstance(t, ast.Name) and t.id[:1].isupper())
    return names


def test_each_type_is_defined_once_in_the_package() -> None:
    types = {name: type_definitions(path.read_text(encoding="utf-8")) for name, path in MODULES.items()}
    assert names_defined_twice(types) == {}
    planted = {**types, "planted.a": {"ModelSource"}, "planted.b": {"ModelSource"}}
    assert "ModelSource" in names_defined_twice(planted)
    assert type_definitions('A = Literal["x"]\nB = int | str\nC = 3\nclass D: ...\n') == {"A", "B", "D"}


REFERENCES = f"{ENGINE}.references"
READERS_OF_REFERENCES = {f"{ENGINE}.dictionaries.saelens", f"{ENGINE}.dictionaries.transcoder_format"}


def resolver_violations(graph: dict[str, set[str]]) -> list[str]:
    """References are resolved in one layer, by one module: only ``core.engine.references`` imports the dictionaries'
    loaders, and nothing outside ``core/`` imports it (adapters pass the store's lookup in; core resolves)."""
    found = []
    for name, targets in graph.items():
        if name != REFERENCES and name not in READERS_OF_REFERENCES and targets & READERS_OF_REFERENCES:
            found.append(f"{name} loads a dictionary itself")
        if REFERENCES in targets and core_place(name) is None:
            found.append(f"{name} resolves references outside core")
    return found


def test_references_are_resolved_in_one_layer_by_one_module() -> None:
    assert resolver_violations(GRAPH) == []
    planted = {
        f"{MCP}.toolkit": {REFERENCES},
        f"{CORE}.features.units": {f"{ENGINE}.dictionaries.saelens", REFERENCES},
        f"{CORE}.lens.steer": {REFERENCES},  # allowed
    }
    assert resolver_violations(planted) == [
        f"{MCP}.toolkit resolves references outside core",
        f"{CORE}.features.units loads a dictionary itself",
    ]
