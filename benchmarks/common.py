"""Shared helpers of bench_torch.py and bench_tf.py: code generation, statistics, tables."""

from __future__ import annotations

import importlib.util
import math
import statistics
import sys
import time
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
    derive_s: dict[str, float]  # function -> seconds in derive_function + plan
    render_s: float  # rendering + ruff-formatting the whole module
    total_s: float  # everything, spec loading included


def generate_module(target: str, outdir: Path) -> Generated:
    """Generate the perf spec's module for ``target`` ("torch" or "tensorflow") and import it.

    Derivation and planning are timed per function; ``generate`` is then handed the
    derived formulas, so what it adds is rendering and formatting.
    """
    from symgrad.derive import derive_function
    from symgrad.generate import generate
    from symgrad.plan import plan_tensorflow, plan_torch
    from symgrad.spec import load_spec

    planner = plan_torch if target == "torch" else plan_tensorflow
    start = time.perf_counter()
    spec = load_spec(SPEC_PATH)
    derived, derive_s = [], {}
    for fn in spec.functions:
        t0 = time.perf_counter()
        d = derive_function(fn)
        planner(d)
        derive_s[fn.name] = time.perf_counter() - t0
        derived.append(d)
    t0 = time.perf_counter()
    files = generate(spec, targets=(target,), tests=False, derived=tuple(derived))
    render_s = time.perf_counter() - t0
    total_s = time.perf_counter() - start
    (file,) = files
    path = outdir / file.name
    path.write_text(file.text)
    name = path.stem
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    module_spec.loader.exec_module(module)
    return Generated(module, path, derive_s, render_s, total_s)


def print_codegen_times(gen: Generated) -> None:
    n = len(gen.derive_s)
    print(
        f"symgrad gen ({gen.path.name}): {gen.total_s:.2f} s for {n} functions = "
        f"{gen.total_s / n:.2f} s/function; rendering + ruff format of the module "
        f"{gen.render_s:.2f} s"
    )
    rows = [[name, f"{s:.2f}"] for name, s in gen.derive_s.items()]
    print_table(["function", "derive+plan s"], rows)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def ratio(a: float | None, b: float | None) -> float | None:
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


def short_reason(exc: BaseException, limit: int = 160) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return first if len(first) <= limit else first[: limit - 3] + "..."
