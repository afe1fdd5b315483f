"""Before/after of session 38, from the repository root:

    python benchmarks/results/public-s38/combine.py

Only the formulas whose generated code changed (functions.txt) were measured, at the code
before the session (before/) and after it (after/), side by side in one run each
(measure_corpus.py --half both --sources --budget 60 --functions ...). Each half's totals
are session 37's (its combine.py: session 36's rows with session 37's measured formulas
replaced) with this session's formulas' rows replaced by before/ or after/; the rows of
the changed formulas whose mean moved are listed.
"""

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("combine_s37", HERE.parent / "public-s37/combine.py")
_s37 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s37)
load, stats, print_moved = _s37.load, _s37.stats, _s37.print_moved
CHANGED = set((HERE / "functions.txt").read_text().split())


def session37(half: str, dtype: str) -> list[tuple]:
    """Session 37's rows of ``half``: session 36's, its changed formulas' measured after it."""
    base = load(_s37.BASE / f"rows-{half}-{dtype}.jsonl")
    kept = [x for x in base if x[0].function not in _s37.CHANGED]
    return kept + _s37.measured("after", half, dtype)


def main() -> None:
    for half in ("tuning", "heldout"):
        for dtype in ("float64", "float32"):
            kept = [x for x in session37(half, dtype) if x[0].function not in CHANGED]
            old = load(HERE / f"before/rows-{half}-{dtype}.jsonl")
            new = load(HERE / f"after/rows-{half}-{dtype}.jsonl")
            print(half, dtype, "before:", stats(kept + old))
            print(half, dtype, "after: ", stats(kept + new))
            print_moved(old, new, width=18)


if __name__ == "__main__":
    main()
