"""Behaviour of generated torch/TF code that the generated suites do not cover."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from conftest import run_generated_suite

torch = pytest.importorskip("torch")

MUL = """\
module: m
functions:
  mul:
    inputs: {x: {}, y: {}}
    output: x*y
  bce:
    inputs:
      z: {}
      target: {differentiable: false, domain: [0, 1]}
      weight: {kind: scalar, default: 2.0}
    output: -weight*(target*log(1/(1 + exp(-z))) + (1 - target)*log(1 - 1/(1 + exp(-z))))
  sinh_cosh:
    inputs: {x: {}}
    outputs: {s: sinh(x), c: cosh(x)}
  ste:
    inputs: {x: {}}
    output: Heaviside(x, 1)
    gradient:
      x: grad * Heaviside(1 - Abs(x), 1)
  step:
    inputs: {x: {}}
    output: Heaviside(x, 1)
"""


def test_broadcast_gradients_are_summed_to_input_shapes(generate_module):
    m = generate_module(MUL)
    x = torch.randn(3, 1, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, dtype=torch.float64, requires_grad=True)
    out = m.mul(x, y)
    assert out.shape == (3, 4)
    out.sum().backward()
    assert x.grad.shape == (3, 1) and y.grad.shape == (4,)
    torch.testing.assert_close(x.grad, y.detach().sum().expand(3, 1))
    torch.testing.assert_close(y.grad, x.detach().sum().expand(4))


def test_needs_input_grad_skips_unneeded_gradients(generate_module, monkeypatch):
    m = generate_module(MUL)
    called = []
    for name in ("MulGradX", "MulGradY"):
        cls = getattr(m, name)
        original = cls.apply
        monkeypatch.setattr(
            cls, "apply", lambda *a, _o=original, _n=name: called.append(_n) or _o(*a)
        )
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(3, dtype=torch.float64)
    # create_graph=True: the differentiable path, one backward Function per input
    (gx,) = torch.autograd.grad(m.mul(x, y).sum(), x, create_graph=True)
    assert called == ["MulGradX"]
    torch.testing.assert_close(gx, y)
    # create_graph=False: one graph-free function for all gradients, no Function, asked
    # for x's gradient only (y.grad is None whatever it computes: y needs none)
    flags = []
    original = m._mul_backward
    monkeypatch.setattr(m, "_mul_backward", lambda *a: flags.append(a[-2:]) or original(*a))
    m.mul(x, y).sum().backward()
    assert called == ["MulGradX"]
    assert flags == [(True, False)]
    torch.testing.assert_close(x.grad, y)


def test_non_differentiable_and_scalar_inputs_get_none(generate_module):
    m = generate_module(MUL)
    z = torch.randn(5, dtype=torch.float64, requires_grad=True)
    target = torch.rand(5, dtype=torch.float64, requires_grad=True)
    out = m.bce(z, target, weight=3.0)
    gz, gt = torch.autograd.grad(out.sum(), (z, target), allow_unused=True)
    assert gt is None
    torch.testing.assert_close(gz, 3.0 * (torch.sigmoid(z) - target).detach())
    # stable where the naive formula is not: the gradient at z = 1e4 is finite
    big = torch.tensor([1e4, -1e4], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(m.bce(big, torch.tensor([0.0, 1.0], dtype=torch.float64)).sum(), big)
    torch.testing.assert_close(g, torch.tensor([2.0, -2.0], dtype=torch.float64))


def test_several_outputs_and_their_gradients(generate_module):
    m = generate_module(MUL)
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    s, c = m.sinh_cosh(x)
    torch.testing.assert_close(s, torch.sinh(x))
    (gx,) = torch.autograd.grad((2 * s + 3 * c).sum(), x)
    torch.testing.assert_close(gx, (2 * torch.cosh(x) + 3 * torch.sinh(x)).detach())


def test_straight_through_override(generate_module):
    m = generate_module(MUL)
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 2.0], requires_grad=True)
    out = m.ste(x)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0]))
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0]))


def test_output_with_derivative_zero_gets_zero_gradients(generate_module):
    """As torch.round and torch.sign: the output requires grad and its gradient is zeros
    (first and second order, forward mode too)."""
    m = generate_module(MUL)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    out = m.step(x)
    assert out.requires_grad
    (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    torch.testing.assert_close(g, torch.zeros(3, dtype=torch.float64))
    assert torch.autograd.gradcheck(m.step, (x,), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(m.step, (x,))


def test_output_of_non_differentiable_inputs_only_is_marked_so(generate_module):
    m = generate_module(
        "module: n\nfunctions:\n  f:\n    inputs:\n      x: {differentiable: false}\n"
        "    output: 2*x\n"
    )
    assert not m.f(torch.randn(3, requires_grad=True)).requires_grad


def test_double_backward_runs_the_derived_formulas(generate_module):
    """softplus'' at 800: re-tracing autograd through sigmoid-free code gives NaN."""
    m = generate_module(
        "module: s\nfunctions:\n  sp:\n    inputs: {x: {}}\n    output: log(1 + exp(x))\n"
    )
    x = torch.tensor([800.0, -800.0, 0.0], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(m.sp(x).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(g, torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64))
    torch.testing.assert_close(h, torch.tensor([0.0, 0.0, 0.25], dtype=torch.float64))
    # the naive formula's double backward is NaN at 800
    xn = x.detach().clone().requires_grad_()
    (gn,) = torch.autograd.grad(torch.log(1 + torch.exp(xn)).sum(), xn, create_graph=True)
    (hn,) = torch.autograd.grad(gn.sum(), xn)
    assert torch.isnan(hn[0]) or torch.isnan(gn[0])
    assert type(g.grad_fn).__name__ == "SpGradBackward"  # (autograd's node of SpGrad)


def test_generated_modules_import_neither_sympy_nor_symgrad():
    code = (
        "import sys; sys.path.insert(0, 'examples/generated');"
        "import activations_torch, activations_tf;"
        "bad = [m for m in ('sympy', 'symgrad', 'mpmath') if m in sys.modules];"
        "assert not bad, bad"
    )
    from pathlib import Path

    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


SELU = """\
module: s
functions:
  selu:
    inputs: {x: {}}
    output: 1.0507009873554805*(Max(0, x) + Min(0, 1.6732632423543772*(exp(x) - 1)))
"""


def test_kinks_follow_the_stable_condition_and_mask_unused_branches(generate_module):
    """The Min's condition is c*expm1(x) < 0, not c - c*exp(x) > 0 (which rounds to a tie
    for tiny x and halves the gradient), and exp(x) of the unused branch never gives NaN."""
    m = generate_module(SELU)
    x = torch.tensor([-1e-20, 1000.0, -1000.0], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(m.selu(x).sum(), x)
    scale, alpha = 1.0507009873554805, 1.6732632423543772
    torch.testing.assert_close(g, torch.tensor([scale * alpha, scale, 0.0], dtype=torch.float64))


def test_an_unused_output_contributes_nothing_even_where_its_derivative_overflows(
    generate_module,
):
    """exp(x) and exp(-x) at x = -800, only the first used: autograd passes 0 for the
    second, whose derivative -exp(800) is -inf; 0 * -inf would make the gradient NaN."""
    torch = pytest.importorskip("torch")
    module = generate_module(
        "module: two_exps\n"
        "functions:\n"
        "  two_exps:\n"
        "    inputs: {x: {}}\n"
        "    outputs: {up: exp(x), down: exp(-x)}\n"
    )
    x = torch.tensor([-800.0, 0.5], dtype=torch.float64, requires_grad=True)
    up, _ = module.two_exps(x)
    (grad,) = torch.autograd.grad(up.sum(), x, create_graph=True)
    assert grad.tolist() == [0.0, math.exp(0.5)]
    (second,) = torch.autograd.grad(grad.sum(), x)
    assert second.tolist() == [0.0, math.exp(0.5)]


def test_generated_value_tests_fail_on_an_output_detached_by_mistake(tmp_path, monkeypatch):
    """_check_cases skipped every gradient assertion when an output did not require grad:
    an output detached by mistake passed. It must fail, and a sound module pass."""
    from symgrad.generate import generate
    from symgrad.spec import load_spec

    (tmp_path / "detach.yaml").write_text(
        "module: detach\ntargets: [torch]\nfunctions:\n"
        "  softplus:\n    inputs: {x: {}}\n    output: log(1 + exp(x))\n"
    )
    for f in generate(load_spec(tmp_path / "detach.yaml")):
        (tmp_path / f.name).write_text(f.text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "detach_torch", raising=False)
    from conftest import import_file

    tests = import_file(tmp_path / "test_detach_torch.py")
    tests.test_softplus_matches_exact_values("cpu")  # sound: passes
    real = tests.generated.softplus
    monkeypatch.setattr(tests.generated, "softplus", lambda x: real(x).detach())
    with pytest.raises(AssertionError, match="output out: requires_grad is False"):
        tests.test_softplus_matches_exact_values("cpu")
    monkeypatch.delitem(sys.modules, "detach_torch", raising=False)


AFFINE = """\
module: affine
functions:
  affine:
    inputs: {x: {}, w: {}, b: {}}
    output: x*w + b
"""


@pytest.mark.parametrize("target", ["torch", "tensorflow"])
def test_inputs_that_do_not_broadcast_get_an_error_naming_function_and_shapes(
    generate_module, target
):
    """A formula written for a matrix (x W + b) is elementwise to symgrad: called with
    (16, 8), (4, 8), (4,) the error names the function and the shapes it got."""
    if target == "tensorflow":
        tf = pytest.importorskip("tensorflow")
        make, error = tf.ones, ValueError
    else:
        make, error = torch.ones, RuntimeError  # the type each framework raises for it
    m = generate_module(AFFINE, target)
    with pytest.raises(error, match=r"affine\(\): the inputs do not broadcast") as info:
        m.affine(make((16, 8)), make((4, 8)), make((4,)))
    assert "x (16, 8), w (4, 8), b (4,)" in str(info.value)
    assert "elementwise" in str(info.value)
    out = m.affine(make((4, 8)), make((4, 8)), make((8,)))  # these broadcast: no error
    assert tuple(out.shape) == (4, 8)


LOST_INPUTS = """\
module: lost
order: 2
functions:
  identity_plus:
    doc: the formula simplifies to cosh(y) + 1; its result is still broadcast over x
    inputs: {x: {}, y: {}}
    output: sin(x)**2 + cos(x)**2 + cosh(y)
  constant:
    inputs: {x: {}, y: {}}
    output: x - x + y - y + 3
  pair:
    inputs: {x: {}, y: {}}
    outputs: {a: cosh(y), b: x*y}
"""


@pytest.mark.parametrize("target", ["torch", "tensorflow"])
def test_a_formula_that_loses_an_input_keeps_the_broadcast_shape(generate_module, target):
    """sin(x)**2 + cos(x)**2 + cosh(y) is cosh(y) + 1 to SymPy, x - x + y - y + 3 is 3: the
    results still have the shape of x and y broadcast together, as the formula as written."""
    m = generate_module(LOST_INPUTS, target)
    if target == "tensorflow":
        tf = pytest.importorskip("tensorflow")
        x = tf.constant([[0.5], [1.0], [2.0]], tf.float64)
        y = tf.constant([0.1, 0.2, 0.3, 0.4], tf.float64)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([x, y])
            out = m.identity_plus(x, y)
            const = m.constant(x, y)
            a, _ = m.pair(x, y)
        assert out.shape == (3, 4) and const.shape == (3, 4) and a.shape == (3, 4)
        assert const.dtype == tf.float64
        np = pytest.importorskip("numpy")
        np.testing.assert_allclose(const.numpy(), np.full((3, 4), 3.0))
        grad_y = tape.gradient(out, y)
        np.testing.assert_allclose(grad_y.numpy(), 3 * np.sinh(y.numpy()))  # summed over x
        return
    x = torch.tensor([[0.5], [1.0], [2.0]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64, requires_grad=True)
    out = m.identity_plus(x, y)
    const = m.constant(x, y)
    a, b = m.pair(x, y)
    for result in (out, const, a, b):
        assert result.shape == (3, 4) and result.dtype == torch.float64
        assert result.is_contiguous()
    torch.testing.assert_close(const, torch.full((3, 4), 3.0, dtype=torch.float64))
    # a number of differentiable inputs requires grad, with zero gradients (x * 0 + 3)
    assert const.requires_grad
    assert not torch.autograd.grad(const.sum(), x)[0].any()
    grad_x, grad_y = torch.autograd.grad(out.sum(), (x, y), create_graph=True)
    assert grad_x.shape == (3, 1) and not grad_x.any()
    torch.testing.assert_close(grad_y, 3 * torch.sinh(y))  # summed over x's 3 rows
    (second,) = torch.autograd.grad(grad_y.sum(), y)
    torch.testing.assert_close(second, 3 * torch.cosh(y.detach()))
    # forward mode: the tangent has the output's shape
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(y.detach(), torch.ones(4, dtype=torch.float64))
        tangent = torch.autograd.forward_ad.unpack_dual(m.identity_plus(x.detach(), dual)).tangent
    assert tangent.shape == (3, 4)
    torch.testing.assert_close(tangent, torch.sinh(y.detach()).expand(3, 4))
    # dtypes promote as the formula as written would: float32 x, float64 y
    assert m.constant(x.detach().float(), y.detach()).dtype == torch.float64
    assert m.identity_plus(x.detach(), y.detach().float()).dtype == torch.float64
    assert torch.autograd.gradgradcheck(m.identity_plus, (x, y))
    assert torch.autograd.gradcheck(m.pair, (x, y), check_forward_ad=True)


def test_an_unused_output_is_masked_in_the_second_derivative_too(generate_module):
    """a = cosh(y), b = x*y with only b used: d grad_y / d y is grad_a*cosh(y), and
    autograd's zero for grad_a times cosh(1e4) = inf would make it NaN."""
    m = generate_module(LOST_INPUTS)
    x = torch.tensor([2.0], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1e4], dtype=torch.float64, requires_grad=True)
    _, b = m.pair(x, y)
    _, grad_y = torch.autograd.grad(b.sum(), (x, y), create_graph=True)
    assert grad_y.tolist() == [2.0]
    (second,) = torch.autograd.grad(grad_y.sum(), y)
    assert second.tolist() == [0.0]


@pytest.mark.parametrize("target", ["torch", "tensorflow"])
def test_a_formula_that_loses_an_input_passes_its_generated_tests(tmp_path, target):
    """The generated suite of LOST_INPUTS: its naive reference keeps the written shape
    (3 + zeros_like(x) + zeros_like(y)), gradgradcheck takes the input whose gradient is 0
    everywhere as a constant, and none is emitted where every gradient is 0."""
    pytest.importorskip(target)
    extra = ["-k", "not compile and not fused"] if target == "torch" else []
    files = run_generated_suite(tmp_path, LOST_INPUTS, target, *extra)
    if target == "torch":
        tests = files["test_lost_torch.py"]
        assert "def test_constant_gradgradcheck" not in tests
        assert 'x.detach() if n not in ["y"] else x' in tests
