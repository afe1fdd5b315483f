"""Session 57's tables on the public corpus, from the repository root:

    python benchmarks/results/public-s57/summary.py

Each with ``measure_corpus.py --half H --jobs 1 --budget 10 --sources`` (``--timeout
300``, and 600 for ``heldout2-final``: under the load of the test suite
``exp_w_used_to_crash`` took more than 300 s to derive in float32): draw 2's held-out half
after the session's first rules (``heldout2-d530977/``) and at its final code
(``heldout2-final/``, d260ebf), beside session 56's "after" (``../public-s56/
heldout2-after``, at 5f750fc); draw 1's held-out half in float64 at e8b0ec4 (session
56's rules; ``heldout-e8b0ec4-float64-only/``, its float32 run was stopped for time) and
at the final code (``heldout-final/``), beside session 55's "after" (``../public-s55/
heldout-after``, at 716ca03).
The summary is session 55's: both readings of the mean, the non-finite results where the
exact value is finite, the rows worse than naive, and the means over the rows measured at
the same points before and after (the 10 s budget makes a row's points depend on the
machine's load). Two held-out formulas have rows for the first time here, because
session 56's crash fixes landed after its "after" table (``exp_w_used_to_crash``,
``x_1_to_x_20``): they are in the all-row figures and not in the same-point ones.
"""

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent

# session 55's summary, pointed at this folder's tables (its script reads no file when
# imported)
_spec = importlib.util.spec_from_file_location(
    "s55_summary", HERE.parent / "public-s55" / "summary.py"
)
_s55 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s55)
_s55.HERE = HERE
_s55.TABLES = [
    ("heldout2", "../public-s56/heldout2-after"),
    ("heldout2", "heldout2-d530977"),
    ("heldout2", "heldout2-final"),
    ("heldout", "heldout-e8b0ec4-float64-only"),
    ("heldout", "heldout-final"),
]
_s55.BEFORE_AFTER = {
    "heldout2": (("before", "../public-s56/heldout2-after"), ("after", "heldout2-final")),
    "heldout": (("before", "../public-s55/heldout-after"), ("after", "heldout-final")),
}


def main() -> None:
    for half in ("heldout2", "heldout"):
        for dtype in ("float64", "float32"):
            _s55.same_points(half, dtype)
    _s55.print_tables()


if __name__ == "__main__":
    main()
