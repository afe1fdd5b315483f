"""The package's shape: a one-way pipeline (docs/architecture.md).

Imports are read from the source (every ``import`` statement, those inside functions
too), so a lazy import cannot hide a circle or a stage reaching back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "symgrad"

#: The layers, lowest first: a module may import its own layer's modules and those of
#: the layers below, never those above.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "symgrad",
        "symgrad.errors",
        "symgrad.series",
        "symgrad.numerics",
        "symgrad.numerics.floats",
        "symgrad.runtime.shared_helpers",  # plain Python: the NumPy model runs it too
    ),
    ("symgrad.spec", "symgrad.functions", "symgrad.ops", "symgrad.cost"),
    (
        "symgrad.expr",
        "symgrad.cse",
        "symgrad.numerics.mp",
        "symgrad.numerics.native",
        "symgrad.numerics.points",
    ),
    ("symgrad.rewrite", "symgrad.derived"),
    ("symgrad.choose",),
    ("symgrad.derive", "symgrad.tensor", "symgrad.tensor.lang", "symgrad.tensor.tape"),
    ("symgrad.tensor.exact",),
    ("symgrad.printers", "symgrad.docstrings"),
    ("symgrad.plan", "symgrad.ir", "symgrad.tensor.emit", "symgrad.tensor.plan"),
    ("symgrad.runtime",),
    ("symgrad.render",),
    ("symgrad.write",),
    # consumers and drivers on top of the pipeline
    ("symgrad.cases", "symgrad.testgen", "symgrad.generate", "symgrad.load", "symgrad.smoke"),
    ("symgrad.report",),
    ("symgrad.cli",),
)

#: What differentiates or evaluates with mpmath: nothing after derive may import these.
MATHS = ("symgrad.derive", "symgrad.choose", "symgrad.numerics.mp", "symgrad.numerics.native")
AFTER_DERIVE = ("symgrad.plan", "symgrad.ir", "symgrad.printers", "symgrad.render", "symgrad.write")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Module -> the symgrad modules it imports (anywhere in its source)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _layer(module: str) -> int:
    """The layer of ``module``: of its own name, else of its nearest package listed."""
    names = {name: depth for depth, layer in enumerate(LAYERS) for name in layer}
    parts = module.split(".")
    for end in range(len(parts), 1, -1):
        if ".".join(parts[:end]) in names:
            return names[".".join(parts[:end])]
    if module in names:
        return names[module]
    raise AssertionError(f"{module} is in no layer of tests/test_architecture.py: add it")


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_every_module_has_a_layer():
    for module in _imports():
        _layer(module)


def test_no_module_imports_a_later_stage():
    backward = [
        f"{module} imports {dep}"
        for module, deps in sorted(_imports().items())
        for dep in sorted(deps)
        if _layer(dep) > _layer(module)
    ]
    assert not backward, "\n".join(backward)


def test_no_import_circle():
    graph = _imports()
    circles = [m for m in sorted(graph) if m in _reachable(graph, m)]
    assert not circles, f"modules on an import circle: {circles}"


@pytest.mark.parametrize("stage", AFTER_DERIVE)
def test_nothing_after_derive_differentiates_or_evaluates(stage):
    graph = _imports()
    for module in [m for m in graph if m == stage or m.startswith(stage + ".")]:
        reached = _reachable(graph, module) & set(MATHS)
        assert not reached, f"{module} reaches {sorted(reached)}"


def test_the_checks_see_a_lazy_import():
    """The graph includes imports inside functions (the reason it is read from source)."""
    graph = _imports()
    assert "symgrad.generate" in graph["symgrad.cli"]  # cli imports its stages lazily
