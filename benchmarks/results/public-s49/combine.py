"""Before/after of session 49, from the repository root:

    python benchmarks/results/public-s49/combine.py

Session 47's tables (its base with its after/ rows: the code at 477b204, session 49's
start) are the base. The session's step (radical_factored) was generated on both halves
at 477b204 and with the session's last code and compared function by function (functions-<half>.txt: those whose generated
torch code changed); those functions were measured with each code side by side
(before/, after/: ``measure_corpus.py --half tuning|heldout --functions ... --sources
--jobs 1 --timeout 900 --budget 60``), and their rows replace the base's. The moved rows
are listed (before -> after, both at --budget 60).

STUDIED: the held-out formulas the steps were written on (nmse_problem_3_4_6,
jmat_real_gamma_branch_z_greater_than_0_5), with the earlier sessions'; the line "not
studied" leaves them out.
"""

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("combine_s48", HERE.parent / "public-s48/combine.py")
_s48 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s48)
stats, print_moved, load = _s48.stats, _s48.print_moved, _s48.load
STUDIED = _s48.STUDIED | {"nmse_problem_3_4_6", "jmat_real_gamma_branch_z_greater_than_0_5"}


def base(half: str, dtype: str) -> list[tuple]:
    """Session 48's rows of ``half`` (its base with its after/ rows)."""
    return _s48.replaced(_s48.base(half, dtype), "after", half, dtype)


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
