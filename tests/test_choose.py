"""The accuracy choice measures the same errors on every machine."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

#: NumPy's dispatched SIMD loops, turned off: the loops an older or other CPU would run.
_NO_SIMD = (
    "AVX AVX2 FMA3 F16C X86_V3 AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL "
    "AVX512_ICL AVX512_SPR X86_V4"
)

_SCRIPT = """
import numpy as np, sympy
from symgrad import functions as F
from symgrad.numerics.native import evaluator as _evaluator
x = sympy.Symbol("x", real=True)
unit = [sympy.asin, sympy.acos, sympy.atanh]  # on (-1, 1)
formulas = [sympy.exp, sympy.log, sympy.sin, sympy.cos, sympy.tan, sympy.atan, sympy.sinh,
            sympy.cosh, sympy.tanh, sympy.asinh, sympy.acosh, F.expm1, F.log1p, F.sigmoid,
            F.softplus, *unit]
points = np.random.default_rng(0).uniform(-3, 3, 400)
for f in formulas:
    evaluate = _evaluator(f(x), [x])
    at = points / 3.1 if f in unit else 1 + np.abs(points) if f is sympy.acosh else points
    for dtype in (np.float64, np.float32):
        values = [evaluate(dtype(p)) for p in at]
        print(f.__name__, dtype.__name__, np.asarray(values, dtype=dtype).tobytes().hex())
"""


def _run(env_extra: dict[str, str]) -> str:
    env = {**os.environ, **env_extra}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("disabled", [_NO_SIMD])
def test_candidate_values_do_not_depend_on_the_cpus_simd(disabled):
    """NumPy's float64 tanh differs in the last bit between its AVX2 and SSE loops (and
    sinh, expm1, ... under AVX-512): measured through them, the docstrings' errors, and
    with them the committed generated files, changed from machine to machine."""
    assert _run({}) == _run({"NPY_DISABLE_CPU_FEATURES": disabled})


def test_libm_evaluation_keeps_numpys_special_values():
    import numpy as np

    from symgrad.ops import libm

    exp, log = libm("exp"), libm("log")
    assert exp(np.float64(1000.0)) == np.inf
    assert exp(np.float32(100.0)) == np.inf and exp(np.float32(1.0)).dtype == np.float32
    assert log(np.float64(0.0)) == -np.inf and np.isnan(log(np.float64(-1.0)))
    assert exp(np.float64(-1000.0)) == 0.0
    assert list(exp(np.array([0.0, 1.0]))) == [1.0, np.exp(1.0)]
    assert log(2) == np.log(2.0) and exp(np.array([0, 1])).dtype == np.float64  # ints in


# ----------------------------------------------------------------------------- the choice
def test_measure_counts_overflow_where_the_exact_value_is_finite():
    import sympy

    from symgrad import functions as F
    from symgrad.choose import measure

    x = sympy.Symbol("x", real=True)
    naive = sympy.log(1 + sympy.exp(x))
    points = [{x: v} for v in (-800.0, -1.0, 0.0, 2.0, 100.0, 800.0, 1e300)]
    worse = measure(naive, naive, points)
    better = measure(F.softplus(x), naive, points)
    # exp(800) and exp(1e300) overflow float64; float32's exp overflows at 100 and 800 too
    # (1e300 is no float32: not counted there)
    assert (worse.non_finite64, worse.non_finite) == (2, 4) and "x = 800" in worse.worst
    assert better.non_finite == 0 and better.max_bits <= 1
    assert worse.points == better.points == len(points)


def test_a_nan_where_the_exact_value_overflows_breaks_a_tie():
    """(16x**8 - 105)*exp(x**2)/x**8 at x = 1e40: inf/inf is NaN where the value is inf;
    divided through, (16 - 105/x**8)*exp(x**2) is inf. Such points are counted apart
    (most of a formula's points may overflow: they would choose alone), and between forms
    as accurate where the value is finite, the one right at them wins."""
    import sympy

    from symgrad.choose import measure, most_accurate

    x = sympy.Symbol("x", real=True)
    naive = (16 * x**8 - 105) * sympy.exp(x**2) / x**8
    scaled = (16 - 105 / x**8) * sympy.exp(x**2)
    points = [{x: v} for v in (2.0, 3.0, 30.0, 1e40)]
    worse, better = measure(naive, naive, points), measure(scaled, naive, points)
    # x = 30: exp(900) is inf and so is each form; only 1e40 tells them apart
    assert (worse.points, worse.overflow_misses) == (2, 1)
    assert (better.points, better.overflow_misses) == (2, 0)
    assert worse.max_bits <= 1 and better.max_bits <= 1
    assert [form for form, _ in most_accurate([naive, scaled], points)] == [scaled]


def test_the_most_accurate_candidates_keep_their_order_and_drop_the_worse():
    import sympy

    from symgrad import functions as F
    from symgrad.choose import most_accurate, symbol_points
    from symgrad.spec import Input

    x = sympy.Symbol("x", real=True)
    inputs = [Input("x", "tensor", True, (-1e308, 1e308), (), None, False, None, 1)]
    points = symbol_points(inputs, {"x": x}, n=16)
    naive = sympy.log(1 + sympy.exp(x))
    mirrored = x + sympy.log(1 + sympy.exp(-x))  # overflows for x < -710 instead
    chosen = most_accurate([naive, F.softplus(x), mirrored], points)
    assert [form for form, _ in chosen] == [F.softplus(x)]
    assert chosen[0][1].non_finite == 0


def test_a_contest_within_the_margin_is_measured_again_on_more_points():
    """log(1 + x) is within 1/2 bit of log1p(x) on a sample whose smallest x is 0.01 (6
    bits there); where the cheaper form would be taken on that sample, the choice measures
    the close forms again with ``more`` points, and the tail it missed decides."""
    import sympy

    from symgrad import functions as F
    from symgrad.choose import most_accurate

    x = sympy.Symbol("x", real=True)
    naive, stable = sympy.log(1 + x), F.log1p(x)
    points = [{x: 1.0 + k / 8} for k in range(200)] + [{x: 0.01 + k / 1e4} for k in range(10)]
    more = [{x: 10.0**-k} for k in range(8, 16)]

    def cost(form):
        return 0 if form == naive else 1

    close = most_accurate([naive, stable], points, costs=(cost,))
    assert [form for form, _ in close] == [naive, stable]  # the naive form would be taken
    assert close[0][1].score > close[1][1].score
    again = most_accurate([naive, stable], points, more=more, costs=(cost,))
    assert [form for form, _ in again] == [stable]
    assert again[0][1].points == len(points) + len(more)
    # no contest where the form taken is the best measured: ``more`` is not used
    cheap_stable = most_accurate([naive, stable], points, more=more, costs=(lambda f: -cost(f),))
    assert [form for form, _ in cheap_stable] == [naive, stable]


def test_a_form_whose_worst_point_is_far_worse_than_the_best_forms_is_not_close():
    """One x = 1e-10 in 201 points: log(1 + x) is 0.15 bits mean to log1p's 0.06, within
    the 1/2 bit margin, but 29 bits wrong there, where log1p is within 1 (WORST_SLACK)."""
    import sympy

    from symgrad import functions as F
    from symgrad.choose import WORST_SLACK, measure, most_accurate

    x = sympy.Symbol("x", real=True)
    naive, stable = sympy.log(1 + x), F.log1p(x)
    points = [{x: 1.0 + k / 8} for k in range(200)] + [{x: 1e-10}]
    worse, better = measure(naive, naive, points), measure(stable, naive, points)
    assert worse.score <= better.score + 0.5
    assert worse.max_bits > better.max_bits + WORST_SLACK
    assert [form for form, _ in most_accurate([naive, stable], points)] == [stable]


def test_two_input_extremes_are_also_measured_with_the_others_tame():
    """The derivative in x of NMSE section 6.1's A is inf * 0 at x = 710, e = 0.5 as
    expm1(2*e*x)*exp(-(1 + e)*x); at the drawn base (e = 6e-58) every form is as far
    off. With the other input at its tame value the paired form wins."""
    import sympy

    from symgrad import functions as F
    from symgrad.choose import measure, most_accurate, symbol_points
    from symgrad.rewrite.regimes import exp_product
    from symgrad.spec import Input

    x, e = sympy.symbols("x eps", real=True)
    inputs = [
        Input(name, "tensor", True, (-1e308, 1e308), (), None, False, None, 1)
        for name in ("x", "eps")
    ]
    points = symbol_points(inputs, {"x": x, "eps": e}, seed="symgrad:nmse")
    assert {x: 710.0, e: 0.5} in [{x: p[x], e: p[e]} for p in points]
    reference = sympy.diff(
        ((1 + 1 / e) * sympy.exp(-(1 - e) * x) - (1 / e - 1) * sympy.exp(-(1 + e) * x)) / 2, x
    )
    product = (e - 1) * (e + 1) / e * F.expm1(2 * e * x) * sympy.exp(-(1 + e) * x) / 2
    paired = exp_product(product, frozenset(), frozenset())
    assert measure(product, reference, [{x: 710.0, e: 0.5}]).non_finite64 == 1
    assert measure(paired, reference, [{x: 710.0, e: 0.5}]).non_finite == 0
    chosen = [form for form, _ in most_accurate([reference, product, paired], points)]
    assert paired in chosen and product not in chosen


def test_a_form_whose_intermediate_overflows_inside_the_values_range_loses_at_its_edge():
    """Rump's polynomial over one denominator: (44*x**8 + 1)/x has x**8 past x = 2**128,
    where the value 44*x**7 + 1/x is finite up to 2**146. Points drawn over a benign
    range (or over the bit patterns, for a seed that misses that band) cannot tell the
    forms apart; the points just inside the value's edges (edge_points) can."""
    import sympy

    from symgrad.choose import edge_points, measure, most_accurate
    from symgrad.spec import Input

    x = sympy.Symbol("x", real=True)
    inp = Input("x", "tensor", True, (-math.inf, math.inf), (), None, False, None, 1)
    value = 44 * x**7 + 1 / x
    one_denominator = (44 * x**8 + 1) / x
    points = [{x: k / 4} for k in range(1, 41)]
    assert len(most_accurate([value, one_denominator], points)) == 2  # a tie

    edges = edge_points(value, {x: 0.5}, {x: inp})
    sizes = sorted(abs(p[x]) for p in edges)
    # inside the float64 edge at 2**145.5, and the float32 one (1e38) at 2**17.3; inside
    # the pole's edge at 2**-1024 toward 0 (1/x overflows there): each sign
    assert any(2.0**140 < s < 2.0**145.5 for s in sizes)
    assert any(2.0**12 < s < 2.0**17.3 for s in sizes)
    assert any(s < 2.0**-1000 for s in sizes)
    assert {p[x] > 0 for p in edges} == {True, False}
    assert measure(value, value, edges).non_finite == 0
    assert measure(one_denominator, value, edges).non_finite64 > 0

    def at_edges(reference):
        return edge_points(reference, {x: 0.5}, {x: inp})

    chosen = most_accurate([value, one_denominator], points, edges=at_edges)
    assert [form for form, _ in chosen] == [value]


def test_edge_points_stay_in_the_inputs_domain():
    """Along a positive input from 0.5 up, a value with no edge toward 0 gets points only
    toward infinity; an integer input's only toward infinity too."""
    import sympy

    from symgrad.choose import edge_points
    from symgrad.spec import Input

    x = sympy.Symbol("x", real=True)
    positive = Input(
        "x", "tensor", True, (0.5, math.inf), (("positive", True),), None, False, None, 1
    )
    points = edge_points(sympy.exp(x) / x, {x: 1.0}, {x: positive})
    assert points and all(0.5 <= p[x] < 710 for p in points)
    assert max(p[x] for p in points) > 300  # inside exp's edge at 709.8

    n = sympy.Symbol("n", real=True)
    integer = Input(
        "n", "tensor", True, (-math.inf, math.inf), (("integer", True),), None, False, None, 1
    )
    points = edge_points(n**3 + 1 / n, {n: 1.0}, {n: integer})
    assert points and all(abs(p[n]) >= 1 and p[n] == int(p[n]) for p in points)


def _sqrt_diff_gradients():
    """Two forms of d/dx (sqrt(x + 1) - sqrt(x)) that float64 cannot tell apart (both
    within a bit of the exact value) and float32 can: in the one sum of three products,
    x**(3/2) + sqrt(x) + x*sqrt(x + 1), x**(3/2) overflows past x = 4.9e25, where the
    value, about x**-1.5/2, is a float32 subnormal: 0 there, where the quotient of sums of
    reciprocal roots keeps it."""
    import sympy

    from symgrad.spec import Input

    x = sympy.Symbol("x", real=True)
    inp = Input(
        "x", "tensor", True, (0.0, math.inf), (("nonnegative", True),), None, False, None, 1
    )
    one_sum = -1 / (2 * (x ** sympy.Rational(3, 2) + sympy.sqrt(x) + x * sympy.sqrt(x + 1)))
    roots = -(1 / sympy.sqrt(x + 1) + 1 / sympy.sqrt(x)) / (
        2 * (sympy.sqrt(x) + sympy.sqrt(x + 1)) ** 2
    )
    return x, inp, one_sum, roots


def test_float32_points_are_float32_numbers_of_the_domain():
    import sympy

    from symgrad.choose import float32_points
    from symgrad.numerics.floats import round_to
    from symgrad.numerics.points import dtype_extremes

    x, inp, _, _ = _sqrt_diff_gradients()
    g = sympy.Symbol("grad", real=True)
    points = float32_points([inp], {"x": x}, [g], n=40)
    values = [p[x] for p in points]
    assert all(round_to(v, "float32") == v and 0 <= v <= 3.5e38 for v in values)
    assert all(p[g] == 1.0 for p in points)
    assert set(dtype_extremes(inp, "float32")) <= set(values)
    # drawn over float32's bit patterns: binades from the subnormals to the largest
    drawn = values[-40:]
    assert min(drawn) < 1e-20 and max(drawn) > 1e20


def test_forms_tied_in_float64_are_ranked_by_their_float32_error():
    from symgrad.choose import FLOAT32_MARGIN, _reference, float32_score, measure, most_accurate
    from symgrad.numerics.floats import round_to

    x, _, one_sum, roots = _sqrt_diff_gradients()
    points = [{x: v} for v in (1e-300, 1e-20, 1e-3, 0.5, 2.0, 3.0, 1e3, 1e20, 1e27, 1e300)]
    assert abs(measure(one_sum, roots, points).score - measure(roots, roots, points).score) < 0.5
    assert len(most_accurate([roots, one_sum], points)) == 2  # a tie in float64

    at = [{x: round_to(v, "float32")} for v in (1e-3, 0.5, 2.0, 1e3, 1e6, 1e26, 1e27, 1e28)]
    references = [_reference(roots, p) for p in at]
    assert float32_score(one_sum, roots, at, references) > (
        float32_score(roots, roots, at, references) + FLOAT32_MARGIN
    )
    chosen = most_accurate([roots, one_sum], points, points32=lambda reference: at)
    assert [form for form, _ in chosen] == [roots]
    # the written form first or not: the float32 error decides, not the order
    chosen = most_accurate([one_sum, roots], points, points32=lambda reference: at)
    assert [form for form, _ in chosen] == [roots]


def test_float32_edge_points_reach_the_binade_where_an_intermediate_overflows():
    """The second derivative of sqrt(x + 1) - sqrt(x) is about x**-1.5/4 near 0: a form
    with 1/(x*sqrt(x)) overflows in float32 where x < 2.05e-26 and the value is still
    below float32's largest number (3.4e38) down to x = 8.2e-27. The float32 tie-break's
    edge points have points there; the float64 choice's edge points (one binade in at
    least, below 1e38) do not."""
    import sympy

    from symgrad.choose import (
        FLOAT32_EDGE_MANTISSAS,
        FLOAT32_EDGE_STEPS,
        edge_points,
    )
    from symgrad.numerics.floats import FLOAT_MAX

    x, inp, _, _ = _sqrt_diff_gradients()
    value = (x ** sympy.Rational(-3, 2) - (x + 1) ** sympy.Rational(-3, 2)) / 4
    edges = edge_points(
        value,
        {x: 0.5},
        {x: inp},
        limits=(FLOAT_MAX["float32"],),
        steps=FLOAT32_EDGE_STEPS,
        mantissas=FLOAT32_EDGE_MANTISSAS,
    )
    band = [p[x] for p in edges if 8.2e-27 < p[x] < 2.05e-26]
    assert band
    assert not [p[x] for p in edge_points(value, {x: 0.5}, {x: inp}) if 8.2e-27 < p[x] < 2.05e-26]


def test_float32_non_finite_is_not_counted_at_a_pole_an_input_rounds_onto():
    """At x = 1e-300, log(x) is -690.8; float32 rounds x to 0, where log is -inf, exactly:
    no float32 result could be finite there. x*log(x) is 0 at float32's 0 (its limit):
    a NaN there (0 * -inf) still counts, and xlogy's 0 does not."""
    import sympy

    from symgrad.choose import measure
    from symgrad.functions import xlogy

    x = sympy.Symbol("x", real=True)
    at = [{x: 1e-300}, {x: 0.5}]
    assert measure(sympy.log(x), sympy.log(x), at).non_finite == 0
    assert measure(x * sympy.log(x), x * sympy.log(x), at).non_finite == 1
    assert measure(xlogy(x, x), x * sympy.log(x), at).non_finite == 0


def _lanczos_terms():
    """Three terms of Lanczos' gamma series (g = 7): large, of alternating signs, summing
    to a value 1000 times smaller near x = 1e3. No form keeps float32 arithmetic from
    losing those bits; float64's, rounded, keeps all."""
    import sympy

    x = sympy.Symbol("x", real=True)
    terms = (
        sympy.Float(676.5203681218851) / (x + 1)
        - sympy.Float(1259.1392167224028) / (x + 2)
        + sympy.Float(771.32342877765313) / (x + 3)
    )
    return x, terms


def test_a_form_float32_arithmetic_loses_is_computed_in_float64():
    import numpy as np

    from symgrad import functions as F
    from symgrad.choose import (
        FLOAT64_GAIN_BITS,
        float32_score,
        in_float64,
        reference_values,
        widened,
    )

    x, terms = _lanczos_terms()
    at = [{x: float(np.float32(v))} for v in np.geomspace(1, 1e3, 40)]
    exact = reference_values(terms, at, ())
    wide = widened(terms)
    assert wide == F.rounded_like(terms.xreplace({x: F.in_float64(x)}), x)
    narrow_bits = float32_score(terms, terms, at, exact)
    wide_bits = float32_score(wide, terms, at, exact)
    assert narrow_bits > 2 and wide_bits < 0.1
    assert in_float64(terms, terms, at) == wide
    # a form float32 computes as well as float64 stays as it is (no exact value asked)
    assert in_float64(2 * x + 1, 2 * x + 1, at) == 2 * x + 1
    assert narrow_bits - wide_bits >= FLOAT64_GAIN_BITS


def test_widened_leaves_python_numbers_and_upstream_free_formulas_alone():
    import sympy

    from symgrad import functions as F
    from symgrad.choose import widened

    x, g = sympy.symbols("x grad", real=True)
    p = sympy.Symbol("p", real=True)
    form = g * sympy.exp(p * x)
    wide = widened(form, frozenset({p}))
    assert wide == F.rounded_like(F.in_float64(g) * sympy.exp(p * F.in_float64(x)), g, x)
    assert widened(2 * p, frozenset({p})) == 2 * p
    # an upstream gradient set to a number (a Jacobian's coefficient): gone from ``like``
    assert wide.xreplace({g: 1}) == F.rounded_like(sympy.exp(p * F.in_float64(x)), x)
    assert F.without_float64(wide) == form


def test_a_widened_form_worse_in_float64_is_not_taken(monkeypatch):
    """The casts rebuild a formula (SymPy may order it otherwise); where the rebuilt
    formula has more non-finite float64 results at the choice's points, the form stays as
    chosen. Here in_float64 is made to offer sqrt(x**2 + 1) for hypot(x, 1): inf at x =
    1e200, where hypot is 1e200."""
    import sympy

    import symgrad.choose as C
    import symgrad.derive as D
    from symgrad import functions as F
    from symgrad.derive import _in_float64

    x = sympy.Symbol("x", real=True)
    form = F.hypot(x, 1)
    naive = F.rounded_like(sympy.sqrt(F.in_float64(x) ** 2 + 1), x)
    points32 = [{x: 0.5}, {x: 3.0}]
    points64 = [{x: v} for v in (0.5, 3.0, 1e10, 1e200)]
    monkeypatch.setattr(D, "in_float64", lambda *args: naive)
    assert _in_float64(form, form, points32, points64, (), frozenset()) == (form, None)
    wide = C.widened(form)
    monkeypatch.setattr(D, "in_float64", lambda *args: wide)
    kept, accuracy = _in_float64(form, form, points32, points64, (), frozenset())
    assert kept == wide and accuracy.points == 4 and accuracy.non_finite == 0


def test_two_forms_each_accurate_in_its_own_regime_are_split_by_an_inputs_size():
    """Herbie's regimes: log(1 + x) keeps no digit below x = 1e-16, its Taylor
    polynomial x - x**2/2 + x**3/3 none past x = 0.1; no single form of the two is
    accurate, the pair split at a power of 2 between the sample's sizes is (the choice
    takes it where that scores REGIME_GAIN_BITS better and no worse on more points)."""
    import sympy

    from symgrad import functions as F
    from symgrad.choose import (
        REGIME_GAIN_BITS,
        measure,
        reference_values,
        regime_split,
        split_form,
    )

    x = sympy.Symbol("x", real=True)
    logged, series = sympy.log(1 + x), x - x**2 / 2 + x**3 / 3
    points = [{x: 10.0**-k} for k in range(1, 30)] + [{x: 1.5 + k} for k in range(20)]
    references = reference_values(logged, points, ())
    found = regime_split(logged, [logged, series], points, references)
    assert found is not None
    low, high, v, at = found
    assert (low, high, v) == (series, logged, x)
    assert 1e-16 < at < 0.1 and math.log2(at).is_integer()
    split = measure(split_form(*found), logged, points, references)
    singles = [measure(f, logged, points, references) for f in (logged, series)]
    assert split.score <= min(s.score for s in singles) - REGIME_GAIN_BITS
    assert split.max_bits < 16 < min(s.max_bits for s in singles)
    # one form accurate everywhere: nothing to split
    exact_everywhere = F.log1p(x)
    assert regime_split(logged, [logged, series, exact_everywhere], points, references) is None
