"""The package a wheel is built from holds every module (not only an editable install)."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # (Python 3.11+; CI runs 3.11)
ROOT = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_listed_for_the_wheel():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "symgrad").rglob("__init__.py")
    }
    assert set(config["packages"]) == on_disk | {"symgrad.templates"}
    assert config["package-dir"]["symgrad.templates"] == "templates"
