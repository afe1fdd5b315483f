"""Importing generated modules: the one importer of the smoke run, the accuracy report,
the benchmarks and the tests."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

_counter = itertools.count()


def import_path(path: str | Path, name: str | None = None, keep: bool = True) -> ModuleType:
    """The module at ``path``, imported under ``name`` (default: a name of its own, so
    each import is an independent copy). ``keep``: left in ``sys.modules`` (pickling and
    torch.compile look a module up by name); else removed once it has run."""
    path = Path(path)
    name = name or f"_symgrad_{next(_counter)}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py path always loads
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    if not keep:
        sys.modules.pop(name, None)
    return module


@contextlib.contextmanager
def imported(file_name: str, text: str) -> Iterator[tuple[ModuleType, Path]]:
    """The module ``text`` imported from a temporary file ``file_name`` (tracebacks name
    it), gone again afterwards."""
    with tempfile.TemporaryDirectory(prefix="symgrad-") as tmp:
        path = Path(tmp) / file_name
        path.write_text(text, encoding="utf-8")
        module = import_path(path)
        try:
            yield module, path
        finally:
            sys.modules.pop(module.__name__, None)
