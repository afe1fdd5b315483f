"""Before/after of session 41, from the repository root:

    python benchmarks/results/public-s41/combine.py

One step, measured before and after, side by side in one run (measure_corpus.py --sources
--jobs 1 --budget 60 --functions ...): products spread up to 16 factors, and a factor that
cancels a written-out primitive's branch goes into its branches. The formulas whose
generated code changed (functions.txt: both halves generated before and after, compared
function by function) were measured at a25c64e (before/) and after (after/).

Each half's totals are session 40's (its combine.py: session 38's tables with the pole and
power steps' formulas measured after them) with the changed formulas' rows replaced by
before/ (before) or after/ (after); the rows whose mean moved are listed.
"""

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("combine_s40", HERE.parent / "public-s40/combine.py")
_s40 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s40)
stats, print_moved, load = _s40.stats, _s40.print_moved, _s40.load


def session40(half: str, dtype: str) -> list[tuple]:
    """Session 40's rows of ``half`` after its two steps."""
    rows = _s40.session38(half, dtype)
    for step in ("pole", "power"):
        rows = _s40.replaced(rows, step, "after", half, dtype)
    return rows


def replaced(rows: list[tuple], when: str, half: str, dtype: str) -> list[tuple]:
    """``rows`` with those of this session's formulas replaced by its ``when`` measurement."""
    path = HERE / when / f"rows-{half}-{dtype}.jsonl"
    if not path.exists():  # no changed formula in this half
        return rows
    new = load(path)
    names = {r.function for r, _, _ in new}
    return [x for x in rows if x[0].function not in names] + new


def main() -> None:
    for half in ("tuning", "heldout"):
        for dtype in ("float64", "float32"):
            base = session40(half, dtype)
            print(half, dtype, "before:", stats(replaced(base, "before", half, dtype)))
            print(half, dtype, "after: ", stats(replaced(base, "after", half, dtype)))
            old = HERE / "before" / f"rows-{half}-{dtype}.jsonl"
            if old.exists():
                print_moved(
                    load(old), load(HERE / "after" / f"rows-{half}-{dtype}.jsonl"), width=18
                )


if __name__ == "__main__":
    main()
