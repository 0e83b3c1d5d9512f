"""Imports run one way between the packages of ``hfx/``: each layer imports only from layers
below it (or within itself), lazy imports inside functions included, and no two layers import
each other. The layers, from the bottom (docs/architecture.md, "Layout"):

    base        clock, request, sampling, registry
    stepmodel   the step-time model, roofline, fitting, the shipped profiles
    model       the PyTorch model, weights, tokenizer
    engine      the engine core, planners, executors (and the real engine's profiler)
    policies    the dispatch policies
    workloads   tasks, arrivals, traces, metrics
    config      the layered configuration
    cluster     the control plane and the Instance / Placement protocols
    backends    local, Ray and vLLM instances
    assembly    a cluster from a config; the simulator
    evaluation  sweeps, capacity, comparisons, calibration, the bench client
    serving     the gateway, fronts, the control process
    cli         the command line
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "hfx"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # ``hfx.backends`` itself is the backends' registry of import paths, read by the config.
    ("base", ("hfx.clock", "hfx.request", "hfx.sampling", "hfx.registry", "hfx",
              "hfx.backends")),
    ("stepmodel", ("hfx.stepmodel",)),
    ("model", ("hfx.model",)),
    ("engine", ("hfx.engine",)),
    ("policies", ("hfx.policies",)),
    ("workloads", ("hfx.workloads",)),
    ("config", ("hfx.config",)),
    ("cluster", ("hfx.cluster",)),
    ("backends", ("hfx.backends.base", "hfx.backends.local", "hfx.backends.own",
                  "hfx.backends.engine_spec", "hfx.backends.ray", "hfx.backends.vllm")),
    ("assembly", ("hfx.assembly", "hfx.sim")),
    ("evaluation", ("hfx.evaluation",)),
    ("serving", ("hfx.serving",)),
    ("cli", ("hfx.cli",)),
]


def layer_of(module: str) -> int:
    """The layer of a module: the longest prefix that names one."""
    best, length = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = i, len(prefix)
    return best


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_in(source: str, module: str, is_package: bool) -> list[tuple[str, int]]:
    """Every hfx module a module's source imports, anywhere in it (lazy imports included)."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.startswith("hfx")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against this package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            if name.startswith("hfx"):
                found.append((name, node.lineno))
    return found


def upward_imports(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """module → (source, is a package): each import that goes up a layer."""
    upward = []
    for module, (source, is_package) in sources.items():
        here = layer_of(module)
        for name, line in imports_in(source, module, is_package):
            there = layer_of(name)
            if there > here:
                upward.append(f"{module}:{line} imports {name} "
                              f"({LAYERS[here][0]} → {LAYERS[there][0]})")
    return upward


def hfx_sources() -> dict[str, tuple[str, bool]]:
    return {module_of(p): (p.read_text(), p.name == "__init__.py")
            for p in sorted(ROOT.rglob("*.py"))}


def test_every_module_has_a_layer():
    unplaced = [m for m in hfx_sources() if layer_of(m) < 0]
    assert not unplaced, f"modules in no layer (add them to LAYERS): {unplaced}"


def test_imports_run_downwards_only():
    upward = upward_imports(hfx_sources())
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def test_the_checker_catches_lazy_and_relative_imports_up_a_layer():
    lazy = "import asyncio\n\ndef f():\n    from hfx.cli import main\n    return main\n"
    relative = "from ..serving.server import Server\n"
    down = "from hfx.stepmodel.latency import Profile\nimport hfx.request\n"
    found = upward_imports({"hfx.engine.core": (lazy, False),
                            "hfx.policies.hfx": (relative, False),
                            "hfx.cluster.control": (down, False)})
    assert found == ["hfx.engine.core:4 imports hfx.cli (engine → cli)",
                     "hfx.policies.hfx:1 imports hfx.serving.server (policies → serving)"]
