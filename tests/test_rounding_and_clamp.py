"""round, floor, ceil, trunc and clamp: parsed, printed, evaluated and generated.

Conventions pinned here: rounding functions have derivative 0 everywhere (torch.round's
zero gradient; a straight-through estimator overrides it with ``gradient:``), ``round``
ties to even (torch.round, tf.math.round), and clamp, also written
``Min(Max(e, lo), hi)`` with numbers lo < hi, has torch.clamp's gradients: x gets it on
the closed interval lo <= x <= hi (F.hardsigmoid's own backward uses the open one).
"""

from __future__ import annotations

import inspect

import mpmath
import numpy as np
import pytest
import sympy
from conftest import ROOT, import_file, run_generated_suite

from symgrad import functions as F
from symgrad.cost import OP_COST
from symgrad.errors import Location
from symgrad.expr import FUNCTIONS, parse_formula
from symgrad.numerics.mp import evaluate, exact
from symgrad.numerics.native import evaluator as _evaluator
from symgrad.numerics.native import stable_numpy
from symgrad.ops import BY_CLASS
from symgrad.plan import _TORCH_INPLACE
from symgrad.printers import TensorFlowPrinter, TorchPrinter
from symgrad.printers.base import FrameworkPrinter

x, y, lo, hi, b = sympy.symbols("x y lo hi b", real=True)
SYMBOLS = {"x": x, "y": y, "lo": lo, "hi": hi, "b": b}
WHERE = Location("/specs/s.yaml", 3, "f")
HALF = sympy.S.Half

#: spec name -> SymPy class and the torch op it prints as
NEW = {
    "round": (F.round, "torch.round"),
    "floor": (F.floor, "torch.floor"),
    "ceil": (F.ceil, "torch.ceil"),
    "trunc": (F.trunc, "torch.trunc"),
    "clamp": (F.clamp, "torch.clamp"),
}
TIES = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5]
TIES_EVEN = [0.0, 2.0, 2.0, -0.0, -2.0, -2.0]


def parse(text):
    return parse_formula(text, SYMBOLS, WHERE)


# ------------------------------------------------------------------------------ tables
@pytest.mark.parametrize("name", NEW)
def test_every_table_has_the_primitive(name):
    """A primitive lives in several tables keyed by name: each new one is in all of them."""
    cls, torch_op = NEW[name]
    key = cls.__name__
    assert FUNCTIONS[name][0] is cls
    assert BY_CLASS[cls].spelled == (name,)  # its row in the registry (symgrad.ops)
    assert key in OP_COST
    assert key in stable_numpy()
    assert torch_op in _TORCH_INPLACE  # in-place form of the generated code
    for printer in (TorchPrinter, TensorFlowPrinter):
        assert key in printer.functions or hasattr(printer, f"_print_{key}")
    # Python numbers (expressions of scalar inputs only)
    assert key in FrameworkPrinter.math_functions or key in FrameworkPrinter.scalar_formats
    torch = pytest.importorskip("torch")
    op_costs = import_file(ROOT / "benchmarks" / "op_costs.py")  # measures the OP_COST weights
    t = torch.ones(2)
    assert key in op_costs.ops(t, t, torch.empty(2))


# ------------------------------------------------------------------------------ parsing
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("round(x)", F.round(x)),
        ("floor(x)", F.floor(x)),
        ("ceil(x)", F.ceil(x)),
        ("trunc(x)", F.trunc(x)),
        ("clamp(x, lo, hi)", F.clamp(x, lo, hi)),
        ("clamp(x, -1, 2)", F.clamp(x, -1, 2)),
        ("Min(Max(x/6 + 1/2, 0), 1)", F.clamp(x / 6 + HALF, 0, 1)),
        ("Max(Min(x, 1), -1)", F.clamp(x, -1, 1)),
        ("Max(-1, Min(1, x))", F.clamp(x, -1, 1)),
        # the number factor moves into the clamp: x*6 overflows where x*(6/6) does not
        ("x*Min(Max(x + 3, 0), 6)/6", x * F.clamp(x / 6 + HALF, 0, 1)),
        ("-2*clamp(x, 0, 1)", -F.clamp(2 * x, 0, 2)),
        # not a clamp: bounds that are inputs, or lo >= hi (SymPy's Min/Max as written)
        ("Min(Max(x, lo), 1)", sympy.Min(sympy.Max(x, lo), 1)),
        ("Min(Max(x, 1), 0)", sympy.S.Zero),
        ("Min(Max(x, 0), y)", sympy.Min(sympy.Max(x, 0), y)),
    ],
)
def test_parses(text, expected):
    assert parse(text) == expected


def test_numbers_round_exactly():
    assert [parse(f"round({v})") for v in TIES] == [int(v) for v in TIES_EVEN]
    assert parse("floor(-2.5) + ceil(-2.5) + trunc(-2.5) + trunc(2.5)") == -3 - 2 - 2 + 2
    assert parse("clamp(7, 0, 6)") == 6 and parse("clamp(1, 2, 0)") == 0  # hi where lo > hi


def test_derivatives():
    for name in ("round", "floor", "ceil", "trunc"):
        assert sympy.diff(parse(f"{name}(x**2)"), x) == 0
    inside = sympy.Piecewise((1, (x >= -3) & (x <= 3)), (0, True))
    assert sympy.diff(parse("Min(Max(x/6 + 1/2, 0), 1)"), x) == inside / 6  # on x: no u
    c = parse("clamp(x, lo, hi)")
    assert sympy.diff(c, x) == sympy.Piecewise((1, (x >= lo) & (x <= hi)), (0, True))
    assert sympy.diff(c, lo) == sympy.Piecewise((1, (x < lo) & (lo < hi)), (0, True))
    assert sympy.diff(c, hi) == sympy.Piecewise((1, (x > hi) | (lo > hi)), (0, True))
    assert sympy.diff(c, x, 2) == 0


# ------------------------------------------------------------------------------ evaluation
def test_round_ties_to_even_in_every_evaluation():
    """mpmath (references), NumPy (the accuracy choice) and SymPy numbers agree with
    torch.round: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> -0."""
    for v, want in zip(TIES, TIES_EVEN):
        with mpmath.workprec(64):
            assert evaluate(F.round(x), {x: mpmath.mpf(v)}) == want
        assert exact(F.round(x), {x: v}) == want  # the generated tests' reference values
        assert F.round(sympy.Float(v)) == int(want)
    numpy_round = _evaluator(F.round(x), [x])
    assert list(numpy_round(np.array(TIES))) == TIES_EVEN


@pytest.mark.parametrize(
    ("expr", "at", "want"),
    [
        (F.floor(x), -2.5, -3),
        (F.ceil(x), -2.5, -2),
        (F.trunc(x), -2.5, -2),
        (F.trunc(x), 2.5, 2),
        (F.clamp(x, lo, hi), (5, 0, 1), 1),
        (F.clamp(x, lo, hi), (0.5, 1, 0), 0),  # lo > hi: hi, as torch.clamp
    ],
)
def test_mpmath_and_numpy_values(expr, at, want):
    at = at if isinstance(at, tuple) else (at,)
    syms = [x, lo, hi][: len(at)]
    with mpmath.workprec(64):
        assert evaluate(expr, {s: mpmath.mpf(v) for s, v in zip(syms, at)}) == want
    assert _evaluator(expr, syms)(*at) == want


# ------------------------------------------------------------------------------ printers
# expr -> (torch, tensorflow); b is a scalar input (a Python float at run time)
PINNED = [
    (F.round(x), "torch.round(x)", "tf.math.round(x)"),
    (F.floor(x), "torch.floor(x)", "tf.math.floor(x)"),
    (F.ceil(x), "torch.ceil(x)", "tf.math.ceil(x)"),
    (F.trunc(x), "torch.trunc(x)", "tf.where(x < 0, tf.math.ceil(x), tf.math.floor(x))"),
    (
        F.trunc(x / y) ** 2,
        "torch.trunc(x/y)**2",
        "tf.math.square(tf.where(x/y < 0, tf.math.ceil(x/y), tf.math.floor(x/y)))",
    ),
    (
        F.clamp(x / 6 + HALF, 0, 1),
        "torch.clamp(x/6 + 0.5, min=0, max=1)",
        "tf.clip_by_value(x/6 + 0.5, 0.0, 1.0)",
    ),
    (
        F.clamp(x, b, 2),
        "torch.clamp(x, min=b, max=2)",
        "tf.math.minimum(tf.math.maximum(x, b), 2.0)",
    ),
    (F.clamp(x, lo, hi), "torch.clamp(x, lo, hi)", "tf.math.minimum(hi, tf.math.maximum(lo, x))"),
    # torch.clamp takes number bounds or tensor bounds, not one of each
    (
        F.clamp(x, lo, 1),
        "torch.clamp(torch.maximum(lo, x), max=1)",
        "tf.math.minimum(tf.math.maximum(lo, x), 1.0)",
    ),
    # lo > hi: hi, as torch.clamp (TF's clip_by_value gives lo)
    (
        F.clamp(x, 1, 0),
        "torch.clamp(x, min=1, max=0)",
        "tf.math.minimum(tf.math.maximum(x, 1.0), 0.0)",
    ),
    (F.round(b) + F.clamp(b, 0, 1), "min(max(b, 0), 1) + round(b)", "min(max(b, 0), 1) + round(b)"),
    (F.floor(b) + F.ceil(b) + F.trunc(b), "math.ceil(b) + math.floor(b) + math.trunc(b)", None),
]


@pytest.mark.parametrize(("expr", "torch_src", "tf_src"), PINNED, ids=[str(p[0]) for p in PINNED])
def test_pinned(expr, torch_src, tf_src):
    assert TorchPrinter(scalars=[b]).doprint(expr) == torch_src
    assert TensorFlowPrinter(scalars=[b]).doprint(expr) == (tf_src or torch_src)


def test_tensorflow_source_runs():
    tf = pytest.importorskip("tensorflow")
    values = [-2.5, -0.5, -0.0, 0.5, 1.5, 2.5, 7.0]
    t = tf.constant(values, tf.float64)
    env = {"tf": tf, "x": t, "lo": tf.constant(-1.0, tf.float64), "hi": tf.zeros((), tf.float64)}
    for expr, fn in [
        (F.round(x), np.rint),
        (F.trunc(x), np.trunc),
        (F.clamp(x, 0, 6), lambda v: np.clip(v, 0, 6)),
        (F.clamp(x, lo, hi), lambda v: np.clip(v, -1, 0)),
        (F.clamp(x, hi, lo), lambda v: np.full_like(v, -1.0)),  # lo > hi: hi
    ]:
        got = eval(TensorFlowPrinter().doprint(expr), env).numpy()
        np.testing.assert_array_equal(got, fn(np.array(values)))
    assert list(np.signbit(eval(TensorFlowPrinter().doprint(F.trunc(x)), env).numpy())) == list(
        np.signbit(np.trunc(values))
    )


# ------------------------------------------------------------------------------ generated code
SPEC = """\
module: ops
functions:
  clamp_numbers:
    inputs: {x: {}}
    output: clamp(x, -1, 2)
  clamp_tensors:
    inputs: {x: {}, lo: {}, hi: {}}
    output: clamp(x, lo, hi)
  clamp_scalars:
    inputs:
      x: {}
      lo: {kind: scalar, default: -1.0}
      hi: {kind: scalar, default: 2.0}
    output: clamp(x, lo, hi)
  hard_sigmoid:
    inputs: {x: {}}
    output: Min(Max(x/6 + 1/2, 0), 1)
  hard_swish:
    inputs: {x: {}}
    output: x*Min(Max(x + 3, 0), 6)/6
  rounded:
    inputs: {x: {}}
    output: round(x)
  ste_round:
    inputs: {x: {}}
    output: round(x)
    gradient:
      x: grad
"""
#: x at the ends, inside and outside of clamp(x, -1, 2)
AT_ENDS = [-3.0, -1.0, 0.5, 2.0, 4.0]
#: (x, lo, hi): each side, the ends, lo == hi and lo > hi (torch.clamp gives hi there)
TENSOR_CASES = [
    (-2.0, -1.0, 1.0),
    (-1.0, -1.0, 1.0),
    (0.0, -1.0, 1.0),
    (1.0, -1.0, 1.0),
    (2.0, -1.0, 1.0),
    (0.0, 1.0, 1.0),
    (1.0, 1.0, 1.0),
    (2.0, 1.0, 1.0),
    (0.5, 1.0, 0.0),
    (0.5, 1.0, 0.5),
]


@pytest.fixture(scope="module")
def torch_ops(tmp_path_factory):
    return _generated(tmp_path_factory, "torch")


@pytest.fixture(scope="module")
def tf_ops(tmp_path_factory):
    pytest.importorskip("tensorflow")
    return _generated(tmp_path_factory, "tensorflow")


def _generated(tmp_path_factory, target):
    from symgrad.generate import generate
    from symgrad.spec import load_spec

    folder = tmp_path_factory.mktemp(target)
    (folder / "ops.yaml").write_text(SPEC)
    for f in generate(load_spec(folder / "ops.yaml"), targets=(target,), tests=False):
        (folder / f.name).write_text(f.text)
    return import_file(folder / ("ops_torch.py" if target == "torch" else "ops_tf.py"))


def _torch_clamp_grads(*columns):
    """Gradients of torch.clamp's sum at the columns (x, lo, hi), as lists."""
    import torch

    args = [torch.tensor(c, dtype=torch.float64, requires_grad=True) for c in columns]
    torch.clamp(*args).sum().backward()
    return [a.grad.tolist() for a in args]


def test_torch_gradients_are_torch_clamps(torch_ops):
    torch = pytest.importorskip("torch")
    t = torch.tensor(AT_ENDS, dtype=torch.float64, requires_grad=True)
    (want,) = _torch_clamp_grads(AT_ENDS, [-1.0] * 5, [2.0] * 5)[:1]
    assert want == [0.0, 1.0, 1.0, 1.0, 0.0]
    for f in (torch_ops.clamp_numbers, torch_ops.clamp_scalars):
        torch.testing.assert_close(f(t), torch.clamp(t, -1, 2))
        (g,) = torch.autograd.grad(f(t).sum(), t, create_graph=True)
        assert g.tolist() == want
        (h,) = torch.autograd.grad(g.sum(), t, allow_unused=True, materialize_grads=True)
        assert h.tolist() == [0.0] * 5
    columns = list(zip(*TENSOR_CASES))
    args = [torch.tensor(c, dtype=torch.float64, requires_grad=True) for c in columns]
    out = torch_ops.clamp_tensors(*args)
    torch.testing.assert_close(out, torch.clamp(*args))
    got = torch.autograd.grad(out.sum(), args)
    assert [g.tolist() for g in got] == _torch_clamp_grads(*columns)


def test_tensorflow_gradients_are_torch_clamps(tf_ops):
    import tensorflow as tf

    t = tf.constant(AT_ENDS, tf.float64)
    want = _torch_clamp_grads(AT_ENDS, [-1.0] * 5, [2.0] * 5)[0]
    for f in (tf_ops.clamp_numbers, tf_ops.clamp_scalars):
        with tf.GradientTape() as tape:
            tape.watch(t)
            out = f(t)
        assert out.numpy().tolist() == np.clip(AT_ENDS, -1, 2).tolist()
        assert tape.gradient(out, t).numpy().tolist() == want
    columns = [tf.constant(c, tf.float64) for c in zip(*TENSOR_CASES)]
    with tf.GradientTape() as tape:
        tape.watch(columns)
        out = tf_ops.clamp_tensors(*columns)
    torch = pytest.importorskip("torch")
    want_out = torch.clamp(*(torch.tensor(c.numpy()) for c in columns)).tolist()
    assert out.numpy().tolist() == want_out
    got = [g.numpy().tolist() for g in tape.gradient(out, columns)]
    assert got == _torch_clamp_grads(*(c.numpy().tolist() for c in columns))


def test_hard_sigmoid_at_the_ends_is_one_sixth(torch_ops, tf_ops):
    """torch.clamp's closed interval: 1/6 at x = +-3 (SymPy's Min/Max gave 1/12 there;
    F.hardsigmoid's backward gives 0); elsewhere F.hardsigmoid's values and gradients."""
    import tensorflow as tf
    import torch

    points = [-4.0, -3.0, -1.0, 0.0, 2.5, 3.0, 4.0]
    want = [0.0, 1 / 6, 1 / 6, 1 / 6, 1 / 6, 1 / 6, 0.0]
    t = torch.tensor(points, dtype=torch.float64, requires_grad=True)
    out = torch_ops.hard_sigmoid(t)
    torch.testing.assert_close(out, torch.nn.functional.hardsigmoid(t))
    (g,) = torch.autograd.grad(out.sum(), t)
    assert g.tolist() == pytest.approx(want, abs=0, rel=1e-15)
    x_tf = tf.constant(points, tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x_tf)
        out_tf = tf_ops.hard_sigmoid(x_tf)
    assert tape.gradient(out_tf, x_tf).numpy().tolist() == pytest.approx(want, abs=0, rel=1e-15)


def test_hard_swish_is_finite_where_x_times_6_overflows(torch_ops, tf_ops):
    import tensorflow as tf
    import torch

    big = [1e37, 1e38, 3e38, -3e38]
    t = torch.tensor(big, dtype=torch.float32)
    torch.testing.assert_close(torch_ops.hard_swish(t), torch.tensor([*big[:3], 0.0]))
    want = np.array([*big[:3], 0.0], np.float32)
    np.testing.assert_array_equal(tf_ops.hard_swish(tf.constant(big)).numpy(), want)
    # values of F.hardswish; gradients of autograd through torch.clamp (F.hardswish's
    # backward is open at both ends: 0 at x = -3 and 1 at 3, not -1/2 and 3/2)
    x = torch.tensor(
        [-4.0, -3.0, -1.0, 0.0, 2.5, 3.0, 4.0], dtype=torch.float64, requires_grad=True
    )
    out = torch_ops.hard_swish(x)
    torch.testing.assert_close(out, torch.nn.functional.hardswish(x))
    want = x * torch.clamp(x + 3, 0, 6) / 6
    torch.testing.assert_close(
        torch.autograd.grad(out.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0]
    )


def _count(fn, *ops):
    source = inspect.getsource(fn)
    return sum(source.count(op) for op in ops)


def test_one_clamp_forward_and_one_mask_backward(torch_ops):
    """Min(Max(x/6 + 1/2, 0), 1) generates as one clamp and one select, not three nested
    selects on Heaviside conditions (five masks)."""
    m = torch_ops
    selects = ("_where(", "torch.where(")
    for name in ("hard_sigmoid", "hard_swish"):
        assert _count(getattr(m, f"_{name}_forward"), "clamp") == 1
        grad = getattr(m, f"_{name}_grad_x")
        assert _count(grad, *selects) == 1, inspect.getsource(grad)
        assert _count(grad, "clamp") == (name == "hard_swish")  # x*clamp: its product rule
        assert _count(grad, " & ") == 1  # (x >= -3) & (x <= 3): on x, not on x/6 + 1/2
    assert "_where((x >= -3) & (x <= 3), grad / 6, 0.0)" in inspect.getsource(
        m._hard_sigmoid_grad_x
    )


def test_rounding_has_zero_gradients_like_torch_round(torch_ops, tf_ops):
    import tensorflow as tf
    import torch

    t = torch.tensor(TIES, dtype=torch.float64, requires_grad=True)
    out = torch_ops.rounded(t)
    assert out.tolist() == TIES_EVEN == torch.round(t).tolist()
    assert torch.autograd.grad(out.sum(), t)[0].tolist() == [0.0] * len(TIES)
    assert torch.autograd.grad(torch_ops.ste_round(t).sum(), t)[0].tolist() == [1.0] * len(TIES)
    assert tf_ops.rounded(tf.constant(TIES, tf.float64)).numpy().tolist() == TIES_EVEN
    x_tf = tf.constant(TIES, tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x_tf)
        out_tf = tf_ops.ste_round(x_tf)
    assert tape.gradient(out_tf, x_tf).numpy().tolist() == [1.0] * len(TIES)


STE_SPEC = """\
module: ste
functions:
  ste_round:
    inputs: {x: {}}
    output: round(x)
    gradient:
      x: grad
  quantize:
    inputs:
      x: {}
      step: {kind: scalar, default: 0.25, domain: [0.01, 10]}
    output: step*round(x/step)
    gradient:
      x: grad*clamp(x, -1, 1)
  floor_times_x:
    inputs: {x: {}}
    output: x*floor(x) + ceil(x) + trunc(x)
  fine_quantizer:
    inputs: {x: {}}
    output: x*round(x/0.001)
"""


@pytest.mark.parametrize("target", ["torch", "tensorflow"])
def test_straight_through_spec_passes_its_generated_tests(tmp_path, target):
    """Numeric derivatives are 0 across a step too, but for points within the difference
    step of a jump: torch's gradcheck steps 1e-6, and TF's check does so too for these
    functions (at its default 1e-3, x*round(x/0.001) straddles a jump at most points)."""
    pytest.importorskip(target)
    run_generated_suite(tmp_path, STE_SPEC, target)
