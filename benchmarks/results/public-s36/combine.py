"""Before/after of session 36, from the repository root:

    python benchmarks/results/public-s36/combine.py

"After" is this directory's rows (measure_corpus.py --half both --sources at the
session's code). "Before" is the same rows, except those of the functions whose generated
code changed (before-changed/functions.txt), measured at the code before the session
(before-changed/). The rows of the changed functions whose mean moved are listed.
"""

import json
from pathlib import Path

from symgrad.report.measure import Row

HERE = Path(__file__).parent
CHANGED = set((HERE / "before-changed/functions.txt").read_text().split())


def load(path: Path) -> list[tuple]:
    """(Row, error sources, finite-exact mean) per line of a rows-*.jsonl file."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            fields = json.loads(line)
            sources, finite = fields.pop("sources"), fields.pop("finite")
            fields["samples"] = ()
            out.append((Row(**fields), sources, finite))
    return out


def stats(rows: list[tuple]) -> str:
    split = [(r, s, f) for r, s, f in rows if s is not None]
    mean = sum(sum(s.values()) for _, s, _ in split) / len(split)
    finite = [f["mean"] for _, _, f in split if f and f["mean"] is not None]
    nonfinite = sum(r.symgrad_nonfinite for r, _, _ in rows if r.ok)
    worse = sum(1 for r, _, _ in rows if r.worse_than_naive)
    overflows = sum(f["overflows"] for _, _, f in split if f)
    missed = sum(f["missed"] for _, _, f in split if f)
    return (
        f"rows {len(split)} mean {mean:.3f} finite-exact {sum(finite) / len(finite):.3f} "
        f"nonfinite {nonfinite} worse {worse} overflow {overflows} missed {missed}"
    )


def main() -> None:
    for half in ("tuning", "heldout"):
        for dtype in ("float64", "float32"):
            after = load(HERE / f"rows-{half}-{dtype}.jsonl")
            old = load(HERE / f"before-changed/rows-{half}-{dtype}.jsonl")
            before = [x for x in after if x[0].function not in CHANGED] + old
            print(half, dtype, "before:", stats(before))
            print(half, dtype, "after: ", stats(after))
            print_moved(old, after)


def print_moved(before: list[tuple], after: list[tuple], width: int = 16) -> None:
    """Each row of ``after`` measured in ``before`` too whose mean moved by more than 0.05
    bits or whose non-finite count changed."""
    was = {(r.function, r.quantity): r for r, _, _ in before}
    for r, _, _ in after:
        o = was.get((r.function, r.quantity))
        if o is None or not (r.ok and o.ok):
            continue
        if (
            abs(o.symgrad_mean_bits - r.symgrad_mean_bits) > 0.05
            or o.symgrad_nonfinite != r.symgrad_nonfinite
        ):
            print(
                f"   {r.function:44s} {r.quantity:{width}s} {o.points:3d} points "
                f"{o.symgrad_mean_bits:6.2f} bits {o.symgrad_nonfinite} non-finite -> "
                f"{r.points:3d} {r.symgrad_mean_bits:6.2f} {r.symgrad_nonfinite} "
                f"(naive {r.naive_mean_bits:.2f})"
            )


if __name__ == "__main__":
    main()
