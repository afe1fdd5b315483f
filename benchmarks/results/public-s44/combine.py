"""Before/after of session 44, from the repository root:

    python benchmarks/results/public-s44/combine.py

Each step measured before and after, side by side in one run (measure_corpus.py --half
tuning|heldout --sources --jobs 1 --budget 300 --functions ...), on the formulas whose
generated code changed when both halves were generated with the step, compared function by
function with the code before it (<step>/functions.txt):

- logratio: regimes.log_ratios and log_ratios_kept_second (log(a/b) and pairs of
  logarithms through log1p of a ratio >= 0), at b51f86f (before/) and with the step
  (after/);
- cancel: regimes.cancelled_arguments (a quotient inside a root or a call cancelled) and
  regimes.exp_powers_factored, with logratio (before/) and with both (after/);
- conditions: log_ratios' pairs branched by the sign of a - b under a guard without the
  implied conditions (fewer comparisons; a >= b sent SymPy into endless recursion), after
  cancel (before/) and with it (after/): the same accuracy.

Each half's totals are session 43's (its combine.py) with each step's formulas' rows
replaced by before/ (before) or after/ (after), steps in order; the rows whose mean moved
are listed. Both steps were written for classes first seen on held-out rows (STUDIED):
by the corpus's rules those formulas are no longer held out for them, and the held-out
totals are also printed without them.
"""

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
#: Held-out formulas whose failures the steps' classes were found on (diagnosed, then the
#: rules written; session 43's note named the log and Mercator classes, issue 20 the root
#: of a ratio that simplifies).
STUDIED = frozenset(
    {
        "nmse_problem_3_3_6",
        "nmse_example_3_8",
        "forward_tanph",
        "forward_y",
        "init_v_pole_n",
        "nmse_problem_3_4_4",
    }
)
STEPS = tuple(s for s in ("logratio", "cancel", "conditions") if (HERE / s / "after").exists())
_spec = importlib.util.spec_from_file_location("combine_s43", HERE.parent / "public-s43/combine.py")
_s43 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s43)
stats, print_moved, load = _s43.stats, _s43.print_moved, _s43.load


def session43(half: str, dtype: str) -> list[tuple]:
    """Session 43's rows of ``half`` after its steps."""
    rows = _s43.session42(half, dtype)
    for step in _s43.STEPS:
        rows = _s43.replaced(rows, step, "after", half, dtype)
    return rows


def replaced(rows: list[tuple], step: str, when: str, half: str, dtype: str) -> list[tuple]:
    """``rows`` with those of ``step``'s formulas replaced by its ``when`` measurement."""
    return _s43.replaced(rows, step, when, half, dtype, here=HERE)


def main() -> None:
    for half in ("tuning", "heldout"):
        for dtype in ("float64", "float32"):
            rows = session43(half, dtype)
            print(half, dtype, "session 43:", stats(rows))
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
                first = replaced(session43(half, dtype), STEPS[0], "before", half, dtype)
                for when, rows_ in (("before", first), ("after", rows)):
                    kept = [x for x in rows_ if x[0].function not in STUDIED]
                    print(half, dtype, f"not studied, {when}:".ljust(22), stats(kept))


if __name__ == "__main__":
    main()
