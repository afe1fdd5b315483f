"""Shared fixtures for symgrad's own tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def import_file(path: Path):
    """Import a generated module from its file, under a unique name."""
    name = f"_symgrad_test_{path.stem}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def generate_module(tmp_path):
    """Write a spec text, generate its modules, and import the torch one."""
    from symgrad.generate import generate
    from symgrad.spec import load_spec

    def _generate(text: str, target: str = "torch"):
        path = tmp_path / "spec.yaml"
        path.write_text(text)
        spec = load_spec(path)
        suffix = {"torch": "_torch.py", "tensorflow": "_tf.py"}[target]
        for f in generate(spec, targets=(target,), tests=False):
            (tmp_path / f.name).write_text(f.text)
        return import_file(tmp_path / f"{spec.module}{suffix}")

    return _generate
