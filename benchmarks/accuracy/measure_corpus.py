"""Measure the public corpus: ``symgrad accuracy`` per function, each in its own process.

    python benchmarks/accuracy/measure_corpus.py                      # every half of both draws, both dtypes
    python benchmarks/accuracy/measure_corpus.py --half heldout --dtypes float32

Each function is derived and measured in a subprocess with a time limit (``--timeout``):
a formula that SymPy takes too long on is a row with an error, not a stalled report. Two
run at once by default (``--jobs``). Prints, per half and dtype, the per-row table
(``symgrad accuracy``'s) and a summary line; ``--out DIR`` also writes them to
``DIR/public-<half>-<dtype>.txt``. The settings (points, budget, seed) are printed in each
file's header, so that a before/after comparison uses the same ones.

``--sources`` also splits each row's mean error by the kind of point it comes from
(:func:`error_sources`) and prints, per half and dtype, the split of the whole mean and
the rows that contribute most (``DIR/sources-<half>-<dtype>.txt`` with ``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The corpus's halves: draw 1 (``tuning``, ``heldout``) and draw 2 (``tuning2``,
#: ``heldout2``: Herbie's bench/ files that draw 1 missed, README.md in this folder).
HALVES = {
    half: HERE / f"public_{half}.yaml" for half in ("tuning", "heldout", "tuning2", "heldout2")
}
#: The CI-sized check (tests/test_public_corpus.py): every CI_STRIDE-th formula of each
#: half in file order, CI_POINTS random points (and the extremes), no time budget (the
#: same points on every machine), both dtypes.
CI_STRIDE = 8
CI_POINTS = 16
CI_BASELINE = HERE.parent.parent / "tests" / "data" / "public_corpus_baseline.json"


def ci_subset(half: str) -> list[str]:
    """The formulas of ``half`` that the CI-sized check measures."""
    from symgrad.spec import load_spec

    return [f.name for f in load_spec(HALVES[half]).functions][::CI_STRIDE]


def ci_rows(half: str, dtype: str, names: list[str] | None = None) -> list:
    """The CI-sized measurement of ``half`` in ``dtype`` (in this process)."""
    from symgrad.report.measure import measure_spec
    from symgrad.spec import load_spec

    names = ci_subset(half) if names is None else names
    spec = load_spec(HALVES[half])
    return measure_spec(spec, dtype, CI_POINTS, budget=None, functions=names)


def baseline_entry(row) -> dict:
    """What the CI baseline keeps of a row: symgrad's mean bits and non-finite count, and
    whether it was worse than naive autograd."""
    return {
        "mean_bits": round(row.symgrad_mean_bits, 3),
        "nonfinite": row.symgrad_nonfinite,
        "worse": row.worse_than_naive,
    }


def write_ci_baseline() -> None:
    """Measure the CI subsets and write them as the baseline the tests compare with."""
    data: dict = {}
    for half in HALVES:
        for dtype in ("float64", "float32"):
            rows = ci_rows(half, dtype)
            bad = [r for r in rows if not r.ok]
            if bad:
                raise SystemExit(f"{half} {dtype}: rows without numbers: {bad}")
            data.setdefault(half, {})[dtype] = {
                f"{r.function} | {r.quantity}": baseline_entry(r) for r in rows
            }
    CI_BASELINE.parent.mkdir(parents=True, exist_ok=True)
    CI_BASELINE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {CI_BASELINE}")


#: The kinds of point a row's mean error is split into (:func:`error_sources`).
SOURCES = ("overflow", "non-finite", "naive as bad", "symgrad worse", "within 4 bits")


def error_sources(row) -> dict[str, float]:
    """A row's mean bits of error split by the kind of point they come from (summing to
    the mean): ``overflow``, where the exact value is an infinity the result is not;
    ``non-finite``, where the exact value is finite and the result is not; ``naive as
    bad``, more than 4 bits off where naive autograd is at most a bit better; ``symgrad
    worse``, more than 4 bits off where naive autograd is more than a bit better; the
    rest ``within 4 bits``."""
    from symgrad.report.measure import bits_of_error

    sums = dict.fromkeys(SOURCES, 0.0)
    n = 0
    for s in row.samples:
        if s.exact is None:
            continue
        n += 1
        bits = bits_of_error(s.symgrad, s.exact, row.dtype)
        naive = 64.0 if s.naive is None else bits_of_error(s.naive, s.exact, row.dtype)
        if not math.isfinite(float(s.exact)):
            kind = "overflow"
        elif not math.isfinite(s.symgrad):
            kind = "non-finite"
        elif bits <= 4:
            kind = "within 4 bits"
        else:
            kind = "naive as bad" if naive >= bits - 1 else "symgrad worse"
        sums[kind] += bits
    return {k: v / n for k, v in sums.items()} if n else sums


def finite_exact(row) -> dict[str, float | int | None]:
    """A row's mean bits of error over the points whose exact value is finite (``mean``,
    None where there is none; over ``points`` of them), and the points whose exact value
    overflows (``overflows``), of which ``missed`` have a result that is not that
    infinity. Each missed overflow counts 64 (32) bits in the row's mean; this is the
    mean without them, the misses counted apart as non-finite results are (see
    ``benchmarks/accuracy/README.md``, session 36)."""
    from symgrad.report.measure import bits_of_error

    total, points, overflows, missed = 0.0, 0, 0, 0
    for s in row.samples:
        if s.exact is None:
            continue
        if math.isfinite(float(s.exact)):
            total += bits_of_error(s.symgrad, s.exact, row.dtype)
            points += 1
        else:
            overflows += 1
            missed += s.symgrad != float(s.exact)
    mean = total / points if points else None
    return {"mean": mean, "points": points, "overflows": overflows, "missed": missed}


def _worker(
    spec_path: str, name: str, dtype: str, points: int, budget: float, range_ends: bool = True
) -> None:
    """Print the accuracy rows of one function as JSON lines (run in a subprocess), each
    with its :func:`error_sources` and :func:`finite_exact`."""
    from symgrad.report.measure import measure_spec
    from symgrad.spec import load_spec

    rows = measure_spec(
        load_spec(spec_path), dtype, points, budget=budget, functions=[name], range_ends=range_ends
    )
    for r in rows:
        row = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
        row["sources"] = error_sources(r) if r.samples else None
        row["finite"] = finite_exact(r) if r.samples else None
        row.pop("samples")
        row.pop("input_names")
        print(json.dumps(row))


def _row(fields: dict) -> tuple:
    """(the Row, its :func:`error_sources`, its :func:`finite_exact`; None each where it
    has no samples) from a worker's JSON line."""
    from symgrad.report.measure import Row

    sources, finite = fields.pop("sources", None), fields.pop("finite", None)
    return Row(**fields), sources, finite


def sources_summary(measured: list, top: int = 25) -> str:
    """The split of the mean of the rows' means by :data:`SOURCES`, then the ``top`` rows
    with the largest means, each with its split (``measured``: :func:`measure`'s triples).
    The second line: the mean of the rows' :func:`finite_exact` means, and the points
    whose exact value overflows, with those the result misses."""
    split = [(r, s) for r, s, _ in measured if s is not None]
    if not split:
        return "no row with samples\n"
    mean = sum(sum(s.values()) for _, s in split) / len(split)
    parts = ", ".join(f"{k} {sum(s[k] for _, s in split) / len(split):.3f}" for k in SOURCES)
    lines = [f"{len(split)} rows, mean {mean:.3f} bits: {parts}"]
    finite = [f for _, s, f in measured if s is not None and f and f["mean"] is not None]
    if finite:
        overflows = sum(f["overflows"] for _, _, f in measured if f)
        missed = sum(f["missed"] for _, _, f in measured if f)
        lines.append(
            f"over finite exact values: mean {sum(f['mean'] for f in finite) / len(finite):.3f}"
            f" bits ({len(finite)} rows); the exact value overflows at {overflows} points,"
            f" the result misses that infinity at {missed}"
        )
    lines.append(
        f"{'function':44s} {'quantity':18s} {'mean':>6s} " + " ".join(f"{k:>13s}" for k in SOURCES)
    )
    for r, s in sorted(split, key=lambda rs: -sum(rs[1].values()))[:top]:
        cells = " ".join(f"{s[k]:13.2f}" for k in SOURCES)
        lines.append(f"{r.function[:44]:44s} {r.quantity[:18]:18s} {sum(s.values()):6.2f} {cells}")
    return "\n".join(lines) + "\n"


def _failed_row(name: str, dtype: str, error: str):
    return _row(
        dict(
            function=name, quantity="derive", dtype=dtype, points=0,
            symgrad_mean_bits=math.nan, symgrad_max_bits=math.nan, symgrad_nonfinite=0,
            naive_mean_bits=None, naive_max_bits=None, naive_nonfinite=None, error=error,
        )
    )  # fmt: skip


def measure(spec: Path, names: list[str], dtype: str, args) -> list:
    """(Row, error sources, finite-exact mean; None each where the row has no samples)
    for each row of ``names``, each function in a worker."""

    def one(name: str) -> list:
        cmd = [sys.executable, __file__, "--worker", str(spec), name, dtype]
        cmd += [str(args.points), str(args.budget), "range-ends" if args.range_ends else ""]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return [_failed_row(name, dtype, f"timeout: more than {args.timeout:g} s")]
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["?"])[-1]
            return [_failed_row(name, dtype, f"crash: {last[:200]}")]
        return [_row(json.loads(line)) for line in done.stdout.splitlines() if line.strip()]

    with ThreadPoolExecutor(args.jobs) as pool:
        return [row for rows in pool.map(one, names) for row in rows]


def formula_summary(rows: list) -> str:
    """Per-formula counts: formulas measured, with an error, with a non-finite or a worse row."""
    by_fn: dict[str, list] = {}
    for r in rows:
        by_fn.setdefault(r.function, []).append(r)
    failed = sum(1 for rs in by_fn.values() if any(not r.ok for r in rs))
    nonfin = sum(1 for rs in by_fn.values() if any(r.ok and r.symgrad_nonfinite for r in rs))
    worse = sum(1 for rs in by_fn.values() if any(r.worse_than_naive for r in rs))
    return (
        f"{len(by_fn)} formulas: {failed} with a row without numbers, {nonfin} with a "
        f"non-finite row, {worse} with a row worse than naive."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--half", choices=[*HALVES, "both"], default="both")
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
    parser.add_argument("--points", type=int, default=64)
    parser.add_argument("--budget", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--functions", nargs="+", help="only these functions")
    parser.add_argument("--out", type=Path, help="write public-<half>-<dtype>.txt here")
    parser.add_argument(
        "--sources",
        action="store_true",
        help="split each row's mean by kind of point (with --out, also rows-<half>-<dtype>.jsonl)",
    )
    parser.add_argument(
        "--no-range-ends",
        dest="range_ends",
        action="store_false",
        help="leave out the ends of the dtype's range (1e38, 3.4e38, 1e308, 1.8e308 and their "
        "negatives), which each input's extreme points include by default, as in symgrad "
        "gen's accuracy choice (the tables of sessions before 53 were measured without them)",
    )
    parser.add_argument(
        "--write-ci-baseline",
        action="store_true",
        help="measure the CI subsets and write tests/data/public_corpus_baseline.json",
    )
    args = parser.parse_args()
    if args.write_ci_baseline:
        write_ci_baseline()
        return

    from symgrad.report.table import format_table
    from symgrad.spec import load_spec

    halves = list(HALVES) if args.half == "both" else [args.half]
    for half in halves:
        spec = HALVES[half]
        names = [f.name for f in load_spec(spec).functions]
        if args.functions:
            names = [n for n in names if n in args.functions]
        for dtype in args.dtypes:
            start = time.monotonic()
            measured = measure(spec, names, dtype, args)
            rows = [row for row, *_ in measured]
            header = (
                f"# public corpus, {half} half, {dtype}: {len(names)} formulas, "
                f"--points {args.points} --budget {args.budget:g} --timeout {args.timeout:g}"
                f"{'' if args.range_ends else ' --no-range-ends'} "
                f"({time.monotonic() - start:.0f} s)\n"
            )
            text = header + format_table(rows) + formula_summary(rows) + "\n"
            print(text)
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / f"public-{half}-{dtype}.txt").write_text(text)
            if args.sources:
                sources = header + sources_summary(measured)
                print(sources)
                if args.out:
                    (args.out / f"sources-{half}-{dtype}.txt").write_text(sources)
                    lines = [
                        json.dumps({**dataclasses.asdict(r), "sources": s, "finite": f})
                        for r, s, f in measured
                    ]
                    (args.out / f"rows-{half}-{dtype}.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        spec_path, name, dtype, points, budget, ends = sys.argv[2:8]
        _worker(spec_path, name, dtype, int(points), float(budget), ends == "range-ends")
    else:
        main()
