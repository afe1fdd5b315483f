"""Before/after of session 43, from the repository root:

    python benchmarks/results/public-s43/combine.py

One step, measured before and after, side by side in one run (measure_corpus.py --half
tuning|heldout --sources --jobs 1 --budget 300 --functions ...): series that reach where
the formula stops cancelling (up to 16 terms in one input), a sum's series as a whole where
its parts have their own, and product series in a ratio or under a common factor
(regimes._series_cut, _series_of_whole, product_series). The formulas measured
(series/functions.txt) are those whose generated code changed when both halves were
generated with this step (with 16-term product series too; the step as landed keeps
product series at four terms, which only undid changes), compared function by function
with the code before it (8514319), at 8514319 (series/before/) and after (series/after/).

Each half's totals are session 42's (its combine.py) with the step's formulas' rows
replaced by before/ (before) or after/ (after); the rows whose mean moved are listed.
"""

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
STEPS = ("series",)
_spec = importlib.util.spec_from_file_location("combine_s42", HERE.parent / "public-s42/combine.py")
_s42 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s42)
stats, print_moved, load = _s42.stats, _s42.print_moved, _s42.load


def session42(half: str, dtype: str) -> list[tuple]:
    """Session 42's rows of ``half`` after its steps."""
    rows = _s42.session41(half, dtype)
    for step in _s42.STEPS:
        rows = _s42.replaced(rows, step, "after", half, dtype)
    return rows


def replaced(
    rows: list[tuple], step: str, when: str, half: str, dtype: str, here: Path = HERE
) -> list[tuple]:
    """``rows`` with those of ``step``'s formulas replaced by its ``when`` measurement (in
    ``here``, a session's folder)."""
    path = here / step / when / f"rows-{half}-{dtype}.jsonl"
    if not path.exists():  # no changed formula in this half
        return rows
    new = load(path)
    names = {r.function for r, _, _ in new}
    return [x for x in rows if x[0].function not in names] + new


def main() -> None:
    for half in ("tuning", "heldout"):
        for dtype in ("float64", "float32"):
            rows = session42(half, dtype)
            print(half, dtype, "session 42:", stats(rows))
            for step in STEPS:
                before = replaced(rows, step, "before", half, dtype)
                rows = replaced(rows, step, "after", half, dtype)
                print(half, dtype, f"{step} before:".ljust(15), stats(before))
                print(half, dtype, f"{step} after:".ljust(15), stats(rows))
                old = HERE / step / "before" / f"rows-{half}-{dtype}.jsonl"
                if old.exists():
                    new = load(HERE / step / "after" / f"rows-{half}-{dtype}.jsonl")
                    print_moved(load(old), new, width=18)


if __name__ == "__main__":
    main()
