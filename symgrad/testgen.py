"""Build the generated pytest suites: reference data from mpmath, laid out by templates."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import NamedTuple

import sympy

from symgrad import functions as F
from symgrad.cases import Case, quantities, reference
from symgrad.derive import each_function
from symgrad.derived import Derived
from symgrad.errors import DerivationError
from symgrad.numerics.floats import round_to
from symgrad.numerics.points import domain_interior, scalar_value
from symgrad.printers import TorchPrinter
from symgrad.render import render
from symgrad.spec import Spec


def literal(value: float | None) -> str:
    """A float as Python source (math.inf for overflow, None for undefined)."""
    if value is None:
        return "None"
    if math.isinf(value):
        return "math.inf" if value > 0 else "-math.inf"
    return repr(float(value))


#: The generated tests' tolerances (templates/test_torch_module.py.jinja: BENIGN_RTOL,
#: EXTREME_RTOL): where symgrad's own form misses them at generation, the error measured
#: there is recorded in the test data (``known``) instead.
BENIGN_RTOL = 1e-9
EXTREME_RTOL = {"float64": 1e-6, "float32": 1e-3}
#: Below tiny/eps a result may pass through subnormal numbers (the template's ATOL).
_TINY_OVER_EPS = {"float64": 2.0**-1022 / 2.0**-52, "float32": 2.0**-126 / 2.0**-23}


def _measured_error(
    value: float, exact: float | None, dtype: str, rtol: float, atol: float | None = None
) -> float | None:
    """The relative error the test would see at a point where ``value`` misses the test's
    tolerance (``math.inf``: not finite, or finite where the exact value overflows), else
    None; the exact value and the check are as in the template's ``_assert_matches``.
    ``atol``: at an exact 0, the absolute error allowed (:func:`_zero_slack`); the error
    there is absolute too."""
    if exact is None:
        return None
    rounded = round_to(exact, dtype)
    if math.isinf(rounded):
        return None if value == rounded else math.inf
    if not math.isfinite(value):
        return math.inf
    if exact == 0 and atol is not None:
        return None if abs(value) <= atol else abs(value)
    miss = abs(value - rounded) - _TINY_OVER_EPS[dtype]
    if miss <= rtol * abs(rounded):
        return None
    return miss / abs(rounded) if rounded else math.inf


def _neighbours(args: list[float], npdtype) -> list[list[float]]:
    """``args`` and every point with each argument moved by at most one ``npdtype`` ulp."""
    import itertools

    import numpy as np

    steps = []
    for a in args:
        v = npdtype(a)
        steps.append(
            [
                float(v),
                float(np.nextafter(v, npdtype(-np.inf))),
                float(np.nextafter(v, npdtype(np.inf))),
            ]
        )
    return [list(p) for p in itertools.product(*steps)]


def _worst(errors) -> float | None:
    """The largest recorded error (None: the point met the tolerance every time)."""
    found = [e for e in errors if e is not None]
    return max(found) if found else None


class _Form(NamedTuple):
    """One quantity's chosen form, for :func:`known_errors`."""

    kind: str  # "outputs", "grads" or "second": the test data's table
    key: str  # the table's key
    fn: object  # NumPy evaluator of ``stable``
    symbols: list  # its arguments
    stable: sympy.Expr  # the chosen form
    reference: sympy.Expr  # the naive formula (or its derivative)


def _stable_forms(derived: Derived, measured=None) -> list[_Form]:
    """Every quantity's chosen form with its NumPy evaluator: built once per function, for
    :func:`known_errors` on each set of cases. ``measured``: the function's
    :func:`~symgrad.cases.quantities`, if already derived."""
    from symgrad.numerics.native import evaluator

    names = [name for name, _ in derived.naive_outputs]
    kinds = {"forward": "outputs", "grad": "grads", "second": "second"}
    forms = []
    for q in quantities(derived) if measured is None else measured:
        if q.stable is None:
            continue
        key = str(q.output) if q.kind == "forward" else f"{names[q.output]}:{q.input}"
        symbols = sorted(q.stable.free_symbols, key=lambda s: s.name)
        try:
            fn = evaluator(q.stable, symbols)
        except Exception:  # noqa: BLE001 - not evaluable with NumPy: nothing recorded
            continue
        forms.append(_Form(kinds[q.kind], key, fn, symbols, q.stable, q.reference))
    return forms


def known_errors(
    derived: Derived, cases: tuple[Case, ...], dtype: str, rtol: float, forms=None
) -> dict[str, dict[str, list[float | None]]] | None:
    """Per quantity and point, the relative error of symgrad's chosen form (evaluated with
    NumPy as the frameworks compute it) where it misses ``rtol``; None where it meets it
    everywhere. These are the points where gen warns that the stable rewrites did not
    reach the formula: the tests record the error there instead of failing. ``forms``:
    :func:`_stable_forms` of ``derived``, if already built.

    At a point whose exact value is 0 no relative error is defined: the entry there is an
    absolute one, :func:`_zero_slack` (or the form's own, if larger).
    """
    import numpy as np

    from symgrad.numerics.native import call

    if not cases:
        return None
    by_name = {s: n for n, s in derived.symbols.items()}
    npdtype = getattr(np, dtype)
    found: dict[str, dict[str, list[float | None]]] = {"outputs": {}, "grads": {}, "second": {}}
    for kind, key, fn, symbols, stable, ref in _stable_forms(derived) if forms is None else forms:
        if kind == "outputs":
            exacts = [c.values[int(key)] for c in cases]
        else:
            exacts = [(c.grads if kind == "grads" else c.second)[key] for c in cases]
        points = [[case.inputs.get(by_name.get(s, ""), 1.0) for s in symbols] for case in cases]
        with np.errstate(all="ignore"):
            slack = [
                _zero_slack(derived, (stable, ref), case, dtype, (fn, args)) if ex == 0 else None
                for case, ex, args in zip(cases, exacts, points)
            ]
            column = [
                _measured_error(call(fn, args, npdtype), ex, dtype, rtol, atol)
                for args, ex, atol in zip(points, exacts, slack)
            ]
            if any(v is not None for v in column):
                # The form misses here: rounding noise decides how much, and the
                # frameworks' libm differs from NumPy's in the last bits. So every point
                # of this quantity gets the worst error over its inputs moved by one ulp.
                # Where the exact value overflows the dtype, an intermediate's overflow
                # decides between inf and NaN (inf - inf): not checked either.
                column = [
                    math.inf
                    if ex is not None and math.isinf(round_to(ex, dtype))
                    else _worst(
                        _measured_error(call(fn, moved, npdtype), ex, dtype, rtol, atol)
                        for moved in _neighbours(args, npdtype)
                    )
                    for args, ex, atol in zip(points, exacts, slack)
                ]
            # Where the form met the tolerance by luck (a cancellation whose rounding
            # another libm, moving the last bits of a sine, makes miss), the entry is
            # the bound on its rounding error; where it missed, the larger of its
            # measured error and that bound: the model's error in a cancellation is one
            # order of operations' luck, and the generated code, which shares
            # subexpressions across a method's formulas, computes the sum in another
            # (a sum that cancels to 1e-6 of its terms: 0.02 in the model, 1.0 in torch)
            column = [
                _worst((v, _fragile(stable, dict(zip(symbols, args)), dtype, rtol, ex, fn)))
                if ex and (v is None or math.isfinite(v))
                else v
                for v, ex, args in zip(column, exacts, points)
            ]
        # an exact zero is held to its slack even where the form computes 0 itself:
        # the frameworks' libm need not cancel the same way
        column = [v if v is not None else a for v, a in zip(column, slack)]
        if any(v is not None for v in column):
            found[kind][key] = column
    return found if any(found.values()) else None


def _zero_slack(derived: Derived, formulas, case: Case, dtype: str, model) -> float | None:
    """The absolute error allowed where the exact value is 0: the larger of a bound on
    the rounding error of symgrad's form there (:func:`~symgrad.numerics.mp.rounding_bound`;
    of the naive formula where the form has none) and what the form computes with its
    inputs moved by one ulp. ``formulas``: (the chosen form, the naive formula);
    ``model``: the form's NumPy evaluator and its arguments at ``case``.

    Terms that cancel to 0 exactly (``sin(x)*cos(y) - cos(x)*sin(y)`` at x = y, or
    ``log(tan(x + pi/4))`` at x = 0, where pi/4 is a float) leave a few ulps of themselves,
    which no relative tolerance accepts, and how many depends on the libm: NumPy's may
    cancel to 0 where torch's leaves 2e-16. None where both are below the tests'
    subnormal slack (``expm1(0)`` is exactly 0), and where the formula may step
    (``relu'(0) = 0`` stays exact: the value beside the step is no measure of rounding).
    """
    import numpy as np

    from symgrad.numerics.mp import rounding_bound
    from symgrad.numerics.native import call

    stable, reference = formulas
    if reference.has(*_DISCONTINUOUS):
        return None
    npdtype = getattr(np, dtype)
    env = {derived.symbols[n]: v for n, v in case.inputs.items()}
    eps = float(np.finfo(npdtype).eps)
    largest = rounding_bound(stable, env, eps)
    if largest is None:
        largest = rounding_bound(reference, env, eps)
    if largest is None:
        return None  # no bound: the exact 0 is checked as it is
    fn, form_args = model
    for moved in _neighbours(form_args, npdtype):
        value = call(fn, moved, npdtype)
        if math.isfinite(value):
            largest = max(largest, abs(value))
    return largest if largest > _TINY_OVER_EPS[dtype] else None


#: A point whose model error (at it, or with its inputs moved by an ulp) is within this
#: factor of the tolerance gets its rounding bound computed (:func:`_fragile`).
_FRAGILE_WITHIN = 64


def _fragile(
    stable: sympy.Expr, at: dict, dtype: str, rtol: float, exact: float, fn
) -> float | None:
    """The relative bound on the rounding error of ``stable`` at ``at``
    (:func:`~symgrad.numerics.mp.rounding_bound`) where it exceeds ``rtol``: a
    cancellation that amplifies each libm's last bits, which NumPy's may have survived
    (sin(x)*sin(t*x)/x**4 terms of the Lanczos kernel's second derivative at x = 1e-5
    leave 1e-6 of the value to ulps), and whose error depends on the order the code sums
    its terms in, which the code's sharing across a method's formulas may change. Only where
    the model's error at the point or an ulp beside it (for float32, also float64's there
    times the ratio of the epsilons: float32's may be lucky too) is within
    :data:`_FRAGILE_WITHIN` of ``rtol`` (the bound costs an exact evaluation per node);
    else None. ``fn``: the form's NumPy evaluator, of ``at``'s symbols in order."""
    import numpy as np

    from symgrad.numerics.mp import rounding_bound
    from symgrad.numerics.native import call

    rounded = round_to(exact, dtype)
    if not math.isfinite(rounded) or rounded == 0:
        return None
    npdtype = getattr(np, dtype)
    worst = 0.0
    for moved in _neighbours(list(at.values()), npdtype):
        value = call(fn, moved, npdtype)
        worst = max(worst, abs(value - rounded) / abs(rounded) if math.isfinite(value) else 1.0)
    if npdtype is not np.float64:
        # a lower precision's luck: float64's error there, scaled by the ratio of the
        # epsilons, is what the cancellation makes of float32's rounding
        scale = float(np.finfo(npdtype).eps / np.finfo(np.float64).eps)
        for moved in _neighbours(list(at.values()), np.float64):
            value = call(fn, moved, np.float64)
            if math.isfinite(value):
                worst = max(worst, scale * abs(value - exact) / abs(exact))
    if worst * _FRAGILE_WITHIN <= rtol:
        return None
    bound = rounding_bound(stable, at, float(np.finfo(npdtype).eps))
    if bound is None or bound <= rtol * abs(rounded):
        return None
    return bound / abs(rounded)


def _columns(
    cases: tuple[Case, ...], derived: Derived, known: dict | None = None
) -> dict[str, str]:
    """The cases of one function as source text of columnar dicts/lists."""
    tensors = [i.name for i in derived.function.inputs if i.is_tensor]

    def col(values) -> str:
        return "[" + ", ".join(literal(v) for v in values) + "]"

    inputs = "{" + ", ".join(f'"{n}": {col(c.inputs[n] for c in cases)}' for n in tensors) + "}"
    outputs = (
        "[" + ", ".join(col(c.values[k] for c in cases) for k in range(len(derived.outputs))) + "]"
    )
    grads = (
        "{"
        + ", ".join(
            f'"{n}": {col(c.grads[n] for c in cases)}' for n in (cases[0].grads if cases else {})
        )
        + "}"
    )
    second = (
        "{"
        + ", ".join(
            f'"{n}": {col(c.second[n] for c in cases)}' for n in (cases[0].second if cases else {})
        )
        + "}"
    )
    columns = {"inputs": inputs, "outputs": outputs, "grads": grads, "second": second}
    if known is not None:
        columns["known"] = (
            "{"
            + ", ".join(
                f'"{kind}": {{'
                + ", ".join(f'"{key}": {col(v)}' for key, v in known[kind].items())
                + "}"
                for kind in ("outputs", "grads", "second")
            )
            + "}"
        )
    return columns


@dataclass
class FunctionTests:
    name: str
    upper: str
    tensors: list[str]
    diff: list[str]
    second_diff: list[str]  # the differentiable inputs whose gradient is not 0 everywhere
    scalars: str  # source of a dict of scalar keyword values
    domains: str  # source of {name: (lo, hi)}: where random inputs are drawn
    fd_eps: dict[str, float] | None  # finite-difference step per input, None: the default
    shapes: str  # source of {name: shape} for the broadcasting gradcheck
    order: int
    overridden: bool
    outputs: list[str]
    differentiable: list[str]  # outputs that must require grad (the others must not)
    benign: dict[str, str]
    extreme: dict[str, str]
    extreme32: dict[str, str]
    naive: list[str]  # torch source of the naive formula (for Hessian comparisons)
    params: str
    jumps: bool = False  # a rounding function (jumps) or clamp (kinks): small numeric steps


def function_tests(derived: Derived) -> FunctionTests:
    fn = derived.function
    measured = quantities(derived)
    domains = random_domains(derived, measured)
    ref = reference(derived)
    forms = _stable_forms(derived, measured)
    tensors = [i.name for i in fn.inputs if i.is_tensor]
    scalars = {i.name: scalar_value(i) for i in fn.inputs if not i.is_tensor}
    shapes = [(3, 1), (4,), (3, 4), (1, 4), (3, 1), (4,)]
    return FunctionTests(
        name=fn.name,
        upper=fn.name.upper(),
        tensors=tensors,
        diff=list(derived.diff_inputs),
        second_diff=[i for i in derived.diff_inputs if sympy.sympify(derived.vjps[i]) != 0],
        scalars="{" + ", ".join(f'"{k}": {literal(v)}' for k, v in scalars.items()) + "}",
        domains="{"
        + ", ".join(
            f'"{name}": ({literal(lo)}, {literal(hi)})' for name, (lo, hi) in domains.items()
        )
        + "}",
        fd_eps=finite_difference_step(domains),
        shapes="{"
        + ", ".join(f'"{n}": {shapes[k % len(shapes)]}' for k, n in enumerate(tensors))
        + "}",
        order=fn.order,
        overridden=bool(derived.overridden),
        outputs=[name for name, _ in derived.outputs],
        differentiable=list(derived.outputs_requiring_grad()),
        naive=_naive_torch(derived),
        params=", ".join(i.name for i in fn.inputs),
        benign=_columns(
            ref.benign, derived, known_errors(derived, ref.benign, "float64", BENIGN_RTOL, forms)
        ),
        extreme=_columns(
            ref.extreme,
            derived,
            known_errors(derived, ref.extreme, "float64", EXTREME_RTOL["float64"], forms),
        ),
        extreme32=_columns(
            ref.extreme32,
            derived,
            known_errors(derived, ref.extreme32, "float32", EXTREME_RTOL["float32"], forms),
        ),
        jumps=any(e.has(*_JUMPS) for _, e in derived.naive_outputs),
    )


#: Random-input tests (gradcheck, vmap, compile, ...) need every value and derivative
#: finite, and small enough that a finite difference of it does not overflow.
_RANDOM_MAX = 1e100
#: Cells per input of the grid the random-input box is chosen on (by number of inputs),
#: and the points sampled over the benign box to judge them.
_RANDOM_CELLS = {1: 32, 2: 16, 3: 6}
_RANDOM_SAMPLES = 4096


def random_domains(derived: Derived, measured=None) -> dict[str, tuple[float, float]]:
    """The box the random-input tests draw each tensor input from.

    It is the inputs' benign intervals (:func:`~symgrad.numerics.points.domain_interior`)
    where the forward and every derivative the tests take are finite and below 1e100 at
    4096 points sampled over them. Where the formula is undefined on part of that box
    (``asin(sin(a)/d)`` for ``|d| < 1``: a precondition that relates inputs is no
    ``domain:``), the box is cut into a grid of cells (32 for one input, 16 per input for
    two, 6 for three, 2 for more), and the largest box of cells whose sampled points all
    pass is kept, less a quarter cell at each end (the sampled points never reach a cell's
    edges); where no cell passes, the largest box where the generated forms are finite at
    all (``1.7e308 * (t - 1)``; the formula as written overflows everywhere), else the
    benign intervals (the tests will say where).

    The benign intervals are first cut to [-100, 100] where they reach into it (the uncut
    ones are searched only where nothing passes there): these tests check structure
    (broadcasting, batching, second order, compilation) against finite differences and
    plain autograd, which cancel where a small input is added to one at 1e8
    ((x + e)**2 - x**2: a step of 1e-6 in e moves x + e by 16 ulps); the extremes are
    checked against exact values (``stable_at_extremes``).
    ``measured``: the function's :func:`~symgrad.cases.quantities`, if already derived.
    """
    tensors = [i for i in derived.function.inputs if i.is_tensor]
    benign = {i.name: domain_interior(i) for i in tensors}
    moderate = {name: _moderate(lo, hi) for name, (lo, hi) in benign.items()}
    measured = quantities(derived) if measured is None else measured
    for intervals in (moderate, benign) if moderate != benign else (benign,):
        box = _defined_box(derived, measured, intervals)
        if box is not None:
            return box
    return benign


#: Random-input tests draw from inside this interval where the box reaches into it.
_MODERATE = 100.0


def _moderate(lo: float, hi: float) -> tuple[float, float]:
    """``[lo, hi]`` cut to ``[-_MODERATE, _MODERATE]`` where they overlap."""
    cut = (max(lo, -_MODERATE), min(hi, _MODERATE))
    return cut if cut[0] < cut[1] else (lo, hi)


def _defined_box(
    derived: Derived, measured, full: dict[str, tuple[float, float]]
) -> dict[str, tuple[float, float]] | None:
    """The box of :func:`random_domains` inside the intervals ``full``; None where no
    cell passes."""
    import numpy as np

    from symgrad.numerics.native import evaluator

    fn = derived.function
    tensors = [i for i in fn.inputs if i.is_tensor]
    if not tensors:
        return full
    ours = [q.stable for q in measured if q.stable is not None]
    ours += [e for row in derived.second.values() for e in row.values()]
    exprs = [(q.reference, False) for q in measured] + [(e, True) for e in ours]
    scalars = {derived.symbols[i.name]: scalar_value(i) for i in fn.inputs if not i.is_tensor}
    column = {derived.symbols[i.name]: k for k, i in enumerate(tensors)}
    lows = np.array([lo for lo, _ in full.values()])
    widths = np.array([hi - lo for lo, hi in full.values()])
    unit = np.random.default_rng(0).random((_RANDOM_SAMPLES, len(tensors)))
    points = lows + widths * unit
    valid = np.ones(_RANDOM_SAMPLES, dtype=bool)
    finite = np.ones(_RANDOM_SAMPLES, dtype=bool)
    with np.errstate(all="ignore"):
        for expr, generated in exprs:
            symbols = sorted(expr.free_symbols, key=lambda s: s.name)
            args = [
                points[:, column[s]] if s in column else np.full(len(points), scalars.get(s, 1.0))
                for s in symbols
            ]
            try:
                result = np.broadcast_to(evaluator(expr, symbols)(*args), valid.shape)
                valid &= np.abs(result.astype(np.float64)) <= _RANDOM_MAX  # NaN fails too
                if generated:  # (the formula as written may overflow everywhere)
                    finite &= np.isfinite(result.astype(np.float64))
            except Exception:  # noqa: BLE001 - not evaluable with NumPy: not checked
                continue
    if valid.all():
        return full
    for passing in (valid, finite):
        box = _largest_box(unit, passing, full)
        if box is not None:
            return box
    return None


def _largest_box(unit, valid, full) -> dict[str, tuple[float, float]] | None:
    """The largest box of grid cells of the intervals ``full`` where every sampled point
    (``unit``: in the unit cube) is ``valid``, less a quarter cell at each end; None where
    no cell is."""
    import numpy as np

    tensors = list(full)
    n = _RANDOM_CELLS.get(len(tensors), 2)
    cells = np.minimum((unit * n).astype(int), n - 1)
    bad = np.zeros((n,) * len(tensors), dtype=int)
    np.add.at(bad, tuple(cells[~valid].T), 1)
    # bad cells in each box [a, b) by inclusion-exclusion on the summed-area table
    table = np.pad(bad, [(1, 0)] * len(tensors))
    for axis in range(len(tensors)):
        table = table.cumsum(axis=axis)
    best, best_size = None, 0
    spans = [(a, b) for a in range(n) for b in range(a + 1, n + 1)]
    for box in itertools.product(spans, repeat=len(tensors)):
        size = math.prod(b - a for a, b in box)
        if size <= best_size:
            continue
        count = sum(
            (-1) ** sum(corner) * table[tuple(ab[1 - c] for ab, c in zip(box, corner))]
            for corner in itertools.product((0, 1), repeat=len(tensors))
        )
        if count == 0:
            best, best_size = box, size
    if best is None:
        return None
    return {
        name: (float(lo + (hi - lo) * (a + 0.25) / n), float(lo + (hi - lo) * (b - 0.25) / n))
        for (name, (lo, hi)), (a, b) in zip(full.items(), best)
    }


#: gradcheck's finite-difference step is absolute (1e-6): past inputs of this size it is
#: scaled with them, as rounding in f(x + h) - f(x - h) would swamp the difference.
_FD_SCALE_FROM = 100.0


def finite_difference_step(domains: dict[str, tuple[float, float]]) -> dict[str, float] | None:
    """gradcheck's ``eps`` per input drawn from ``domains`` (1e-6 times the input's scale
    past 100); None where every input takes gradcheck's default."""
    scales = {name: max(abs(lo), abs(hi)) for name, (lo, hi) in domains.items()}
    if all(scale <= _FD_SCALE_FROM for scale in scales.values()):
        return None
    return {name: 1e-6 * max(scale, 1.0) for name, scale in scales.items()}


#: symgrad's primitives with jumps or kinks, whose numeric derivative is checked with a
#: step small enough to straddle one only at points that close to it
_ROUNDING = (F.round, F.floor, F.ceil, F.trunc)
_JUMPS = (*_ROUNDING, F.clamp)
#: Where a formula may step: no slack at its exact zeros (:func:`_zero_slack`).
_DISCONTINUOUS = (*_ROUNDING, sympy.sign, sympy.Heaviside, sympy.DiracDelta, sympy.Piecewise)


def _naive_torch(derived: Derived) -> list[str]:
    """The user's formula printed as plain torch ops, nothing rewritten."""
    printer = TorchPrinter(scalars=derived.scalars, as_written=True)
    tensors = [derived.symbols[i.name] for i in derived.function.inputs if i.is_tensor]
    try:
        # SymPy simplifies x - x + y to y as it parses: a zeros_like(x) per input the
        # formula lost gives the written formula's shape and dtype
        lines = []
        for _, expr in derived.naive_outputs:
            code = printer.doprint(expr)
            lost = [f"torch.zeros_like({s.name})" for s in tensors if s not in expr.free_symbols]
            if lost and expr.has(sympy.Piecewise):
                code = f"({code})"  # (a Python conditional binds looser than +)
            lines.append(" + ".join([code, *lost]))
        return lines
    except DerivationError:
        return []


def test_files(
    spec: Spec, derived: tuple[Derived, ...], targets, spec_path: str
) -> list[tuple[str, str]]:
    """(file name, source) of the test module of each target."""
    tests = each_function(derived, "writing the tests of", function_tests, lambda d: d.function)
    tensor_cases = each_function(spec.tensor_functions, "writing the tests of", tensor_case)
    files = []
    for target, template, module in (
        ("torch", "test_torch_module.py.jinja", f"{spec.module}_torch"),
        ("tensorflow", "test_tf_module.py.jinja", f"{spec.module}_tf"),
    ):
        if target in targets:
            text = render(
                template,
                spec=spec,
                spec_path=spec_path,
                module=module,
                functions=tests,
                tensor_functions=tensor_cases,
            )
            files.append((f"test_{module}.py", text))
    return files


def tensor_case(fn) -> dict:
    """What the generated tests of a tensor function need: an input shape per tensor (each
    named axis its own small size, batch axes '...' one axis of 2), domains, scalars."""
    sizes: dict[str, int] = {}
    tensors = {}
    for inp in fn.inputs:
        if not inp.is_tensor:
            continue
        shape = []
        for axis in inp.shape:
            if axis == "...":
                shape.append(2)
                continue
            sizes.setdefault(axis, 3 + len(sizes) % 3)
            shape.append(sizes[axis])
        lo, hi = inp.domain
        tensors[inp.name] = {
            "shape": tuple(shape),
            "domain": (max(lo, -3.0), min(hi, 3.0)) if lo < 3.0 and hi > -3.0 else (lo, hi),
            "limits": (literal(lo), literal(hi)),
            "differentiable": inp.differentiable,
            "optional": inp.optional,
            "integer": dict(inp.assumptions).get("integer") is True,
        }
    return {
        "name": fn.name,
        "order": fn.order,
        "references": tensor_references(fn),
        "tensors": tensors,
        "scalars": {i.name: repr(float(i.default)) for i in fn.inputs if not i.is_tensor},
        "inputs": [i.name for i in fn.inputs],
    }


#: Kinds of input the generated tests compare with exact values (symgrad.tensor.exact).
REFERENCE_KINDS = ("large", "offset", "constant", "logits")


def tensor_references(fn) -> list[dict]:
    """Exact values (mpmath) of a tensor function's output and gradients at the hard rows,
    per kind and dtype, at the inputs as that dtype holds them: source text for the tests
    (flat lists; None where the exact value is undefined or not settled at 256 vs 384
    bits)."""
    import numpy as np

    from symgrad.numerics.floats import round_to
    from symgrad.tensor.exact import exact_values, sample_inputs
    from symgrad.tensor.plan import derive_tensor

    d = derive_tensor(fn)
    diff = [i for i in fn.inputs if i.gets_gradient]
    refs = []
    for kind in REFERENCE_KINDS:
        raw = sample_inputs(fn, kind, 0, small=True)
        for dtype, npt in (("float64", np.float64), ("float32", np.float32)):
            held = {
                k: v.astype(npt).astype(np.float64)
                if isinstance(v, np.ndarray) and v.dtype.kind == "f"
                else v
                for k, v in raw.items()
            }
            out_shape = _out_shape(fn, held)
            rng = np.random.default_rng(7)
            upstream = rng.standard_normal(out_shape).astype(npt).astype(np.float64)
            gg = [rng.standard_normal(held[i.name].shape) for i in diff]
            low = exact_values(fn, d, held, upstream, gg, 256)
            high = exact_values(fn, d, held, upstream, gg, 384)
            if low is None or high is None:
                continue

            def settled(label, low=low, high=high, dtype=dtype):
                values = []
                for a, b in zip(low[label].flat, high[label].flat):
                    ok = (
                        a is not None
                        and b is not None
                        and round_to(a, "float64") == (round_to(b, "float64"))
                    )
                    values.append(_shortest(round_to(a, dtype), dtype) if ok else "None")
                return "[" + ", ".join(values) + "]"

            def flat(v, dtype=dtype):
                return "[" + ", ".join(_shortest(float(x), dtype) for x in np.asarray(v).flat) + "]"

            refs.append(
                {
                    "kind": kind,
                    "dtype": dtype,
                    "inputs": {
                        k: flat(v) if v.dtype.kind == "f" else flat(v, "float64")
                        for k, v in held.items()
                        if isinstance(v, np.ndarray)
                    },
                    "shapes": {
                        k: str(tuple(v.shape)) for k, v in held.items() if isinstance(v, np.ndarray)
                    },
                    "upstream": flat(upstream),
                    "exact": {
                        label: settled(label)
                        for label in ["out", *(f"grad_{i.name}" for i in diff)]
                    },
                }
            )
    return refs


def _shortest(value: float, dtype: str) -> str:
    """The shortest decimal that is ``value`` in ``dtype`` (float32: '0.1', not
    '0.10000000149011612')."""
    import numpy as np

    if dtype == "float32" and math.isfinite(value):
        return str(np.float32(value))
    return literal(value)


def _out_shape(fn, held) -> tuple[int, ...]:
    sizes = {}
    for inp in fn.inputs:
        if inp.shape:
            for axis, n in zip(inp.shape, held[inp.name].shape):
                sizes[axis] = n
    return tuple(sizes[a] for a in fn.outputs[0].shape)
