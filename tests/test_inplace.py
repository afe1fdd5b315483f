"""In-place updates of owned temporaries (plan.update_in_place on an ir.Tape) and the
first-order path."""

from __future__ import annotations

import importlib.util
import inspect
import math
from pathlib import Path

import mpmath
import numpy as np
import pytest
from conftest import generate_into

from symgrad.ir import Tape
from symgrad.plan import update_in_place


def _rewrite(lines: list[str], keep: set[str], **kinds: str) -> list[str]:
    """``lines`` with the inputs ``kinds`` (name -> "float" or "other") and the results
    ``keep``, after the in-place pass; where torch is installed, both versions are run
    (with the generated modules' helpers) and must give the same results and leave the
    inputs as they were."""
    rewritten = update_in_place(Tape.of(lines, inputs=kinds, results=keep)).lines()
    if importlib.util.find_spec("torch") is not None:
        _run_both(lines, rewritten, kinds, keep)
    return rewritten


def _run_both(lines, rewritten, kinds, keep) -> None:
    import torch

    from symgrad.runtime import torch_helpers

    generator = torch.Generator().manual_seed(0)
    inputs = {}
    for name, kind in kinds.items():
        values = torch.randn(6, 5, dtype=torch.float64, generator=generator) * 3
        inputs[name] = values if kind == "float" else (values > 0).to(torch.float64)
    results = []
    for code in (lines, rewritten):
        scope = {**vars(torch_helpers), "torch": torch, "math": math}
        scope |= {name: value.clone() for name, value in inputs.items()}
        exec("\n".join(code), scope)
        for name, value in inputs.items():
            assert torch.equal(scope[name], value), f"{name} was changed by {code}"
        results.append({name: scope[name] for name in keep})
    for name in keep:
        torch.testing.assert_close(results[1][name], results[0][name], equal_nan=True)


# ----------------------------------------------------------------------------- strings
def test_a_chain_of_fresh_values_is_updated_in_place():
    # (the upstream gradient may be batched where x is not: multiplied in after a check)
    lines = ["grad_x = grad * (x * torch.sigmoid(-x) + 1) * torch.tanh(x)"]
    assert _rewrite(lines, {"grad_x"}, x="float", grad="float") == [
        "grad_x = _mul_into((-x).sigmoid_().mul_(x).add_(1), grad).mul_(torch.tanh(x))"
    ]
    # with sigmoid(x) beside sigmoid(-x), both go through _sigmoid, which compiled takes
    # exp(-|x|) from x for both (one exp)
    lines = ["grad_x = grad * (x * torch.sigmoid(-x) + 1) * torch.sigmoid(x)"]
    assert _rewrite(lines, {"grad_x"}, x="float", grad="float") == [
        "grad_x = _mul_into(_sigmoid(-x, negative_of=x, overwrite=True).mul_(x).add_(1), grad)"
        ".mul_(_sigmoid(x))"
    ]


def test_inputs_are_never_updated():
    assert _rewrite(["out = x * y + 1"], {"out"}, x="float", y="float") == ["out = (x * y).add_(1)"]
    assert _rewrite(["out = torch.exp(x)"], {"out"}, x="float") == ["out = torch.exp(x)"]


def test_a_temporary_is_updated_at_its_last_use_only():
    lines = ["t0 = torch.exp(x)", "a = t0 * 2", "b = t0 * 3"]
    assert _rewrite(lines, {"a", "b"}, x="float") == [
        "t0 = torch.exp(x)",
        "a = t0 * 2",
        "b = t0.mul_(3)",
    ]
    # read again in its last statement: the earlier reads' operations come first
    lines = ["t0 = torch.exp(x)", "out = t0 * t0 + t0"]
    assert _rewrite(lines, {"out"}, x="float")[1:] == ["t1 = t0 * t0", "out = t1.add_(t0)"]
    lines = ["t0 = torch.abs(x)", "out = torch.where(t0 <= 1, x, t0 - 0.5)"]
    assert _rewrite(lines, {"out"}, x="float")[1:] == [
        "t1 = t0 <= 1",
        "out = _where(t1, x, t0.sub_(0.5), overwrite='b')",
    ]
    # an earlier read inside another earlier read goes with it (no orphan `t2 = -t0`)
    lines = ["t0 = torch.exp(x)", "out = t0 * (grad * torch.tanh(-t0)) * torch.tanh(t0)"]
    assert _rewrite(lines, {"out"}, x="float", grad="float")[1:] == [
        "t1 = _mul_into((-t0).tanh_(), grad).mul_(t0)",
        "out = t1.mul_(t0.tanh_())",
    ]
    # where() itself reads t0: never updated while where() still needs it; the fresh
    # t0 * 2 may take the result
    lines = ["t0 = torch.exp(x)", "out = torch.where(t0 > 1, t0, t0 * 2)"]
    assert (
        _rewrite(lines, {"out"}, x="float")[1] == "out = _where(t0 > 1, t0, t0 * 2, overwrite='b')"
    )
    # no branch of its own (inputs, a broadcast value): nothing to overwrite
    lines = ["out = torch.where(x > 0, x, y)"]
    assert _rewrite(lines, {"out"}, x="float", y="float") == ["out = _where(x > 0, x, y)"]
    lines = ["out = torch.where(x > 0, torch.exp(x), y)"]  # exp(x) may be smaller than y
    assert _rewrite(lines, {"out"}, x="float", y="float") == [
        "out = _where(x > 0, torch.exp(x), y)"
    ]


def test_results_and_their_aliases_are_kept():
    lines = ["t0 = torch.exp(x)", "a = t0", "b = t0 * 3"]
    assert _rewrite(lines, {"a", "b"}, x="float")[2] == "b = t0 * 3"


def test_broadcasting_never_grows_a_buffer_in_place():
    # exp(x) has x's shape; exp(x) * y may be larger (x: [3, 1], y: [4]): the helper
    # checks at run time
    assert _rewrite(["out = torch.exp(x) * y"], {"out"}, x="float", y="float") == [
        "out = _mul_into(torch.exp(x), y)"
    ]
    # x * y covers y's shape: updating it with exp(y) is safe
    assert _rewrite(["out = x * y * torch.exp(y)"], {"out"}, x="float", y="float") == [
        "out = (x * y).mul_(torch.exp(y))"
    ]


def test_dtypes_integer_and_boolean_values_are_not_updated():
    # target may be an integer tensor: 1 - target is not a floating buffer
    assert _rewrite(["out = (1 - target) * 0.5"], {"out"}, target="other") == [
        "out = (1 - target) * 0.5"
    ]
    # comparisons give booleans
    assert _rewrite(["out = (x > 0) * 2.0"], {"out"}, x="float") == ["out = (x > 0) * 2.0"]
    # where() takes its dtype from its branches, not from its condition: x may be wider
    assert _rewrite(["out = torch.where(x > 0, y, 1.0) * x"], {"out"}, x="float", y="float") == [
        "out = _mul_into(_where(x > 0, y, 1.0), x)"
    ]
    assert _rewrite(["out = torch.where(x > 0, y, 1.0) * y"], {"out"}, x="float", y="float") == [
        "out = _where(x > 0, y, 1.0).mul_(y)"
    ]


def test_non_commutative_updates_are_exact():
    assert _rewrite(["out = x - torch.exp(x)"], {"out"}, x="float") == [
        "out = torch.exp(x).neg_().add_(x)"
    ]
    assert _rewrite(["out = 1 / torch.exp(x)"], {"out"}, x="float") == [
        "out = torch.exp(x).reciprocal_()"
    ]
    # c / t is not 1 / t * c in floating point: a fresh tensor instead
    assert _rewrite(["out = 2.0 / torch.exp(x)"], {"out"}, x="float") == [
        "out = 2.0 / torch.exp(x)"
    ]


# ----------------------------------------------------------------------------- printing
def test_torch_printer_saves_passes():
    import sympy

    from symgrad.printers.torch import TorchPrinter

    x, u = sympy.symbols("x u", real=True)
    p = TorchPrinter()
    # p*x/q and -x/q: one float factor, one pass
    assert p.doprint(sympy.Rational(8943, 200000) * x**3) == "0.044715*x**3"
    assert p.doprint(-(x**2) / 2) == "-0.5*x**2"
    assert p.doprint(x / 2) == "x/2"
    # |x| < c without a float tensor |x|; compound arguments keep torch.abs
    assert p.doprint(sympy.Abs(x) < 40) == "(x < 40) & (x > -40)"
    assert p.doprint(sympy.Abs(x) <= 1) == "(x <= 1) & (x >= -1)"
    assert p.doprint(sympy.Abs(x + u) < 2) == "torch.abs(u + x) < 2"


# ----------------------------------------------------------------------------- generated code
torch = pytest.importorskip("torch")

SPEC = """\
module: ip
functions:
  mix:
    inputs: {x: {}, y: {}}
    output: x*exp(y) + sin(x*y) + x**2/2
  bce:
    inputs:
      z: {}
      target: {differentiable: false, domain: [0, 1]}
    output: -(target*log(1/(1 + exp(-z))) + (1 - target)*log(1 - 1/(1 + exp(-z))))
  silu:
    inputs: {x: {}}
    output: x/(1 + exp(-x))
"""


def _naive_mix(x, y):
    return x * torch.exp(y) + torch.sin(x * y) + x**2 / 2


def _naive_bce(z, target):
    return target * torch.nn.functional.softplus(-z) + (1 - target) * torch.nn.functional.softplus(
        z
    )


@pytest.fixture(scope="module")
def ip(tmp_path_factory):
    # generated once for the module (about 14 s): the tests only call it (a monkeypatch
    # of one of its functions is undone after its test)
    return generate_into(tmp_path_factory.mktemp("inplace"), SPEC)


def test_broadcast_inputs_match_naive_and_are_not_mutated(ip):
    x = torch.randn(3, 1, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, dtype=torch.float64, requires_grad=True)
    before = (x.detach().clone(), y.detach().clone())
    gy = torch.randn(3, 4, dtype=torch.float64)
    out = ip.mix(x, y)
    grads = torch.autograd.grad(out, (x, y), gy, retain_graph=True)
    again = torch.autograd.grad(out, (x, y), gy)  # saved tensors unchanged by the first
    naive = _naive_mix(x, y)
    torch.testing.assert_close(out, naive)
    expected = torch.autograd.grad(naive, (x, y), gy)
    for a, b, c in zip(grads, again, expected):
        torch.testing.assert_close(a, c)
        torch.testing.assert_close(b, c)
    torch.testing.assert_close((x.detach(), y.detach()), before, rtol=0, atol=0)
    assert grads[0].shape == (3, 1) and grads[1].shape == (4,)


def test_mixed_dtypes_promote_as_torch_does(ip):
    x = torch.randn(5, dtype=torch.float32, requires_grad=True)
    y = torch.randn(5, dtype=torch.float64, requires_grad=True)
    out = ip.mix(x, y)
    assert out.dtype == torch.float64
    gx, gy = torch.autograd.grad(out.sum(), (x, y))
    assert gx.dtype == torch.float32 and gy.dtype == torch.float64
    ex, ey = torch.autograd.grad(_naive_mix(x, y).sum(), (x, y))
    torch.testing.assert_close((gx, gy), (ex, ey))


@pytest.mark.parametrize("target_dtype", [torch.int64, torch.float64, torch.float32])
def test_integer_and_other_dtype_targets(ip, target_dtype):
    z = torch.randn(6, dtype=torch.float32, requires_grad=True)
    target = torch.tensor([0, 1, 1, 0, 1, 0]).to(target_dtype)
    out = ip.bce(z, target)
    expected = _naive_bce(z, target)
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out, expected)
    (g,) = torch.autograd.grad(out.sum(), z)
    (e,) = torch.autograd.grad(expected.sum(), z)
    torch.testing.assert_close(g, e)
    assert torch.equal(target, torch.tensor([0, 1, 1, 0, 1, 0]).to(target_dtype))


@pytest.mark.parametrize("in_dims", [(0, None), (None, 0), (0, 0)])
def test_vmap_with_inputs_batched_apart(ip, in_dims):
    x = torch.randn(4, 3, dtype=torch.float64)
    y = torch.randn(4, 3, dtype=torch.float64)
    args = [x if in_dims[0] == 0 else x[0], y if in_dims[1] == 0 else y[0]]
    got = torch.func.vmap(ip.mix, in_dims=in_dims)(*args)
    torch.testing.assert_close(got, torch.func.vmap(_naive_mix, in_dims=in_dims)(*args))
    jac = torch.func.jacrev(ip.mix, argnums=(0, 1))(x[0], y[0])
    naive = torch.func.jacrev(_naive_mix, argnums=(0, 1))(x[0], y[0])
    torch.testing.assert_close(jac, naive)


def test_first_order_backward_under_vmap_with_batched_gradients(ip):
    """autograd.grad(is_grads_batched=True) runs the graph-free backward under vmap with
    the upstream gradient batched and the saved inputs not."""
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    y = torch.randn(5, dtype=torch.float64, requires_grad=True)
    eye = torch.eye(5, dtype=torch.float64)
    got = torch.autograd.grad(ip.mix(x, y), (x, y), eye, is_grads_batched=True)
    expected = torch.autograd.grad(_naive_mix(x, y), (x, y), eye, is_grads_batched=True)
    torch.testing.assert_close(got, expected)
    (got,) = torch.autograd.grad(ip.silu(x), x, eye, is_grads_batched=True)
    (expected,) = torch.autograd.grad(x * torch.sigmoid(x), x, eye, is_grads_batched=True)
    torch.testing.assert_close(got, expected)


def test_first_order_backward_is_one_call_that_honours_needs_input_grad(ip, monkeypatch):
    calls = []
    original = ip._mix_backward
    monkeypatch.setattr(ip, "_mix_backward", lambda *a: calls.append(a[-2:]) or original(*a))
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(3, dtype=torch.float64)
    ip.mix(x, y).sum().backward()
    assert calls == [(True, False)]
    y.requires_grad_()
    (gx, gy) = torch.autograd.grad(ip.mix(x, y).sum(), (x, y))
    assert calls[-1] == (True, True)
    torch.testing.assert_close((gx, gy), torch.autograd.grad(_naive_mix(x, y).sum(), (x, y)))


def test_double_backward_still_takes_the_differentiable_path(ip):
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(ip.mix(x, y).sum(), x, create_graph=True)
    assert gx.requires_grad
    (hx,) = torch.autograd.grad(gx.sum(), x)
    (ngx,) = torch.autograd.grad(_naive_mix(x, y).sum(), x, create_graph=True)
    (nhx,) = torch.autograd.grad(ngx.sum(), x)
    torch.testing.assert_close(hx, nhx)


# ----------------------------------------------------------------------------- save vs recompute
COST = """\
module: cost
functions:
  ex:
    inputs: {x: {}}
    output: exp(x)
  sp:
    inputs: {x: {}}
    output: log(1 + exp(x))
"""


def _saved(fn, x):
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        out = fn(x)
    return out, packed


def test_cost_model_saves_the_output_where_the_backward_is_cheaper_from_it(generate_module):
    m = generate_module(COST)
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    out, packed = _saved(m.ex, x)  # d exp = grad * out: one pass, and x is not needed
    assert len(packed) == 1 and packed[0] is out
    out, packed = _saved(m.sp, x)  # sigmoid(x) from softplus(x) would cost more passes
    assert len(packed) == 1 and packed[0] is x
    (g,) = torch.autograd.grad(m.ex(x).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close((g, h), (torch.exp(x), torch.exp(x)))


# ----------------------------------------------------------------------------- _where
WHERE_SPEC = """\
module: sel
functions:
  elu:
    inputs: {x: {}}
    output: Piecewise((x, x > 0), (exp(x) - 1, True))
  huber:
    inputs: {pred: {}, target: {}}
    output: Piecewise(((pred - target)**2/2, Abs(pred - target) <= 1), (Abs(pred - target) - 1/2, True))
"""


@pytest.fixture
def sel(generate_module):
    return generate_module(WHERE_SPEC)


def _bits_equal(a, b) -> bool:
    """Equal bit for bit (NaN == NaN, -0.0 != 0.0)."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(ints), b.view(ints))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@torch.no_grad()  # as in Function.forward and the first-order backward
def test_where_helper_selects_bit_for_bit(sel, dtype):
    g = torch.Generator().manual_seed(0)
    n = 1000
    special = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0, 0.0, 1e-40])
    a = torch.randn(n, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    a[: len(special)] = special.to(dtype)
    b[-len(special) :] = special.to(dtype)
    cond = torch.rand(n, generator=g) > 0.5
    expected = torch.where(cond, a, b)
    assert _bits_equal(sel._where(cond, a, b), expected)
    for overwrite, branch in (("a", a), ("b", b)):
        buffer = branch.clone()
        args = (buffer, b) if overwrite == "a" else (a, buffer)
        got = sel._where(cond, *args, overwrite=overwrite)
        assert _bits_equal(got, expected)
        assert got.data_ptr() == buffer.data_ptr()  # written into the buffer it was given
    for number in (0.0, -0.0, 1.5, float("inf")):
        assert _bits_equal(sel._where(cond, a, number), torch.where(cond, a, number))
        assert _bits_equal(sel._where(cond, number, b), torch.where(cond, number, b))
    # branches not named by overwrite are never written
    a0, b0 = a.clone(), b.clone()
    sel._where(cond, a, b)
    assert _bits_equal(a, a0) and _bits_equal(b, b0)


def test_where_helper_is_torch_where_elsewhere(sel):
    x = torch.randn(3, 1, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, dtype=torch.float64)
    # a condition smaller than the result (broadcasting)
    with torch.no_grad():
        assert torch.equal(sel._where(x > 0, x, y), torch.where(x > 0, x, y))
        assert torch.equal(sel._where(y > 0, x, y), torch.where(y > 0, x, y))
    # autograd recording: differentiable like torch.where
    out = sel._where(x > 0, x, y)
    assert out.requires_grad
    (gx,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(gx, (x > 0).to(x.dtype) * 4)
    # other dtypes and mixed dtypes
    i = torch.arange(6) - 3
    f32 = torch.randn(6)
    with torch.no_grad():
        assert torch.equal(sel._where(i > 0, i, 0), torch.where(i > 0, i, 0))
        got = sel._where(f32 > 0, f32, y[:1].expand(6))
        assert got.dtype == torch.float64
        assert torch.equal(got, torch.where(f32 > 0, f32, y[:1].expand(6)))
    # under vmap, with the condition and the branches batched apart
    a, b = torch.randn(5, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    with torch.no_grad():
        got = torch.func.vmap(lambda u: sel._where(b > 0, b * 2, u, overwrite="a"))(a)
    assert torch.equal(got, torch.where(b > 0, b * 2, a))


def test_piecewise_functions_through_the_helper_match_naive(sel):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(4096, generator=g, dtype=torch.float64) * 30).requires_grad_()
    target = torch.randn(4096, generator=g, dtype=torch.float64).requires_grad_()
    gy = torch.randn(4096, generator=g, dtype=torch.float64)
    naive_elu = torch.where(x > 0, x, torch.expm1(x))
    out = sel.elu(x)
    assert torch.equal(out, naive_elu)
    torch.testing.assert_close(
        torch.autograd.grad(out, x, gy)[0], gy * torch.where(x > 0, 1.0, x.exp())
    )
    d = x - target
    naive_huber = torch.where(d.abs() <= 1, d**2 / 2, d.abs() - 0.5)
    out = sel.huber(x, target)
    torch.testing.assert_close(out, naive_huber, rtol=1e-15, atol=0)
    got = torch.autograd.grad(out, (x, target), gy)
    torch.testing.assert_close(got, torch.autograd.grad(naive_huber, (x, target), gy))
    # the gradient's vmap and double-backward paths keep torch.where's semantics
    eye = torch.eye(8, dtype=torch.float64)
    xs = x[:8].detach().requires_grad_()
    (batched,) = torch.autograd.grad(sel.elu(xs), xs, eye, is_grads_batched=True)
    torch.testing.assert_close(batched, torch.diag(torch.where(xs > 0, 1.0, torch.exp(xs))))
    (gx,) = torch.autograd.grad(sel.elu(xs).sum(), xs, create_graph=True)
    (hx,) = torch.autograd.grad(gx.sum(), xs)
    torch.testing.assert_close(hx, torch.where(xs > 0, 0.0, torch.exp(xs)))


HYPOT_SPEC = """\
module: hyp
functions:
  norm2:
    inputs: {x: {}, y: {}}
    output: sqrt(x**2 + y**2)
"""


def test_second_derivatives_of_hypot_stay_finite_where_its_cube_overflows(generate_module):
    """The graph-free second order shares hypot(x, y) as a temporary; x*y/hypot**3 must
    still be computed as ratios (hypot**3 overflows for |x| > 1e102)."""
    m = generate_module(HYPOT_SPEC)
    x = torch.tensor([3e200, -3.0, 1e-300], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([4e200, 4.0, 2e-300], dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(m.norm2(x, y).sum(), x, create_graph=True)
    hxx, hxy = torch.autograd.grad(gx.sum(), (x, y))  # the last step: graph-free code
    h = torch.hypot(x, y).detach()
    xd, yd = x.detach(), y.detach()
    torch.testing.assert_close(hxx, (yd / h) ** 2 / h, rtol=1e-14, atol=0)
    torch.testing.assert_close(hxy, -(xd / h) * (yd / h) / h, rtol=1e-14, atol=0)


SOFTPLUS_SPEC = """\
module: sp
functions:
  softplus:
    inputs: {x: {}}
    output: log(1 + exp(x))
  log_x_plus_one:
    inputs: {x: {domain: [0, inf]}}
    output: log(1 + x)
  silu:
    inputs: {x: {}}
    output: x / (1 + exp(-x))
"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_forms_of_log1p_softplus_and_sigmoid_match_the_eager_ops(generate_module, dtype):
    """The fused path compiles log1p as Kahan's log(w) * u / (w - 1), softplus and sigmoid
    from exp(-|x|): within 2 ulp of torch's ops, with the same special values."""
    m = generate_module(SOFTPLUS_SPEC)
    assert "_log1p(" in Path(m.__file__).read_text()  # the graph-free code calls them
    gen = torch.Generator().manual_seed(0)
    exponents = torch.rand(20000, generator=gen, dtype=torch.float64) * 60 - 50
    u = torch.cat([10.0**exponents, -(10.0 ** -exponents.abs()) * 0.999]).to(dtype)
    specials = [0.0, -0.0, torch.finfo(dtype).tiny / 8, -1.0, math.inf, math.nan, -2.0]
    u = torch.cat([u, torch.tensor(specials, dtype=dtype)])
    log1p = torch.compile(m._log1p, dynamic=True, fullgraph=True)
    got = log1p(u)
    # the exact value rounded (glibc's log1p in float64; torch's flushes the smallest
    # subnormals to 0, Kahan's form keeps them)
    want = torch.from_numpy(np.log1p(u.double().numpy())).to(dtype)
    eps, smallest = (
        torch.finfo(dtype).eps,
        torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps,
    )
    torch.testing.assert_close(got, want, rtol=2 * eps, atol=smallest, equal_nan=True)
    assert torch.equal(torch.signbit(got[-7:-5]), torch.signbit(want[-7:-5]))  # -0.0 stays
    x = torch.cat([torch.randn(20000, generator=gen, dtype=dtype) * 50])
    x = torch.cat([x, torch.tensor([0.0, 40.0, -40.0, 1e3, -1e3, 1e-30, math.inf], dtype=dtype)])
    softplus = torch.compile(m._softplus, dynamic=True, fullgraph=True)
    want = torch.nn.functional.softplus(x.double(), threshold=40.0)
    # (compiled float32 exp flushes subnormal results to 0: compared absolutely down there)
    tiny = torch.finfo(dtype).smallest_normal
    torch.testing.assert_close(softplus(x).double(), want, rtol=4 * eps, atol=tiny)
    assert "_sigmoid(" in Path(m.__file__).read_text()
    sigmoid = torch.compile(m._sigmoid, dynamic=True, fullgraph=True)
    x = torch.cat([x, torch.tensor([-math.inf, math.nan, -0.0, -100.0], dtype=dtype)])
    want = torch.sigmoid(x.double())
    torch.testing.assert_close(sigmoid(x).double(), want, rtol=2 * eps, atol=tiny, equal_nan=True)
    # eagerly they are the ops themselves, in place where the caller owns the buffer
    buffer = u.clone()
    assert m._log1p(buffer, overwrite=True) is buffer
    torch.testing.assert_close(buffer, torch.log1p(u), equal_nan=True)
    buffer = x.clone()
    assert m._sigmoid(buffer, overwrite=True) is buffer
    torch.testing.assert_close(buffer, torch.sigmoid(x), equal_nan=True)


def test_upstream_gradient_multiplies_after_the_select_unless_a_branch_is_zero():
    import sympy

    from symgrad.plan import _select_then_scale

    x, grad, y = sympy.symbols("x grad y", real=True)
    both = sympy.Piecewise((grad * x, x > 0), (grad * sympy.exp(x), True))
    assert _select_then_scale(both, frozenset({grad})) == grad * sympy.Piecewise(
        (x, x > 0), (sympy.exp(x), True)
    )
    # a 0 branch stays 0 whatever the upstream gradient (inf * 0 would be NaN)
    zero = sympy.Piecewise((0, x < -745), (grad * x, True))
    assert _select_then_scale(zero, frozenset({grad})) == zero
    # only upstream gradients move: x * where(...) would be inf * 0 at x = inf
    inputs = sympy.Piecewise((y * x, x > 0), (y * 2, True))
    assert _select_then_scale(inputs, frozenset({grad})) == inputs


MISH_SPEC = """\
module: mi
functions:
  mish:
    inputs: {x: {}}
    output: x * tanh(log(1 + exp(x)))
"""


def test_fused_path_computes_its_own_form_where_the_cheapest_compiled_differs(
    generate_module, monkeypatch
):
    """Eager, mish is tanh(softplus(x)) * x (three passes); compiled, the polynomial in
    exp(-|x|) (less arithmetic, one loop either way). Both as accurate; the fused path
    compiles the second, registered for the first."""
    m = generate_module(MISH_SPEC)
    source = Path(m.__file__).read_text()
    assert "_FUSED_FORMS[_mish_forward] = _mish_forward_fused" in source
    assert "Compiled instead by the fused path" in m.Mish.__doc__  # the docstring says so
    assert m._FUSED_FORMS[m._mish_forward] is m._mish_forward_fused
    x = torch.cat(
        [torch.linspace(-30, 30, 601, dtype=torch.float64), torch.tensor([-800.0, 800.0])]
    )
    eager, fused = m._mish_forward(x), m._mish_forward_fused(x)
    torch.testing.assert_close(fused, eager, rtol=1e-15, atol=0)  # each within 2 ulp
    compiled, real_compile = [], torch.compile
    monkeypatch.setattr(
        torch, "compile", lambda fn, **kw: compiled.append(fn) or real_compile(fn, **kw)
    )
    m.use_fused(True)
    try:
        xr = x.clone().requires_grad_()
        out = m.mish(xr)
        # what the fused path compiled (a copy, with a code object of its own), no fallback
        assert compiled[0].__code__ == m._mish_forward_fused.__code__
        entries = [c for (f, _), c in m._compiled.items() if f is m._mish_forward]
        assert entries and m._mish_forward not in entries
        torch.testing.assert_close(out, fused, rtol=1e-15, atol=0)
        (grad,) = torch.autograd.grad(out.sum(), xr)
        torch.testing.assert_close(grad, m._mish_grad_x(x, torch.ones_like(x)))
    finally:
        m.use_fused(False)


def test_eager_code_writes_dsigmoid_as_two_sigmoids_and_compiled_code_keeps_one_exp(
    generate_module,
):
    """torch's sigmoid costs 3 multiplies to its exp's 8: eager silu's gradient is
    s * x * sigmoid(-x) + s with s = sigmoid(x) shared, not exp(-|x|) / (1 + exp(-|x|))**2
    beside a sigmoid (six passes more). Compiled, dsigmoid's one exp is the cheaper, and
    the fused path keeps it. Both agree with mpmath's gradient to float64's last bits,
    far into both tails (|x| = 700: the product of an underflowing and a saturated sigmoid)."""
    m = generate_module(SOFTPLUS_SPEC)  # (its silu)
    eager = inspect.getsource(m._silu_grad_x)
    fused = inspect.getsource(m._silu_grad_x_fused)
    assert "_sigmoid(-x" in eager and "exp" not in eager
    assert "exp_()" in fused and "_sigmoid(-x" not in fused
    x = torch.tensor([-700.0, -40.0, -3.0, -1e-3, 0.0, 2e-7, 1.5, 30.0, 700.0], dtype=torch.float64)
    with mpmath.workdps(50):
        want = torch.tensor(
            [float(mpmath.diff(lambda v: v / (1 + mpmath.exp(-v)), v)) for v in x.tolist()],
            dtype=torch.float64,
        )
    one = torch.ones_like(x)
    for got in (m._silu_grad_x(x, one), m._silu_grad_x_fused(x, one)):
        torch.testing.assert_close(got, want, rtol=4 * torch.finfo(torch.float64).eps, atol=0)
    # The price (docs/stability.md): past x = -709.8 torch.sigmoid is 0, so the
    # eager gradient is 0 where the exact one is -3.2e-306, as aten's silu_backward is;
    # the compiled form keeps it (run eagerly here, less its sigmoid(x) term: 4.5e-309).
    far = torch.tensor([-710.0], dtype=torch.float64)
    assert m._silu_grad_x(far, torch.ones_like(far)).item() == 0.0
    assert torch.ops.aten.silu_backward(torch.ones_like(far), far).item() == 0.0
    torch.testing.assert_close(
        m._silu_grad_x_fused(far, torch.ones_like(far)),
        torch.tensor([-3.17369e-306], dtype=torch.float64),
        rtol=2e-3,
        atol=0,
    )


STUDENT_SPEC = """\
module: st
functions:
  student_t:
    inputs:
      x: {}
      nu: {kind: scalar, default: 3.0, domain: [1, 100]}
    output: loggamma((nu + 1)/2) - loggamma(nu/2) - log(nu*pi)/2 - (nu + 1)/2*log(1 + x**2/nu)
"""


def test_log1p_square_ratio_is_finite_in_every_dtype_and_compiles_without_hypot(generate_module):
    """Student-t's log1p(x**2/nu) is 2 log1p(q * _tan_half_atan(q)): hypot eagerly (any
    dtype, float16 too), a clamp and a sqrt compiled in float32/float64; both agree."""
    m = generate_module(STUDENT_SPEC)
    assert "_tan_half_atan(" in Path(m.__file__).read_text()
    q = torch.tensor([0.0, -1e-30, 1e-4, 0.7, -3.0, 1e8, 3e19, -1e30, 1e300, math.inf, math.nan])
    q = q.double()
    want = torch.where(q.isinf(), q.sign(), q / (1 + torch.hypot(q, torch.ones(()).double())))
    compiled = torch.compile(m._tan_half_atan, dynamic=True, fullgraph=True)
    for dtype in (torch.float32, torch.float64):
        eps = torch.finfo(dtype).eps
        exact = want.to(dtype)
        for got in (m._tan_half_atan(q.to(dtype)), compiled(q.to(dtype))):
            torch.testing.assert_close(got, exact, rtol=2 * eps, atol=0, equal_nan=True)
    # half precision: no clamp bound to overflow it, and the density stays finite
    x = torch.tensor([0.0, 2.0, 300.0, 6e4], dtype=torch.float16)
    got = m.student_t(x)
    torch.testing.assert_close(got, m.student_t(x.double()).half(), rtol=2e-3, atol=0)
    # x = +-inf: the log-density is -inf (q * tan_half_atan(q) = inf), not NaN
    assert torch.equal(
        m.student_t(torch.tensor([math.inf, -math.inf])), -torch.full((2,), math.inf)
    )


EXPM1_SPEC = """\
module: em
functions:
  elu:
    inputs: {x: {}}
    output: Piecewise((x, x > 0), (exp(x) - 1, True))
  artanh:
    inputs: {x: {domain: [-0.99, 0.99]}}
    output: atanh(x)
  log_erfc:
    inputs: {x: {}}
    output: log(1 - erf(x))
"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_expm1_atanh_and_erf_keep_their_digits_near_zero(generate_module, dtype):
    """Inductor's vectorised CPU expm1 is exp(x) - 1 and its atanh log((1+x)/(1-x))/2:
    both give 0 at x = -1e-10; its float32 erf is within 1.5e-7 absolute only. The fused
    path compiles Kahan's forms instead (within 2 ulp of the correctly rounded values,
    special values included) and erf in float64; end to end, fused elu, atanh and
    log(1 - erf(x)) keep the digits of tiny inputs."""
    m = generate_module(EXPM1_SPEC)
    source = Path(m.__file__).read_text()
    assert "_expm1(x" in source and "_atanh(x" in source and "_erf(x" in source
    eps = torch.finfo(dtype).eps
    gen = torch.Generator().manual_seed(1)
    exponents = torch.rand(20000, generator=gen, dtype=torch.float64) * 40 - 38
    x = torch.cat([10.0**exponents, -(10.0**exponents), torch.linspace(-104, 89, 2001).double()])
    x = torch.cat([x, torch.tensor([0.0, -0.0, 800.0, -800.0, math.inf, -math.inf, math.nan])])
    x = x.to(dtype)
    expm1 = torch.compile(m._expm1, dynamic=True, fullgraph=True)
    with np.errstate(over="ignore"):
        want = torch.from_numpy(np.expm1(x.double().numpy())).to(dtype)
    got = expm1(x)
    torch.testing.assert_close(got, want, rtol=2 * eps, atol=0, equal_nan=True)
    assert torch.equal(torch.signbit(got[-7:-5]), torch.signbit(want[-7:-5]))  # -0.0 stays
    a = torch.cat([10.0 ** exponents.clamp(max=-1e-3), -(10.0 ** exponents.clamp(max=-1e-3))])
    a = torch.cat([a, torch.tensor([0.0, -0.0, 1.0, -1.0, 1.5, math.nan])]).to(dtype)
    atanh = torch.compile(m._atanh, dynamic=True, fullgraph=True)
    got = atanh(a)
    with np.errstate(invalid="ignore", divide="ignore"):
        want = torch.from_numpy(np.arctanh(a.double().numpy())).to(dtype)
    torch.testing.assert_close(got, want, rtol=2 * eps, atol=0, equal_nan=True)
    # eagerly they are the ops themselves, in place where the caller owns the buffer
    buffer = x.clone()
    assert m._expm1(buffer, overwrite=True) is buffer
    torch.testing.assert_close(buffer, torch.expm1(x), equal_nan=True)
    erf = torch.compile(m._erf, dynamic=True, fullgraph=True)
    got, want = erf(x), torch.erf(x.double()).to(dtype)  # (torch's float64 erf: 2 ulp)
    torch.testing.assert_close(got, want, rtol=2 * eps, atol=0, equal_nan=True)
    integers = torch.tensor([0, 1, 2, -3])  # erf of an integer tensor: the default dtype
    torch.testing.assert_close(erf(integers), torch.erf(integers))
    for integers in (torch.tensor([0, 1, -3]), torch.tensor([True, False])):
        torch.testing.assert_close(expm1(integers), torch.expm1(integers))
    tiny = torch.tensor([-1e-10, -3e-30, 1e-20, 2.2e-7], dtype=dtype)
    m.use_fused(True)
    try:
        torch.testing.assert_close(m.elu(tiny), torch.expm1(tiny).where(tiny < 0, tiny))
        torch.testing.assert_close(m.artanh(tiny), torch.atanh(tiny))
        torch.testing.assert_close(m.log_erfc(tiny), torch.log1p(-torch.erf(tiny)))
    finally:
        m.use_fused(False)


BCE_SPEC = """\
module: bce
functions:
  bce:
    inputs:
      z: {}
      target: {differentiable: false, domain: [0, 1]}
    output: -(target*log(1/(1 + exp(-z))) + (1 - target)*log(1 - 1/(1 + exp(-z))))
"""


def test_sigmoid_and_softplus_of_a_and_minus_a_share_one_exp_when_compiled(generate_module):
    """bce's softplus(-z) and softplus(z) (and its gradient's sigmoid(-z) and sigmoid(z))
    take exp(-|z|) from z itself when compiled, so inductor computes one exp: the calls
    on -z carry ``negative_of=z``. Compiled and eager agree to rounding, and a hint gives
    the value the call would have without it."""
    m = generate_module(BCE_SPEC)
    source = Path(m.__file__).read_text()
    assert "_softplus(-z, threshold=40.0, negative_of=z)" in source
    assert "_sigmoid(-z, negative_of=z" in source
    gen = torch.Generator().manual_seed(2)
    for dtype in (torch.float32, torch.float64):
        z = torch.randn(5000, generator=gen, dtype=torch.float64).mul_(30).to(dtype)
        z = torch.cat(
            [z, torch.tensor([0.0, -0.0, 800.0, -800.0, math.inf, -math.inf], dtype=dtype)]
        )
        tiny = torch.finfo(dtype).smallest_normal
        eps = torch.finfo(dtype).eps
        for helper in (m._softplus, m._sigmoid):
            compiled = torch.compile(helper, dynamic=True, fullgraph=True)
            torch.testing.assert_close(compiled(-z, negative_of=z), compiled(-z), rtol=0, atol=0)
            want = helper(-z.double())
            torch.testing.assert_close(
                compiled(-z, negative_of=z).double(), want, rtol=4 * eps, atol=tiny
            )
        target = torch.rand(z.shape, generator=gen, dtype=dtype)
        eager = m._bce_forward(z, target), m._bce_grad_z(z, target, torch.ones_like(z))
        compiled = (
            torch.compile(m._bce_forward, dynamic=True, fullgraph=True)(z, target),
            torch.compile(m._bce_grad_z, dynamic=True, fullgraph=True)(
                z, target, torch.ones_like(z)
            ),
        )
        # the loss is a sum of positive terms; its gradient a difference of terms of at
        # most 1 in size, which cancel where sigmoid(z) is near the target
        for got, want, atol in zip(compiled, eager, (tiny, 4 * eps)):
            torch.testing.assert_close(got, want, rtol=4 * eps, atol=atol, equal_nan=True)


def test_mul_into_writes_into_the_buffer_only_where_the_product_fits(generate_module):
    """Graph-free code multiplies the upstream gradient into a buffer it owns after a run-
    time check: same shape and dtype, no autograd recording, no transform. Anywhere else
    (a wider dtype, a larger operand, vmap, batched gradients) a fresh product."""
    m = generate_module(SOFTPLUS_SPEC)
    assert "_mul_into(torch.sigmoid(x), grad)" in Path(m.__file__).read_text()
    x, grad = torch.randn(5), torch.randn(5)
    buffer = torch.sigmoid(x)
    want = buffer * grad
    with torch.no_grad():
        got = m._mul_into(buffer, grad)
        assert got is buffer  # in place
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        for other in (grad.double(), torch.randn(3, 5), 2.0):  # wider, larger, a number
            buffer = torch.sigmoid(x)
            got = m._mul_into(buffer, other)
            assert got is not buffer and torch.equal(buffer, torch.sigmoid(x))
            assert got.dtype == torch.result_type(buffer, other)
            torch.testing.assert_close(got, torch.sigmoid(x) * other)
    buffer = torch.sigmoid(x)
    assert m._mul_into(buffer, grad) is not buffer  # grad mode records: never in place
    # vmap over the gradient (functorch), and autograd's batched gradients
    xr = x.clone().requires_grad_()
    out = m.softplus(xr)
    grads = torch.randn(4, 5)
    (batched,) = torch.autograd.grad(out, xr, grads, is_grads_batched=True, retain_graph=True)
    torch.testing.assert_close(batched, grads * torch.sigmoid(x))
    vjp = torch.func.vjp(m.softplus, x)[1]
    (mapped,) = torch.func.vmap(vjp)(grads)
    torch.testing.assert_close(mapped, grads * torch.sigmoid(x))
