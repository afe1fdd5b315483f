"""Before/after of session 46, from the repository root:

    python benchmarks/results/public-s46/combine.py

clean/: both halves measured in full at 0301a85 (session 45's last commit), alone on the
machine but for one generation beside it, ``measure_corpus.py --half both --sources --jobs
1 --timeout 900 --budget 300``: the first full table since session 41's patchwork began,
every function's points complete (the patchwork's rows at the default ``--budget 5``
had lost points under load).

float64/: the step, chosen forms computed in float64 for float32 inputs where float32
arithmetic loses 2 bits or more (``choose.in_float64``), measured side by side at 0301a85
(before/) and with the step (after/) on the formulas whose generated code changed when
both halves were generated with it (functions.txt: those with a ``(float32 in float64)``
formula; nothing else in the code moves), ``measure_corpus.py --half tuning|heldout
--sources --jobs 1 --timeout 900 --budget 300 --functions ...``.

after/ holds the step's final code: compound_interest (tuning) and jmat_real_erf (held
out) were measured again with it (after-guard/, merged into after/'s rows), their
widened quantities having changed with the float64 guard.

Each half's totals are clean/'s, then with the step's formulas' rows replaced by
before/ (before) or after/ (after); the rows whose mean moved are listed. The step was
written from no formula of the held-out half. Session 44's STUDIED formulas are also
left out of the held-out totals printed "not studied", and jmat_real_erf (STUDIED).
"""

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("combine_s44", HERE.parent / "public-s44/combine.py")
_s44 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s44)
stats, print_moved, load = _s44.stats, _s44.print_moved, _s44.load
#: Session 44's studied formulas, and jmat_real_erf: the first version of the step's
#: float64 guard (the widened form's float64 mean within 1/2 bit) rejected its forward's
#: widening; the guard was relaxed (no more non-finite results, the mean within 2 bits)
#: after that was seen, so it is not counted as held out for this step.
STUDIED = _s44.STUDIED | {"jmat_real_erf"}
STEPS = tuple(s for s in ("float64",) if (HERE / s / "after").exists())


def replaced(rows: list[tuple], step: str, when: str, half: str, dtype: str) -> list[tuple]:
    """``rows`` with those of ``step``'s formulas replaced by its ``when`` measurement."""
    path = HERE / step / when / f"rows-{half}-{dtype}.jsonl"
    if not path.exists():
        return rows
    new = load(path)
    changed = {r.function for r, _, _ in new}
    return [x for x in rows if x[0].function not in changed] + new


def main() -> None:
    for half in ("tuning", "heldout"):
        for dtype in ("float64", "float32"):
            rows = load(HERE / "clean" / f"rows-{half}-{dtype}.jsonl")
            print(half, dtype, "clean (0301a85):".ljust(18), stats(rows))
            for step in STEPS:
                before = replaced(rows, step, "before", half, dtype)
                rows = replaced(rows, step, "after", half, dtype)
                print(half, dtype, f"{step} before:".ljust(18), stats(before))
                print(half, dtype, f"{step} after:".ljust(18), stats(rows))
                old = HERE / step / "before" / f"rows-{half}-{dtype}.jsonl"
                if old.exists():
                    new = load(HERE / step / "after" / f"rows-{half}-{dtype}.jsonl")
                    print_moved(load(old), new, width=18)
            if half == "heldout":
                kept = [x for x in rows if x[0].function not in STUDIED]
                print(half, dtype, "not studied, after:".ljust(28), stats(kept))


if __name__ == "__main__":
    main()
