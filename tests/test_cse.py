"""Shared subexpressions as the generated code and its NumPy model compute them
(symgrad.cse): a power or product that a printer spreads out is not shared alone."""

from __future__ import annotations

import numpy as np
import pytest
import sympy
import torch

from symgrad.cse import common_subexpressions
from symgrad.numerics.native import call, evaluator
from symgrad.plan import emit
from symgrad.printers import TorchPrinter

a, b, g, s, x = sympy.symbols("a b g s x", real=True)


def _temps():
    return sympy.numbered_symbols("t", real=True)


def test_a_shared_power_stays_in_each_product_that_spreads_it():
    exprs = [a * s**-2 * (s + 1), b * s**-2 * (s - 1)]
    replacements, reduced = common_subexpressions(exprs, _temps())
    assert all(not isinstance(v, sympy.Pow) for _, v in replacements), replacements
    assert all(e.has(s**-2) for e in reduced)


def test_a_shifted_exponential_is_not_shared_with_its_scale():
    """exp_bounded_product's e**64 * exp(x - 64), shared by two products, would be exp(x)
    again (inf at x = 710): each product keeps the scale, multiplied after its bounded
    factor (the complex exp's second derivative)."""
    scale = sympy.Float(6.235149080811617e27)
    exprs = [scale * sympy.exp(x - 64) * sympy.sin(a), scale * sympy.exp(x - 64) * sympy.cos(a)]
    replacements, reduced = common_subexpressions(exprs, _temps())
    assert not any(v.has(scale) for _, v in replacements), replacements
    assert all(e.has(scale) for e in reduced)


def test_a_shared_half_integer_power_stays_in_each_product():
    """s**-1.5 is 1/s/sqrt(s) in each product, sqrt(s) a temporary: shared alone, s**-1.5
    overflows (s = 3e-228) where the products do not (b = 1e-200: 1.9e141)."""
    exprs = [a * s ** sympy.Rational(-3, 2) * b**3, b * s ** sympy.Rational(-3, 2)]
    replacements, reduced = common_subexpressions(exprs, _temps())
    assert [v for _, v in replacements] == [sympy.sqrt(s)], replacements
    root = replacements[0][0]
    assert all(e.has(s**-1) and e.has(root**-1) for e in reduced), reduced
    tape = emit([("p", exprs[0]), ("q", exprs[1])], TorchPrinter())
    code = "\n".join(tape.lines())
    assert code.count("sqrt") == 1 and "**" not in code, code
    point = {a: 1e-200, b: 1e-200, s: 3e-228}
    env = {"torch": torch} | {
        str(k): torch.tensor([v], dtype=torch.float64) for k, v in point.items()
    }
    exec(code, env)
    for name, expr in zip("pq", exprs):
        exact = float(sympy.N(expr.subs({k: sympy.Float(v, 30) for k, v in point.items()}), 20))
        assert env[name].item() == pytest.approx(exact, rel=1e-14, abs=0)
        model = call(evaluator(expr, [a, b, s]), list(point.values()), np.float64)
        assert model == pytest.approx(exact, rel=1e-14, abs=0)


def test_a_half_integer_power_takes_the_square_root_the_code_has():
    """x**1.5 + sqrt(x): one square root, x**1.5 = x * sqrt(x) (a compound base is named
    first: (x + 1)**2.5 is t0**2 * sqrt(t0))."""
    exprs = [x ** sympy.Rational(3, 2) + sympy.sqrt(x), (x + 1) ** sympy.Rational(5, 2) / g]
    replacements, reduced = common_subexpressions(exprs, _temps())
    values = [v for _, v in replacements]
    assert values.count(sympy.sqrt(x)) == 1 and x + 1 in values, replacements
    assert not any(
        p.is_Pow and p.exp.q == 2 and abs(p.exp) > 1
        for e in values + reduced
        for p in sympy.preorder_traversal(e)
        if isinstance(p, sympy.Pow) and p.exp.is_Rational
    ), (replacements, reduced)
    for expr in exprs:
        fn = evaluator(expr, [g, x])
        exact = float(expr.subs({g: 3, x: sympy.Rational(7, 4)}))
        assert call(fn, [3.0, 1.75], np.float64) == pytest.approx(exact, rel=1e-15, abs=0)


def test_a_shared_spread_product_stays_in_each_product():
    exprs = [a * g * s**-2 * (s + 1), b * g * s**-2 * (s - 1)]
    replacements, _ = common_subexpressions(exprs, _temps())
    assert all(not v.has(s**-2) for _, v in replacements), replacements


def test_a_number_over_a_shared_power_stays_in_each_product():
    """8 / t**3 shared by two products (Kalman's gain, d2/ddt2, with t = N + 2r): as a
    temporary it is 0 at t = 1e113, where r * 8 / t**3 * (20*r + ...) is finite."""
    t = sympy.Symbol("t", real=True)
    exprs = [8 * a * t**-3 * (s + 1), 8 * b * t**-3 * (s - 1)]
    replacements, reduced = common_subexpressions(exprs, _temps())
    assert all(not v.has(t**-3) for _, v in replacements), replacements
    assert all(e.has(t**-3) for e in reduced)
    at = [1e113, 1e113, 1e113, 1e113]  # a, b, s, t
    exact = float(exprs[0].subs({a: 1e113, s: 1e113, t: 1e113}))
    assert call(evaluator(exprs[0], [a, b, s, t]), at, np.float64) == pytest.approx(
        exact, rel=1e-15, abs=0
    )


def test_a_number_times_a_shared_power_stays_in_each_product():
    """4*y**3 shared by -4*y**3/t**3 and -4*y**3/(v*x)**3 (the two branches of a
    second derivative of x - y/(1 + x*y/2), t = x*y + 2): as a temporary it is inf at y
    = 1e250, where each product is (y/t)**3 * -4, about -4/x**3."""
    t, v, y = sympy.symbols("t v y", real=True)
    exprs = [-4 * y**3 * t**-3, -4 * y**3 * (v * x) ** -3]
    replacements, _ = common_subexpressions(exprs, _temps())
    assert all(not value.has(y**3) for _, value in replacements), replacements
    point = {t: 2e252, v: 1e250, x: 100.0, y: 1e250}
    code, results = _run_torch(exprs, point, torch.float64)
    for expr, result in zip(exprs, results, strict=True):
        assert result == pytest.approx(float(expr.subs(point)), rel=1e-14), code


def test_a_number_times_a_shared_spread_temporary_goes_back_too():
    """The second derivatives of x*y/((x + y)**2*(x + y + 1)) (math-functions'
    incompleteBetaApprox, draw 2's tuning half) share t = (x + y)**-3, and 4*t: at x =
    4.3e-131, y = 1.9e-255 t is inf (NaN in d2/dx2, whose value is 4.9e136). Each
    product that spreads 4*t takes it back, and t is not computed."""
    y = sympy.Symbol("y", real=True)
    u, v = x + y, x + y + 1
    exprs = [  # as symgrad derives them (grad_x's gradients in x, y and grad = g)
        g
        * (
            2 * x * y / (u**2 * v**3)
            + 4 * x * y / (u**3 * v**2)
            + 6 * x * y / (u**4 * v)
            - 2 * y / (u**2 * v**2)
            - 4 * y / (u**3 * v)
        ),
        g
        * (
            2 * x * y / v**2
            + 4 * x * y / (u * v)
            + 6 * x * y / u**2
            - x / v
            - 2 * x / u
            - y / v
            - 2 * y / u
            + 1
        )
        / (u**2 * v),
        -x * y / (u**2 * v**2) - 2 * x * y / (u**3 * v) + y / (u**2 * v),
    ]
    replacements, _ = common_subexpressions(exprs, _temps())
    assert not any(isinstance(value, sympy.Pow) and value.exp <= -2 for _, value in replacements), (
        replacements
    )
    point = {x: 4.2576517326330346e-131, y: 1.9076271210123947e-255, g: 1.0}
    code, results = _run_torch(exprs[:2], point, torch.float64)
    for expr, result in zip(exprs, results, strict=False):
        exact = float(sympy.N(expr.subs(point), 30))
        assert result == pytest.approx(exact, rel=1e-13), code


def test_a_power_read_by_a_sum_stays_shared_there():
    exprs = [a * s**-2 * (s + 1), s**-2 + b]
    replacements, reduced = common_subexpressions(exprs, _temps())
    temp = next(t for t, v in replacements if v == s**-2)
    assert reduced[1].has(temp) and not reduced[0].has(temp)


def test_the_code_and_its_model_keep_a_shared_power_from_underflowing():
    """a / s / s at s = 2.8e25, a = 1e37 is 1.3e-14 in float32; s**-2 alone is 0."""
    exprs = [a * s**-2 * (s + 1), b * s**-2 * (s - 1)]
    tape = emit([("p", exprs[0]), ("q", exprs[1])], TorchPrinter())
    env = {"torch": torch}
    env |= {
        n: torch.tensor([v], dtype=torch.float32)
        for n, v in (("a", 1e37), ("b", 1e37), ("s", 2.8e25))
    }
    exec("\n".join(tape.lines()), env)
    for name, expr in zip("pq", exprs):
        exact = float(expr.subs({a: 1e37, b: 1e37, s: 2.8e25}))
        assert env[name].item() == pytest.approx(exact, rel=1e-5)
        model = call(evaluator(expr, [a, b, s]), [1e37, 1e37, 2.8e25], np.float32)
        assert model == pytest.approx(exact, rel=1e-5)


def test_a_shared_product_of_factors_goes_back_into_the_products_that_spread():
    """The second order of x/(x**2 + 1): (x - 1)*(x + 1) is shared by both gradients, and
    computed whole it is inf for |x| > 1.3e154 in float64, where t*x/t0/t0/t0 is 0 and
    inf * 0 is NaN; put back, the products divide between its factors. Where no product
    spreads a product of factors (a sum reads it), it stays shared as CSE wrote it."""
    t0 = x**2 + 1
    exprs = [
        a * (4 * g * x * (x - 1) * (x + 1) / t0**3 - 2 * g * x / t0**2),
        -a * (x - 1) * (x + 1) / t0**2,
    ]
    replacements, _ = common_subexpressions(exprs, _temps())
    assert (x - 1) * (x + 1) not in [v for _, v in replacements], replacements
    assert g * x not in [v for _, v in replacements], replacements
    tape = emit([("p", exprs[0]), ("q", exprs[1])], TorchPrinter())
    cases = (
        (torch.float64, [2.5e291, -9.5e201, 1e160, 3.0], 1e-300),
        (torch.float32, [1e20], 1e-37),
    )
    for dtype, at, tiny in cases:
        env = {"torch": torch, "x": torch.tensor(at, dtype=dtype)}
        env["a"] = env["g"] = torch.ones_like(env["x"])
        exec("\n".join(tape.lines()), env)
        for name, expr in zip("pq", exprs):
            exact = [float(expr.subs({a: 1, g: 1, x: sympy.Float(v, 30)})) for v in at]
            assert env[name].tolist() == pytest.approx(exact, rel=1e-5, abs=tiny), name

    kept = [(x - 1) * (x + 1) + g, b * (x - 1) * (x + 1) / t0]
    replacements, _ = common_subexpressions(kept, _temps())
    assert (x - 1) * (x + 1) in [v for _, v in replacements], replacements


def test_the_model_computes_float32_in_float32():
    """NumPy's sqrt(2) is a float64 scalar: sqrt(2)*x*x would run in float64 and miss the
    overflow that torch's float32 has at x = 2e19; constants are Python floats instead."""
    f = evaluator(sympy.sqrt(2) * sympy.log(3) * x * x, [x])
    assert isinstance(f(np.float32(2.0)), np.float32)
    assert call(f, [2e19], np.float32) == np.inf
    assert np.isfinite(call(f, [2e19], np.float64))


def test_a_product_of_a_spread_product_is_spread_too_and_keeps_its_pieces_shared():
    """t0 = tanh(u)/s**2, t1 = g*t0: t1 goes back into its products as well, and tanh(u)
    stays one temporary rather than one call per product."""
    t = sympy.tanh(x / s / 2)
    exprs = [g * t / s**2 * sympy.exp(x) + g * t / s**2 * sympy.cos(x), -t / s**2 * sympy.sin(x)]
    replacements, reduced = common_subexpressions(exprs, _temps())
    assert [v for _, v in replacements] == [t]
    assert all(e.has(s**-2) for e in reduced)  # each product divides by s twice itself
    assert not any(v.has(s**-2) for _, v in replacements)


def test_a_primitive_written_out_stays_one_factor_of_its_product():
    """dsigmoid(u) is exp(-|u|)/(1 + exp(-|u|))**2 in the code; merged into
    dsigmoid(u) * grad * x * tanh(u) / (s**2 * |x|) it made a product of too many factors
    to spread, whose s**2 underflows at s = 2e-173: 0 * inf, NaN, where the value is 0."""
    from symgrad import functions as F

    u = sympy.Abs(x) / s
    expr = -g * x * sympy.tanh(u / 2) * F.dsigmoid(u) / (s**2 * sympy.Abs(x))
    tape = emit([("out", expr)], TorchPrinter())
    code = "\n".join(tape.lines())
    assert "s**2" not in code, code
    env = {"torch": torch} | {
        n: torch.tensor([v], dtype=torch.float64)
        for n, v in (("x", 1.647e55), ("s", 2.142e-173), ("g", 1.0))
    }
    exec(code, env)
    assert env["out"].item() == 0.0


def test_the_reciprocal_of_an_input_is_not_shared():
    """t = 1/k is inf for a subnormal k, where y/k is 0 at y = 0 (and x/k*2 finite)."""
    k, y = sympy.symbols("k y", real=True)
    exprs = [y / k + sympy.exp(y / k), x / k * sympy.sin(y / k)]
    replacements, _ = common_subexpressions(exprs, _temps())
    assert all(v != 1 / k for _, v in replacements), replacements
    fn = evaluator(exprs[0], [k, y])
    assert call(fn, [5e-324, 0.0], np.float64) == 1.0


def test_a_temporary_known_to_be_nonpositive_says_so():
    """exp(-|y/k|) is bounded by 1: the printers put it first in a product, where -2*y/k
    is inf at y = 1e300, k = 1e-10 and the exponential is 0 (the coefficient, above 1,
    scales last)."""
    k = sympy.Symbol("k", real=True, nonnegative=True)
    y = sympy.Symbol("y", real=True)
    expr = (
        -2 * g * y * sympy.exp(-sympy.Abs(y) / k) / (k**2 * (1 + sympy.exp(-2 * sympy.Abs(y) / k)))
    )
    replacements, reduced = common_subexpressions([expr], _temps())
    temp, value = replacements[0]
    assert value == sympy.Abs(y) / k and temp.is_nonnegative
    src = TorchPrinter().doprint(reduced[0])
    assert src.startswith("-torch.exp(-t0)") and src.endswith(" * 2"), src
    fn = evaluator(expr, [g, k, y])
    assert call(fn, [1.0, 1e-10, 1e300], np.float64) == 0.0


def test_a_product_of_two_spread_temporaries_is_spread_whole():
    """pj_tsfn's second derivative in phi has -2 * t69 * t72, t69 = c*w/(d**4*v**2) (shared
    with another product) and t72 = e**3*(1 - s)*k: thirteen factors in all. Computed
    apart, e**3 overflows and 1/d**4 underflows at e = -7.4e187, d = e*s: inf * 0, NaN,
    where the value (e/d)**3 * ... / d is finite."""
    c, d, e, k, q, v, w = sympy.symbols("c d e k q v w", real=True)
    shared = c * w / (d**4 * v**2)
    exprs = [-2 * e**3 * (1 - s) * k * shared, e**3 * q * k**3 * shared]
    tape = emit([("p", exprs[0]), ("r", exprs[1])], TorchPrinter())
    point = {c: 0.4, d: 7.4e187, e: -7.4e187, k: -0.08, q: 3.0, s: 0.3, v: 1.5, w: 0.7}
    env = {"torch": torch} | {
        str(n): torch.tensor([val], dtype=torch.float64) for n, val in point.items()
    }
    exec("\n".join(tape.lines()), env)
    for name, expr in zip("pr", exprs):
        exact = float(expr.subs({n: sympy.Float(val, 30) for n, val in point.items()}))
        assert env[name].item() == pytest.approx(exact, rel=1e-14, abs=0), name
        model = call(evaluator(expr, list(point)), list(point.values()), np.float64)
        assert model == pytest.approx(exact, rel=1e-14, abs=0), name


def _values(replacements):
    """Each temporary's value in the inputs (the temporaries before it substituted)."""
    values: dict[sympy.Symbol, sympy.Expr] = {}
    for temp, value in replacements:
        values[temp] = value.xreplace(values)
    return values


def _run_torch(exprs, point, dtype):
    """The generated torch code of ``exprs`` (named p, q, ...) at ``point``, in ``dtype``."""
    names = "pqrs"[: len(exprs)]
    code = "\n".join(emit(list(zip(names, exprs)), TorchPrinter()).lines())
    env = {"torch": torch, "math": __import__("math")} | {
        str(k): torch.tensor([v], dtype=dtype) for k, v in point.items()
    }
    exec(code, env)
    return code, [env[n].item() for n in names]


def test_a_power_beside_an_exponential_is_halved_around_it():
    """t**(z - 1/2) * exp(-t), Lanczos' gamma (t = z + 13/2): the power alone is inf in
    float32 past z = 29.6 (36.5**29.5 = 1e46), the product is 1.7e30 at z = 30; computed
    h * exp(-t) * h with h = t**(z/2 - 1/4), it is finite in the code and in its model."""
    z = sympy.Symbol("z", positive=True)
    t = z + sympy.Rational(13, 2)
    expr = t ** (z - sympy.Rational(1, 2)) * sympy.exp(-t)
    replacements, reduced = common_subexpressions([expr], _temps())
    values = _values(replacements)
    assert t ** (z / 2 - sympy.Rational(1, 4)) in values.values(), replacements
    assert not any(
        p.exp == z - sympy.Rational(1, 2)
        for e in [*values.values(), *reduced]
        for p in e.atoms(sympy.Pow)
    ), (replacements, reduced)
    exact = float(sympy.N(expr.subs(z, 30), 30))
    code, (value,) = _run_torch([expr], {z: 30.0}, torch.float32)
    assert value == pytest.approx(exact, rel=1e-5), code
    model = call(evaluator(expr, [z]), [30.0], np.float32)
    assert model == pytest.approx(exact, rel=1e-5)
    _, (value64,) = _run_torch([expr], {z: 30.0}, torch.float64)
    assert value64 == pytest.approx(exact, rel=1e-14)


def test_a_power_of_a_base_of_either_sign_is_not_halved():
    """x**n * exp(-x) at x = -2, n = 3 is -8*e**2: x**(n/2) would be NaN there."""
    n = sympy.Symbol("n", real=True)
    expr = x**n * sympy.exp(-x)
    replacements, reduced = common_subexpressions([expr], _temps())
    values = _values(replacements)
    assert not any(v.has(x ** (n / 2)) for v in values.values())
    assert reduced[0].xreplace(values).has(x**n)
    _, (value,) = _run_torch([expr], {x: -2.0, n: 3.0}, torch.float64)
    assert value == pytest.approx(-8 * np.exp(2.0), rel=1e-15)


def test_a_power_without_an_exponential_beside_it_is_left_alone():
    z = sympy.Symbol("z", positive=True)
    expr = (z + 1) ** z * g
    replacements, reduced = common_subexpressions([expr], _temps())
    values = _values(replacements)
    assert not any(v.has((z + 1) ** (z / 2)) for v in values.values())
    assert reduced[0].xreplace(values) == expr


def test_a_power_whose_exponent_varies_comes_first_in_its_product():
    """(n - 1)*x**(1/n)/(n**2*x**2) at x = 2.8e-55, n = 8e-275: x**(1/n) is 0 and (n -
    1)/n/x is -inf, so the power goes first (0 / n / x ... stays 0), a temporary or not; in
    the code and in its model (NMSE 3.4.6's second derivative: NaN where the value is inf)."""
    n = sympy.Symbol("n", real=True)
    alone = (n - 1) * x ** (1 / n) / (n**2 * x**2)
    # the power and n - 1 shared: temporaries, ordered by name unless the power goes first
    shared = [alone, x ** (1 / n) * g / (n * x), (n - 1) * g / x]
    point = {x: 2.769141391531426e-55, n: 7.987775521783024e-275, g: 3.0}
    for exprs in ([alone], shared):
        code, values = _run_torch(exprs, point, torch.float64)
        assert values[0] == 0.0, code
    model = call(evaluator(alone, [n, x]), [point[n], point[x]], np.float64)
    assert model == 0.0


def test_a_product_shared_beside_a_varying_power_goes_back_into_its_products():
    """(1 - 1/n)/n, shared by x**(1/n - 2)*c and (x + 1)**(1/n - 2)*c (the power-difference
    form of NMSE 3.4.6's second derivative), is -inf at n = -1e-228 where both powers are
    0: shared, each product is NaN; put back, each multiplies its power first (0), in the
    code and in its model. Elsewhere the product stays shared."""
    n = sympy.Symbol("n", real=True)
    c = (1 - 1 / n) / n
    p = 1 / n - 2
    exprs = [x**p * c * sympy.exp(x / 4), (x + 1) ** p * c * g, c * g * x]
    replacements, reduced = common_subexpressions(exprs, _temps())
    values = _values(replacements)
    shared = [t for t, v in values.items() if v == c]
    assert shared, replacements  # still shared by c*g*x
    assert not any(e.has(shared[0]) for e in reduced[:2]), reduced
    assert [e.xreplace(values) for e in reduced] == exprs
    point = {x: 30.0, n: -1.0572790548467556e-228, g: 3.0}
    code, results = _run_torch(exprs[:2], point, torch.float64)
    assert results == [0.0, 0.0], code
    for expr in exprs[:2]:
        symbols = sorted(expr.free_symbols, key=lambda s: s.name)
        model = call(evaluator(expr, symbols), [point[s] for s in symbols], np.float64)
        assert model == 0.0, expr
