"""The helpers of the generated modules, and their copy into each module that uses them.

torch_helpers.py (with torch_private.py, the private torch APIs) and tf_helpers.py are
plain modules on their framework alone, tested directly. A generated module imports
neither them nor symgrad: :func:`copy_in` gives the source of the helpers its code uses,
with those they use in turn, to be pasted into it. Reading that source needs neither
framework (the files are parsed, not imported).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

#: The runtime files of each framework, in the order their definitions are copied.
FILES = {
    "torch": ("torch_helpers.py", "torch_private.py", "shared_helpers.py"),
    "tensorflow": ("tf_helpers.py", "shared_helpers.py"),
}

#: Modules the generated code reads itself, beside those of the runtime's imports (the
#: printers write math.pi, math.log(2), ...).
CODE_IMPORTS = {"math": "import math"}


@dataclass(frozen=True)
class Definition:
    """One top-level statement of a runtime file (a def, a class, an assignment)."""

    names: frozenset[str]  # the names it binds
    uses: frozenset[str]  # the names it reads
    source: str  # its text, with the comments and blank lines above it


@dataclass(frozen=True)
class Runtime:
    """A framework's runtime: its definitions in order, and what its imports bind."""

    definitions: tuple[Definition, ...]
    imports: dict[str, str]  # name -> the import statement that binds it


@dataclass(frozen=True)
class Copy:
    """What a generated module gets: import statements and the helpers' source."""

    imports: tuple[str, ...]
    source: str


def names_in(code: str) -> frozenset[str]:
    """The names ``code`` uses (and exports: the strings of its ``__all__``)."""
    tree = ast.parse(code)
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            names |= {
                e.value
                for e in ast.walk(node.value)
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            }
    return frozenset(names)


def runtime(framework: str) -> Runtime:
    """Parse the runtime files of ``framework`` ("torch" or "tensorflow")."""
    definitions: list[Definition] = []
    imports: dict[str, str] = dict(CODE_IMPORTS)
    for file in FILES[framework]:
        text = (Path(__file__).parent / file).read_text()
        lines = text.splitlines(keepends=True)
        end = 0  # the last line of the statement before
        for node in ast.parse(text).body:
            source = "".join(lines[end : node.end_lineno])
            end = node.end_lineno
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imports.update(_bound_by(node))
            elif isinstance(
                node, (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
            ):
                definitions.append(Definition(_bound(node), _read(node), source))
            # (the module docstring is left out)
    return Runtime(tuple(definitions), imports)


def copy_in(framework: str, code: str) -> Copy:
    """The runtime helpers that ``code`` (a generated module without them) uses, and the
    ones those use in turn; the imports they and ``code`` need. In the runtime's order,
    the same for the same ``code``."""
    rt = runtime(framework)
    used = set(names_in(code))
    wanted: set[str] = set()
    chosen: set[int] = set()
    while True:
        new = {
            k
            for k, d in enumerate(rt.definitions)
            if k not in chosen and d.names & (used | wanted)
        }
        if not new:
            break
        chosen |= new
        for k in new:
            wanted |= rt.definitions[k].uses
    source = "".join(d.source for k, d in enumerate(rt.definitions) if k in chosen)
    needed = (used | wanted) & rt.imports.keys()
    imports = tuple(sorted({rt.imports[name] for name in needed}))
    return Copy(imports, source.lstrip("\n"))


def _bound(node: ast.stmt) -> frozenset[str]:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return frozenset({node.name})
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return frozenset(
        n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)
    )


def _read(node: ast.stmt) -> frozenset[str]:
    return frozenset(
        n.id
        for n in ast.walk(node)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    ) - _bound(node)


def _bound_by(node: ast.Import | ast.ImportFrom) -> dict[str, str]:
    """Name -> an import statement of that name alone; nothing for ``__future__`` and
    relative imports (the runtime's own files, copied as definitions)."""
    if isinstance(node, ast.ImportFrom) and (node.level or node.module == "__future__"):
        return {}
    result = {}
    for alias in node.names:
        name = alias.asname or alias.name.partition(".")[0]
        if isinstance(node, ast.Import):
            statement = ast.Import(names=[alias])
        else:
            statement = ast.ImportFrom(module=node.module, names=[alias], level=0)
        result[name] = ast.unparse(statement)
    return result
