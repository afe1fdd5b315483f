"""Before/after of session 37, from the repository root:

    python benchmarks/results/public-s37/combine.py

Only the formulas whose generated code changed (functions.txt) were measured, at the code
before the session (before/) and after it (after/), side by side in one run each
(measure_corpus.py --half both --sources --functions ...); the formulas whose point
counts moved with the time budget (5 s) were measured again at --budget 60, before and
after (before-budget60/, after-budget60/), and those rows replace theirs. Each half's
totals are
session 36's table (../public-s36/rows-*.jsonl, the code before) with those formulas'
rows replaced by before/ or after/; the rows of the changed formulas whose mean moved are
listed.
"""

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
BASE = HERE.parent / "public-s36"
# its rows-*.jsonl reader, totals and list of moved rows
_spec = importlib.util.spec_from_file_location("combine_s36", BASE / "combine.py")
_s36 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s36)
load, stats, print_moved = _s36.load, _s36.stats, _s36.print_moved
CHANGED = set((HERE / "functions.txt").read_text().split())


def measured(when: str, half: str, dtype: str) -> list[tuple]:
    """The rows measured ``when`` ("before" or "after"), those measured again at a budget
    of 60 s in their place."""
    rows = load(HERE / f"{when}/rows-{half}-{dtype}.jsonl")
    again = HERE / f"{when}-budget60/rows-{half}-{dtype}.jsonl"
    if not again.exists():
        return rows
    better = load(again)
    names = {r.function for r, _, _ in better}
    return [x for x in rows if x[0].function not in names] + better


def main() -> None:
    for half in ("tuning", "heldout"):
        for dtype in ("float64", "float32"):
            base = load(BASE / f"rows-{half}-{dtype}.jsonl")
            kept = [x for x in base if x[0].function not in CHANGED]
            old = measured("before", half, dtype)
            new = measured("after", half, dtype)
            print(half, dtype, "before:", stats(kept + old))
            print(half, dtype, "after: ", stats(kept + new))
            print_moved(old, new, width=18)


if __name__ == "__main__":
    main()
