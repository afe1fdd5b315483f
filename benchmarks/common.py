"""Shared helpers of bench_torch.py and bench_tf.py: code generation, statistics, tables."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
SPEC_PATH = HERE / "specs" / "perf.yaml"


@dataclass
class Generated:
    """The generated module of one target, and how long symgrad took to produce it."""

    module: ModuleType
    path: Path
    derive_s: dict[str, float]  # function -> seconds in derive_function (SymPy)
    plan_s: dict[str, float]  # function -> seconds in plan_torch / plan_tensorflow
    render_s: float  # generate(): planning again, rendering and ruff-formatting the module
    total_s: float  # everything, spec loading included


def generate_module(target: str, outdir: Path, functions: list[str] | None = None) -> Generated:
    """Generate the perf spec's module for ``target`` ("torch" or "tensorflow") and import it.

    ``functions``: only these functions of the spec (all by default).

    Derivation and planning are timed per function; ``generate`` is then handed the
    derived formulas, so what it adds is planning again, rendering and formatting.
    """
    from symgrad.derive import derive_function
    from symgrad.generate import generate
    from symgrad.plan import plan_tensorflow, plan_torch
    from symgrad.spec import load_spec

    planner = plan_torch if target == "torch" else plan_tensorflow
    start = time.perf_counter()
    spec = load_spec(SPEC_PATH)
    if functions is not None:
        spec = dataclasses.replace(
            spec, functions=tuple(f for f in spec.functions if f.name in functions)
        )
    derived, derive_s, plan_s = [], {}, {}
    for fn in spec.functions:
        t0 = time.perf_counter()
        d = derive_function(fn)
        t1 = time.perf_counter()
        planner(d)
        derive_s[fn.name] = t1 - t0
        plan_s[fn.name] = time.perf_counter() - t1
        derived.append(d)
    t0 = time.perf_counter()
    files = generate(spec, targets=(target,), tests=False, derived=tuple(derived))
    render_s = time.perf_counter() - t0
    total_s = time.perf_counter() - start
    (file,) = files
    path = outdir / file.name
    path.write_text(file.text)
    module = import_file(path, path.stem)
    return Generated(module, path, derive_s, plan_s, render_s, total_s)


def import_file(path: Path, name: str) -> ModuleType:
    """Import ``path`` as module ``name`` (a second name gives an independent copy)."""
    from symgrad.load import import_path

    return import_path(path, name)


def print_codegen_times(gen: Generated) -> None:
    n = len(gen.derive_s)
    digest = hashlib.sha256(gen.path.read_bytes()).hexdigest()[:12]
    print(
        f"symgrad gen ({gen.path.name}, sha256 {digest}): {gen.total_s:.2f} s for {n} functions = "
        f"{gen.total_s / n:.2f} s/function (generate() after deriving: plan + render + "
        f"format {gen.render_s:.2f} s)"
    )
    rows = [[name, f"{s:.2f}", f"{gen.plan_s[name]:.2f}"] for name, s in gen.derive_s.items()]
    print_table(["function", "derive s", "plan s"], rows)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


#: A median is marked noisy (``*``) when its interquartile range exceeds this fraction of it.
NOISY_IQR = 0.25


def is_noisy(samples: list[float]) -> bool:
    if len(samples) < 4:
        return False
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return (q3 - q1) > NOISY_IQR * statistics.median(samples)


def fmt_samples(samples: list[float] | None) -> str:
    """Median of timing samples in ms, with ``*`` when the samples are noisy."""
    if not samples:
        return "n/a"
    return fmt_ms(statistics.median(samples)) + ("*" if is_noisy(samples) else "")


def _value(x: float | list[float] | None) -> float | None:
    if isinstance(x, list):
        return statistics.median(x) if x else None
    return x


def ratio(a: float | list[float] | None, b: float | list[float] | None) -> float | None:
    """a / b, each a number or timing samples (then their median); None if either is n/a."""
    a, b = _value(a), _value(b)
    if a is None or b is None or b == 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def fmt_ratio(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.2f}"


def fmt_ms(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "n/a"
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def fmt_num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def suite_median(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def print_table(headers: list[str], rows: list[list[str]], title: str | None = None) -> None:
    """A plain fixed-width table: first column left-aligned, the others right-aligned."""
    if title:
        print(f"\n{title}")
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        out = [str(cells[0]).ljust(widths[0])]
        out += [str(c).rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "  ".join(out).rstrip()

    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence fd 2 (C++ libraries' log lines, e.g. the profiler's start/stop) for a while."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def short_reason(exc: BaseException, limit: int = 160) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return first if len(first) <= limit else first[: limit - 3] + "..."
