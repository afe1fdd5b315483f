"""Where the bar of the public corpus stands at session 52, from the repository root:

    python benchmarks/results/public-s52/summary.py

The rows are session 50's tables (``public-s50/combine.py``'s after: every row measured
with ``measure_corpus.py --sources``, the rows of each session's changed functions
replaced by their after measurement; no code changed in session 51), with the one
held-out formula whose code session 52's rule (``rules.log_acosh``) changes measured
before and after, side by side (before/, after/: ``measure_corpus.py --half heldout
--functions rust_f64_acosh --sources --jobs 1 --timeout 900 --budget 60``; both halves
and the project's specs were searched for the rule's pattern, and the held-out half
generated before and after: no other formula's code changed). For each half and dtype it
prints both readings of the mean (over the points whose exact value is finite, as
Herbie samples, and over all points, a missed overflow counted as 64 bits) for symgrad
and for naive autograd, the non-finite results where the exact value is finite, the rows
worse than naive (by their all-points mean or their non-finite count) and the points
where the exact value overflows and the result is not that infinity; for the held-out
half, the formulas with the most of those.
"""

import importlib.util
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("combine_s50", HERE.parent / "public-s50/combine.py")
_s50 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s50)


def rows(half: str, dtype: str, when: str = "after") -> list[tuple]:
    """Session 50's after table of ``half``, with session 52's ``when`` rows."""
    table = _s50.replaced(_s50.base(half, dtype), "after", half, dtype)
    path = HERE / when / f"rows-{half}-{dtype}.jsonl"
    if not path.exists():  # no function of the half changed
        return table
    new = _s50.load(path)
    changed = {r.function for r, _, _ in new}
    return [x for x in table if x[0].function not in changed] + new


def line(table: list[tuple]) -> str:
    split = [(r, s, f) for r, s, f in table if s is not None and r.ok]
    finite = [f["mean"] for _, _, f in split if f and f["mean"] is not None]
    return (
        f"rows {len(split):3d}  finite-exact {sum(finite) / len(finite):.3f}  "
        f"all points {sum(r.symgrad_mean_bits for r, _, _ in split) / len(split):.3f}  "
        f"(naive {sum(r.naive_mean_bits for r, _, _ in split) / len(split):.3f})  "
        f"non-finite {sum(r.symgrad_nonfinite for r, _, _ in split)}  "
        f"(naive {sum(r.naive_nonfinite or 0 for r, _, _ in split)})  "
        f"worse {sum(1 for r, _, _ in split if r.worse_than_naive)}  "
        f"missed infinities {sum(f['missed'] for _, _, f in split if f)} of "
        f"{sum(f['overflows'] for _, _, f in split if f)}"
    )


def main() -> None:
    for half in ("tuning", "heldout"):
        for dtype in ("float64", "float32"):
            for when in ("before", "after"):
                print(f"{half:7s} {dtype} {when:6s}: {line(rows(half, dtype, when))}")
            table = rows(half, dtype)
            if half == "heldout":
                missed = Counter()
                for r, _, f in table:
                    if f:
                        missed[r.function] += f["missed"]
                worst = ", ".join(f"{name} {n}" for name, n in missed.most_common(5))
                print(f"        most missed infinities: {worst}")


if __name__ == "__main__":
    main()
