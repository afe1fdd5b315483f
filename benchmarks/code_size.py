"""Size of the generated modules: lines per function, preamble, largest module.

    python benchmarks/code_size.py                       # examples/generated
    python benchmarks/code_size.py BEFORE_DIR AFTER_DIR  # side by side, with ratios

A function's lines run from its ``# --- name ---`` banner to the next banner (or the end
of the module); the preamble is everything before the first banner (imports, helpers).
Only the framework modules are counted, not the generated test files.
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

BANNER = re.compile(r"^# --- (\w+) -+$")


def sizes(module: Path) -> tuple[int, dict[str, int]]:
    """(preamble lines, function -> lines) of one generated module."""
    lines = module.read_text().splitlines()
    starts = [(k, m.group(1)) for k, line in enumerate(lines) if (m := BANNER.match(line))]
    preamble = starts[0][0] if starts else len(lines)
    ends = [k for k, _ in starts[1:]] + [len(lines)]
    return preamble, {name: end - k for (k, name), end in zip(starts, ends)}


def summary(directory: Path) -> dict[str, dict[str, float]]:
    """Per framework: median and max lines per function, median preamble, largest module."""
    result = {}
    for framework, pattern in (("torch", "*_torch.py"), ("tf", "*_tf.py")):
        modules = sorted(p for p in directory.glob(pattern) if not p.name.startswith("test_"))
        if not modules:
            continue
        per_function, preambles, totals = [], [], []
        for module in modules:
            preamble, functions = sizes(module)
            per_function += functions.values()
            preambles.append(preamble)
            totals.append(len(module.read_text().splitlines()))
        result[framework] = {
            "modules": len(modules),
            "functions": len(per_function),
            "median lines per function": statistics.median(per_function),
            "max lines per function": max(per_function),
            "median preamble": statistics.median(preambles),
            "largest module": max(totals),
            "all modules": sum(totals),
        }
    return result


def main(argv: list[str]) -> None:
    directories = [Path(a) for a in argv] or [Path(__file__).parents[1] / "examples/generated"]
    tables = [summary(d) for d in directories]
    for framework in tables[0]:
        print(f"{framework}:")
        for key in tables[0][framework]:
            values = [t.get(framework, {}).get(key) for t in tables]
            cells = "  ".join(f"{v:>8g}" if v is not None else f"{'-':>8}" for v in values)
            ratio = ""
            if len(values) == 2 and values[0] and values[1] is not None:
                ratio = f"  ({values[1] / values[0]:.2f}x)"
            print(f"  {key:<28}{cells}{ratio}")


if __name__ == "__main__":
    main(sys.argv[1:])
