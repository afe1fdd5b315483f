"""Before/after of session 47, from the repository root:

    python benchmarks/results/public-s47/combine.py

Session 46's tables (its clean/ rows with its float64 step's after/ rows: the code at
8f3b090, session 47's start) are the base. The session's three steps (power_difference's
merged powers and collected cofactors, sign_of_factors, paired_product by growth and by
the temporaries' values) were generated together on both halves at 8f3b090 and with the
session's last code (its measured after/ rows are 4fa3f6d's, whose generated code for
these functions is the same as the last commit's: both generated and compared) and
compared function by function (functions-<half>.txt: those whose generated torch code
changed); those functions were measured with each code side by side
(before/, after/: ``measure_corpus.py --half tuning|heldout --functions ... --sources
--jobs 1 --timeout 900 --budget 60``), and their rows replace the base's. The moved rows
are listed (before -> after, both at --budget 60).

STUDIED: the held-out formulas a step was written on (nmse_problem_3_4_6,
eccentricity_of_an_ellipse, complex_square_root), with session 44's and 46's; the line
"not studied" leaves them out.
"""

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("combine_s46", HERE.parent / "public-s46/combine.py")
_s46 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s46)
stats, print_moved, load = _s46.stats, _s46.print_moved, _s46.load
STUDIED = _s46.STUDIED | {"nmse_problem_3_4_6", "eccentricity_of_an_ellipse", "complex_square_root"}
S46 = HERE.parent / "public-s46"


def base(half: str, dtype: str) -> list[tuple]:
    """Session 46's rows of ``half`` (its clean table with its step's after/ rows)."""
    rows = load(S46 / "clean" / f"rows-{half}-{dtype}.jsonl")
    return _s46.replaced(rows, "float64", "after", half, dtype)


def replaced(rows: list[tuple], when: str, half: str, dtype: str) -> list[tuple]:
    """``rows`` with those of the changed functions replaced by the ``when`` measurement."""
    new = load(HERE / when / f"rows-{half}-{dtype}.jsonl")
    changed = {r.function for r, _, _ in new}
    return [x for x in rows if x[0].function not in changed] + new


def main() -> None:
    for half in ("tuning", "heldout"):
        for dtype in ("float64", "float32"):
            rows = base(half, dtype)
            before = replaced(rows, "before", half, dtype)
            after = replaced(rows, "after", half, dtype)
            print(half, dtype, "before:".ljust(12), stats(before))
            print(half, dtype, "after:".ljust(12), stats(after))
            print_moved(
                load(HERE / "before" / f"rows-{half}-{dtype}.jsonl"),
                load(HERE / "after" / f"rows-{half}-{dtype}.jsonl"),
                width=18,
            )
            if half == "heldout":
                for label, table in (("before", before), ("after", after)):
                    kept = [x for x in table if x[0].function not in STUDIED]
                    print(half, dtype, f"not studied, {label}:".ljust(28), stats(kept))


if __name__ == "__main__":
    main()
