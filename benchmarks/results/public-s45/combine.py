"""Before/after of session 45, from the repository root:

    python benchmarks/results/public-s45/combine.py

Each step measured before and after, side by side in one run (measure_corpus.py --half
tuning|heldout --sources --jobs 1 --budget 300 --functions ...), on the formulas whose
generated code changed when both halves were generated with the step, compared function by
function with the code before it (<step>/functions.txt):

- float32: the choice ranks the forms tied in float64 by their float32 error at float32
  points (choose.float32_score, float32_points, FLOAT32_MARGIN), at fc13429 (before/) and
  with the step (after/);
- (pole: float32 results are not required finite where an input rounds onto a pole,
  choose._finite_in_float32: both halves generated with float32 and with both, and no
  function's code changed, only the non-finite counts in the docstrings (held out 735 ->
  691 over the docstrings' rows); nothing to measure.)

Each half's totals are session 44's (its combine.py) with each step's formulas' rows
replaced by before/ (before) or after/ (after), steps in order; the rows whose mean moved
are listed. No formula of either step was studied on the held-out half: the held-out
rows that moved are evidence of the rules generalizing. Session 44's STUDIED formulas are
also left out of the held-out totals printed "not studied".
"""

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
STEPS = tuple(s for s in ("float32",) if (HERE / s / "after").exists())
_spec = importlib.util.spec_from_file_location("combine_s44", HERE.parent / "public-s44/combine.py")
_s44 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s44)
stats, print_moved, load, STUDIED = _s44.stats, _s44.print_moved, _s44.load, _s44.STUDIED


def session44(half: str, dtype: str) -> list[tuple]:
    """Session 44's rows of ``half`` after its steps."""
    rows = _s44.session43(half, dtype)
    for step in _s44.STEPS:
        rows = _s44.replaced(rows, step, "after", half, dtype)
    return rows


def replaced(rows: list[tuple], step: str, when: str, half: str, dtype: str) -> list[tuple]:
    """``rows`` with those of ``step``'s formulas replaced by its ``when`` measurement."""
    return _s44._s43.replaced(rows, step, when, half, dtype, here=HERE)


def main() -> None:
    for half in ("tuning", "heldout"):
        for dtype in ("float64", "float32"):
            rows = session44(half, dtype)
            print(half, dtype, "session 44:", stats(rows))
            for step in STEPS:
                before = replaced(rows, step, "before", half, dtype)
                rows = replaced(rows, step, "after", half, dtype)
                print(half, dtype, f"{step} before:".ljust(15), stats(before))
                print(half, dtype, f"{step} after:".ljust(15), stats(rows))
                old = HERE / step / "before" / f"rows-{half}-{dtype}.jsonl"
                if old.exists():
                    new = load(HERE / step / "after" / f"rows-{half}-{dtype}.jsonl")
                    print_moved(load(old), new, width=18)
            if half == "heldout":
                for when, rows_ in (("session 44", session44(half, dtype)), ("after", rows)):
                    kept = [x for x in rows_ if x[0].function not in STUDIED]
                    print(half, dtype, f"not studied, {when}:".ljust(28), stats(kept))


if __name__ == "__main__":
    main()
