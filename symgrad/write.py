"""Deterministic, atomic file output and the --check comparison."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Planned:
    """A file symgrad wants on disk."""

    path: Path
    text: str

    def status(self) -> str:
        """'missing', 'stale' or 'fresh'."""
        if not self.path.exists():
            return "missing"
        return "fresh" if self.path.read_text(encoding="utf-8") == self.text else "stale"


def check(files: list[Planned]) -> list[tuple[Planned, str]]:
    """The files that are missing or would change."""
    return [(f, s) for f in files if (s := f.status()) != "fresh"]


def _mode(path: Path) -> int:
    """The mode a written file gets: the replaced file's, else what the umask allows for a
    new file (mkstemp's own is 0600, private to the user)."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_all(files: list[Planned]) -> list[Path]:
    """Write every changed file; all new contents are staged before any file is replaced.

    Everything is rendered before this is called, so a bad spec never gets here; staging
    first means a disk error leaves the old files (an os.replace is atomic per file). An
    OSError (a directory that cannot be made or written) reaches the caller.
    """
    staged: list[tuple[str, Path]] = []
    try:
        for f in files:
            if f.status() == "fresh":
                continue
            f.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=f.path.parent, prefix=f".{f.path.name}.", suffix=".tmp")
            staged.append((tmp, f.path))
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
                handle.write(f.text)
            os.chmod(tmp, _mode(f.path))
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise
    for tmp, target in staged:
        os.replace(tmp, target)
    return [target for _, target in staged]
