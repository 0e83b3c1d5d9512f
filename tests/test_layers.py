"""Imports run one way between the packages of ``hfx/``: each layer imports only from layers
below it (or within itself), lazy imports inside functions included, and nothing imports in a
circle — no two packages import each other, and no module reaches itself through imports that
run (those under ``if TYPE_CHECKING:`` do not). The layers, from the bottom
(docs/architecture.md, "Layout"):

    base        the package, the virtual clock and its timers (sim/), request, sampling,
                registries, tallies, native
    stepmodel   the step-time model, roofline, fitting, the shipped profiles
    model       the PyTorch model, weights, tokenizer
    engine      the engine core, planners, executors (and the real engine's profiler)
    policies    the dispatch policies
    workloads   tasks, arrivals, traces
    records     what a run's records become: columns, metrics, streaming metrics
    config      the layered configuration
    cluster     the control plane and the Instance / Placement protocols
    backends    local, Ray and vLLM instances
    assembly    a cluster from a config; the simulation driver (sim/driver.py, miss_watch.py)
    evaluation  sweeps, capacity, comparisons, calibration, the bench client
    serving     the gateway, fronts, the control process
    cli         the command line

A name ending in ``.*`` is a package and everything in it; any other names one module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "hfx"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("hfx", "hfx.sim", "hfx.sim.clock", "hfx.sim.timer_queue", "hfx.request",
              "hfx.sampling", "hfx.registry", "hfx.engines", "hfx.tally", "hfx.native")),
    ("stepmodel", ("hfx.stepmodel.*",)),
    ("model", ("hfx.model.*",)),
    ("engine", ("hfx.engine.*",)),
    ("policies", ("hfx.policies.*",)),
    ("workloads", ("hfx.workloads.*",)),
    ("records", ("hfx.records.*",)),
    ("config", ("hfx.config.*",)),
    ("cluster", ("hfx.cluster.*",)),
    ("backends", ("hfx.backends.*",)),
    ("assembly", ("hfx.assembly", "hfx.sim.driver", "hfx.sim.miss_watch")),
    ("evaluation", ("hfx.evaluation.*",)),
    ("serving", ("hfx.serving.*",)),
    ("cli", ("hfx.cli.*",)),
]
# Modules the walk must find where they are (moved, or the walk broken, it finds none).
EXPECTED = ("hfx", "hfx.cluster.control", "hfx.engine.core", "hfx.policies.hfx",
            "hfx.serving.gateway.app", "hfx.backends.vllm.instance", "hfx.cli")


def layer_of(module: str) -> int:
    """The layer of a module, or -1."""
    for i, (_, names) in enumerate(LAYERS):
        for name in names:
            if name.endswith(".*"):
                package = name[:-2]
                if module == package or module.startswith(package + "."):
                    return i
            elif module == name:
                return i
    return -1


def module_of(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _typing_only(tree: ast.Module) -> set[int]:
    """Line numbers of the imports under ``if TYPE_CHECKING:`` (never run)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    if isinstance(sub, ast.Import | ast.ImportFrom):
                        lines.add(sub.lineno)
    return lines


def imports_in(source: str, module: str, is_package: bool, modules: set[str]
               ) -> list[tuple[str, int, bool]]:
    """Every hfx module a module's source imports, anywhere in it (lazy imports included), as
    (module, line, runs): ``from hfx import x`` and ``from hfx.a import b`` name the module
    ``x`` or ``b`` where it is one; relative imports resolve against the package."""
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    typing_only = _typing_only(tree)
    found: list[tuple[str, int, bool]] = []
    for node in ast.walk(tree):
        runs = node.lineno not in typing_only if hasattr(node, "lineno") else True
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, runs) for a in node.names
                      if a.name == "hfx" or a.name.startswith("hfx.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against this package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            if name != "hfx" and not name.startswith("hfx."):
                continue
            for alias in node.names:
                sub = f"{name}.{alias.name}"
                found.append((sub if sub in modules else name, node.lineno, runs))
    return found


def upward_imports(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """module → (source, is a package): each import that goes up a layer."""
    modules = set(sources)
    upward = []
    for module, (source, is_package) in sources.items():
        here = layer_of(module)
        for name, line, _ in imports_in(source, module, is_package, modules):
            there = layer_of(name)
            if there > here:
                upward.append(f"{module}:{line} imports {name} "
                              f"({LAYERS[here][0]} → {LAYERS[there][0]})")
    return upward


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module → the modules it imports in code that runs."""
    modules = set(sources)
    return {m: {name for name, _, runs in imports_in(src, m, pkg, modules)
                if runs and name in modules and name != m}
            for m, (src, pkg) in sources.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles between packages: ``hfx.a`` for ``hfx.a.b.c`` (top-level modules are their own),
    taken by layer where a package spans two (``hfx.sim``: its clock in the base layer, its
    driver above the cluster)."""
    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    layers: dict[str, set[int]] = {}
    for module in {*graph, *(t for targets in graph.values() for t in targets)}:
        layers.setdefault(package(module), set()).add(layer_of(module))

    def unit(module: str) -> str:
        name = package(module)
        return name if len(layers[name]) < 2 else f"{name} ({LAYERS[layer_of(module)][0]})"

    units: dict[str, set[str]] = {}
    for module, targets in graph.items():
        here = unit(module)
        units.setdefault(here, set()).update(unit(t) for t in targets if unit(t) != here)
    return cycles(units)


def hfx_sources(root: Path = ROOT) -> dict[str, tuple[str, bool]]:
    return {module_of(p, root): (p.read_text(), p.name == "__init__.py")
            for p in sorted(root.rglob("*.py"))}


def test_the_walk_reads_the_sources_it_expects():
    sources = hfx_sources()
    assert len(sources) > 150
    assert set(EXPECTED) <= set(sources)


def test_every_module_has_a_layer():
    unplaced = [m for m in hfx_sources() if layer_of(m) < 0]
    assert not unplaced, f"modules in no layer (add them to LAYERS): {unplaced}"


def test_imports_run_downwards_only():
    upward = upward_imports(hfx_sources())
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def test_no_module_and_no_package_imports_itself_in_a_circle():
    graph = import_graph(hfx_sources())
    assert not cycles(graph), f"module cycles: {cycles(graph)}"
    assert not package_cycles(graph), f"package cycles: {package_cycles(graph)}"


def test_the_checker_catches_every_import_form_up_a_layer():
    lazy = "import asyncio\n\ndef f():\n    from hfx.cli import main\n    return main\n"
    relative = "from ..serving.server import Server\n"
    from_package = "from hfx import cli\nimport hfx.assembly\n"
    down = "from hfx.stepmodel.latency import Profile\nimport hfx.request\nfrom hfx import clock\n"
    found = upward_imports({"hfx.engine.core": (lazy, False),
                            "hfx.policies.hfx": (relative, False),
                            "hfx.workloads.load": (from_package, False),
                            "hfx.cluster.control": (down, False),
                            "hfx.cli": ("", True), "hfx.sim.clock": ("", False),
                            "hfx.serving.server": ("", False)})
    assert found == ["hfx.engine.core:4 imports hfx.cli (engine → cli)",
                     "hfx.policies.hfx:1 imports hfx.serving.server (policies → serving)",
                     "hfx.workloads.load:1 imports hfx.cli (workloads → cli)",
                     "hfx.workloads.load:2 imports hfx.assembly (workloads → assembly)"]


def test_the_checker_catches_a_planted_cycle_and_a_module_in_no_layer(tmp_path):
    root = tmp_path / "hfx"
    (root / "cluster").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "cluster" / "__init__.py").write_text("")
    (root / "cluster" / "a.py").write_text("def f():\n    from hfx.cluster import b\n")
    (root / "cluster" / "b.py").write_text("from hfx.cluster.a import f\n")
    (root / "cluster" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hfx.cluster import a\n")
    (root / "stray.py").write_text("")
    sources = hfx_sources(root)
    graph = import_graph(sources)
    assert cycles(graph) == [["hfx.cluster.a", "hfx.cluster.b"]]  # c's import never runs
    assert package_cycles({"hfx.config.x": {"hfx.backends"}, "hfx.backends": {"hfx.config.y"},
                           "hfx.config.y": set()}) == [["hfx.backends", "hfx.config"]]
    assert [m for m in sources if layer_of(m) < 0] == ["hfx.stray"]
