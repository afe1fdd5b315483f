"""The derive stage on its own: VJP, JVP, second order, masks, and what it hands on."""

from __future__ import annotations

import pytest
import sympy

from symgrad.derive import derive_function
from symgrad.derived import Derived
from symgrad.functions import real_diff
from symgrad.spec import load_spec

SPEC = """\
module: m
functions:
  exp:
    inputs: {x: {}}
    output: exp(x)
  sinh_cosh:
    inputs: {x: {}}
    outputs:
      s: sinh(x)
      c: cosh(x)
  ste:
    inputs: {x: {}}
    output: round(x)
    gradient:
      x: grad
  first:
    order: 1
    inputs: {x: {}, y: {differentiable: false}}
    output: x*y
"""

x, y = sympy.symbols("x y", real=True)
grad = sympy.Symbol("grad", real=True)


def _derived(tmp_path, name) -> Derived:
    path = tmp_path / "m.yaml"
    path.write_text(SPEC)
    fn = next(f for f in load_spec(path).functions if f.name == name)
    return derive_function(fn, measure=False)


def test_vjp_jvp_and_second_order_of_one_output(tmp_path):
    d = _derived(tmp_path, "exp")
    assert d.vjps == {"x": grad * sympy.exp(x)}
    assert d.jacobian == {"out": {"x": sympy.exp(x)}}
    assert d.second == {"x": {"x": grad * sympy.exp(x), "grad": sympy.exp(x)}}
    assert d.outputs_requiring_grad() == ("out",)


def test_an_unused_output_drops_out_of_the_vjp(tmp_path):
    """Autograd passes a zero gradient for an output that was not used: its term is not
    computed (0 * inf would be NaN past x = 710 where cosh overflows)."""
    d = _derived(tmp_path, "sinh_cosh")
    grad_s, grad_c = d.grads
    vjp = d.vjps["x"]
    assert isinstance(vjp, sympy.Piecewise)
    only_s = vjp.subs(grad_c, 0)
    assert sympy.simplify(only_s - grad_s * sympy.cosh(x)) == 0
    assert not only_s.has(sympy.sinh)  # the unused output's derivative is not computed


def test_a_user_gradient_is_kept_as_written(tmp_path):
    d = _derived(tmp_path, "ste")
    assert d.vjps == {"x": grad} and d.overridden == frozenset({"x"})
    assert d.jacobian["out"]["x"] == 1  # forward mode follows the user's VJP
    assert d.outputs_requiring_grad() == ("out",)


def test_first_order_only_and_a_non_differentiable_input(tmp_path):
    d = _derived(tmp_path, "first")
    assert d.diff_inputs == ("x",)
    assert d.vjps == {"x": grad * y}
    assert d.second == {} and d.second_partials == {}


def test_every_derivative_the_planner_may_need_is_derived_here(tmp_path):
    """Whichever outputs the planner saves, the second-order terms it needs are in
    ``second_partials``: no differentiation happens after derive."""
    d = _derived(tmp_path, "exp")
    out = sympy.Symbol("out", real=True)
    for expr, symbol in d.reusable_outputs():
        reading = d.vjps["x"].xreplace({expr: symbol})
        assert reading == grad * out
        assert d.second_partials[reading] == {"grad": out, "out": grad}


def test_abs_of_what_sympy_cannot_prove_real_is_differentiated():
    """``1 - y**2/x**2`` is ``zoo`` at x = 0, so SymPy will not call it real and leaves
    ``Derivative(sign(...), x)`` unevaluated in the second order; every input is real, so
    ``|u|' = sign(u)*u'`` and ``sign' = 0`` (autograd's convention)."""
    u = 1 - y**2 / x**2
    first = real_diff(sympy.sqrt(sympy.Abs(u)), x)
    second = real_diff(first, x)
    assert not first.has(sympy.Derivative) and not second.has(sympy.Derivative)
    assert sympy.diff(sympy.sqrt(sympy.Abs(u)), x, 2).has(sympy.Derivative)  # what SymPy does
    at = {x: sympy.Rational(3, 2), y: 1}  # u > 0: |u| = u, sign(u) = 1
    assert sympy.simplify((second - sympy.diff(sympy.sqrt(u), x, 2)).subs(at)) == 0
    assert real_diff(sympy.sign(u) * x, x) == sympy.sign(u)


def test_abs_in_a_branch_that_fixes_its_sign_is_differentiated_as_that_branch():
    """The Lambert W Newton step (tuning half), wj - (wj*exp(wj) - x)/(exp(wj) +
    wj*exp(wj)), is chosen as branches on wj's sign with exp(-|wj|) in them. As written,
    the derivative of |wj| is sign(wj), 0 at wj = 0: the gradient there was -0.5, not -1
    (and d2/(dwj dx) -1, not -2). In the branch wj >= 0, |wj| is wj; in the one after it
    (wj < 0), -wj."""
    wj = sympy.Symbol("wj", real=True)
    t = sympy.exp(-sympy.Abs(wj))
    chosen = sympy.Piecewise(
        (wj**2 / (wj + 1), wj > 745),
        ((t * x + wj**2) / (wj + 1), wj >= 0),
        ((t * wj**2 + x) / (t * (wj + 1)), True),
    )
    written = wj - (wj * sympy.exp(wj) - x) / (sympy.exp(wj) + wj * sympy.exp(wj))
    for at in ({wj: 0, x: sympy.Rational(1, 2)}, {wj: -2, x: 3}, {wj: 5, x: 3}):
        got = real_diff(chosen, wj).subs(at)
        assert sympy.simplify(got - sympy.diff(written, wj).subs(at)) == 0, (at, got)
        for var in (wj, x):
            mixed = real_diff(real_diff(chosen, wj), var).subs(at)
            assert sympy.simplify(mixed - sympy.diff(written, wj, var).subs(at)) == 0, at
    # a condition that does not fix the sign leaves |u| as it is
    loose = real_diff(sympy.Piecewise((sympy.Abs(wj), wj > -1), (0, True)), wj)
    assert loose.has(sympy.sign)


def test_a_function_with_abs_of_a_ratio_derives_to_second_order(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "module: m\nfunctions:\n  f:\n    inputs: {a: {}, b: {}}\n"
        "    output: sqrt(Abs((b * b - a * a) / (b * b)))\n"
    )
    d = derive_function(load_spec(path).functions[0], measure=False)
    assert not any(e.has(sympy.Derivative) for row in d.second.values() for e in row.values())


def test_powers_of_numbers_are_opaque_to_simplify():
    """simplify would split 2**(c + ...) with c a fifty-digit rational from the expanded
    decimal polynomial and compute 2**p on the way (a minute per formula); the power goes
    through simplify whole, and the result is still the derivative."""
    from symgrad.derive import _opaque_number_powers, _simplify

    u = (x - sympy.Rational("31.5")) / sympy.Rational("17.25")
    p = sympy.Rational("0.25") * u**6 - sympy.Rational("0.75") * u**5 - sympy.Rational("2.125") * u
    d = sympy.diff(2**p * sympy.exp(x) + 3**x, x)
    opaque, restore = _opaque_number_powers(d)
    assert not any(e.base.is_Number and not e.exp.is_number for e in opaque.atoms(sympy.Pow))
    assert restore(opaque) == d
    simple = _simplify(d)
    at = {x: sympy.Rational(40)}
    assert sympy.N((simple - d).subs(at) / d.subs(at), 30) == pytest.approx(0, abs=1e-25)


def test_forward_mode_computes_the_vjps_measured_form(tmp_path):
    """The Jacobian (jvp) is each VJP's coefficient of its output's gradient, not a form of
    its own: the measured choice is what both modes compute. (gtr1's d/d alpha: the
    cheapest unmeasured form and the chosen VJP differ by 50% at alpha = 1 - 1e-8.)"""
    spec = tmp_path / "g.yaml"
    spec.write_text(
        "module: g\n"
        "functions:\n"
        "  ratio:\n"
        "    inputs: {c: {domain: [0, 1]}, a: {domain: [0.0001, 1], positive: true}}\n"
        "    output: (a*a - 1) / (pi*log(a*a)*(1 + (a*a - 1)*c*c))\n"
        "  pair:\n"
        "    inputs: {x: {}}\n"
        "    outputs: {s: sinh(x), c: cosh(x)}\n"
    )
    for fn in load_spec(spec).functions:
        d = derive_function(fn)
        for (name, _), g in zip(d.outputs, d.grads):
            only = {h: sympy.S.One if h == g else sympy.S.Zero for h in d.grads}
            for i in d.diff_inputs:
                assert d.jacobian[name][i] == d.vjps[i].xreplace(only)


def test_one_abs_of_a_formula_is_split_by_its_sign():
    """d2/dy2 of sqrt(|1 - y**2/x**2|) through |u| and sign(u) is two terms that cancel
    where |y| >> |x| (u < 0); one simplified branch per sign of u has no difference left:
    full precision at x = 1, y = 1e8, where the formula as derived keeps no digit."""
    from symgrad.derive import _abs_free
    from symgrad.numerics.mp import exact

    u = 1 - y**2 / x**2
    d2 = real_diff(real_diff(sympy.sqrt(sympy.Abs(u)), y), y)
    split = _abs_free(d2)
    assert isinstance(split, sympy.Piecewise) and not split.has(sympy.Abs, sympy.sign)
    value, naive = (sympy.lambdify([x, y], e, "math") for e in (split, d2))
    for at_x, at_y in ((1.0, 1e8), (3.0, 1.0), (-2.0, 7.0)):  # u < 0, u > 0, u < 0
        want = exact(d2, {x: at_x, y: at_y})
        assert value(at_x, at_y) == pytest.approx(want, rel=1e-14, abs=0.0)
    assert naive(1.0, 1e8) != pytest.approx(exact(d2, {x: 1.0, y: 1e8}), rel=1e-3, abs=0.0)
    # two different |.|: not split
    assert _abs_free(sympy.Abs(x - y) + sympy.Abs(x + 2 * y)) is None


def _forward_errors(
    tmp_path, inputs: str, output: str, points: dict, gradient: str | None = None
) -> list[tuple]:
    """(dtype, point, bits of error) of the chosen forward of ``output`` (one function of
    ``inputs``, in their order; or its gradient in the input ``gradient``, the upstream
    gradient 1) at each point of each NumPy dtype in ``points``."""
    import numpy as np

    from symgrad.numerics.floats import bits_of_error
    from symgrad.numerics.mp import exact
    from symgrad.numerics.native import evaluator

    spec = tmp_path / "f.yaml"
    spec.write_text(
        f"module: f\norder: 1\nfunctions:\n  f:\n    inputs: {inputs}\n    output: {output}\n"
    )
    d = derive_function(load_spec(spec).functions[0])
    (_, forward), (_, naive) = d.outputs[0], d.naive_outputs[0]
    symbols = [d.symbols[i.name] for i in d.function.inputs]
    if gradient is not None:
        ones = {g: sympy.S.One for g in d.grads}
        forward = d.vjps[gradient].xreplace(ones)
        naive = sympy.diff(naive, d.symbols[gradient])
    value = evaluator(forward, symbols)
    errors = []
    for dtype, at_dtype in points.items():
        for at in at_dtype:
            want = exact(naive, dict(zip(symbols, at)))
            with np.errstate(all="ignore"):
                got = value(*(dtype(v) for v in at))
            errors.append((dtype, at, bits_of_error(float(got), want, dtype.__name__)))
    return errors


def test_n2h_is_accurate_near_0_and_past_the_overflow(tmp_path):
    """Basilisk's N2H, N - (e*sinh(N) - 2N)/(e*cosh(N) - 1): as written inf/inf past |N| =
    710; as one exponential its coefficients' e terms cancel near N = 0 (0 at N = -1e-8,
    e = 2 in float32); over one denominator e*(N*cosh(N) - sinh(N)) + N cancels at N =
    1.9e-13, e = 2e20. The chosen forward keeps the formula near 0, with its Taylor
    polynomial in N there (exp_rational_written_near_zero, its middle split,
    product_series), and the limit 1 + N past exp's underflow."""
    import numpy as np

    points = [(1.9e-13, 2e20), (-1e-8, 2.0), (0.5, 3.0), (-40.0, 1e10), (-6e31, 1.6e13)]
    errors = _forward_errors(
        tmp_path,
        "{N: {}, e: {domain: [1, inf], positive: true}}",
        "N - (e * sinh(N) - N - N) / (e * cosh(N) - 1)",
        {np.float64: points, np.float32: points},
    )
    assert all(bits <= 3 for *_, bits in errors), errors


def test_compound_interest_gradient_is_the_written_forms(tmp_path):
    """Compound interest, ((1 + i/n)**n - 1)/(i/n): its forward is written (candidates
    phase, then the rules) as n*log1prel(i/n)*exprel(i*log1prel(i/n)). Its gradient in i
    differentiated as the formula it came from is two terms of 100*n/i that cancel (27
    bits lost at i = 1e-8, n = 0.5; NaN where i/n underflows, i = -5.2e-301, n = -2.3e64);
    differentiated as written (offered to the choice beside it), a product that does not
    cancel."""
    import numpy as np

    points = [(1e-8, 0.5), (-1e-8, 0.5), (-5.2e-301, -2.3e64), (0.05, 12.0), (3.0, -40.0)]
    errors = _forward_errors(
        tmp_path,
        "{i: {}, n: {}}",
        "100 * (((1 + i / n) ** n - 1) / (i / n))",
        {np.float64: points},
        gradient="i",
    )
    assert all(bits <= 3 for *_, bits in errors), errors


def test_d2psi_distributes_its_factor_into_the_sum(tmp_path):
    """Herbie's d2PSI-dDelta2-over-PSI, (2*Ci*(delta - 1)**2 - 1)*(2*Ci): as written
    2*Ci*(delta - 1)**2 is inf at Ci = 2.5e-110, delta = -4.4e257, where the value is
    4.7e296. Distributed (regimes.distributed_products), 4*Ci**2*(delta - 1)**2 - 2*Ci
    is a common power, ((delta - 1)*Ci)**2 (functions.interleaved_product): finite."""
    import numpy as np

    errors = _forward_errors(
        tmp_path,
        "{delta: {}, Ci: {}}",
        "(2 * (Ci * ((delta - 1) * (delta - 1))) - 1) * (2 * Ci)",
        {np.float64: [(-4.436e257, 2.46e-110), (3.0, 0.5)], np.float32: [(1e30, 1e-25)]},
    )
    assert all(bits <= 2 for *_, bits in errors), errors


def test_diff_by_blocks_simplifies_the_quotient_rule_of_one_input():
    """d/de of sqrt((e + 1)/(e - 1))*t/(1 + (e + 1)/(e - 1)*t**2), the gradient in H of
    held-out h2f (t = tanh(H/2)): by SymPy's quotient rule two terms of 3e-39 at e = 3e38
    whose difference is -2e-77; with (e + 1)/(e - 1) and its root differentiated as blocks
    of e alone and simplified, no cancellation. derive offers it to the choice beside the
    derivative as SymPy takes it."""
    import numpy as np

    from symgrad.derive import diff_by_blocks
    from symgrad.numerics.floats import bits_of_error
    from symgrad.numerics.mp import exact
    from symgrad.numerics.native import evaluator

    e, h = sympy.symbols("e h", real=True)
    t = sympy.tanh(h / 2)
    vjp = grad * sympy.sqrt(e + 1) * sympy.sqrt(1 / (e - 1)) * (1 - t**2)
    vjp = vjp / (1 + (e + 1) * t**2 / (e - 1))
    blockwise = diff_by_blocks(vjp, e)
    assert sympy.simplify(blockwise - sympy.diff(vjp, e)) == 0
    args = (1.0, 0.5, 3e38)
    want = exact(sympy.diff(vjp, e), dict(zip((grad, h, e), args)))
    for form, bound in ((blockwise, 3), (sympy.diff(vjp, e), None)):
        with np.errstate(all="ignore"):
            got = float(evaluator(form, [grad, h, e])(*(np.float64(v) for v in args)))
        bits = bits_of_error(got, want, "float64")
        assert bits <= 3 if bound else bits > 40, (form, got, want)
    assert diff_by_blocks(grad * h * e, h) is None  # no block of h alone but h itself


def test_a_split_by_regime_is_taken_only_where_it_scores_better_here_and_on_more_points():
    """finish's use of choose.regime_split: log(1 + x) (no digit left below x = 1e-16) and
    its Taylor polynomial (none past x = 0.1), each where the size of x says, where no
    single form is accurate; not where the chosen form is already as good, and not where
    the split is worse on the points drawn apart (``more``) than the form it replaces
    (REGIME_GAIN_BITS better on the choice's points is the first test)."""
    import math

    from symgrad.derive import _split_by_regime
    from symgrad.functions import log1p

    x = sympy.Symbol("x", real=True)
    logged, series = sympy.log(1 + x), x - x**2 / 2 + x**3 / 3
    points = [{x: 10.0**-k} for k in range(1, 30)] + [{x: 1.5 + k} for k in range(20)]
    more = [{x: 10.0**-k - 1e-3} for k in range(4, 9)] + [{x: 3.25 + k} for k in range(5)]
    split = _split_by_regime(logged, [logged, series], logged, points, more, ())
    assert split is not None
    form, accuracy = split
    assert isinstance(form, sympy.Piecewise) and form.args[0].expr == series
    assert accuracy.max_bits < 16 and not math.isnan(accuracy.score)
    assert accuracy.points == len(points)
    # the chosen form is exact: no split scores REGIME_GAIN_BITS better
    assert _split_by_regime(logged, [logged, series, log1p(x)], log1p(x), points, more, ()) is None
    # a form with a pole at x = 1e-6, which the sample misses and the more points have:
    # the split that takes it there loses to the logarithm alone on them
    pole = series + sympy.Float(1e-300) / (x - sympy.Float(1e-6))
    sample = [p for p in points if p[x] != 1e-6]
    at_pole = [{x: 1e-6}] * 3
    assert _split_by_regime(logged, [logged, pole], logged, sample, (), ()) is not None
    assert _split_by_regime(logged, [logged, pole], logged, sample, at_pole, ()) is None


@pytest.mark.parametrize("extremum", [sympy.Max, sympy.Min])
def test_a_tie_of_three_splits_the_gradient_into_weights_that_sum_to_one(extremum):
    """SymPy's derivative of an n-argument Max weighs each tied argument 1/2 (3/2 at a tie
    of three: the gradient of Herbie's "letters hi" was -2 where its value is -1); two at
    a time, as torch.maximum, each level halves a tie."""
    from symgrad.functions import real_diff

    a, b, c = sympy.symbols("a b c", real=True)
    f = extremum(a, b, c)
    at = {a: 1, b: 1, c: 1}
    weights = [real_diff(f, s).subs(at) for s in (a, b, c)]
    assert sum(weights) == 1 and all(0 < w < 1 for w in weights), weights
    # away from a tie the one extreme argument takes it all
    assert [real_diff(f, s).subs({a: 3, b: 1, c: 2}) for s in (a, b, c)] == (
        [1, 0, 0] if extremum is sympy.Max else [0, 1, 0]
    )
