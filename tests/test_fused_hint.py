"""The fused path tunes its compiled kernels for large tensors, whatever size compiled them.

Compiled for dynamic shapes, a kernel keeps what inductor chose for the size of the call
that compiled it; on a CPU a first call on 1000 elements gave a kernel without threads, run
as such on every size after it (float32, 8M elements on 2 threads: 7.0 ms forward instead of
3.6). The generated ``_run`` marks the tensors of a call that compiles with a size hint.
"""

from __future__ import annotations

import math
import warnings

import pytest

torch = pytest.importorskip("torch")

SPEC = """\
module: hinted
functions:
  softplus:
    inputs: {x: {}}
    output: log(1 + exp(x))
  mul:
    inputs: {x: {}, y: {}}
    output: x*y
"""


@pytest.fixture
def m(generate_module):
    module = generate_module(SPEC)
    yield module
    module.use_fused(False)


def test_size_hint_marks_aliases_of_the_tensors_never_the_tensors(m):
    hint = m._SIZE_HINT
    x = torch.randn(1000, requires_grad=True)
    grad = torch.randn(1000)
    hx, hgrad, flag = m._size_hinted((x, grad, True))
    assert flag is True
    for alias, tensor in ((hx, x), (hgrad, grad)):
        assert alias is not tensor and alias.data_ptr() == tensor.data_ptr()
        assert alias.requires_grad == tensor.requires_grad  # dynamo guards on it
        assert alias._dynamo_hint_overrides == {0: 1000 * math.ceil(hint / 1000)}
        assert not hasattr(tensor, "_dynamo_hint_overrides")  # the caller's: untouched


def test_size_hint_is_one_per_size_so_broadcast_dimensions_agree(m):
    hint = m._SIZE_HINT
    x, y = torch.randn(300, 1000), torch.randn(1000)
    hx, hy = m._size_hinted((x, y))
    want = 1000 * math.ceil(hint / 300_000)
    assert hx._dynamo_hint_overrides == {1: want}  # the 300 stays as it is
    assert hy._dynamo_hint_overrides == {0: want}
    # a square: both dimensions scaled, to about the hint in all
    (hs,) = m._size_hinted((torch.randn(64, 64),))
    assert hs._dynamo_hint_overrides == {0: 64 * 64, 1: 64 * 64}


@pytest.mark.parametrize(
    "args",
    [
        (torch.zeros(1).expand(1 << 24),),  # large already (an expanded view: no memory)
        (torch.empty(0, 5),),  # empty
        (torch.tensor(2.0), 3.0),  # 0-dim and numbers
        (torch.randn(1, 1),),  # nothing larger than 1 to scale
    ],
)
def test_size_hint_leaves_other_calls_as_they_are(m, args):
    assert m._size_hinted(args) is args


def test_only_calls_that_compile_are_hinted(m, monkeypatch):
    """Per math function, the first call of each dtype, device, rank and requires_grad."""
    hinted = []
    real = m._size_hinted
    monkeypatch.setattr(m, "_size_hinted", lambda args: hinted.append(args) or real(args))
    m.use_fused(True)
    x = torch.randn(100)
    with torch.no_grad():
        m.softplus(x)
        m.softplus(torch.randn(50))  # same kind, another size: no new compile
        assert len(hinted) == 1
        m.softplus(x.double())
        m.softplus(torch.randn(3, 4))
    assert len(hinted) == 3
    xr = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(m.softplus(xr).sum(), xr)  # forward (requires_grad) and
    assert len(hinted) == 5  # the backward's math
    torch.testing.assert_close(grad, torch.sigmoid(x))


@pytest.mark.skipif(not torch.backends.openmp.is_available(), reason="a torch build without OpenMP")
def test_a_first_call_on_a_small_tensor_compiles_a_threaded_cpu_kernel(m, monkeypatch):
    """What the hint is for: inductor's CPU kernel for dynamic shapes uses threads only if
    the size that compiled it was large. Without the hint (``_SIZE_HINT`` at 1: nothing is
    marked) the same first call gives a kernel without them."""
    from torch._inductor.utils import run_and_get_code

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:

        def first_call_code(module):
            module.use_fused(True)
            x = torch.randn(1000)
            with torch._inductor.config.patch(fx_graph_cache=False), torch.no_grad():
                out, code = run_and_get_code(module.softplus, x)
            torch.testing.assert_close(out, torch.nn.functional.softplus(x))
            return "\n".join(code)

        assert "#pragma omp parallel" in first_call_code(m)
        m._compiled.clear()  # fresh copies: fresh dynamo caches
        monkeypatch.setattr(m, "_SIZE_HINT", 1)
        assert "#pragma omp parallel" not in first_call_code(m)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(
    "x_shape, y_shape",
    [((300, 1000), (1000,)), ((1000, 1), (1, 50)), ((64, 64), (64,)), ((7,), ())],
)
def test_hinted_compiles_of_broadcast_inputs_match_the_eager_code(m, x_shape, y_shape):
    """Marked dimensions that broadcast against each other (or against unmarked ones)
    compile without a fallback to the eager code, and give its results."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(x_shape, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randn(y_shape, generator=gen, dtype=torch.float64, requires_grad=True)

    def run():
        out = m.mul(x, y)
        return [out, *torch.autograd.grad(out.sum(), (x, y))]

    eager = run()
    m.use_fused(True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "torch.compile unavailable")  # the fallback's
        fused = run()
    assert _ran_compiled(m, m._mul_forward)
    for got, want in zip(fused, eager):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)


def test_more_kinds_of_call_than_dynamos_recompile_limit_all_stay_compiled(m):
    """Dynamo keeps at most 8 compiled versions of a code object (recompile_limit) and,
    under fullgraph=True, fails the ninth; the fused path compiles a copy per kind of call
    (dtype, device, rank, requires_grad), so 12 kinds of call are 12 compiled copies."""
    m.use_fused(True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "torch.compile unavailable")
        for dtype in (torch.float32, torch.float64):
            for rank in (1, 2, 3):
                for requires_grad in (False, True):
                    x = torch.randn((3,) * rank, dtype=dtype, requires_grad=requires_grad)
                    with torch.no_grad():
                        torch.testing.assert_close(m.softplus(x), torch.nn.functional.softplus(x))
    entries = [c for (f, _), c in m._compiled.items() if f is m._softplus_forward]
    assert len(entries) == 12 and m._softplus_forward not in entries


def test_the_hint_is_for_the_broadcast_result(m):
    """An outer product counts as its result; shapes that do not broadcast go as they are
    (the call itself raises)."""
    hx, hy = m._size_hinted((torch.randn(500, 1), torch.randn(1, 500)))  # 500 x 500
    want = 500 * math.ceil((m._SIZE_HINT / 250_000) ** 0.5)
    assert hx._dynamo_hint_overrides == {0: want} and hy._dynamo_hint_overrides == {1: want}
    args = (torch.randn(3), torch.randn(4))
    assert m._size_hinted(args) is args


def test_parameters_go_unhinted_and_stay_compiled(m):
    """Dynamo keeps a Parameter's sizes static; a hint on a size it shares (the upstream
    gradient's) would be a violated constraint and send the call to the eager code."""
    p = torch.nn.Parameter(torch.randn(1000))
    args = (p, torch.randn(1000))
    assert m._size_hinted(args) is args
    m.use_fused(True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "torch.compile unavailable")
        out = m.softplus(p)
        (grad,) = torch.autograd.grad(out.sum(), p)
    torch.testing.assert_close(out, torch.nn.functional.softplus(p))
    torch.testing.assert_close(grad, torch.sigmoid(p.detach()))
    assert _ran_compiled(m, m._softplus_forward) and _ran_compiled(m, m._softplus_grad_x)


def test_a_kind_of_call_past_the_recompile_limit_gets_a_fresh_copy(m):
    """Layouts (transposed, sliced, sizes 0 and 1, ...) recompile within a kind; the ninth
    would be dynamo's hard failure under fullgraph=True: a fresh copy compiles instead."""
    m.use_fused(True)
    base = torch.randn(60, 60)
    views = [base, base.t(), base[::2], base[:, ::2], base[:1], base[:, :1], base[:0]]
    views += [base[1:, 1:].t(), base[::3].t(), base[:, ::3].t(), base[2:, ::2]]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.filterwarnings("error", "torch.compile unavailable")
        for v in views:
            torch.testing.assert_close(m.softplus(v), torch.nn.functional.softplus(v))
    assert _ran_compiled(m, m._softplus_forward)


def test_fresh_copies_are_bounded(m):
    """More layouts than fit, round after round, end in the eager code for that kind (two
    fresh copies at most), and a recompile limit of 0 ends there at once: no endless
    recompiling, no recursion."""
    m.use_fused(True)
    base = torch.randn(40, 40)
    views = [base, base.t(), base[::2], base[:, ::2], base[:1], base[:, :1], base[:0]]
    views += [base[1:, 1:].t(), base[::3].t(), base[:, ::3].t(), base[2:, ::2]]
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(4):
            for v in views:
                torch.testing.assert_close(m.softplus(v), torch.nn.functional.softplus(v))
    ((key, copies),) = m._fresh_copies.items()
    assert copies == 2 and m._compiled[key] is m._softplus_forward
    assert sum("torch.compile unavailable" in str(w.message) for w in caught) == 1
    # The config's own patching API: monkeypatch's undo deletes a config module's
    # attribute under pytest >= 9.2, and every later torch.compile in the process fails.
    with (
        torch._dynamo.config.patch(recompile_limit=0),
        pytest.warns(UserWarning, match="torch.compile unavailable"),
        torch.no_grad(),
    ):
        x = torch.randn(5, dtype=torch.float64)
        torch.testing.assert_close(m.softplus(x), torch.nn.functional.softplus(x))


def test_vmap_runs_the_eager_math_and_leaves_the_compiled_kinds_alone(m):
    """Dynamo does not trace vmap's batched tensors; under a functorch transform the
    fused path runs the eager math, and ordinary calls stay compiled."""
    m.use_fused(True)
    x = torch.randn(8, 100)
    torch.testing.assert_close(torch.func.vmap(m.softplus)(x), torch.nn.functional.softplus(x))
    with torch.no_grad():
        m.softplus(x[0])
    assert _ran_compiled(m, m._softplus_forward)


def test_an_error_of_the_call_itself_raises_and_keeps_the_kind_compiled(m):
    """Shapes that do not broadcast raise as the eager code would (no warning about the
    compiler), and valid calls of the same kind still run compiled."""
    m.use_fused(True)
    with torch.no_grad():
        with warnings.catch_warnings():
            warnings.filterwarnings("error", "torch.compile unavailable")
            with pytest.raises(RuntimeError):
                m.mul(torch.randn(3), torch.randn(4))
        assert not m._compiled  # that call's copy is gone: the next one compiles, hinted
        x, y = torch.randn(5), torch.randn(5)
        torch.testing.assert_close(m.mul(x, y), x * y)
    assert _ran_compiled(m, m._mul_forward)


def _ran_compiled(module, math_fn):
    compiled = [c for (f, _), c in module._compiled.items() if f is math_fn]
    return bool(compiled) and all(c is not math_fn for c in compiled)
