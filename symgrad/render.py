"""Render generated files: the one Jinja2 environment, and ruff formatting of the result."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

import jinja2

from symgrad import __version__
from symgrad.errors import DerivationError, SpecError


def _templates_dir() -> Path:
    """templates/ at the repo top level, or inside the installed package."""
    packaged = Path(__file__).parent / "templates"
    return packaged if packaged.is_dir() else Path(__file__).parent.parent / "templates"


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["returned"] = returned
    return env


def returned(lines: list[str]) -> list[str]:
    """Straight-line code ending ``name = expr`` and ``return name``, ending
    ``return expr`` instead."""
    if len(lines) >= 2 and not lines[-2].startswith(" "):
        name, eq, value = lines[-2].partition(" = ")
        if eq and name.isidentifier() and lines[-1] == f"return {name}":
            return [*lines[:-2], f"return {value}"]
    return lines


def render(template: str, **context) -> str:
    """Render one template with symgrad's version in the context."""
    return environment().get_template(template).render(version=__version__, **context)


def ruff_binary() -> str:
    """The executable of the ruff symgrad formats generated code with (a dependency, pinned
    so that the output is byte-identical); a SpecError saying how to install it where it is
    missing, instead of an internal error per function."""
    try:
        from ruff.__main__ import find_ruff_bin

        return str(find_ruff_bin())
    except (ImportError, FileNotFoundError) as exc:
        raise SpecError(
            None,
            f"ruff, which formats the generated code, cannot be run here ({exc})",
            "install symgrad with its dependencies (pip install symgrad, or pip install -e . "
            "in a checkout): they pin the ruff version the generated files are formatted with",
        ) from exc


def ruff_format(source: str, name: str) -> str:
    """Format generated Python with ruff (pinned), independent of any user config."""
    ruff = ruff_binary()
    for command in (
        ["check", "--isolated", "--select", "I,RUF022", "--fix", "--exit-zero", "--quiet"],
        ["format", "--isolated"],
    ):
        proc = subprocess.run(
            [ruff, *command, "--stdin-filename", name, "-"],
            input=source,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise DerivationError(
                None, f"generated {name} is not valid Python:\n{proc.stderr}\n{source}"
            )
        source = proc.stdout
    return source
