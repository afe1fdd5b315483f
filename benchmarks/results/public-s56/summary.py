"""Session 56's tables on the public corpus, from the repository root:

    python benchmarks/results/public-s56/summary.py

Draw 2 (Herbie's bench/ files that draw 1 missed; see benchmarks/accuracy/README.md),
measured as sessions 54 and 55 measured draw 1, each with ``measure_corpus.py --half H
--jobs 1 --budget 10 --timeout 300 --sources``: its held-out half before any change
(``heldout2-before/``, at 3a92646: session 55's final code) and after the session's rules
(``heldout2-after/``, at 5f750fc; the last code commit, 2a07478, which lets
``exp_w_used_to_crash`` derive, came after it); its tuning half before (``tuning2-before/``,
at 3a92646). ``heldout2-before`` has three rows without numbers that the measurement's
own bug made (naive autograd's second derivative of ``abs``, fixed in 113e153). The
summary is session 55's: both readings of the mean, the non-finite results where the
exact value is finite, the rows worse than naive, and the means over the rows measured
at the same points before and after (the 10 s budget makes a row's points depend on
the machine's load).
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
    ("heldout2", "heldout2-before"),
    ("heldout2", "heldout2-after"),
    ("tuning2", "tuning2-before"),
]
_s55.BEFORE_AFTER = {
    "heldout2": (("before", "heldout2-before"), ("after", "heldout2-after")),
}


def main() -> None:
    for dtype in ("float64", "float32"):
        _s55.same_points("heldout2", dtype)
    _s55.print_tables()


if __name__ == "__main__":
    main()
