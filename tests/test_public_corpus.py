"""The public corpus (benchmarks/accuracy/public_*.yaml: FPBench and Herbie formulas), CI-sized.

The corpus is what it says (sources cited, split by its fixed rule), and a fixed subset of
each half is measured with ``symgrad accuracy``'s machinery against the committed baseline
(tests/data/public_corpus_baseline.json): a rewrite or printing change that makes a
formula of either half less accurate, or non-finite where it was finite, fails here. An
improvement passes; ``python benchmarks/accuracy/measure_corpus.py --write-ci-baseline``
then records it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pytest

from symgrad.spec import load_spec

ACCURACY = Path(__file__).resolve().parent.parent / "benchmarks" / "accuracy"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ACCURACY / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


corpus = _module("fpcore_corpus")
measure = _module("measure_corpus")
BASELINE = json.loads(measure.CI_BASELINE.read_text())
#: A row may lose this many bits of mean error over the baseline (its 16 random points
#: are the same on every machine; the slack is for libm differences between machines).
SLACK_BITS = 1.0


@pytest.fixture(scope="module")
def halves():
    return {half: load_spec(path) for half, path in measure.HALVES.items()}


def test_the_corpus_has_over_100_formulas_that_cite_their_sources(halves):
    functions = [f for spec in halves.values() for f in spec.functions]
    assert len(functions) >= 100
    for half, path in measure.HALVES.items():
        text = path.read_text()
        for fn in halves[half].functions:
            block = text.split(f"\n  {fn.name}:\n", 1)[1]
            assert re.match(r'    # (FPBench|Herbie) \S+\.fpcore: ".+"\n', block), fn.name


def test_the_split_follows_its_fixed_rule(halves):
    studied = corpus.old_corpus_names()
    for half, spec in halves.items():
        text = measure.HALVES[half].read_text()
        for fn in spec.functions:
            fpname = re.search(rf'\n  {fn.name}:\n    # \S+ \S+: "(.+)"\n', text).group(1)
            goes_out = corpus.held_out(fn.name) and fpname not in studied
            assert goes_out == half.startswith("heldout"), fn.name
    assert len(halves["heldout"].functions) >= 40  # the rule gave 86 of 193
    assert len(halves["heldout2"].functions) >= 40  # and 63 of draw 2's 148


def test_no_formula_is_in_two_halves(halves):
    """Draw 2 leaves out draw 1's formulas, and every draw keeps a formula once."""
    seen: dict[str, str] = {}
    for half, spec in halves.items():
        for fn in spec.functions:
            formula = corpus.Formula(
                source=half,
                fpname=fn.name,
                args=[i.name for i in fn.inputs],
                names=[i.name for i in fn.inputs],
                formula=fn.outputs[0].text,
                pre=None,
                domains={},
            )
            key = corpus.canonical(formula)
            assert key not in seen, f"{half} {fn.name} is {seen[key]}"
            seen[key] = f"{half} {fn.name}"


def test_the_baseline_covers_exactly_the_ci_subset():
    for half in measure.HALVES:
        names = set(measure.ci_subset(half))
        for dtype in ("float64", "float32"):
            recorded = {key.split(" | ")[0] for key in BASELINE[half][dtype]}
            assert recorded == names, (half, dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("half", ["tuning", "heldout", "tuning2", "heldout2"])
def test_no_formula_of_the_ci_subset_gets_less_accurate(half, dtype):
    baseline = BASELINE[half][dtype]
    rows = measure.ci_rows(half, dtype)
    seen = set()
    problems = []
    for row in rows:
        key = f"{row.function} | {row.quantity}"
        seen.add(key)
        if not row.ok:
            problems.append(f"{key}: no numbers ({row.error})")
            continue
        was = baseline.get(key)
        if was is None:
            problems.append(f"{key}: not in the baseline")
            continue
        if row.symgrad_nonfinite > was["nonfinite"]:
            problems.append(f"{key}: {row.symgrad_nonfinite} non-finite, was {was['nonfinite']}")
        if not math.isfinite(row.symgrad_mean_bits) or (
            row.symgrad_mean_bits > was["mean_bits"] + SLACK_BITS
        ):
            problems.append(f"{key}: {row.symgrad_mean_bits:.2f} bits, was {was['mean_bits']}")
        if row.worse_than_naive and not was["worse"]:
            problems.append(f"{key}: now worse than naive autograd")
    missing = set(baseline) - seen
    problems += [f"{key}: no longer measured" for key in sorted(missing)]
    assert not problems, "\n".join(problems)


def test_error_sources_split_a_rows_mean_by_kind_of_point():
    from symgrad.report.measure import Sample

    class Row:  # the fields error_sources reads
        dtype = "float64"
        samples = [
            Sample((1.0,), 2.0, 2.0, 2.0),  # exact: within 4 bits
            Sample((2.0,), math.inf, math.nan, math.nan),  # the value overflows
            Sample((3.0,), 1.0, math.nan, 1.0),  # non-finite
            Sample((4.0,), 1.0, 1.5, 1.5),  # 51 bits off, as naive is
            Sample((5.0,), 1.0, 1.5, 1.0),  # 51 bits off where naive is exact
            Sample((6.0,), None, 1.0, 1.0),  # no exact value: not counted
        ]

    sources = measure.error_sources(Row)
    assert set(sources) == set(measure.SOURCES)
    assert sources["within 4 bits"] == 0.0
    assert sources["overflow"] == sources["non-finite"] == pytest.approx(64 / 5)
    assert sources["naive as bad"] == sources["symgrad worse"] == pytest.approx(51 / 5, abs=0.1)


def test_finite_exact_mean_counts_missed_overflows_apart():
    from symgrad.report.measure import Sample

    class Row:  # the fields finite_exact and sources_summary read
        function, quantity, dtype = "f", "forward out", "float64"
        samples = [
            Sample((1.0,), 2.0, 2.0, 2.0),  # exact
            Sample((2.0,), math.inf, math.nan, math.nan),  # overflow missed (NaN)
            Sample((3.0,), -math.inf, -math.inf, math.nan),  # overflow right
            Sample((4.0,), 1.0, math.nan, 1.0),  # non-finite: 64 bits, counted
            Sample((5.0,), None, 1.0, 1.0),  # no exact value: not counted
        ]

    finite = measure.finite_exact(Row)
    assert finite == {"mean": 32.0, "points": 2, "overflows": 2, "missed": 1}
    sources = measure.error_sources(Row)
    summary = measure.sources_summary([(Row, sources, finite)])
    assert "over finite exact values: mean 32.000 bits (1 rows)" in summary
    assert "overflows at 2 points, the result misses that infinity at 1" in summary
