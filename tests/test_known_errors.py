"""Generated tests record the error of a form that gen warned about instead of failing
(symgrad.testgen.known_errors; the templates' ``known`` argument)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import sympy

from symgrad.cases import Case, reference
from symgrad.derive import derive_function
from symgrad.spec import load_spec
from symgrad.testgen import EXTREME_RTOL, _measured_error, _neighbours, known_errors


def test_measured_error_mirrors_the_tests_check():
    assert _measured_error(1.0 + 1e-12, 1.0, "float64", 1e-9) is None
    assert _measured_error(1.1, 1.0, "float64", 1e-9) == pytest.approx(0.1, rel=1e-9)
    assert _measured_error(math.nan, 1.0, "float64", 1e-9) == math.inf
    assert _measured_error(math.inf, 1.0, "float64", 1e-9) == math.inf
    assert _measured_error(math.inf, 1e300, "float32", 1e-3) is None  # overflows: inf is right
    assert _measured_error(3.0e38, 1e300, "float32", 1e-3) == math.inf
    assert _measured_error(0.5, None, "float64", 1e-9) is None  # undefined: nothing checked
    assert _measured_error(1e-300, 0.0, "float64", 1e-9) is None  # within the subnormal slack
    assert _measured_error(1e-10, 0.0, "float64", 1e-9) == math.inf


def test_neighbours_move_each_argument_by_one_ulp():
    import numpy as np

    points = _neighbours([1.0, 2.0], np.float64)
    assert len(points) == 9 and [1.0, 2.0] in points
    assert [float(np.nextafter(1.0, 2.0)), float(np.nextafter(2.0, 0.0))] in points


def test_a_warned_form_records_its_error_and_a_stable_form_records_none(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(
        "module: m\ntargets: [torch]\nfunctions:\n  em1:\n    inputs: {x: {}}\n"
        "    output: exp(x) - 1\n"
    )
    (fn,) = load_spec(path).functions
    derived = derive_function(fn)  # expm1(x): meets every tolerance
    cases = reference(derived).extreme32
    assert known_errors(derived, cases, "float32", EXTREME_RTOL["float32"]) is None
    # exp(x) - 1 in float32 is 0 at x = 1e-8: relative error 1 there, recorded
    x = derived.symbols["x"]
    naive = dataclasses.replace(derived, outputs=(("out", sympy.exp(x) - 1),))
    known = known_errors(naive, cases, "float32", EXTREME_RTOL["float32"])
    assert known is not None
    column = known["outputs"]["0"]
    at = [k for k, c in enumerate(cases) if 0 < abs(c.inputs["x"]) < 1e-7]
    assert at and all(column[k] is not None and column[k] >= 0.5 for k in at)
    far = [k for k, c in enumerate(cases) if 1 <= abs(c.inputs["x"]) <= 30]
    assert far and all(column[k] is None for k in far)  # accurate there: checked as usual


def test_an_exact_zero_is_held_to_the_rounding_error_of_the_formula(tmp_path):
    """x**(1/3) - 2 at x = 8 is exactly 0, but pow(8, 1/3) is 2 - 2**-52 in float64 (1/3
    is a float): no relative tolerance accepts the -2.2e-16 that the code computes there.
    The recorded entry is absolute: a bound on the rounding error of the formula there."""
    path = tmp_path / "spec.yaml"
    path.write_text(
        "module: m\ntargets: [torch]\nfunctions:\n  root:\n"
        "    inputs: {x: {domain: [0, inf]}}\n    output: x**(1/3) - 2\n"
    )
    (fn,) = load_spec(path).functions
    derived = derive_function(fn)
    zero = Case(
        inputs={"x": 8.0}, values=(0.0,), grads={"out:x": 1 / 12}, second={"out:x": -1 / 144}
    )
    away = Case(
        inputs={"x": 27.0}, values=(1.0,), grads={"out:x": 1 / 27}, second={"out:x": -2 / 2187}
    )
    known = known_errors(derived, (zero, away), "float64", EXTREME_RTOL["float64"])
    assert known is not None
    slack, elsewhere = known["outputs"]["0"]
    # 1/3's rounding through d/de 8**e = 2 log 8, pow's and the subtraction's: ~7 eps
    assert 2.0**-52 < slack < 16 * 2.0**-52
    assert elsewhere is None  # not an exact zero: the relative check as usual
    # the error at an exact zero is absolute, held to the slack
    assert _measured_error(-(2.0**-52), 0.0, "float64", 1e-6, atol=slack) is None
    assert _measured_error(1e-12, 0.0, "float64", 1e-6, atol=slack) == 1e-12
    assert _measured_error(math.nan, 0.0, "float64", 1e-6, atol=slack) == math.inf
    # a constant zero has no rounding error: no slack
    x = derived.symbols["x"]
    flat = dataclasses.replace(
        derived, outputs=(("out", sympy.S.Zero),), naive_outputs=(("out", x - x),)
    )
    assert known_errors(flat, (zero,), "float64", EXTREME_RTOL["float64"]) is None


def test_a_step_gets_no_slack_at_its_exact_zero(tmp_path):
    """relu'(0) = 0 is torch's convention: the 1 beside it is no rounding error."""
    path = tmp_path / "spec.yaml"
    path.write_text(
        "module: m\ntargets: [torch]\nfunctions:\n  r:\n    inputs: {x: {}}\n    output: relu(x)\n"
    )
    (fn,) = load_spec(path).functions
    derived = derive_function(fn)
    at_zero = Case(inputs={"x": 0.0}, values=(0.0,), grads={"out:x": 0.0}, second={"out:x": 0.0})
    assert known_errors(derived, (at_zero,), "float64", EXTREME_RTOL["float64"]) is None


def test_a_point_the_model_passed_by_luck_gets_the_rounding_bound():
    """(exp(x) - 1 - x)/x**2 at x = 1e-4 cancels 8 digits: NumPy's model is off by 1e-8,
    another libm may be off by up to the rounding bound, 2.2e-7. With a tolerance of 1e-8
    the bound is the entry; with 1e-3 nothing is fragile, nor where nothing cancels."""
    import numpy as np

    from symgrad.numerics.mp import exact
    from symgrad.numerics.native import evaluator
    from symgrad.testgen import _fragile

    x = sympy.Symbol("x", real=True)
    f = (sympy.exp(x) - 1 - x) / x**2
    fn = evaluator(f, [x])
    at = {x: 1e-4}
    ex = exact(f, at)
    bound = _fragile(f, at, "float64", 1e-8, ex, fn)
    assert bound == pytest.approx(2.22e-7, rel=0.01)
    assert abs(float(fn(np.float64(1e-4))) - ex) / ex < bound
    assert _fragile(f, at, "float64", 1e-3, ex, fn) is None
    assert _fragile(f, {x: 0.5}, "float64", 1e-8, exact(f, {x: 0.5}), fn) is None


def test_a_float32_point_gets_its_bound_where_float64_shows_the_cancellation():
    """At x = 1e-3, (exp(x) - 1 - x)/x**2 cancels 6 digits: float32 keeps one, or none.
    Whatever float32's model happened to compute, float64's error there times 2**29 says
    so, and the entry is the float32 rounding bound."""
    from symgrad.numerics.mp import exact, rounding_bound
    from symgrad.numerics.native import evaluator
    from symgrad.testgen import _fragile

    x = sympy.Symbol("x", real=True)
    f = (sympy.exp(x) - 1 - x) / x**2
    at = {x: 1e-3}
    ex = exact(f, at)
    entry = _fragile(f, at, "float32", 1e-3, ex, evaluator(f, [x]))
    assert entry == pytest.approx(rounding_bound(f, at, 2.0**-23) / ex, rel=1e-6)
    assert entry > 1e-3


def test_a_point_the_model_missed_records_at_least_the_rounding_bound(tmp_path):
    """At x = 1e-5, (exp(x) - 1 - x)/x**2 cancels 11 digits: NumPy's model misses 1e-6 by
    3e-6, but that is one order of operations' luck; the code may sum the terms in another
    (its sharing across a method's formulas reorders them), off by up to the rounding
    bound, 2.2e-5. The entry is the larger of the two."""
    import numpy as np

    from symgrad.numerics.mp import exact, rounding_bound
    from symgrad.numerics.native import evaluator
    from symgrad.testgen import _Form

    path = tmp_path / "spec.yaml"
    path.write_text(
        "module: m\ntargets: [torch]\nfunctions:\n  f:\n    inputs: {x: {}}\n    output: x\n"
    )
    (fn,) = load_spec(path).functions
    derived = derive_function(fn)
    x = derived.symbols["x"]
    f = (sympy.exp(x) - 1 - x) / x**2
    model = evaluator(f, [x])
    at = {x: 1e-5}
    ex = exact(f, at)
    measured = abs(float(model(np.float64(1e-5))) - ex) / ex
    bound = rounding_bound(f, at, 2.0**-52) / ex
    assert EXTREME_RTOL["float64"] < measured < bound / 4  # missed, by less than the bound
    case = Case(inputs={"x": 1e-5}, values=(ex,), grads={}, second={})
    form = _Form("outputs", "0", model, [x], f, f)
    known = known_errors(derived, (case,), "float64", EXTREME_RTOL["float64"], forms=[form])
    assert known is not None
    (entry,) = known["outputs"]["0"]
    assert entry == pytest.approx(bound, rel=1e-6)
