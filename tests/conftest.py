"""Shared fixtures for symgrad's own tests."""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path

import pytest

from symgrad.load import import_path

ROOT = Path(__file__).resolve().parent.parent

# A candidate rewrite that raises fails the derivation here (users get a note and the
# code without that form: symgrad.derive.STRICT_REWRITES_ENV).
os.environ.setdefault("SYMGRAD_STRICT_REWRITES", "1")


def import_file(path: Path):
    """Import a generated module from its file, under a unique name."""
    return import_path(path)


def generate_into(directory: Path, text: str, target: str = "torch"):
    """Write a spec text into ``directory``, generate its modules there, and import the
    ``target`` one."""
    from symgrad.generate import generate
    from symgrad.spec import load_spec

    path = directory / "spec.yaml"
    path.write_text(text)
    spec = load_spec(path)
    suffix = {"torch": "_torch.py", "tensorflow": "_tf.py"}[target]
    for f in generate(spec, targets=(target,), tests=False):
        (directory / f.name).write_text(f.text)
    return import_file(directory / f"{spec.module}{suffix}")


@pytest.fixture
def generate_module(tmp_path):
    """Write a spec text, generate its modules, and import the torch one."""

    def _generate(text: str, target: str = "torch"):
        return generate_into(tmp_path, text, target)

    return _generate


def run_generated_suite(tmp_path: Path, spec_text: str, target: str, *pytest_args: str):
    """Generate ``spec_text``'s modules and tests for ``target`` into ``tmp_path`` and run
    the generated test file in a fresh process; returns {file name: source}. Fails the
    calling test unless the suite passed."""
    import subprocess
    import sys

    from symgrad.generate import generate
    from symgrad.spec import load_spec

    path = tmp_path / "spec.yaml"
    path.write_text(spec_text)
    spec = load_spec(path)
    files = {f.name: f.text for f in generate(spec, targets=(target,))}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    suffix = "torch" if target == "torch" else "tf"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [*command, f"test_{spec.module}_{suffix}.py", *pytest_args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
    return files


def _global_state() -> dict[str, object]:
    """Process-wide settings a test could change and leave behind."""
    if importlib.util.find_spec("torch") is None:
        return {}
    import torch  # (before the first test that imports it, too: else nothing is compared)

    state: dict[str, object] = {
        "default dtype": torch.get_default_dtype(),
        "grad mode": torch.is_grad_enabled(),
        "threads": torch.get_num_threads(),
    }
    for name in ("_dynamo", "_inductor"):
        module = importlib.import_module(f"torch.{name}.config")
        if hasattr(module, "get_config_copy"):
            # read as the compiler reads them: an attribute that a patch's undo deleted
            # (pytest 9.2's monkeypatch) is gone although the config copy still lists it
            with warnings.catch_warnings():  # (reading a deprecated setting warns)
                warnings.simplefilter("ignore")
                settings = {k: getattr(module, k, "<deleted>") for k in module.get_config_copy()}
            state[f"torch.{name}.config"] = repr(sorted(settings.items()))
    return state


@pytest.fixture(autouse=True)
def _no_leaked_global_state():
    """Fail a test that leaves torch's process-wide settings changed.

    A leak shows up as failures in whichever tests run later (pytest 9.2's monkeypatch
    undo once deleted ``torch._dynamo.config.recompile_limit`` and broke every later
    ``torch.compile``); here it fails the test that caused it, by name.
    """
    before = _global_state()
    yield
    after = _global_state()
    changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    assert not changed, f"this test left global state changed: {', '.join(changed)}"
