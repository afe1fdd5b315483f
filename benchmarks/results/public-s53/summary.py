"""Session 53's before/after on the public corpus, from the repository root:

    python benchmarks/results/public-s53/summary.py

Session 53 changed what the table measures (``measure_corpus.py`` and ``symgrad
accuracy``): each input's extreme points now include the ends of the dtype's range, as
``symgrad gen``'s choice has them, and the second derivatives include the mixed ones. So
the tables of earlier sessions are not comparable with these, and the held-out half was
measured again, whole, before any of the session's rules (``before/``, at f98f434, the
harness change alone) and after them (``after/``), both with ``measure_corpus.py --half
heldout --jobs 2 --budget 10 --timeout 300 --sources``; the tuning half was not
measured whole (its CI subset was, before and after: the accuracy README).
``after/`` was measured at f21f71e, whose last rule change (d459098, in
``linear_terms_unscaled``) was then reverted: it made a form the choice measured finite
but the generated code computes as inf/inf (tuning ``nmse_example_3_5``'s second
derivative, 0.3 -> 17.5 bits on the CI subset). The 11 held-out formulas whose derived
formulas differ between f21f71e and the revert (``after-revert/functions.txt``) were
measured again at the revert (``after-revert/``), and their rows replace ``after/``'s. For each table it prints both readings of the
mean (the mean over rows of each row's mean over the points whose exact value is finite,
as Herbie samples, and over all points, a missed overflow counted as 64 bits), naive
autograd's, the non-finite results where the exact value is finite, the rows worse than
naive, the points where the exact value overflows and the result is not that infinity,
and which rows are non-finite or worse. The budget makes a row's points depend on the
machine's load (`sample_trimmed_logistic_on_pi_pi` got 9 points before and 73 after), so
it also prints both means over the rows measured at the same points before and after,
where only the code differs.
"""

import json
from pathlib import Path

from symgrad.report.measure import Row

HERE = Path(__file__).parent
TABLES = [
    ("heldout", "before"),
    ("heldout", "after"),
]


REVERTED = set((HERE / "after-revert/functions.txt").read_text().split())


def load(path: Path) -> list[tuple]:
    """(Row, error sources, finite-exact mean) per line of a rows-*.jsonl file."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            fields = json.loads(line)
            sources, finite = fields.pop("sources"), fields.pop("finite")
            fields["samples"] = ()
            out.append((Row(**fields), sources, finite))
    if path.parent.name == "after":  # the session's final code: the reverted rows
        again = load(HERE / "after-revert" / path.name)
        out = [x for x in out if x[0].function not in REVERTED] + again
    return out


def line(table: list[tuple]) -> str:
    split = [(r, s, f) for r, s, f in table if s is not None and r.ok]
    finite = [f["mean"] for _, _, f in split if f and f["mean"] is not None]
    naive = [r.naive_mean_bits for r, _, _ in split if r.naive_mean_bits is not None]
    return (
        f"rows {len(split):3d} (without numbers {sum(1 for r, _, _ in table if not r.ok)})  "
        f"finite-exact {sum(finite) / len(finite):.3f}  "
        f"all points {sum(r.symgrad_mean_bits for r, _, _ in split) / len(split):.3f}  "
        f"(naive {sum(naive) / len(naive):.3f})  "
        f"non-finite {sum(r.symgrad_nonfinite for r, _, _ in split)}  "
        f"(naive {sum(r.naive_nonfinite or 0 for r, _, _ in split)})  "
        f"worse {sum(1 for r, _, _ in split if r.worse_than_naive)}  "
        f"missed infinities {sum(f['missed'] for _, _, f in split if f)} of "
        f"{sum(f['overflows'] for _, _, f in split if f)}"
    )


def same_points(dtype: str) -> None:
    """Both held-out means over the rows with as many points before as after."""
    tables = {
        when: {(r.function, r.quantity): (r, f) for r, _, f in load(HERE / when / name)}
        for when in ("before", "after")
        if (HERE / when / (name := f"rows-heldout-{dtype}.jsonl")).exists()
    }
    if len(tables) < 2:
        return
    keys = [
        k
        for k, (r, f) in tables["before"].items()
        if r.ok and f and f["mean"] is not None and k in tables["after"]
        and tables["after"][k][0].points == r.points
        and tables["after"][k][1] and tables["after"][k][1]["mean"] is not None
    ]  # fmt: skip
    for when, table in tables.items():
        finite = sum(table[k][1]["mean"] for k in keys) / len(keys)
        every = sum(table[k][0].symgrad_mean_bits for k in keys) / len(keys)
        print(
            f"heldout {dtype} {when:12s}: the {len(keys)} rows with the same points: "
            f"finite-exact {finite:.3f}  all points {every:.3f}"
        )


def main() -> None:
    for dtype in ("float64", "float32"):
        same_points(dtype)
    for half, when in TABLES:
        for dtype in ("float64", "float32"):
            path = HERE / when / f"rows-{half}-{dtype}.jsonl"
            if not path.exists():
                print(f"{half:7s} {dtype} {when:12s}: not measured")
                continue
            table = load(path)
            print(f"{half:7s} {dtype} {when:12s}: {line(table)}")
            for r, _, _ in table:
                if not r.ok:
                    print(f"    no numbers: {r.function} {r.quantity}: {r.error}")
                elif r.symgrad_nonfinite or r.worse_than_naive:
                    print(
                        f"    {r.function} {r.quantity}: {r.symgrad_mean_bits:.2f} bits "
                        f"(naive {r.naive_mean_bits:.2f}), {r.symgrad_nonfinite} non-finite"
                        f"{', worse' if r.worse_than_naive else ''}"
                    )


if __name__ == "__main__":
    main()
