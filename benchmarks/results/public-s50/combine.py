"""Before/after of session 50, from the repository root:

    python benchmarks/results/public-s50/combine.py

Session 49's tables (its base with its after/ rows: the code at ba495a8, session 50's
start) are the base. The session's step (polynomial_tails: a power of the smaller input
common to every term kept out of the ratio) changes a formula's code only where some
form of it is a polynomial in two symbols with such a power. Every formula of both halves
was scanned for one (its forward, first and second derivatives, mixed ones too, with the
upstream gradient as a symbol); the 16 found (7 tuning, 9 held out) were generated at
ba495a8 and with the step and compared function by function (functions-<half>.txt: those
whose generated torch code changed, none in the tuning half), and the changed ones
measured with each code side by side (before/, after/: ``measure_corpus.py --half heldout
--functions ... --sources --jobs 1 --timeout 900 --budget 60``); their rows replace the
base's. The moved rows are listed (before -> after, both at --budget 60).

STUDIED: the held-out formula the step was written knowing (bouland_and_aaronson_equation_25,
whose d/db was the last held-out row worse than naive; the limit itself was written down
in session 25 from a tuning analog), with the earlier sessions'; the line "not studied"
leaves them out.
"""

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("combine_s49", HERE.parent / "public-s49/combine.py")
_s49 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s49)
stats, print_moved, load = _s49.stats, _s49.print_moved, _s49.load
STUDIED = _s49.STUDIED | {"bouland_and_aaronson_equation_25"}


def base(half: str, dtype: str) -> list[tuple]:
    """Session 49's rows of ``half`` (its base with its after/ rows)."""
    return _s49.replaced(_s49.base(half, dtype), "after", half, dtype)


def replaced(rows: list[tuple], when: str, half: str, dtype: str) -> list[tuple]:
    """``rows`` with those of the changed functions replaced by the ``when`` measurement."""
    path = HERE / when / f"rows-{half}-{dtype}.jsonl"
    if not path.exists():  # no function of the half changed
        return rows
    new = load(path)
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
            moved = HERE / "before" / f"rows-{half}-{dtype}.jsonl"
            if moved.exists():
                print_moved(
                    load(moved), load(HERE / "after" / f"rows-{half}-{dtype}.jsonl"), width=18
                )
            if half == "heldout":
                for label, table in (("before", before), ("after", after)):
                    kept = [x for x in table if x[0].function not in STUDIED]
                    print(half, dtype, f"not studied, {label}:".ljust(28), stats(kept))


if __name__ == "__main__":
    main()
