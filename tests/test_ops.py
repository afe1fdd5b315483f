"""The registry of primitives (symgrad.ops): every row complete or saying why not, every
table a view of it, and every cell true of the framework it names."""

from __future__ import annotations

import importlib
import math
import re

import numpy as np
import pytest
import sympy
from conftest import ROOT
from sympy.codegen import cfunctions
from sympy.core.relational import Relational
from sympy.functions.elementary.piecewise import ExprCondPair
from sympy.logic.boolalg import Boolean
from sympy.printing.numpy import NumPyPrinter

from symgrad import cost, ops, plan
from symgrad import functions as F
from symgrad.errors import DerivationError, Location
from symgrad.expr import _SYNTAX, FUNCTIONS, parse_formula
from symgrad.numerics import mp, native
from symgrad.ops import BY_CLASS, CELLS, OPS, REGIMES, Op, spelled
from symgrad.printers import FrameworkPrinter, TensorFlowPrinter, TorchPrinter

x, y, z = sympy.symbols("x y z", real=True)
ROWS = {op.name: op for op in OPS}
#: Arguments a row is tried with where symbols are not right: an integer order, numbers
#: for clamp's bounds (what TF's clip_by_value takes).
SAMPLE_ARGS: dict[str, tuple] = {
    "polygamma": (2, x),
    "exprel_d": (1, x),
    "log1prel_d": (1, x),
    "sinc_d": (1, x),
    "sincpi_d": (1, x),
    "clamp": (x, -1, 1),
}
#: Points the mpmath and NumPy evaluations are compared at (first that is defined).
POINTS = [(0.6, 1.3, 2.1), (-0.6, 0.9, 1.7), (1.6, 2.5, 0.4)]
#: Nodes of formulas that are arithmetic or branches, not primitives.
STRUCTURE = (sympy.Add, sympy.Mul, sympy.Pow, sympy.Piecewise, ExprCondPair, Relational, Boolean)


def sample(op: Op) -> sympy.Expr:
    """A call of ``op`` on symbols (or :data:`SAMPLE_ARGS`), as it is (digamma(x) stays)."""
    args = SAMPLE_ARGS.get(op.name, (x, y, z)[: op.arity[0]])
    return op.build(*args) if op.build else op.sympy(*args, evaluate=False)


def framework_cells(op: Op) -> dict[str, bool]:
    """Cell -> whether a printer method fills it."""
    methods = set(op.printer_methods)
    base = "FrameworkPrinter" in methods
    return {
        "torch": base or "TorchPrinter" in methods,
        "tf": base or "TensorFlowPrinter" in methods,
        "python": bool(methods),  # a method is called for Python numbers too
    }


def all_subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | all_subclasses(sub)
    return found


# ------------------------------------------------------------------------------ completeness
@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_every_row_is_complete_or_says_why_not(op):
    unknown = set(op.why_not) - set(CELLS)
    assert not unknown, f"{op.name}: why_not names no cell: {sorted(unknown)}"
    by_method = framework_cells(op)
    required = ["spelled", "mp", "numpy", "python", "torch", "tf", "cost"]
    if spelled(op.torch) and op.torch.startswith("torch."):
        required.append("torch_inplace")
    for cell in required:
        value = getattr(op, cell)
        filled = bool(value) or value == 0
        if filled:
            assert cell not in op.why_not, f"{op.name}.{cell} is filled: a stale why_not"
        elif not by_method.get(cell):
            assert op.why_not.get(cell), f"{op.name}.{cell} is empty and says not why"


def test_every_class_a_formula_can_contain_has_a_row():
    """Every symgrad function, what every formula word builds, and every function the
    derivatives of those (first and second order) contain."""
    stable = {c for c in all_subclasses(F.StableFunction) if not c.__subclasses__()}
    assert stable <= set(BY_CLASS), sorted(c.__name__ for c in stable - set(BY_CLASS))
    seen: set[type] = set()
    for op in OPS:
        if not op.spelled:
            continue
        call = sample(op)
        exprs = [call]
        for s in call.free_symbols:
            d = sympy.diff(call, s)
            exprs += [d] + [sympy.diff(d, t) for t in call.free_symbols]
        for e in exprs:
            seen |= {type(n) for n in sympy.preorder_traversal(e) if not n.is_Atom}
    primitives = {c for c in seen if not issubclass(c, STRUCTURE)}
    assert primitives <= set(BY_CLASS), sorted(c.__name__ for c in primitives - set(BY_CLASS))


@pytest.mark.parametrize("word", sorted(set(FUNCTIONS) - set(_SYNTAX)))
def test_every_formula_word_parses_to_its_row(word):
    (op,) = [op for op in OPS if word in op.spelled]
    args = ", ".join(str(a) for a in SAMPLE_ARGS.get(op.name, ("x", "y", "z")[: op.arity[0]]))
    parsed = parse_formula(f"{word}({args})", {"x": x, "y": y, "z": z}, Location("t.yaml"))
    # SymPy writes digamma(x) as polygamma(0, x)
    assert type(parsed) is {"digamma": sympy.polygamma}.get(op.name, op.sympy)


def test_the_language_doc_lists_every_word():
    """Every function a formula may call has a row in the doc's table of functions (its
    first cell names it, ``exp(x)``), and the table names nothing else."""
    doc = (ROOT / "docs" / "spec-language.md").read_text()
    first_cells = [line.split("|")[1] for line in doc.splitlines() if line.startswith("| `")]
    words = {w for cell in first_cells for w in re.findall(r"`(\w+)\(", cell)}
    assert words == set(FUNCTIONS)


# ------------------------------------------------------------------------------ cells are true
@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_printer_methods_are_the_ones_the_row_names(op):
    classes = (FrameworkPrinter, TorchPrinter, TensorFlowPrinter)
    assert tuple(c.__name__ for c in classes) == ops.PRINTER_CLASSES
    have = {c.__name__ for c in classes if f"_print_{op.name}" in vars(c)}
    assert have == set(op.printer_methods)


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
@pytest.mark.parametrize(("cell", "printer"), [("torch", TorchPrinter), ("tf", TensorFlowPrinter)])
def test_each_row_prints_for_each_framework(op, cell, printer):
    if op.why_not.get(cell) and not framework_cells(op)[cell]:
        return  # never printed (DiracDelta)
    call = sample(op)
    text = printer().doprint(call)
    if spelled(getattr(op, cell)):
        assert f"{getattr(op, cell)}(" in text
    if getattr(op, cell) == REGIMES:
        assert call.regimes() is not None
    # Python numbers: the row's function or format, or the printer's method
    scalar = printer(scalars=call.free_symbols)
    if spelled(op.python):
        text = scalar.doprint(call)
        if "{" not in op.python:
            assert f"{op.python}(" in text
    elif op.python is None and not framework_cells(op)["python"]:
        with pytest.raises(DerivationError):
            scalar.doprint(call)


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_mpmath_and_numpy_agree(op):
    if op.numpy is None:
        return
    call = sample(op)
    symbols = sorted(call.free_symbols, key=lambda s: s.name)
    evaluate = native.evaluator(call, symbols)
    compared = 0
    for point in POINTS:
        values = dict(zip(symbols, point))
        want = mp.exact(call, values)
        if want is None:
            continue
        got = float(evaluate(*(np.float64(v) for v in values.values())))
        assert got == pytest.approx(want, rel=1e-13, abs=1e-300), (op.name, point)
        compared += 1
    assert compared, f"{op.name}: defined at none of {POINTS}"


@pytest.mark.parametrize(
    "op", [op for op in OPS if isinstance(op.numpy, str)], ids=lambda op: op.name
)
def test_numpy_names_are_what_lambdify_prints(op):
    if op.numpy == REGIMES:
        assert sample(op).regimes() is not None
        return
    printer = NumPyPrinter({"fully_qualified_modules": False, "allow_unknown_functions": True})
    assert op.numpy in printer.doprint(sample(op))


def _resolve(dotted: str, module):
    obj = module
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("op", [op for op in OPS if spelled(op.torch)], ids=lambda op: op.name)
def test_torch_cells_name_torch_functions(op):
    torch = pytest.importorskip("torch")
    assert callable(_resolve(op.torch, torch))
    if op.torch_inplace:
        assert callable(getattr(torch.Tensor, op.torch_inplace))


@pytest.mark.parametrize("op", [op for op in OPS if spelled(op.tf)], ids=lambda op: op.name)
def test_tf_cells_name_tf_functions(op):
    tf = pytest.importorskip("tensorflow")
    assert callable(_resolve(op.tf, tf))


def test_compiled_forms_are_module_helpers():
    """Each compiled form is a function of the torch runtime (so the generator copies it
    into a module that calls it) and a form the planner routes to."""
    from symgrad.runtime import copy_in, runtime

    defined = {n for d in runtime("torch").definitions for n in d.names}
    for op in OPS:
        if op.torch_compiled:
            assert op.torch_compiled in defined, op.torch_compiled
            assert plan.COMPILED_FORMS[op.torch] == op.torch_compiled
            copied = copy_in("torch", f"y = {op.torch_compiled}(x)\n").source
            assert f"def {op.torch_compiled}(" in copied


# ------------------------------------------------------------------------------ views
def test_the_parser_table_is_a_view():
    for op in OPS:
        for word in op.spelled:
            assert FUNCTIONS[word] == (op.constructor, op.arity)
    assert set(FUNCTIONS) == {w for op in OPS for w in op.spelled} | set(_SYNTAX)


def test_the_mpmath_and_numpy_tables_are_views():
    table = native.stable_numpy()
    for op in OPS:
        assert mp._MP_FUNCS.get(op.sympy) is op.mp
        if callable(op.numpy):
            assert table[op.name] is op.numpy
        elif op.numpy == REGIMES:
            assert op.name in table
    assert set(table) - set(ROWS) <= set(ops.LIBM)


def test_the_printer_tables_are_views():
    assert TorchPrinter.functions == {o.name: o.torch for o in OPS if spelled(o.torch)}
    assert TensorFlowPrinter.functions == {o.name: o.tf for o in OPS if spelled(o.tf)}
    python = {o.name: o.python for o in OPS if spelled(o.python)}
    assert FrameworkPrinter.math_functions | FrameworkPrinter.scalar_formats == python


def test_the_cost_tables_are_views():
    assert cost.OP_COST == {o.name: o.cost for o in OPS if o.cost is not None}
    assert cost.REGIME_OPS == {o.name: o.passes for o in OPS if o.passes != 1}


def test_the_planner_tables_are_views():
    for op in OPS:
        if op.torch_inplace:
            assert plan._TORCH_INPLACE[op.torch] == op.torch_inplace
        if spelled(op.torch):
            assert op.torch in plan._TORCH_FRESH
        if op.torch_compiled:
            assert plan.COMPILED_FORMS[op.torch] == op.torch_compiled
    rows = {op.torch for op in OPS}
    assert set(plan._TORCH_INPLACE) - rows <= set(ops.TORCH_ARITHMETIC)
    assert set(plan._TORCH_FRESH) - rows <= set(ops.TORCH_ARITHMETIC)
    assert set(plan.COMPILED_FORMS) <= rows


def test_no_module_keeps_a_table_of_its_own():
    """The tables the registry replaced stay views: no literal keyed by a primitive's name
    comes back in the modules that had one."""
    for module in ("expr", "cost", "plan", "numerics.mp", "numerics.native", "printers.base",
                   "printers.torch", "printers.tensorflow"):  # fmt: skip
        source = importlib.import_module(f"symgrad.{module}").__file__
        text = open(source).read()
        for name in ("erfc", "loggamma", "xlog1py"):
            assert f'"{name}":' not in text and f"sympy.{name}: mpmath" not in text, module


# ------------------------------------------------------------------------------ log2
BITS = """\
module: bits
functions:
  bits:
    inputs: {x: {domain: [0, 1.0e300]}}
    output: log2(x)
  bits_of_product:
    inputs: {x: {domain: [0, 1.0e150]}, y: {domain: [0, 1.0e150]}}
    output: log2(x*y)
"""


def test_log2_parses_and_differentiates():
    parsed = parse_formula("log2(x) + log2(8)", {"x": x}, Location("t.yaml"))
    assert parsed == cfunctions.log2(x) + 3
    assert sympy.diff(parsed, x) == 1 / (x * sympy.log(2))


def test_log2_values():
    log2 = cfunctions.log2(x)
    assert mp.exact(log2, {x: 3.0}) == math.log2(3.0)
    assert mp.exact(log2, {x: 0.0}) == -math.inf and mp.exact(log2, {x: -1.0}) is None
    # 1 + 1e-200 is 1 at the first precisions: log2 reports what it cancels, and the
    # precision rises until the value is 1e-200 / log(2), not 0
    assert mp.exact(cfunctions.log2(1 + x), {x: 1e-200}) == pytest.approx(
        1e-200 / math.log(2), rel=1e-15, abs=0
    )
    evaluate = native.evaluator(log2, [x])
    assert evaluate(np.float64(3.0)) == math.log2(3.0)
    assert evaluate(np.float32(3.0)) == np.float32(math.log2(3.0))
    assert evaluate(np.float32(3.0)).dtype == np.float32


def test_log2_prints():
    s = sympy.Symbol("s", real=True)
    assert TorchPrinter().doprint(cfunctions.log2(x)) == "torch.log2(x)"
    assert TensorFlowPrinter().doprint(cfunctions.log2(x)) == "tf.experimental.numpy.log2(x)"
    assert TorchPrinter(scalars=[s]).doprint(cfunctions.log2(s)) == "math.log2(s)"


def test_generated_log2_runs_in_torch(generate_module):
    import inspect

    torch = pytest.importorskip("torch")
    m = generate_module(BITS)
    assert "log2_()" in inspect.getsource(m)  # the product's buffer, updated in place
    x = torch.tensor([1e-300, 0.3, 1.0, 3.0, 1e300], dtype=torch.float64, requires_grad=True)
    out = m.bits(x)
    torch.testing.assert_close(out, torch.log2(x.detach()), rtol=0, atol=0)
    (grad,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(grad, 1 / (x.detach() * math.log(2)))
    points = torch.tensor([0.2, 1.5, 40.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(m.bits, (points,))
    assert torch.autograd.gradgradcheck(m.bits, (points,))
    y = torch.tensor([2.0, 0.25, 8.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(m.bits_of_product, (points, y))
    want = torch.log2(points.detach() * y.detach())
    torch.testing.assert_close(m.bits_of_product(points, y), want)


def test_generated_log2_runs_in_tensorflow(generate_module):
    tf = pytest.importorskip("tensorflow")
    m = generate_module(BITS, "tensorflow")
    for dtype in (tf.float32, tf.float64):
        x = tf.constant([0.3, 1.0, 3.0, 1e30], dtype)
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = m.bits(x)
        grad = tape.gradient(out, x)
        assert out.dtype == dtype
        np.testing.assert_allclose(out.numpy(), np.log2(x.numpy()), rtol=1e-6)
        np.testing.assert_allclose(grad.numpy(), 1 / (x.numpy() * np.log(2)), rtol=1e-6)
