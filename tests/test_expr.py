"""parse_formula: the SymPy it builds and the formulas it refuses."""

from __future__ import annotations

import pytest
import sympy

from symgrad import functions as F
from symgrad.errors import Location, SpecError
from symgrad.expr import parse_formula

x, y = sympy.symbols("x y", real=True)
SYMBOLS = {"x": x, "y": y}
WHERE = Location("/specs/s.yaml", 7, "f")


def parse(text):
    return parse_formula(text, SYMBOLS, WHERE)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("log(1 + exp(x))", sympy.log(1 + sympy.exp(x))),
        ("Heaviside(x, 1)", sympy.Heaviside(x, 1)),
        ("Heaviside(x)", sympy.Heaviside(x, sympy.S.Half)),
        ("where(x > 0, x, 0)", sympy.Piecewise((x, x > 0), (0, True))),
        ("Piecewise((x, x > 0), (0, True))", sympy.Piecewise((x, x > 0), (0, True))),
        ("0.1*x", sympy.Rational(1, 10) * x),
        ("x**2 / y - pi", x**2 / y - sympy.pi),
        ("Max(x, 0) + Abs(y)", sympy.Max(x, 0) + sympy.Abs(y)),
        ("softplus(x) + sigmoid(y)", F.softplus(x) + F.sigmoid(y)),
        ("logaddexp(x, y)", F.logaddexp(x, y)),
    ],
)
def test_builds_sympy(text, expected):
    assert parse(text) == expected


def test_decimal_is_exact_rational():
    value = parse("0.1")
    assert value == sympy.Rational(1, 10) and isinstance(value, sympy.Rational)


def test_where_is_piecewise():
    assert isinstance(parse("where(x > 0, x, 0)"), sympy.Piecewise)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("x^2", r"use \*\* for powers"),
        ("0 < x < 1", r"chained comparisons are not allowed: '0 < x < 1'"),
        ("exp(x=1)", r"'exp' takes no keyword arguments"),
        ("exp(x, y)", r"'exp' takes 1 arguments, got 2"),
        ("atan2(x)", r"'atan2' takes 2 arguments, got 1"),
        ("where(x > 0, x)", r"'where' takes 3 arguments, got 2"),
        ("zz + 1", r"unknown name: 'zz'"),
        ("exp", r"function 'exp' used without arguments"),
        ("'text'", r"only numbers are allowed"),
        ("x +", r"syntax error in formula"),
        ("(x, y)", r"number-valued expression"),
        ("exp((x, y))", r"tuple is only allowed inside Piecewise"),
        ("Piecewise(x)", r"Piecewise takes \(value, condition\) pairs"),
        ("x if y else 0", r"'IfExp' is not allowed"),
        ("x % 2", r"operator 'Mod' is not allowed"),
        ("x**5000", r"exponent is too large"),
    ],
)
def test_refused(text, match):
    with pytest.raises(SpecError, match=match) as info:
        parse(text)
    assert "/specs/s.yaml:7 (function 'f')" in str(info.value)


def test_too_long_formula_refused():
    with pytest.raises(SpecError, match="longer than"):
        parse("+".join(["x"] * 3000))
