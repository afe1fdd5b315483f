"""Pin each printer override as a string, then check a few printed strings numerically."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy
import torch

from symgrad import functions as F
from symgrad.printers import TensorFlowPrinter, TorchPrinter, UnsupportedError
from symgrad.printers.base import FrameworkPrinter

x, y, beta = sympy.symbols("x y beta", real=True)
R = sympy.Rational

# expr -> (torch, tensorflow)
PINNED = [
    (sympy.Max(x, 0), "torch.clamp(x, min=0)", "tf.math.maximum(x, 0.0)"),  # tensor first: no int32
    (sympy.Min(x, 1), "torch.clamp(x, max=1)", "tf.math.minimum(x, 1.0)"),
    (sympy.Max(x, y), "torch.maximum(x, y)", "tf.math.maximum(x, y)"),
    (sympy.Min(x, y), "torch.minimum(x, y)", "tf.math.minimum(x, y)"),
    (
        F.softplus(x),
        "torch.nn.functional.softplus(x, threshold=40.0)",
        "tf.math.softplus(x)",
    ),
    (F.sigmoid(x), "torch.sigmoid(x)", "tf.math.sigmoid(x)"),
    (sympy.sqrt(x), "torch.sqrt(x)", "tf.math.sqrt(x)"),
    (x ** R(-1, 2), "torch.rsqrt(x)", "tf.math.rsqrt(x)"),
    (1 / x, "1 / x", "1 / x"),
    (sympy.loggamma(x), "torch.lgamma(x)", "tf.math.lgamma(x)"),
    (F.relu(x), "torch.relu(x)", "tf.nn.relu(x)"),
    (
        F.logaddexp(x, y),
        "torch.logaddexp(x, y)",
        "tf.math.maximum(x, y) + tf.math.softplus(-tf.math.abs(x - y))",
    ),
    (sympy.pi * x, "math.pi*x", "math.pi*x"),
]

TORCH_ONLY = [
    # torch.hypot takes tensors: the number becomes a tensor of the other argument's dtype
    (F.hypot(x, 1), "torch.hypot(x, x.new_full((), 1))"),
    (F.hypot(2 * x, 1), "torch.hypot(2*x, x.new_full((), 1))"),
]


@pytest.mark.parametrize(("expr", "torch_src"), TORCH_ONLY, ids=[str(p[0]) for p in TORCH_ONLY])
def test_pinned_torch(expr, torch_src):
    assert TorchPrinter().doprint(expr) == torch_src


@pytest.mark.parametrize(("expr", "torch_src", "tf_src"), PINNED, ids=[str(p[0]) for p in PINNED])
def test_pinned(expr, torch_src, tf_src):
    assert TorchPrinter().doprint(expr) == torch_src
    assert TensorFlowPrinter().doprint(expr) == tf_src


# Piecewise: torch pinned exactly; TF (whose dtype handling of branches may still change)
# pinned on its structure and checked numerically below.
BRANCHES = [
    (sympy.Piecewise((x, x > 0), (0, True)), "torch.where(x > 0, x, 0.0)", False),
    (
        sympy.Piecewise((1, x > 0), (0, True)),
        "torch.where(x > 0, 1.0, torch.full_like(x, 0))",
        True,
    ),
    (sympy.Heaviside(x, 1), "torch.where(x >= 0, 1.0, torch.full_like(x, 0))", True),
]


@pytest.mark.parametrize(
    ("expr", "torch_src", "numeric"), BRANCHES, ids=[str(b[0]) for b in BRANCHES]
)
def test_piecewise(expr, torch_src, numeric):
    assert TorchPrinter().doprint(expr) == torch_src
    tf_src = TensorFlowPrinter().doprint(expr)
    assert tf_src.startswith("tf.where(x >") and "torch" not in tf_src
    assert ("tf.fill(tf.shape(x)" in tf_src) == numeric  # numbers only: a tensor of x's dtype


def test_where_of_two_numbers_gets_a_tensor_of_the_inputs_dtype():
    """Max's derivative, ties split: where(a > b, x, where(a == b, 0.5, 0)) among tensor
    branches. where() of the two numbers would be a float32 tensor (torch.where) or no
    tensor at all (the generated module's branch-free _where, which crashed on it): the
    number tail becomes a tensor like x."""
    from symgrad.runtime.torch_helpers import _where

    expr = sympy.Piecewise(
        (x, x > 1), (1, x > 0), (sympy.Rational(1, 2), sympy.Eq(x, 0)), (0, True)
    )
    src = TorchPrinter().doprint(expr)
    assert src == (
        "torch.where(x > 1, x, torch.where(x > 0, 1.0, "
        "torch.where(x == 0, 0.5, torch.full_like(x, 0.0))))"
    )
    values = torch.tensor([-2.0, 0.0, 0.5, 3.0], dtype=torch.float64)
    for helper in ("torch.where", "_where"):
        with torch.no_grad():  # _where's own select runs where no graph is recorded
            scope = {"torch": torch, "_where": _where, "x": values}
            out = eval(src.replace("torch.where", helper), scope)
        assert out.dtype == torch.float64
        assert out.tolist() == [0.0, 0.5, 1.0, 3.0]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("expr", [b[0] for b in BRANCHES] + [sympy.Max(x, 0), F.logaddexp(x, y)])
def test_tensorflow_source_runs(expr, dtype):
    tf = pytest.importorskip("tensorflow")
    values = [-2.0, 0.0, 3.0]
    env = {
        "tf": tf,
        "math": math,
        "x": tf.constant(values, dtype),
        "y": tf.constant(values[::-1], dtype),
    }
    out = eval(TensorFlowPrinter().doprint(expr), env)
    assert out.dtype == getattr(tf, dtype) and out.shape == (3,)
    for got, a, b in zip(out.numpy(), values, values[::-1]):
        exact = float(expr.subs({x: a, y: b}).evalf(30))
        assert got == pytest.approx(exact, rel=1e-6, abs=0)


INTEGER_POWERS = [
    (x**2, "tf.math.square(x)"),
    ((x + 1) ** -2, "1 / tf.math.square(x + 1)"),
    ((x - y) ** 3, "(tf.math.square(x - y) * (x - y))"),
    (x**5, "(tf.math.square(tf.math.square(x)) * x)"),
    (x**7, "(tf.math.square(tf.math.square(x) * x) * x)"),  # no parentheses inside square()
    # a product with powers is interleaved (functions.interleaved_product): no power formed
    (2 * (x + y) ** 2 / (x - 1) ** 3, "((x + y)/(x - 1)) / (x - 1) * ((x + y)/(x - 1)) * 2"),
    (x**17, "x**17"),  # past 16: TF's pow
]


@pytest.mark.parametrize(
    ("expr", "tf_src"), INTEGER_POWERS, ids=[str(p[0]) for p in INTEGER_POWERS]
)
def test_tensorflow_integer_powers_are_squares_and_products(expr, tf_src):
    """TF's pow is libm's, 50x a multiply even for x**2: integer powers square instead."""
    tf = pytest.importorskip("tensorflow")
    assert TensorFlowPrinter().doprint(expr) == tf_src
    xs, ys = [1.7, -0.3, 2.5, -1.25], [0.4, 1.1, -2.0, 3.0]
    env = {"tf": tf, "x": tf.constant(xs, tf.float64), "y": tf.constant(ys, tf.float64)}
    got = eval(tf_src, env).numpy()
    for value, a, b in zip(got, xs, ys):
        assert value == pytest.approx(float(expr.subs({x: a, y: b})), rel=1e-15, abs=0)


def test_tensorflow_hypot_powers_stay_ratios():
    """hypot(x, y)**-3 as (1/h)**3, like torch and the accuracy choice: h**3 overflows in
    float32 from h = 7e12 where (1/h)**3 is still a float."""
    printed = TensorFlowPrinter().doprint(F.hypot(x, y) ** -3)
    assert printed.startswith("(1 / tf.where(") and printed.endswith(")**3")
    assert "tf.math.square(tf.where" not in printed


def test_max_with_zero_is_not_torch_max():
    assert "torch.max(" not in TorchPrinter().doprint(sympy.Max(x, 0))


@pytest.mark.parametrize("printer", [TorchPrinter, TensorFlowPrinter])
def test_scalar_subexpressions_use_math(printer):
    p = printer(scalars=[beta])
    assert p.doprint(sympy.exp(beta) * x + sympy.sqrt(beta)) == "math.sqrt(beta) + x*math.exp(beta)"
    assert p.uses_math
    assert p.doprint(sympy.Max(beta, 1)) == "max(1, beta)"
    assert p.doprint(x * sympy.Piecewise((beta, beta > 0), (0, True))) == (
        "x*(beta if beta > 0 else 0)"
    )


@pytest.mark.parametrize("printer", [TorchPrinter, TensorFlowPrinter])
def test_a_condition_on_scalars_only_is_a_python_choice(printer):
    """where() takes a boolean tensor: beta >= 0 on a Python float is a bool (it crashed
    the generated backward of a pseudo-Huber loss with delta: {kind: scalar})."""
    text = printer(scalars=[beta]).doprint(sympy.Piecewise((x, beta >= 0), (x**2, True)))
    assert text == "(x if beta >= 0 else x**2)" if printer is TorchPrinter else "where" not in text
    mixed = printer(scalars=[beta]).doprint(
        sympy.Piecewise((x, beta >= 0), (2 * x, x > 0), (x**2, True))
    )
    assert mixed.startswith("(x if beta >= 0 else ") and "where(x > 0" in mixed


@pytest.mark.parametrize("printer", [TorchPrinter, TensorFlowPrinter])
@pytest.mark.parametrize("expr", [sympy.besselj(0, x), sympy.zeta(x), sympy.frac(x), sympy.I * x])
def test_unsupported_raises(printer, expr):
    with pytest.raises(UnsupportedError, match="cannot print"):
        printer().doprint(expr)


@pytest.mark.parametrize("expr", [sympy.Sum(x, (y, 1, 3)), sympy.Integral(x, y)])
def test_sympy_containers_are_unsupported(expr):
    with pytest.raises(UnsupportedError):
        TorchPrinter().doprint(expr)


def test_stable_function_of_scalar_prints():
    assert "math" in TorchPrinter(scalars=[beta]).doprint(x * F.sigmoid(beta))


# ------------------------------------------------------------------ numeric checks
def evaluate(expr, printer: FrameworkPrinter, **values):
    source = printer.doprint(expr)
    namespace = {"torch": torch, "math": math}
    namespace.update(
        {k: torch.tensor(v, dtype=torch.float64) if k != "beta" else v for k, v in values.items()}
    )
    return float(eval(source, namespace))


NUMERIC = [
    (sympy.Max(x, 0), {"x": -2.5}),
    (sympy.Min(x, y), {"x": 1.5, "y": -0.5}),
    (F.softplus(x), {"x": 30.0}),
    (F.sigmoid(x), {"x": -3.0}),
    (x ** R(-1, 2), {"x": 2.0}),
    (sympy.Heaviside(x, 1), {"x": 0.0}),
    (sympy.Heaviside(x), {"x": 0.0}),
    (sympy.Piecewise((x**2, x > 1), (-x, x < -1), (0, True)), {"x": -3.0}),
    (sympy.gamma(x), {"x": -2.5}),
    (F.logaddexp(x, y), {"x": 2.0, "y": -1.0}),
    (sympy.exp(beta) * x + sympy.sqrt(beta), {"x": 0.5, "beta": 2.0}),
]


@pytest.mark.parametrize(("expr", "values"), NUMERIC, ids=[str(n[0]) for n in NUMERIC])
def test_printed_torch_matches_sympy(expr, values):
    got = evaluate(expr, TorchPrinter(scalars=[beta]), **values)
    subs = {sympy.Symbol(k, real=True): sympy.Float(v, 30) for k, v in values.items()}
    exact = float(expr.evalf(30, subs=subs))
    assert got == pytest.approx(exact, rel=1e-12, abs=1e-300)


def test_scalar_reciprocal_square_root_uses_math():
    expr = sympy.pi ** sympy.Rational(-1, 2)
    assert TorchPrinter().doprint(expr) == "1 / math.sqrt(math.pi)"


def test_constant_factors_are_folded_into_one_literal():
    x = sympy.Symbol("x", real=True)
    expr = sympy.sqrt(2) * x / sympy.sqrt(sympy.pi)
    assert TorchPrinter().doprint(expr) == "0.7978845608028654*x"


def test_an_interleaved_product_scales_by_the_upstream_gradient_last():
    """The partial products are those of the value the choice measured with grad = 1: at
    w = -710, grad / t * (w*exp(w) - x) / t overflows (1 / t = 3e305) though the product,
    -1.6e305, does not; (w*exp(w) - x) / t * (...) / t * grad stays finite."""
    w, grad = sympy.symbols("w grad", real=True)
    t = sympy.exp(w) + w * sympy.exp(w)
    expr = -grad * (w * sympy.exp(w) - x) * (-2 * sympy.exp(w) - w * sympy.exp(w)) / t**2
    src = TorchPrinter().doprint(expr)
    assert src.endswith("* grad"), src
    env = {
        "torch": torch,
        "w": torch.tensor([-710.0], dtype=torch.float64),
        "x": torch.tensor([-0.51417], dtype=torch.float64),
        "grad": torch.tensor([1.0], dtype=torch.float64),
    }
    got = eval(src, env).item()
    exact = float(expr.subs({w: -710, x: sympy.Rational(-51417, 100000), grad: 1}).evalf(30))
    assert got == pytest.approx(exact, rel=1e-12)


def test_a_small_coefficient_scales_a_power_first():
    """1e-22 * x**2 at x = 1e20 in float32: x**2 is inf, the value 1e18 (a polynomial fit's
    second derivative, Krovak's mod-dY); spread behind its coefficient it is finite. A
    coefficient near 1 keeps the power (2*x**2)."""
    expr = sympy.Float(1e-22) * x**2
    src = TorchPrinter().doprint(expr)
    assert "**" not in src, src
    env = {"torch": torch, "x": torch.tensor([1e20], dtype=torch.float32)}
    assert eval(src, env).item() == pytest.approx(1e18, rel=1e-6)
    assert "**" in TorchPrinter().doprint(2 * x**2)


def test_an_interleaved_product_spreads_its_divisions_evenly():
    """12*r**2/dt**4 at dt = 1e84, r = 3e236 is 1e138: r / dt * r (one division per
    multiply, then the rest) overflows first; spread evenly, with r over dt as one ratio,
    (r/dt) / dt * (r/dt) / dt * 12 stays near powers of r/dt**2 (the second derivative of
    Herbie's Kalman filter per K). The NumPy model of the accuracy choice prints it the
    same."""
    from symgrad.numerics.native import evaluator

    r, dt = sympy.symbols("r dt", positive=True)
    expr = 12 * r**2 / dt**4
    src = TorchPrinter().doprint(expr)
    assert src == "((r/dt) / dt)**2 * 12", src  # (a common power: see the next test)
    env = {"torch": torch} | {
        "r": torch.tensor([3e236], dtype=torch.float64),
        "dt": torch.tensor([1e84], dtype=torch.float64),
    }
    assert eval(src, env).item() == pytest.approx(1.08e138, rel=1e-12)
    assert evaluator(expr, [dt, r])(1e84, 3e236) == pytest.approx(1.08e138, rel=1e-12)


def test_powers_with_a_common_exponent_are_a_power_of_their_product():
    """-(a*a*b*b) (Herbie's ab-angle, ABCF D) at a = -2.7e32, b = 2.3e-18 in float32 is
    -3.9e29: spread as a * b * a * b, the partial product a*b*a is 1.7e47, inf in
    float32; (a*b)**2 has no partial product beyond the value's size. Both frameworks
    and the NumPy model of the accuracy choice write it so (TF by squaring: its pow is
    libm's); a lone base is spread as before, and upstream gradients scale last."""
    from symgrad.numerics.native import call, evaluator

    a, b, grad = sympy.symbols("a b grad", real=True)
    expr = -(a**2) * b**2
    assert TorchPrinter().doprint(expr) == "-(a * b)**2"
    assert TensorFlowPrinter().doprint(expr) == "-tf.math.square(a * b)"
    assert TorchPrinter().doprint(a**2 * b**4) == "(b * a * b)**2"
    assert TorchPrinter().doprint(grad * a**2 * b**2) == "(a * b)**2 * grad"
    assert TensorFlowPrinter().doprint(7 * a**3 * b**3) == "(tf.math.square(a * b) * (a * b)) * 7"
    assert TorchPrinter().doprint(a**2 * b) == "a * b * a"  # no common power
    point = [-2.7078403672844e32, 2.308982242508324e-18]
    exact = -float((sympy.Float(point[0], 30) * sympy.Float(point[1], 30)) ** 2)
    env = {"torch": torch, "a": torch.tensor([point[0]]), "b": torch.tensor([point[1]])}
    assert eval(TorchPrinter().doprint(expr), env).item() == pytest.approx(exact, rel=1e-6)
    with np.errstate(all="ignore"):
        got = call(evaluator(expr, [a, b]), point, np.float32)
    assert got == pytest.approx(exact, rel=1e-6)
    tf = pytest.importorskip("tensorflow")
    env = {"tf": tf, "a": tf.constant([point[0]]), "b": tf.constant([point[1]])}
    got = eval(TensorFlowPrinter().doprint(expr), env).numpy()[0]
    assert got == pytest.approx(exact, rel=1e-6)


def test_a_power_over_a_power_is_a_power_of_their_ratio():
    """m**2*(m - 1)/v**2 (the gradient in v of Herbie's a parameter of renormalized beta
    distribution) at m = 5.4e-233, v = 1.8e-114 is -8.8e-238: any order of the five factors
    has a partial product m**2/v or m/v**2, 0 or inf there (m / v * (m - 1) * m / v is
    -0.0), but the ratio m/v is 3e-119, and its square the value's size. The NumPy model
    of the accuracy choice prints it the same; a remainder stays its base's power."""
    from symgrad.numerics.native import evaluator

    m, v = sympy.symbols("m v", positive=True)
    expr = m**2 * (m - 1) / v**2
    src = TorchPrinter().doprint(expr)
    assert src == "(m/v) * (m - 1) * (m/v)", src
    point = {"m": 5.397074695080604e-233, "v": 1.8200745160509382e-114}
    exact = float(expr.subs({m: point["m"], v: point["v"]}).evalf(30))
    env = {"torch": torch} | {
        k: torch.tensor([val], dtype=torch.float64) for k, val in point.items()
    }
    assert eval(src, env).item() == pytest.approx(exact, rel=1e-14, abs=0)
    assert evaluator(expr, [m, v])(point["m"], point["v"]) == pytest.approx(exact, rel=1e-14, abs=0)
    assert TorchPrinter().doprint(m**3 / v**2) == "(m/v) * m * (m/v)"


def test_an_interleaved_products_coefficient_above_1_scales_last():
    """8*Ci*t**2 at t = 1e38, Ci = 0 in float32 is 0: 8 * t overflows first (inf * 0 is
    NaN), t * Ci * t * 8 does not (the gradient of Herbie's d2PSI-dDelta2-over-PSI in
    Ci). A coefficient below 1 scales first (1e-22 * x * x: x * x overflows first)."""

    from symgrad.numerics.native import call, evaluator

    t, ci, x = sympy.symbols("t Ci x", real=True)
    assert TorchPrinter().doprint(8 * ci * t**2) == "t * Ci * t * 8"
    assert TorchPrinter().doprint(-8 * ci * t**2) == "-t * Ci * t * 8"
    assert TorchPrinter().doprint(sympy.Float(1e-22) * x**2) == "1e-22 * x * x"
    env = {"torch": torch, "t": torch.tensor([1e38]), "Ci": torch.tensor([0.0])}
    assert eval(TorchPrinter().doprint(8 * ci * t**2), env).item() == 0.0
    with np.errstate(all="ignore"):
        assert call(evaluator(8 * ci * t**2, [ci, t]), [0.0, 1e38], np.float32) == 0.0


def test_a_plain_products_coefficient_above_1_scales_last():
    """2*x*y*exp(y**2) (the gradient of x*exp(y*y) in y, Data.Number.Erf's erfcx) and
    -2*a*e (of a*(1 - e*e) in e) at x = a = 1e308, y = e = 0.5: 2 * x overflows first,
    though the values are 1.3e308 and -1e308. Scaled last, before the upstream gradient
    (its sign with it), neither does, in the code and in its NumPy model."""
    from symgrad.numerics.native import call, evaluator

    a, e, y, grad = sympy.symbols("a e y grad", real=True)
    for expr, point in (
        (2 * x * y * sympy.exp(y**2), {x: 1e308, y: 0.5}),
        (-2 * a * e, {a: 1e308, e: 0.5}),
        (-2 * a * e * grad, {a: 1e308, e: 0.5, grad: 1.0}),
    ):
        src = TorchPrinter().doprint(expr)
        exact = float(expr.subs(point))
        env = {"torch": torch} | {
            str(k): torch.tensor([v], dtype=torch.float64) for k, v in point.items()
        }
        assert eval(src, env).item() == pytest.approx(exact, rel=1e-15), src
        symbols = sorted(point, key=str)
        model = call(evaluator(expr, symbols), [point[s] for s in symbols], np.float64)
        assert model == pytest.approx(exact, rel=1e-15), expr
    assert TorchPrinter().doprint(-2 * a * e * grad) == "a * e * (-2) * grad"


def test_a_quotient_divides_the_factor_that_shares_its_inputs_first():
    """x0*x1/(1 - x1) at x0 = x1 = 1e200: x0*x1 is inf though the value is -1e200;
    x1/(1 - x1) is -1 first. The NumPy model of the accuracy choice prints it the same."""
    from symgrad.numerics.native import evaluator

    x0, x1, grad = sympy.symbols("x0 x1 grad", real=True)
    expr = grad * x0 * x1 / (1 - x1)
    src = TorchPrinter().doprint(expr)
    assert src == "x1 / (1 - x1) * x0 * grad", src
    env = {name: torch.tensor([1e200], dtype=torch.float64) for name in ("x0", "x1")}
    env |= {"torch": torch, "grad": torch.tensor([1.0], dtype=torch.float64)}
    assert eval(src, env).item() == pytest.approx(-1e200, rel=1e-15)
    assert evaluator(expr, [grad, x0, x1])(1.0, 1e200, 1e200) == pytest.approx(-1e200, rel=1e-15)
    # no quotient, or one factor over it: SymPy's order
    assert TorchPrinter().doprint(x0 * x1) == "x0*x1"
    assert TorchPrinter().doprint(x0 / (1 - x1)) == "x0/(1 - x1)"


def test_bases_with_a_common_power_over_one_factor_are_one_base():
    """NMSE section 6.1's B, d/da: pi/2 * f / (a*b*t)**2 (t = a/b + 1, f = 2*a/b + 1)
    spread as ``/ a / b / t * f / a / b / t`` is inf at a = -5.2e-204, b = -2.6e75 (after
    ``/ a / b`` the partial product is 7.5e127, and 1/a is 2e203), where the value is
    -8.8e255; as ``/ (a*b*t) * f / (a*b*t)`` each partial product lies between pi/2 and the
    value. The code (pi/2 a scalar temporary) and the NumPy model (a number) alike. Over
    two factors, the bases stay apart: m * n / (a*b)**2 with a*b past float64's largest is
    a value the spread order reaches."""
    from symgrad.numerics.native import evaluator

    a, b, t3 = sympy.symbols("a b t3", real=True)
    t, f = a / b + 1, 2 * a / b + 1
    printer = TorchPrinter()
    printer.scalars = frozenset({t3})
    t10, t6 = sympy.symbols("t10 t6", real=True)
    src = printer.doprint(-t3 * (2 * t6 + 1) / (a**2 * b**2 * t10**2))
    assert src == "-t3 / (a*b*t10) * (2*t6 + 1) / (a*b*t10)", src
    at = {"a": -5.207323221652861e-204, "b": -2.568336665115557e75}
    env = {n: torch.tensor([v], dtype=torch.float64) for n, v in at.items()}
    env |= {"t6": env["a"] / env["b"], "t3": math.pi / 2}
    env["t10"] = env["t6"] + 1
    value = -8.781867954940424e255
    assert eval(src, {"torch": torch, **env}).item() == pytest.approx(value, rel=1e-14)
    model = evaluator(-sympy.pi / 2 * f / (a**2 * b**2 * t**2), [a, b])
    assert model(at["a"], at["b"]) == pytest.approx(value, rel=1e-14)
    m, n = sympy.symbols("m n", real=True)
    assert TorchPrinter().doprint(m * n / (a**2 * b**2)) == "m / a / b * n / a / b"


def test_one_factor_over_two_tensors_is_divided_by_each_in_turn():
    """x0/(x1*(x1 - 1)) at x0 = x1 = 1e200: x1*(x1 - 1) is inf though the value is 1e-200.
    An upstream gradient keeps SymPy's order (divided by each in turn it would be
    1/x1/(x1 - 1)*grad, one operation more), and a Python-number divisor stays one."""
    from symgrad.numerics.native import evaluator

    x0, x1, grad = sympy.symbols("x0 x1 grad", real=True)
    expr = x0 / (x1 * (x1 - 1))
    src = TorchPrinter().doprint(expr)
    assert src == "x0 / x1 / (x1 - 1)", src
    env = {"torch": torch} | {n: torch.tensor([1e200], dtype=torch.float64) for n in ("x0", "x1")}
    assert eval(src, env).item() == pytest.approx(1e-200, rel=1e-15, abs=0)
    assert evaluator(expr, [x0, x1])(1e200, 1e200) == pytest.approx(1e-200, rel=1e-15, abs=0)
    assert TorchPrinter().doprint(grad / (x1 * (x1 - 1))) == "grad/(x1*(x1 - 1))"
    n = sympy.Symbol("n", positive=True)
    printer = TorchPrinter()
    printer.scalars = frozenset({n})
    assert printer.doprint(x0 / (n * x1)) == "x0/(n*x1)"


@pytest.mark.parametrize("printer", [TorchPrinter, TensorFlowPrinter])
def test_a_power_whose_exponent_no_float_holds_is_the_root_helper(printer):
    """x**(1/3) as pow(x, 0.333...) is 114 ulps off at x = 1e296: the module helper
    instead (functions.root_exponent), also in a product and in the NumPy model of the
    accuracy choice; dyadic exponents, numbers, scalars and the naive formula as written."""
    from symgrad.numerics.native import evaluator

    n = sympy.Symbol("n", real=True)
    assert printer().doprint(x ** R(1, 3)) == "_root_power(x, 1, 3)"
    assert printer().doprint((x + 1) ** R(-2, 3)) == "_root_power(x + 1, -2, 3)"
    assert printer().doprint(y * x ** R(7, 10)) == "_root_power(x, 7, 10)*y"
    assert "_root_power" not in printer().doprint(x ** R(3, 4) + x ** R(5, 2))
    assert "_root_power" not in printer().doprint(x ** R(1, 17) + x ** R(25, 3))  # too large
    assert "_root_power" not in printer(scalars={n}).doprint(n ** R(1, 3))
    assert printer(as_written=True).doprint(x ** R(1, 3)) == "x**(0.3333333333333333)"
    big = 1e296
    assert evaluator(x ** R(1, 3), [x])(big) == 4.641588833612779e98  # x**(1/3) rounded
    assert big ** (1 / 3) != 4.641588833612779e98


@pytest.mark.parametrize("printer", [TorchPrinter, TensorFlowPrinter])
def test_an_exponent_that_is_a_division_is_parenthesised(printer):
    """1/n is a power to SymPy and a division in print: x**(1/n) must not read x**1 / n."""
    n = sympy.Symbol("n", real=True)
    for expr in (x ** (1 / n), (x + 1) ** (1 / n), x ** (1 / (n + 1)), x ** (n**-2)):
        for scalars in (set(), {n}):
            src = printer(scalars=scalars).doprint(expr)
            value = float(expr.subs({x: 2.5, n: 3.0}))
            env = {"x": 2.5, "n": 3.0, "math": math, "torch": torch}
            if printer is TensorFlowPrinter:
                tf = pytest.importorskip("tensorflow")
                env = {
                    "x": tf.constant(2.5, tf.float64),
                    "n": tf.constant(3.0, tf.float64),
                    "tf": tf,
                    "math": math,
                }
                if scalars:
                    env["n"] = 3.0
            else:
                env["x"] = torch.tensor(2.5, dtype=torch.float64)
                if not scalars:
                    env["n"] = torch.tensor(3.0, dtype=torch.float64)
            assert float(eval(src, env)) == pytest.approx(value, rel=1e-12), src


@pytest.mark.parametrize("printer", [TorchPrinter, TensorFlowPrinter])
def test_a_literal_coefficient_scales_first(printer):
    """3e-30*x*y at x = y = 1e20 is 3e10 in float32, but scaling last, 3e-30*(x*y),
    overflows in x*y: the accuracy choice measured the literal first."""
    y = sympy.Symbol("y", real=True)
    for expr in (
        sympy.Rational(3, 10**30) * x * y,
        sympy.sqrt(2) * sympy.Rational(3, 10**30) * x * y,
    ):
        src = printer().doprint(expr)
        if printer is TensorFlowPrinter:
            tf = pytest.importorskip("tensorflow")
            big = tf.constant([1e20], tf.float32)
            got = float(eval(src, {"x": big, "y": big, "tf": tf, "math": math}).numpy()[0])
        else:
            big = torch.tensor([1e20], dtype=torch.float32)
            got = eval(src, {"x": big, "y": big, "torch": torch, "math": math}).item()
        assert got == pytest.approx(float(expr.subs({x: 1e20, y: 1e20})), rel=1e-6), src


def test_paired_product_divides_after_the_factor_that_grows_alike():
    """im/(sqrt(re + h)*h) with h = hypot(im, re): im / h first (degree 0), then the root;
    1/sqrt(re + h)/h is inf at re = 9e-279, im = 1.6e-234. Where h and re + h are shared
    temporaries, their values say what they share and how they grow (functions.Temporaries)."""
    from symgrad.functions import Temporaries, hypot, paired_product, scaling_degree

    re, im, t0, t1 = sympy.symbols("re im t0 t1")
    h = hypot(im, re)
    assert scaling_degree(h) == 1 and scaling_degree(1 / sympy.sqrt(re + h)) == -sympy.S.Half
    assert scaling_degree(re + 1) is None
    _, steps = paired_product(im / (sympy.sqrt(re + h) * h))
    assert steps[:2] == [("*", im), ("/", h)]
    temporaries = Temporaries()
    temporaries.record(t0, h)
    temporaries.record(t1, re + t0)  # a temporary's value holds the ones before it
    assert temporaries.inputs(t1) == {re, im} and temporaries.degree(t1) == 1
    assert temporaries.degree(1 / sympy.sqrt(t1)) == -sympy.S.Half
    assert temporaries.degree(t1 + 1) is None
    _, steps = paired_product(im / (sympy.sqrt(t1) * t0), temporaries=temporaries)
    assert steps[:2] == [("*", im), ("/", t0)]
    _, steps = paired_product(im / (sympy.sqrt(t1) * t0))  # without: nothing is known
    assert steps[:2] != [("*", im), ("/", t0)]
