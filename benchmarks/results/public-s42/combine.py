"""Before/after of session 42, from the repository root:

    python benchmarks/results/public-s42/combine.py

Each step, measured before and after, side by side in one run (measure_corpus.py --half
both --sources --jobs 1 --functions ...): the formulas whose
generated code the step changed (<step>/functions.txt: both halves generated before and
after it, compared function by function), at the code before the step (<step>/before/)
and after it (<step>/after/).

- edge/: the choice measures each formula just inside the edges of its range
  (choose.edge_points), at c587de8 and 1f053a5 (--budget 60).
- group/: the bases of one side of a spread product that share an exponent are one base
  where the other side has one factor at most (functions._group_equal_powers), at
  098230f and after it (--budget 300: the rows' points are then their count, 64 and
  the extreme points, for all but the slowest formulas).

Each half's totals are session 41's (its combine.py) with each step's formulas' rows
replaced by its before/ (before) or after/ (after), on the rows after the steps before
it; the rows whose mean moved are listed. (A step's before/ rows can differ from the
totals' own rows for the same code: another budget, so other points.)
"""

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
STEPS = ("edge", "group")
_spec = importlib.util.spec_from_file_location("combine_s41", HERE.parent / "public-s41/combine.py")
_s41 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s41)
stats, print_moved, load = _s41.stats, _s41.print_moved, _s41.load


def session41(half: str, dtype: str) -> list[tuple]:
    """Session 41's rows of ``half`` after its steps."""
    return _s41.replaced(_s41.session40(half, dtype), "after", half, dtype)


def replaced(rows: list[tuple], step: str, when: str, half: str, dtype: str) -> list[tuple]:
    """``rows`` with those of ``step``'s formulas replaced by its ``when`` measurement."""
    path = HERE / step / when / f"rows-{half}-{dtype}.jsonl"
    if not path.exists():  # no changed formula in this half
        return rows
    new = load(path)
    names = {r.function for r, _, _ in new}
    return [x for x in rows if x[0].function not in names] + new


def main() -> None:
    for half in ("tuning", "heldout"):
        for dtype in ("float64", "float32"):
            rows = session41(half, dtype)
            print(half, dtype, "session 41:", stats(rows))
            for step in STEPS:
                before = replaced(rows, step, "before", half, dtype)
                rows = replaced(rows, step, "after", half, dtype)
                print(half, dtype, f"{step} before:".ljust(13), stats(before))
                print(half, dtype, f"{step} after:".ljust(13), stats(rows))
                old = HERE / step / "before" / f"rows-{half}-{dtype}.jsonl"
                if old.exists():
                    new = load(HERE / step / "after" / f"rows-{half}-{dtype}.jsonl")
                    print_moved(load(old), new, width=18)


if __name__ == "__main__":
    main()
