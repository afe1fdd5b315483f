"""symgrad.runtime: the helpers of the generated modules, tested directly, and their copy
into a generated module (exactly the helpers its code uses, with those they use)."""

from __future__ import annotations

import builtins
import inspect
import math
import subprocess
import symtable
import sys
import types
from pathlib import Path

import pytest

from symgrad.runtime import copy_in, names_in, runtime

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ROOT / "symgrad" / "runtime"


# ----------------------------------------------------------------------------- copy-in
def _copied(framework: str, code: str) -> set[str]:
    """The names of the runtime definitions copied for ``code``."""
    source = copy_in(framework, code).source
    return {
        name
        for d in runtime(framework).definitions
        if d.source.lstrip("\n") in source
        for name in d.names
    }


def test_a_helper_comes_with_exactly_what_it_uses_transitively():
    assert _copied("torch", "y = _where(x > 0, x, 0.0)\n") == {
        "_where",
        "_BITS",
        "_transforms_active",
    }
    assert _copied("torch", "y = _erfc(x)\n") == {
        "_erfc",
        "_compute_dtype",
        "_horner",
        "_ERFC_SERIES",
        "_ERF_TAYLOR",
    }
    # _run -> _size_hinted -> _mark_dynamic_hinted (a private API): three levels down
    assert _copied("torch", "y = _run(f, x)\n") == {
        "_run",
        "_fused_enabled",
        "_compiled",
        "_fresh_copies",
        "_FUSED_FORMS",
        "_own_code",
        "_kinds",
        "_size_hinted",
        "_SIZE_HINT",
        "_transforms_active",
        "_recompile_limit_hit",
        "_mark_dynamic_hinted",
    }
    assert _copied("torch", "y = torch.exp(x)\n") == set()
    assert _copied("tensorflow", "g = _reduce_to(g, x)\n") == {"_reduce_to"}


def test_exports_count_as_used_and_imports_are_those_needed():
    copy = copy_in("torch", '__all__ = ["use_fused"]\n')
    assert "def use_fused(" in copy.source and "def _run(" not in copy.source
    assert copy.imports == ()  # use_fused only sets a flag
    assert copy_in("torch", "y = _where(c, a, b) * math.pi\n").imports == (
        "import math",
        "import torch",
    )
    assert set(copy_in("torch", "y = _run(f, x)\n").imports) == {
        "from collections.abc import Callable",
        "import math",
        "import torch",
        "import types",
        "import warnings",
    }
    assert copy_in("tensorflow", "g = _reduce_to(g, x)\n").imports == ("import tensorflow as tf",)


def test_the_copy_keeps_the_runtimes_order_and_text():
    copy = copy_in("torch", "a = _sigmoid(x)\nb = _where(c, a, b)\nc = _run(f, x)\n")
    text = (RUNTIME / "torch_helpers.py").read_text()
    starts = [copy.source.index(f"def {n}(") for n in ("_run", "_where", "_sigmoid")]
    assert starts == sorted(starts)
    where = text[text.index("#: Integer dtypes") : text.index("def _kahan_log1p")].rstrip()
    assert where in copy.source  # with its comments, as written
    assert copy == copy_in("torch", "c = _run(f, x)\nb = _where(c, a, b)\na = _sigmoid(x)\n")


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_every_helper_copied_alone_is_complete(framework):
    """Whatever a module uses, its copy defines every global name the copied code reads."""
    rt = runtime(framework)
    for definition in rt.definitions:
        for name in definition.names:
            copy = copy_in(framework, f"{name}\n")
            module = "\n".join(copy.imports) + "\n" + copy.source
            missing = _free_globals(module) - set(dir(builtins))
            assert not missing, f"{name}: the copy lacks {sorted(missing)}"


def _free_globals(source: str) -> set[str]:
    """Global names that ``source`` reads and never binds."""
    top = symtable.symtable(source, "<copy>", "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    read: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        tables += table.get_children()
        read |= {
            s.get_name()
            for s in table.get_symbols()
            if s.is_referenced() and (s.is_global() or table is top)
        }
    return read - bound


def test_names_in_reads_names_and_exports():
    code = '__all__ = ["f", "use_fused"]\n\n\ndef f(x):\n    return _run(_g, x.t)\n'
    assert {"use_fused", "_run", "_g", "x"} <= names_in(code)
    assert "t" not in names_in(code)  # an attribute, not a name


def test_the_runtime_needs_neither_sympy_nor_the_rest_of_symgrad():
    """Copying needs no framework; the torch runtime imports torch and itself alone."""
    code = (
        "import sys\n"
        "from symgrad.runtime import copy_in\n"
        "copy_in('torch', 'y = _run(f, x)')\n"
        "assert 'torch' not in sys.modules and 'tensorflow' not in sys.modules\n"
        "import symgrad.runtime.torch_helpers\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('sympy', 'mpmath', 'jinja2')\n"
        "       or (m.startswith('symgrad') and m not in (\n"
        "           'symgrad', 'symgrad.runtime', 'symgrad.runtime.torch_helpers',\n"
        "           'symgrad.runtime.torch_private', 'symgrad.runtime.shared_helpers'))]\n"
        "assert not bad, bad\n"
    )
    pytest.importorskip("torch")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_series_constants_are_symgrads_series():
    """The runtime holds the coefficients as numbers; symgrad.series derives them."""
    from symgrad import series
    from symgrad.runtime import torch_helpers as rt

    assert rt._EXPM1_TAYLOR == series.expm1_taylor()
    assert rt._ERFC_SERIES == series.erfc_chebyshev()
    assert rt._ERF_TAYLOR == series.erf_taylor()
    text = (RUNTIME / "torch_helpers.py").read_text()
    # the float32 cut-offs, thresholds and scale written in the code
    for written in (
        f"_EXPM1_TAYLOR[:{series.EXPM1_TAYLOR_TERMS_FLOAT32}]",
        f"_ERFC_SERIES[:{series.ERFC_TERMS_FLOAT32}]",
        f"_ERF_TAYLOR[:{series.ERF_TAYLOR_TERMS_FLOAT32}]",
        f"torch.abs(x) < {series.EXPM1_TAYLOR_BELOW}",
        f"a < {series.ERF_TAYLOR_BELOW}",
        f"(a - {series.ERFC_SCALE}) / (a + {series.ERFC_SCALE})",
    ):
        assert written in text, written


# ----------------------------------------------------------------------------- private APIs
torch = pytest.importorskip("torch")

from symgrad.runtime import torch_helpers as rt  # noqa: E402
from symgrad.runtime import torch_private  # noqa: E402


def _fresh_private() -> types.ModuleType:
    """torch_private executed anew (its module-level look-ups done again), leaving the
    imported one as it is."""
    module = types.ModuleType("torch_private_fresh")
    exec(compile(inspect.getsource(torch_private), "torch_private", "exec"), module.__dict__)
    return module


def test_transforms_active_says_whether_a_functorch_transform_runs():
    assert not torch_private._transforms_active()
    seen = []
    torch.func.vmap(lambda t: seen.append(torch_private._transforms_active()) or t)(
        torch.ones(2, 3)
    )
    assert seen == [True]


def test_transforms_active_falls_back_to_yes(monkeypatch):
    """Without torch._C's query, a transform is taken to run: no in-place tricks."""
    monkeypatch.delattr(torch._C, "_are_functorch_transforms_active")
    assert _fresh_private()._transforms_active() is True


def test_recompile_limit_hit_recognises_dynamos_error(monkeypatch):
    limit = torch._dynamo.exc.FailOnRecompileLimitHit
    assert torch_private._recompile_limit_hit(limit("past the limit"))
    assert not torch_private._recompile_limit_hit(RuntimeError("past the limit"))
    monkeypatch.delattr(torch._dynamo.exc, "FailOnRecompileLimitHit")
    assert not torch_private._recompile_limit_hit(limit("past the limit"))  # fallback: never


def test_mark_dynamic_hinted_marks_with_the_hint_or_says_it_cannot(monkeypatch):
    x = torch.randn(10, 3)
    assert torch_private._mark_dynamic_hinted(x, 0, 1000)
    assert x._dynamo_hint_overrides == {0: 1000}
    # torch 2.8 and older: mark_dynamic has no hint_override
    monkeypatch.setattr(
        torch._dynamo, "mark_dynamic", lambda t, index: setattr(t, "_marked", index)
    )
    y = torch.randn(10, 3)
    assert not torch_private._mark_dynamic_hinted(y, 0, 1000)
    assert not hasattr(y, "_marked")


def test_without_hints_the_call_goes_unhinted(monkeypatch):
    args = (torch.randn(1000), torch.randn(1000))
    assert rt._size_hinted(args) is not args
    monkeypatch.setattr(rt, "_mark_dynamic_hinted", lambda t, dim, hint: False)
    assert rt._size_hinted(args) is args


# ----------------------------------------------------------------------------- Functions
class _Square(rt._Function):
    @staticmethod
    def forward(x):
        return rt._run(_square_math, x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return rt._grad(ctx.needs_input_grad[0], _SquareGrad, _TracedSquareGrad, x, grad)

    @staticmethod
    def jvp(ctx, x_t):
        (x,) = ctx.saved_tensors
        return 2 * x * x_t


def _square_math(x):
    return x * x


class _SquareGrad(rt._Function):
    @staticmethod
    def forward(x, grad):
        return 2 * x * grad

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.save_for_forward(*inputs)

    @staticmethod
    def backward(ctx, grad_grad_x):
        x, grad = ctx.saved_tensors
        return 2 * grad * grad_grad_x, 2 * x * grad_grad_x

    @staticmethod
    def jvp(ctx, x_t, grad_t):
        x, grad = ctx.saved_tensors
        return 2 * grad * x_t + 2 * x * grad_t


_TracedSquare = rt._without_jvp(_Square)
_TracedSquareGrad = rt._without_jvp(_SquareGrad)


def _square(x):
    return rt._apply(_Square, _TracedSquare, x)


def test_function_base_caches_the_signature_and_generates_vmap():
    assert _Square.forward.__signature__ == inspect.signature(_square_math)
    assert _Square.generate_vmap_rule
    x = torch.randn(4, 3, dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(_square)(x), x * x)


def test_without_jvp_is_the_function_less_its_jvp():
    assert issubclass(_TracedSquare, _Square) and _TracedSquare.__name__ == "__Square"
    assert _TracedSquare.jvp is torch.autograd.Function.jvp
    assert _Square.jvp is not torch.autograd.Function.jvp


def test_apply_and_grad_give_every_order_and_forward_mode():
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_square, (x,), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(_square, (x,), check_fwd_over_rev=True)
    # create_graph=False: the gradient Function's forward alone, no graph
    (g,) = torch.autograd.grad(_square(x).sum(), x)
    assert g.grad_fn is None
    (g,) = torch.autograd.grad(_square(x).sum(), x, create_graph=True)
    assert type(g.grad_fn).__name__ == "_SquareGradBackward"


def test_grad_is_none_where_not_needed():
    assert rt._grad(False, _SquareGrad, _TracedSquareGrad, torch.ones(1), torch.ones(1)) is None


def test_apply_gives_torch_compile_the_function_without_jvp():
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(lambda t: _square(t).sum(), fullgraph=True, dynamic=False)
    (g,) = torch.autograd.grad(compiled(x), x)
    torch.testing.assert_close(g, 2 * x.detach())


def test_sum_to():
    assert rt._sum_to(None, torch.Size([3])) is None
    torch.testing.assert_close(
        rt._sum_to(torch.ones(2, 3), torch.Size([1, 3])), 2 * torch.ones(1, 3)
    )


# ----------------------------------------------------------------------------- the fused path
def test_use_fused_turns_the_fused_path_on_and_off(monkeypatch):
    monkeypatch.setattr(rt, "_fused_enabled", False)
    rt.use_fused()
    assert rt._fused_enabled
    rt.use_fused(False)
    assert not rt._fused_enabled


def test_kinds_are_what_compiled_code_is_specialised_on():
    x = torch.randn(3)
    assert rt._kinds((x, True, 2.0)) == (
        (torch.Tensor, torch.float32, x.device, 1, False),
        True,
        None,
    )
    assert rt._kinds((x.double(),)) != rt._kinds((x,))


def test_own_code_is_the_function_with_a_code_object_of_its_own():
    def f(a, b=2, *, c=3):
        return a + b + c

    g = rt._own_code(f)
    assert g.__code__ is not f.__code__ and g(1) == f(1) == 6 and g(1, c=0) == 3


def test_size_hint_is_for_large_tensors_of_one_broadcast_shape():
    x, y = torch.randn(10, 1), torch.randn(1, 100)
    hx, hy = rt._size_hinted((x, y))
    assert hx is x  # no dimension of the largest size: as it is
    assert hy is not y and hy._dynamo_hint_overrides == {1: 100 * math.ceil(rt._SIZE_HINT / 1000)}
    args = (torch.randn(3), torch.randn(4))
    assert rt._size_hinted(args) is args  # no broadcast shape: the call will say so


def test_run_runs_the_math_eagerly_unless_fused(monkeypatch):
    monkeypatch.setattr(rt, "_fused_enabled", False)
    monkeypatch.setattr(rt, "_compiled", {})
    calls = []

    def math_fn(x):
        calls.append(x)
        return x + 1

    assert torch.equal(rt._run(math_fn, torch.zeros(2)), torch.ones(2))
    assert len(calls) == 1 and not rt._compiled


# ----------------------------------------------------------------------------- in-place helpers
def _bits_equal(a, b):
    bits = rt._BITS[a.dtype]
    return a.dtype == b.dtype and torch.equal(a.view(bits), b.view(bits))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_where_selects_bit_for_bit_and_writes_into_an_owned_branch(dtype):
    cond = torch.tensor([True, False, True, False, True])
    a = torch.tensor([1.0, math.inf, -0.0, math.nan, 2.0], dtype=dtype)
    b = torch.tensor([math.nan, -3.0, 5.0, 0.0, math.inf], dtype=dtype)
    with torch.no_grad():
        expected = torch.where(cond, a, b)
        assert _bits_equal(rt._where(cond, a, b), expected)
        owned = a.clone()
        got = rt._where(cond, owned, b, overwrite="a")
        assert _bits_equal(got, expected) and got.data_ptr() == owned.data_ptr()
        assert _bits_equal(rt._where(cond, a, 0.0), torch.where(cond, a, 0.0))
        assert _bits_equal(rt._where(cond, -0.0, b), torch.where(cond, -0.0, b))


def test_where_is_torch_where_where_autograd_records():
    x = torch.randn(5, requires_grad=True)
    out = rt._where(x > 0, x, 0.0)
    assert out.grad_fn is not None
    torch.testing.assert_close(out, torch.where(x > 0, x, 0.0))


def test_mul_into_writes_into_the_buffer_only_where_the_product_fits():
    with torch.no_grad():
        buffer, other = torch.full((3,), 2.0), torch.full((3,), 3.0)
        out = rt._mul_into(buffer, other)
        assert out.data_ptr() == buffer.data_ptr() and torch.equal(out, torch.full((3,), 6.0))
        small, wide = torch.ones(1), torch.ones(3)
        out = rt._mul_into(small, wide)  # broadcast: a fresh product
        assert out.shape == (3,) and out.data_ptr() != small.data_ptr()
    x = torch.ones(3, requires_grad=True)
    buffer = torch.ones(3)
    assert rt._mul_into(buffer, x).data_ptr() != buffer.data_ptr()  # autograd records


def test_check_broadcast_names_the_function_and_the_shapes():
    rt._check_broadcast("f", x=torch.ones(3), y=torch.ones(1))  # these broadcast: no error
    with pytest.raises(
        RuntimeError, match=r"f\(\): the inputs do not broadcast: x \(3,\), y \(4,\)"
    ):
        rt._check_broadcast("f", x=torch.ones(3), y=torch.ones(4))


# ----------------------------------------------------------------------------- compiled forms
def test_compiled_forms_match_the_eager_ops():
    """Each op's form for compiled code (the fused path) against torch's eager op, near 0
    and far from it, where inductor's own form loses digits or speed."""
    x = torch.tensor([-30, -5, -0.7, -1e-10, 0, 3e-8, 0.3, 0.49, 0.6, 4, 20], dtype=torch.float64)
    u = x.abs()  # log1p's argument
    s = x.clamp(-0.99, 0.99)  # atanh's

    def forms(x, u, s):
        return (
            rt._expm1(x),
            rt._erf(x),
            rt._erfc(x),
            rt._log1p(u),
            rt._atanh(s),
            rt._sigmoid(x),
            rt._softplus(x),
            rt._tan_half_atan(x),
        )

    eager = forms(x, u, s)
    expected = (
        torch.expm1(x),
        torch.erf(x),
        torch.erfc(x),
        torch.log1p(u),
        torch.atanh(s),
        torch.sigmoid(x),
        torch.nn.functional.softplus(x, threshold=40.0),
        x / (1 + torch.hypot(x, torch.ones(()))),
    )
    compiled = torch.compile(forms, fullgraph=True, dynamic=False)(x, u, s)
    for got, ours, want in zip(compiled, eager, expected):
        torch.testing.assert_close(ours, want, rtol=0, atol=0)
        torch.testing.assert_close(got, want, rtol=1e-15, atol=0)
    # float32: the compiled erf and expm1 keep their digits near 0
    x32 = x.float()
    got = torch.compile(lambda t: (rt._erf(t), rt._expm1(t)), fullgraph=True, dynamic=False)(x32)
    torch.testing.assert_close(got[0], torch.erf(x32), rtol=2e-7, atol=0)
    torch.testing.assert_close(got[1], torch.expm1(x32), rtol=2e-7, atol=0)


def test_eager_forms_update_an_owned_tensor_in_place():
    with torch.no_grad():
        for fn in (rt._expm1, rt._erf, rt._erfc, rt._log1p, rt._atanh, rt._sigmoid):
            t = torch.full((3,), 0.25)
            out = fn(t, overwrite=True)
            assert out.data_ptr() == t.data_ptr()


def test_broadcast_result_has_the_shape_and_dtype_of_the_formula_as_written():
    """The result of a formula that lost an input is what ``x * 0 + value`` would be."""
    x = torch.ones(3, 1, dtype=torch.float32)
    y = torch.ones(4, dtype=torch.float64)
    out = rt._broadcast_result(torch.full((4,), 2.0, dtype=torch.float64), x, y)
    assert out.shape == (3, 4) and out.dtype == torch.float64 and out.is_contiguous()
    number = rt._broadcast_result(3, x, y)
    assert number.shape == (3, 4) and number.dtype == torch.float64 and bool((number == 3).all())
    # torch's 0-dim rule: a 0-dim float64 does not widen a float32 tensor
    scalar = torch.tensor(2.0, dtype=torch.float64)
    assert rt._broadcast_result(1.0, x, scalar).dtype == torch.float32
    assert rt._broadcast_result(1.0, x, scalar).dtype == (x * 0 + scalar).dtype
    same = torch.zeros(3, 4, dtype=torch.float64)
    assert rt._broadcast_result(same, same) is same  # already right: no copy


# ----------------------------------------------------------------------------- roots
#: (p, q): x**(p/q) for exponents no float holds, each sign of trunc(p/q) and of p.
_ROOT_EXPONENTS = [
    (1, 3),
    (-1, 3),
    (2, 3),
    (-2, 3),
    (4, 3),
    (-5, 3),
    (7, 3),
    (1, 10),
    (3, 10),
    (5, 6),
]


def _root_power_errors(root_power, dtype: str, to_array, p: int, q: int) -> tuple[float, float]:
    """The largest error in ulps of ``root_power(x, p, q)`` and of plain pow over x from
    tiny to huge, against mpmath."""
    import mpmath
    import numpy as np

    from symgrad.numerics.floats import round_to, ulp_distance

    top = 700 if dtype == "float64" else 85
    xs = np.exp(np.linspace(-top, top, 301)).astype(dtype)
    xs = np.concatenate([xs, np.array([0.5, 1, 2, 3, 8, 27, 1000], dtype=dtype)])
    got = np.asarray(root_power(to_array(xs), p, q), dtype=np.float64)
    with mpmath.workprec(200):
        exact = [round_to(float(mpmath.mpf(float(x)) ** (mpmath.mpf(p) / q)), dtype) for x in xs]
    with np.errstate(over="ignore"):
        pow_ = np.power(xs.astype(np.float64), float(np.dtype(dtype).type(p / q)))
    # normal values only: TF flushes subnormal results to zero
    normal = [k for k, e in enumerate(exact) if e == 0 or abs(e) >= np.finfo(dtype).tiny]
    ours = max(ulp_distance(float(got[k]), exact[k], dtype) for k in normal)
    plain = max(ulp_distance(float(round_to(pow_[k], dtype)), exact[k], dtype) for k in normal)
    return ours, plain


def _special_root_values(root_power, to_array) -> None:
    """0, inf and negative x as pow gives them."""
    import numpy as np

    xs = np.array([0.0, np.inf, -8.0, -0.0])
    for p, q in _ROOT_EXPONENTS:
        got = np.asarray(root_power(to_array(xs), p, q), dtype=np.float64)
        with np.errstate(all="ignore"):
            want = np.power(xs, p / q)
        np.testing.assert_array_equal(got, want, err_msg=f"{p}/{q}")


def _root_power_implementations():
    """(name, helper, array maker): the torch and TF helpers and the NumPy model."""
    import numpy as np

    from symgrad.numerics.native import root_power

    yield "torch", rt._root_power, torch.from_numpy
    yield "numpy", root_power, np.asarray
    tf = pytest.importorskip("tensorflow")
    from symgrad.runtime import tf_helpers

    yield "tensorflow", tf_helpers._root_power, tf.constant


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_root_power_is_within_a_few_ulps_where_pow_is_not(dtype):
    """x**(p/q) by the generated modules' helpers (torch, TF) and the NumPy model of the
    accuracy choice: pow's root and a Newton step, then integer powers. pow's own rounded
    exponent is 114 ulps off for x**(1/3) at x = 1e296 (float64)."""
    for name, root_power, to_array in _root_power_implementations():
        plain_worst = 0.0
        for p, q in _ROOT_EXPONENTS:
            ours, plain = _root_power_errors(root_power, dtype, to_array, p, q)
            s = abs(p - int(p / q) * q)  # root**s: the root's error s times
            assert ours <= s + 2, (name, p, q, ours)
            plain_worst = max(plain_worst, plain)
            if dtype == "float64":
                assert plain >= 20, (p, q, plain)  # where the rounded exponent shows
        assert plain_worst >= 10
        _special_root_values(root_power, to_array)


# ----------------------------------------------------------------------------- TensorFlow
def test_tf_helpers():
    tf = pytest.importorskip("tensorflow")
    from symgrad.runtime import tf_helpers

    grad = tf.ones((3, 4), dtype=tf.float64)
    reduced = tf_helpers._reduce_to(grad, tf.zeros((1, 4), dtype=tf.float64))
    assert reduced.shape == (1, 4) and float(tf.reduce_sum(reduced)) == 12.0
    tf_helpers._check_broadcast("f", x=tf.ones(3), y=tf.ones(1))
    with pytest.raises(ValueError, match=r"f\(\): the inputs do not broadcast: x \(3,\), y \(4,\)"):
        tf_helpers._check_broadcast("f", x=tf.ones(3), y=tf.ones(4))
    spread = tf_helpers._broadcast_result(3, tf.ones((3, 1), tf.float64), tf.ones(4, tf.float64))
    assert spread.shape == (3, 4) and spread.dtype == tf.float64
    assert float(tf.reduce_sum(spread)) == 36.0
