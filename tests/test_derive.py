"""The derive stage on its own: VJP, JVP, second order, masks, and what it hands on."""

from __future__ import annotations

import sympy

from symgrad.derive import derive_function
from symgrad.derived import Derived
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
