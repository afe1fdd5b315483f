"""Before/after of session 40, from the repository root:

    python benchmarks/results/public-s40/combine.py

Two steps, each measured before and after, side by side in one run
(measure_corpus.py --sources --jobs 1 --budget 60 --functions ...):

- pole/: the exact values find a pole early (no generated code changed); the formulas
  whose rows had points left out as disputed or cut by the budget and could have a pole
  at a tame value (pole/functions.txt), at e85755e and at 91bc7ed.
- power/: power_through_log1p for a fraction's power (the formulas whose generated code
  changed, power/functions.txt: generated both halves before and after), at 91bc7ed and
  after.

Each half's totals are session 38's (its combine.py) with the pole formulas' rows
replaced by pole/before/ (before) or pole/after/ (after), then the power formulas' by
power/before/ or power/after/; the rows whose mean moved are listed.
"""

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("combine_s38", HERE.parent / "public-s38/combine.py")
_s38 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s38)
load, stats, print_moved = _s38.load, _s38.stats, _s38.print_moved


def session38(half: str, dtype: str) -> list[tuple]:
    """Session 38's rows of ``half`` (session 37's, its changed formulas measured after it)."""
    kept = [x for x in _s38.session37(half, dtype) if x[0].function not in _s38.CHANGED]
    return kept + load(_s38.HERE / f"after/rows-{half}-{dtype}.jsonl")


def replaced(rows: list[tuple], step: str, when: str, half: str, dtype: str) -> list[tuple]:
    """``rows`` with those of ``step``'s formulas replaced by its ``when`` measurement."""
    path = HERE / step / when / f"rows-{half}-{dtype}.jsonl"
    if not path.exists():  # no formula of this half in the step
        return rows
    new = load(path)
    names = {r.function for r, _, _ in new}
    return [x for x in rows if x[0].function not in names] + new


def main() -> None:
    for half in ("tuning", "heldout"):
        for dtype in ("float64", "float32"):
            base = session38(half, dtype)
            before = replaced(base, "pole", "before", half, dtype)
            after = replaced(
                replaced(base, "pole", "after", half, dtype), "power", "after", half, dtype
            )
            print(half, dtype, "before:", stats(before))
            print(half, dtype, "after: ", stats(after))
            for step in ("pole", "power"):
                old = HERE / step / "before" / f"rows-{half}-{dtype}.jsonl"
                if old.exists():
                    print_moved(
                        load(old),
                        load(HERE / step / "after" / f"rows-{half}-{dtype}.jsonl"),
                        width=18,
                    )


if __name__ == "__main__":
    main()
