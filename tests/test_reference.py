"""Exact (mpmath) reference values: adaptive precision, unknown where it never settles."""

from __future__ import annotations

import math

import mpmath
import pytest
import sympy

from symgrad.numerics.mp import Unresolved, exact

x = sympy.Symbol("x", real=True)
b = sympy.Symbol("b", positive=True)


def test_total_cancellation_raises_the_precision():
    # squareplus at x = -1.05e156: x**2 + 4 rounds to x**2 at 256 and 1024 bits, so both
    # give 0; the value is 4/(4 x) ~ 9.52e-157
    squareplus = (x + sympy.sqrt(x**2 + b)) / 2
    value = exact(squareplus, {x: -1.05e156, b: 4.0})
    assert value == pytest.approx(1 / 1.05e156, rel=1e-15, abs=0)


def test_log_near_one_raises_the_precision():
    # 1 + x**2 rounds to 1 at 256 and 1024 bits: log gives 0 at both
    assert exact(sympy.log(1 + x**2) / x**2, {x: 1e-300}) == 1.0


def test_exact_zero_of_exact_terms_is_zero():
    # x + 3 at x = -3 cancels without rounding: a true zero, found at the first precisions
    assert exact(sympy.Max(x + 3, 0), {x: -3.0}) == 0.0
    assert exact((x + 3) * sympy.exp(x), {x: -3.0}) == 0.0


def test_a_value_that_never_settles_is_unknown():
    # 0 times exp(45753) ~ 2**66000: at every precision up to the bound, rounding leaves a
    # residue that the factor makes a different number (inf, then 2**-536 at 65536 bits...)
    vanishing = (sympy.sin(x) ** 2 + sympy.cos(x) ** 2 - 1) * sympy.exp(x**2)
    with pytest.raises(Unresolved):
        exact(vanishing, {x: 213.9})


def test_a_total_cancellation_that_holds_over_a_16_fold_rise_counts():
    # 1 + tanh(-1e300) is exp(-2e300): beyond any precision; 0 at each, and 0 in float64
    assert exact(1 + sympy.tanh(x), {x: -1e300}) == 0.0
    # log((1 + erf(100/sqrt(2)))/2) is -erfc(70.7)/2 ~ -1e-2174: 0 in float64
    assert exact(sympy.log((1 + sympy.erf(x / sympy.sqrt(2))) / 2), {x: 100.0}) == 0.0


def test_an_infinity_made_by_cancellation_is_not_an_exact_value():
    """-log(1 - sigmoid(z)) is log(0) = inf at every precision below 14,000 bits for
    z = 1e4, where the value is 1e4: the generated BCE tests skipped that point as an
    overflow. Only a finite value settles without being trusted."""
    import sympy

    from symgrad.numerics.mp import Unresolved, exact

    z = sympy.Symbol("z", real=True)
    bce = -sympy.log(1 - 1 / (1 + sympy.exp(-z)))
    assert exact(bce, {z: 1e4}) == 1e4
    assert exact(bce, {z: 710.0}) == 710.0
    with pytest.raises(Unresolved):  # needs more than the 65536 bits allowed
        exact(bce, {z: 1e5})
    assert exact(sympy.exp(z), {z: 1000.0}) == float("inf")  # a true overflow stays one


def test_a_pole_is_undefined_and_found_at_low_precision(monkeypatch):
    """tan(pi*l) at l = 0.5 is about 2**p at p bits (pi/2 to p bits is 2**-p from the
    pole): no precision settles it. It was unresolved after 1.7 s each (65536 bits), which
    spent the accuracy report's budget on the points that hold l at 0.5 before any other
    point (vandenbroeck_and_keller_equation_6 had no measured point)."""
    from symgrad.numerics import mp

    lam, f = sympy.symbols("l F", real=True)
    vk6 = sympy.pi * lam - sympy.tan(sympy.pi * lam) / (f * f)
    tried: list[int] = []
    at_precision = mp.at_precision

    def recorded(expr, point, prec):
        tried.append(prec)
        return at_precision(expr, point, prec)

    monkeypatch.setattr(mp, "at_precision", recorded)
    assert exact(vk6, {lam: 0.5, f: 1.0}) is None
    assert exact(sympy.diff(vk6, lam, f), {lam: 0.5, f: 3.0}) is None
    assert exact(1 / sympy.cos(sympy.pi * x), {x: -2.5}) is None
    assert max(tried) <= 16 * mp.PREC_BITS  # a 16-fold rise, not 65536 bits
    # near a pole, at a float that is not one: a (large) value
    assert exact(sympy.tan(x), {x: 1.5707963267948966}) == pytest.approx(1.633123935319537e16)
    assert exact(sympy.tan(sympy.pi * lam), {lam: 0.49}) == pytest.approx(31.820515953773956)


def test_a_negative_number_to_a_power_that_is_not_an_integer_is_undefined():
    """(-1e300)**1e-200 is 1 + 3e-200i: its imaginary part is below _real's threshold,
    but it is no real number (IEEE pow gives NaN); an integer power stays defined."""
    b, e = sympy.symbols("b e", real=True)
    assert exact(b**e, {b: -1e300, e: 1e-200}) is None
    assert exact(b**e, {b: -2.0, e: 0.5}) is None
    assert exact(b**e, {b: -2.0, e: 3.0}) == -8.0
    assert exact(b**e, {b: -1e300, e: 1e200}) == float("inf")  # an even integer


def test_a_power_with_a_huge_exponent_is_evaluated():
    """l**exp(w) at w = 1e308 (Herbie's "exp-w (used to crash)") asked mpmath to raise l
    to an integer of 1e308 bits: MemoryError. It is 0 for l < 1 and inf for l > 1; a
    negative base to a huge odd integer keeps its sign."""
    from symgrad.numerics.mp import evaluate

    w, base, c = sympy.symbols("w base c", real=True)
    formula = sympy.exp(-w) * base ** sympy.exp(w)
    assert exact(formula, {w: 1e308, base: 0.5}) == 0.0
    assert exact(formula, {w: 30.0, base: 0.5}) == 0.0  # 0.5**1e13: underflows too
    assert exact(formula, {w: 1.0, base: 0.5}) == pytest.approx(
        math.exp(-1) * 0.5**math.e, rel=1e-15
    )
    huge_odd = sympy.Integer(2**5000 + 1)
    with mpmath.workprec(5100):  # (2**5000 + 1 rounds to 2**5000 at 53 bits)
        assert evaluate(c**huge_odd, {c: mpmath.mpf(-3)}) == -mpmath.inf
        assert evaluate(c ** (huge_odd + 1), {c: mpmath.mpf(-3)}) == mpmath.inf
        assert evaluate(c**huge_odd, {c: mpmath.mpf(-0.5)}) == 0
