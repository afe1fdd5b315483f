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


class SpecErrors(SpecError):
    """Several problems, every one reported (a spec's functions are all checked)."""

    def __init__(self, errors: list[SpecError]):
        self.errors = list(errors)
        first = self.errors[0]
        super().__init__(first.location, first.message, first.hint)

    def __str__(self) -> str:
        if len(self.errors) == 1:
            return str(self.errors[0])
        lines = [f"{len(self.errors)} problems:"]
        lines += [f"- {error}".replace("\n", "\n  ") for error in self.errors]
        return "\n".join(lines)


def raise_all(errors: list[SpecError]) -> None:
    """Raise ``errors`` as one (nothing when empty)."""
    if errors:
        raise errors[0] if len(errors) == 1 else SpecErrors(errors)
