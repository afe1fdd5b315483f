"""Session 58's tables on the public corpus, from the repository root:

    python benchmarks/results/public-s58/summary.py

Draw 2's held-out half at 7526f39 (``heldout2-7526f39/``: ``regimes.log_growing_product``
added), beside session 57's final run (``../public-s57/heldout2-final``, d260ebf), both
with ``measure_corpus.py --half heldout2 --jobs 1 --budget 10 --timeout 600 --sources``;
draw 2's tuning half at b5a92b7 (session 57's final code, ``tuning2-b5a92b7/``), beside
session 56's "before" (``../public-s56/tuning2-before``). The summary is session 55's (see
its docstring): both readings of the mean, the non-finite results where the exact value
is finite, the rows worse than naive, and the means over the rows measured at the same
points.
"""

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent

_spec = importlib.util.spec_from_file_location(
    "s55_summary", HERE.parent / "public-s55" / "summary.py"
)
_s55 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s55)
_s55.HERE = HERE
_s55.TABLES = [
    ("heldout2", "../public-s57/heldout2-final"),
    ("heldout2", "heldout2-7526f39"),
    ("tuning2", "../public-s56/tuning2-before"),
    ("tuning2", "tuning2-b5a92b7"),
]
_s55.BEFORE_AFTER = {
    "heldout2": (("before", "../public-s57/heldout2-final"), ("after", "heldout2-7526f39")),
    "tuning2": (("before", "../public-s56/tuning2-before"), ("after", "tuning2-b5a92b7")),
}


def main() -> None:
    for half in ("heldout2", "tuning2"):
        for dtype in ("float64", "float32"):
            _s55.same_points(half, dtype)
    _s55.print_tables()


if __name__ == "__main__":
    main()
