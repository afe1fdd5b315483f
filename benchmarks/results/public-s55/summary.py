"""Session 55's before/after on the public corpus, from the repository root:

    python benchmarks/results/public-s55/summary.py

Measured as session 54's tables (range ends, mixed second derivatives), each with
``measure_corpus.py --half H --jobs 1 --budget 10 --timeout 300 --sources``: the held-out
half before the session's changes (``heldout-before/``, at 7834a2d, session 54's final
code) and after them (``heldout-after/``, at 716ca03, the session's final code); the
tuning half, float64, at 4179d69 (``tuning-mid/``: with the candidate that scales a power
of a sum, taken back after it, and before the derivative fix of |u| in branches) and,
float64 and float32, at 716ca03 (``tuning-after/``), beside session 54's float64 tuning
table at e113a58 (``../public-s54/tuning-after/``, before the regime split's worst-point
guard, which changed n2h's gradient alone). For each table it prints
both readings of the mean (the mean over rows of each row's mean over the points whose
exact value is finite, as Herbie samples, and over all points, a missed overflow counted
as 64 bits), naive autograd's, the non-finite results where the exact value is finite, the
rows worse than naive, the points where the exact value overflows and the result is not
that infinity, and which rows are non-finite or worse; then the means over the rows
measured at the same points before and after (the 10 s budget makes a row's points
depend on the machine's load), where only the code differs.
"""

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
TABLES = [
    ("heldout", "heldout-before"),
    ("heldout", "heldout-after"),
    ("tuning", "../public-s54/tuning-after"),
    ("tuning", "tuning-mid"),
    ("tuning", "tuning-after"),
]

# session 54's reader and summary line (its script reads no file when imported)
_spec = importlib.util.spec_from_file_location(
    "s54_summary", HERE.parent / "public-s54" / "summary.py"
)
_s54 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s54)
load, line = _s54.load, _s54.line


#: the before and after tables of each half that the same-points means compare
BEFORE_AFTER = {
    "heldout": (("before", "heldout-before"), ("after", "heldout-after")),
    "tuning": (("before", "../public-s54/tuning-after"), ("after", "tuning-after")),
}


def same_points(half: str, dtype: str) -> None:
    """Both means of a half over the rows with as many points before as after."""
    tables = {
        when: {(r.function, r.quantity): (r, f) for r, _, f in load(HERE / folder / name)}
        for when, folder in BEFORE_AFTER[half]
        if (HERE / folder / (name := f"rows-{half}-{dtype}.jsonl")).exists()
    }
    if len(tables) < 2:
        return
    keys = [
        k
        for k, (r, f) in tables["before"].items()
        if r.ok and f and f["mean"] is not None and k in tables["after"]
        and tables["after"][k][0].points == r.points
        and tables["after"][k][1] and tables["after"][k][1]["mean"] is not None
    ]  # fmt: skip
    for when, table in tables.items():
        finite = sum(table[k][1]["mean"] for k in keys) / len(keys)
        every = sum(table[k][0].symgrad_mean_bits for k in keys) / len(keys)
        print(
            f"{half:7s} {dtype} {when:6s}: the {len(keys)} rows with the same points: "
            f"finite-exact {finite:.3f}  all points {every:.3f}"
        )


def main() -> None:
    for half in ("heldout", "tuning"):
        for dtype in ("float64", "float32"):
            same_points(half, dtype)
    print_tables()


def print_tables() -> None:
    """Each table's summary line, and its rows without numbers, non-finite or worse."""
    for half, when in TABLES:
        for dtype in ("float64", "float32"):
            path = HERE / when / f"rows-{half}-{dtype}.jsonl"
            if not path.exists():
                print(f"{half:7s} {dtype} {when:14s}: not measured")
                continue
            table = load(path)
            print(f"{half:7s} {dtype} {when:14s}: {line(table)}")
            for r, _, _ in table:
                if not r.ok:
                    print(f"    no numbers: {r.function} {r.quantity}: {r.error}")
                elif r.symgrad_nonfinite or r.worse_than_naive:
                    print(
                        f"    {r.function} {r.quantity}: {r.symgrad_mean_bits:.2f} bits "
                        f"(naive {r.naive_mean_bits:.2f}), {r.symgrad_nonfinite} non-finite"
                        f"{', worse' if r.worse_than_naive else ''}"
                    )


if __name__ == "__main__":
    main()
