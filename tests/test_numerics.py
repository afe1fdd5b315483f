"""The numerics layer: float bit patterns, sample points (symgrad.numerics)."""

from __future__ import annotations

import math
import random

import pytest
import sympy

from symgrad.numerics import floats, points
from symgrad.spec import Input


def _input(domain=(-math.inf, math.inf), **assumptions) -> Input:
    return Input(
        name="x",
        kind="tensor",
        differentiable=True,
        domain=domain,
        assumptions=tuple(assumptions.items()),
        default=None,
        has_default=False,
        shape=None,
        line=1,
    )


# --------------------------------------------------------------------------- bits of error
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_bits_of_error_is_zero_for_the_exact_result(dtype):
    for value in (1.0, -2.5, 0.0, 1e-30, math.inf, -math.inf):
        assert floats.bits_of_error(value, value, dtype) == 0.0
    assert floats.bits_of_error(-0.0, 0.0, dtype) == 0.0


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_bits_of_error_grows_with_ulp_distance(dtype):
    one = floats.ordinal(1.0, dtype)
    bits = [floats.bits_of_error(floats.from_ordinal(one + d, dtype), 1.0, dtype) for d in range(9)]
    assert bits[0] == 0.0
    assert bits[1] == 1.0  # log2(1 + 1)
    assert bits[3] == 2.0  # log2(1 + 3)
    assert bits == sorted(bits) and len(set(bits)) == len(bits)
    width = 64 if dtype == "float64" else 32
    assert floats.bits_of_error(math.nan, 1.0, dtype) == width
    assert 0 < floats.bits_of_error(-1.0, 1.0, dtype) < width
    # +-inf sit next to the largest finite float: an overflow by one float is 1 bit.
    assert floats.bits_of_error(math.inf, floats.FLOAT_MAX[dtype], dtype) == 1.0


def test_ordinals_order_floats_and_round_trip():
    values = [-math.inf, -1e300, -1.0, -5e-324, 0.0, 5e-324, 1e-300, 1.0, 2.0, 1e300, math.inf]
    ords = [floats.ordinal(v) for v in values]
    assert ords == sorted(ords) and len(set(ords)) == len(ords)
    assert floats.ordinal(0.0) == floats.ordinal(-0.0) == 0
    assert floats.ordinal(5e-324) == 1
    assert [floats.from_ordinal(o) for o in ords] == values
    assert floats.ulp_distance(1.0, math.nextafter(1.0, 2.0)) == 1
    tiny32 = floats.from_ordinal(1, "float32")
    assert tiny32 == pytest.approx(1.4e-45, rel=0.01, abs=0)
    assert floats.from_ordinal(
        floats.ordinal(floats.FLOAT_MAX["float32"], "float32") + 1, "float32"
    ) == (math.inf)


def test_round_to_float32():
    assert floats.round_to(0.1, "float32") == pytest.approx(0.1, rel=1e-7)
    assert floats.round_to(0.1, "float32") != 0.1
    assert floats.round_to(1e300, "float32") == math.inf
    assert floats.round_to(-1e300, "float32") == -math.inf
    assert floats.round_to(0.1, "float64") == 0.1
    with pytest.raises(ValueError, match="unknown dtype"):
        floats.round_to(1.0, "float16")


# --------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_samples_cover_the_float_range_of_the_domain(dtype):
    inp = _input()  # domain [-inf, inf]
    values = points.sample_values(inp, 400, random.Random(0), dtype)
    assert all(math.isfinite(v) and floats.round_to(v, dtype) == v for v in values)
    # Uniform over bit patterns: huge, tiny and negative values all show up.
    assert any(abs(v) > 1e30 for v in values)
    assert any(0 < abs(v) < 1e-30 for v in values)
    assert any(v < 0 for v in values) and any(v > 0 for v in values)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_samples_stay_inside_a_bounded_domain(dtype):
    values = points.sample_values(_input((0.0, 1.0), positive=True), 300, random.Random(3), dtype)
    assert all(0 < v <= 1 and floats.round_to(v, dtype) == v for v in values)


def test_extreme_points_keep_to_the_domain_and_its_assumptions():
    assert points.extreme_points(_input((0.0, 1.0))) == [0.0, 1e-08, 0.99999999, 1.0]
    assert min(points.extreme_points(_input(positive=True))) == 1e-8
    assert -1e4 in points.extreme_points(_input())


def test_range_ends_are_float32_points_where_they_fit():
    fits = [v for v in points.RANGE_ENDS if abs(v) <= floats.FLOAT_MAX["float32"]]
    assert len(fits) == 6
    assert all(floats.round_to(v, "float32") == v for v in fits if abs(v) != 1e38)


def test_the_rounding_bound_of_a_cancellation_is_the_size_of_its_terms():
    """sin(x)cos(y) - cos(x)sin(y) at x = y is 0, but each product is 0.45: a correct
    evaluation may land a few ulps of 0.45 away; a product with an exact 0 may not."""
    from symgrad.numerics.mp import rounding_bound

    x, y = sympy.symbols("x y", real=True)
    eps = 2.0**-52
    cancel = sympy.sin(x) * sympy.cos(y) - sympy.cos(x) * sympy.sin(y)
    bound = rounding_bound(cancel, {x: 1.0, y: 1.0}, eps)
    assert 0.45 * eps < bound < 8 * 0.45 * 2 * eps
    assert rounding_bound(x * sympy.sin(y), {x: 0.0, y: 1.0}, eps) == 0.0
    assert rounding_bound((x - 1) ** 3, {x: 1.0}, eps) < 1e-40  # (2 eps)**3
    assert rounding_bound(1 / (x - 1), {x: 1.0}, eps) is None  # a pole: no bound


@pytest.mark.parametrize(
    "f, expanded",
    [
        (sympy.sin, lambda a, b: sympy.sin(a) * sympy.cos(b) + sympy.cos(a) * sympy.sin(b)),
        (sympy.cos, lambda a, b: sympy.cos(a) * sympy.cos(b) - sympy.sin(a) * sympy.sin(b)),
        (
            sympy.tan,
            lambda a, b: (sympy.tan(a) + sympy.tan(b)) / (1 - sympy.tan(a) * sympy.tan(b)),
        ),
    ],
)
def test_the_exact_value_of_a_periodic_function_of_a_rounded_sum(f, expanded):
    """sin(x + e) at x = 30, e = -3.8e131: x + e needs 440 bits, so at 256 bits it is e and
    sin(x + e) is sin(e); the reduction of the rounded argument counts as cancellation, and
    the precision rises until the sum is exact. The expanded form, whose arguments are
    exact, is the check."""
    from symgrad.numerics.mp import exact

    x, e = sympy.symbols("x e", real=True)
    at = {x: 30.0, e: -3.810949309114015e131}
    want = exact(expanded(x, e), at)
    assert exact(f(x + e), at) == want
    assert want != exact(f(e), at)  # x is not lost


@pytest.mark.parametrize("at", [1e-125, -7.209390529086246e-90, 6.10139855453335e-115])
def test_nested_cancellations_add_up(at):
    """d/dx (1 - cos(x))/x**2 as differentiated, sin(x)/x**2 - 2*(1 - cos(x))/x**3, at a
    tiny x: 1 - cos(x) cancels ~2*log2(1/x) bits and the difference as many again. Counted
    as the largest of the two (once, not twice), 1024 bits looked trusted and gave -x/6;
    the value is -x/12 (the second derivative, -1/12, not 1/6)."""
    from symgrad.numerics.mp import exact

    x = sympy.Symbol("x", real=True)
    f = (1 - sympy.cos(x)) / (x * x)
    assert exact(sympy.diff(f, x), {x: at}) == pytest.approx(-at / 12, rel=1e-15, abs=0)
    assert exact(sympy.diff(f, x, 2), {x: at}) == pytest.approx(-1 / 12, rel=1e-15, abs=0)
