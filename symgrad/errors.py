"""The one error type every stage raises for bad input."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Location:
    """Where something came from in a spec file."""

    path: Path | str
    line: int | None = None
    function: str | None = None

    def at(self, line: int | None = None, function: str | None = None) -> Location:
        """The same file, another line and/or function."""
        return Location(
            self.path,
            self.line if line is None else line,
            self.function if function is None else function,
        )

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else f"{self.path}"
        if self.function:
            where += f" (function '{self.function}')"
        return where


class SpecError(Exception):
    """A problem with a spec the user can fix: says where, what, and how to fix it."""

    def __init__(self, location: Location | None, message: str, hint: str | None = None):
        self.location = location
        self.message = message
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.location}: {self.message}" if self.location else self.message
        if self.hint:
            text += f"\n  fix: {self.hint}"
        return text


class DerivationError(SpecError):
    """SymPy could not derive or print something the spec asks for."""
