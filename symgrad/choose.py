"""Accuracy-driven choice between equivalent formulas (Herbie-style, small).

Candidates are evaluated in float64 with NumPy at points sampled over the bit patterns of
each input's domain, and compared with the exact value (mpmath, via
:func:`symgrad.reference.exact`). The error measure is Herbie's: bits of error, log2 of
1 + the number of floats between the computed and the correctly rounded exact value.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import mpmath
import numpy as np
import sympy
from sympy.printing.numpy import NumPyPrinter

from symgrad import functions as F
from symgrad.floats import bits_of_error, from_ordinal, ordinal, round_to
from symgrad.printers.base import hypot_power_parts
from symgrad.reference import Unresolved, exact, scalar_value
from symgrad.spec import Input

POINTS = 48


@dataclass(frozen=True)
class Accuracy:
    """Measured error of one formula in float64."""

    mean_bits: float
    max_bits: float
    non_finite: int  # results that are inf/nan where the exact value is finite
    points: int
    #: the point of the largest error (a non-finite result first), as ``x = -1e4, ...``
    worst: str = field(default="", compare=False)
    #: of ``non_finite``, the float64 results (float32's may come from a point that float32
    #: rounds onto a pole or to 0)
    non_finite64: int = field(default=0, compare=False)

    def __str__(self) -> str:
        text = f"{self.mean_bits:.1f} bits mean, {self.max_bits:.0f} max over {self.points} points"
        if self.non_finite:
            text += f", {self.non_finite} non-finite"
        return text


def sample(inputs: Sequence[Input], n: int, seed: str) -> list[dict[str, float]]:
    """Points drawn uniformly over the float64 bit patterns inside each tensor input's domain.

    Scalars take :func:`symgrad.reference.scalar_value`.
    """
    rng = random.Random(seed)
    points = []
    largest = ordinal(np.finfo(np.float64).max)
    for _ in range(n):
        point = {}
        for inp in inputs:
            if not inp.is_tensor:
                point[inp.name] = scalar_value(inp)
                continue
            lo, hi = inp.domain
            lo_n = -largest if math.isinf(lo) else ordinal(lo)
            hi_n = largest if math.isinf(hi) else ordinal(hi)
            point[inp.name] = from_ordinal(rng.randint(lo_n, hi_n))
        points.append(point)
    return points


def _np(fn):
    # plain Python floats in: mpmath takes no NumPy float32
    return np.vectorize(lambda *args: fn(*(float(a) for a in args)), otypes=[np.float64])


@functools.cache
def _regimes_numpy(cls: type[F.StableFunction], fixed: tuple[int | None, ...]):
    """NumPy code for ``cls``'s regimes, with the integer arguments in ``fixed`` (exprel_d's
    order) fixed and the others (``None``) as parameters; built once per signature."""
    symbols = [sympy.Symbol(f"a{k}", real=True) for k in range(len(fixed))]
    args = [s if f is None else f for f, s in zip(fixed, symbols)]
    free = [s for f, s in zip(fixed, symbols) if f is None]
    return sympy.lambdify(free, cls(*args, evaluate=False).regimes(), modules=_numpy_modules())


def _by_regimes(cls: type[F.StableFunction]):
    def evaluate(*args):
        fixed = tuple(a if isinstance(a, int) else None for a in args)
        return _regimes_numpy(cls, fixed)(*(a for a in args if not isinstance(a, int)))

    return evaluate


@functools.cache
def _numpy_modules() -> list:
    return [_stable_numpy(), "numpy"]


#: NumPy ufuncs whose SIMD loops round differently on different CPUs (float64 tanh on AVX2
#: against SSE; sinh, expm1, ... with AVX-512's SVML), each with the C library's function.
_LIBM = {
    "exp": math.exp,
    "expm1": math.expm1,
    "exp2": lambda v: math.pow(2.0, v),
    "log": math.log,
    "log1p": math.log1p,
    "log2": math.log2,
    "log10": math.log10,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "arcsin": math.asin,
    "arccos": math.acos,
    "arctan": math.atan,
    "arctan2": math.atan2,
    "sinh": math.sinh,
    "cosh": math.cosh,
    "tanh": math.tanh,
    "arcsinh": math.asinh,
    "arccosh": math.acosh,
    "arctanh": math.atanh,
    "cbrt": math.cbrt,
    "power": math.pow,
}


def _libm(name: str):
    """NumPy's ufunc ``name`` computed by the C library in double, rounded to the
    arguments' dtype: the same bits on every CPU, so the measured errors, and with them
    the chosen forms and the generated files, do not depend on the machine that made
    them. Special values (overflow, poles, outside the domain) are NumPy's own."""
    ufunc, scalar = getattr(np, name), _LIBM[name]

    def one(*args: float) -> float:
        try:
            return scalar(*args)
        except (OverflowError, ValueError):
            with np.errstate(all="ignore"):
                return float(ufunc(*args))

    elementwise = np.vectorize(one, otypes=[np.float64])

    def evaluate(*args):
        dtype = np.result_type(*args)
        if dtype.kind != "f":  # log(2): numbers in, a float out (not an integer)
            dtype = np.dtype(np.float64)
        with np.errstate(over="ignore"):  # to float32: inf, as float32 arithmetic gives
            if all(np.ndim(a) == 0 for a in args):
                return dtype.type(one(*(float(a) for a in args)))
            return elementwise(*args).astype(dtype)

    return evaluate


def _stable_numpy() -> dict[str, object]:
    """NumPy evaluations of symgrad's primitives, as the frameworks compute them."""
    exp = _libm("exp")

    def softplus(x):
        return np.logaddexp(0.0, x)

    log, log1p, expm1 = _libm("log"), _libm("log1p"), _libm("expm1")

    def log1mexp(x):
        return np.where(x > -math.log(2), log(-expm1(x)), log1p(-exp(x)))

    def xlogy(x, y):
        return np.where(x == 0, 0.0, x * log(y))

    def xlog1py(x, y):
        return np.where(x == 0, 0.0, x * log1p(y))

    # primitives the printers write out by regime are evaluated from the same regimes
    by_regimes = {
        cls.__name__: _by_regimes(cls)
        for cls in (
            F.dsigmoid,
            F.erfcx_inv,
            F.exprel,
            F.exprel_d,
            F.hypot_ratio,
            F.logcosh,
            F.log1p_square,
            F.tan_half_atan,
        )
    }
    return {
        **{name: _libm(name) for name in _LIBM},
        **by_regimes,
        "xlog1py": xlog1py,
        "erfcx": _np(lambda v: float(F.erfcx.mp(mpmath.mpf(v)))),
        "sigmoid": lambda x: exp(-np.logaddexp(0.0, -x)),
        "softplus": softplus,
        "log1mexp": log1mexp,
        "logaddexp": np.logaddexp,
        "xlogy": xlogy,
        "hypot": np.hypot,
        "relu": lambda x: np.maximum(x, 0.0),
        "one_plus_erf": _np(lambda v: math.erfc(-v)),
        "erf": _np(math.erf),
        "erfc": _np(math.erfc),
        "loggamma": _np(math.lgamma),
        "gamma": _np(lambda v: math.gamma(v) if v > 0 or v != int(v) else math.nan),
        "digamma": _np(lambda v: float(mpmath.digamma(v)) if v > 0 or v != int(v) else math.nan),
        "polygamma": _np(lambda n, v: float(mpmath.polygamma(int(n), v))),
        "Heaviside": lambda x, h0=0.5: np.heaviside(x, h0),
        "round": np.rint,  # ties to even, as torch.round
        "floor": np.floor,
        "ceil": np.ceil,
        "trunc": np.trunc,
        "clamp": lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),  # hi where lo > hi
    }


class _NumPyPrinter(NumPyPrinter):
    """lambdify's NumPy printer with the framework printers' overflow-safe hypot powers."""

    def _hypot_ratios(self, expr):
        parts = hypot_power_parts(expr)
        if parts is None:
            return None
        rest, h, k, pairs = parts
        hyp = self._print(h)
        texts = [f"({self._print(rest)})", f"(1 / {hyp})**{k}"]
        texts += [f"({self._print(b)} / {hyp})**{m}" for b, m in pairs]
        return " * ".join(texts)

    def _print_Mul(self, expr):
        return self._hypot_ratios(expr) or super()._print_Mul(expr)

    def _print_Pow(self, expr, rational=False):
        return self._hypot_ratios(expr) or super()._print_Pow(expr, rational)


def _evaluator(expr: sympy.Expr, symbols: Sequence[sympy.Symbol]):
    # lambdify prints our own (whitelisted, parsed) SymPy tree; nothing from the spec text.
    modules = _numpy_modules()
    printer = _NumPyPrinter(
        {"fully_qualified_modules": False, "inline": True, "allow_unknown_functions": True}
    )
    # cse=True: the same common subexpressions, so the same order of operations, as the
    # generated code (plan.emit), where an intermediate product may overflow first
    return sympy.lambdify(symbols, expr, modules=modules, printer=printer, cse=True)


_F32_MAX = float(np.finfo(np.float32).max)
#: float32 results must be finite where the exact value is below this (a margin for the
#: exact value at the float32-rounded point), or, at a point that is a float32 point,
#: where the exact value rounds to a finite float32
_F32_FINITE = 1e38
#: Points at the ends of each dtype's range, each a float32 where it fits: where a
#: candidate's intermediate overflows (beta*x, x**2) though the value does not, it loses.
RANGE_ENDS = tuple(
    s * v
    for v in (1e38, float(np.float32(3e38)), _F32_MAX, 1e308, float(np.finfo(np.float64).max))
    for s in (-1.0, 1.0)
)


def _call(fn, args: Sequence[float], dtype) -> float:
    try:
        return float(fn(*(dtype(a) for a in args)))
    except (ValueError, ZeroDivisionError, OverflowError):
        return math.nan


def _reference(expr: sympy.Expr, point: Mapping[sympy.Symbol, float]) -> float | None:
    """The exact value at ``point``; None where undefined or unknown (not measured)."""
    try:
        return exact(expr, point)
    except Unresolved:
        return None


def _finite_in_float32(ref: float, args: Sequence[float]) -> bool:
    """The exact value ``ref`` at ``args`` is finite in float32 (at the float32-rounded
    point: with a margin where rounding moves the point)."""
    if not all(abs(a) <= _F32_MAX for a in args):
        return False
    if all(round_to(a, "float32") == a for a in args):
        return math.isfinite(round_to(ref, "float32"))
    return abs(ref) < _F32_FINITE


def measure(
    expr: sympy.Expr,
    reference_expr: sympy.Expr,
    points: Sequence[Mapping[sympy.Symbol, float]],
    references: Sequence[float | None] | None = None,
) -> Accuracy:
    """Float64 error of ``expr`` against the exact value of ``reference_expr``; non-finite
    results counted in float64 and float32 (where the exact value fits in float32)."""
    symbols = sorted(reference_expr.free_symbols | expr.free_symbols, key=lambda s: s.name)
    fn = _evaluator(expr, symbols)
    if references is None:
        references = [_reference(reference_expr, p) for p in points]
    errors, non_finite, non_finite64 = [], 0, 0
    worst, worst_key = "", (-1, -1.0)
    with np.errstate(all="ignore"):
        for point, ref in zip(points, references):
            if ref is None or not math.isfinite(ref):
                continue
            args = [point[s] for s in symbols]
            value = _call(fn, args, np.float64)
            bad = not math.isfinite(value)
            errors.append(bits_of_error(value, ref))
            # float32: only non-finite results count (the error is measured in float64)
            if _finite_in_float32(ref, args):
                bad32 = not math.isfinite(_call(fn, args, np.float32))
                non_finite += bad32
                bad = bad or bad32
            non_finite += not math.isfinite(value)
            non_finite64 += not math.isfinite(value)
            if (bad, errors[-1]) > worst_key:
                worst_key = (bad, errors[-1])
                worst = _point_text(point, symbols)
    if not errors:
        return Accuracy(0.0, 0.0, 0, 0)
    mean = sum(errors) / len(errors)
    return Accuracy(mean, max(errors), non_finite, len(errors), worst, non_finite64)


def _point_text(point: Mapping[sympy.Symbol, float], symbols: Sequence[sympy.Symbol]) -> str:
    """``x = -1e+04, y = 2.5``: the inputs of a point (upstream gradients left out)."""
    return ", ".join(
        f"{s.name} = {point[s]:.4g}"
        for s in symbols
        if s.name != "grad" and not s.name.startswith("grad_")
    )


def most_accurate(
    candidates: Sequence[sympy.Expr], points: Sequence[Mapping[sympy.Symbol, float]]
) -> list[tuple[sympy.Expr, Accuracy]]:
    """The candidates as accurate as the best (fewest non-finite results, then mean bits
    within 1/2 bit), with their measured accuracy, in the given order. The first
    candidate is the reference; [] where none can be evaluated with NumPy."""
    reference_expr = candidates[0]
    references = [_reference(reference_expr, p) for p in points]
    scored = []
    for candidate in candidates:
        try:
            accuracy = measure(candidate, reference_expr, points, references)
        except (TypeError, NameError, KeyError, AttributeError):
            continue  # cannot be evaluated with NumPy: not measurable, not chosen
        scored.append((candidate, accuracy))
    if not scored:
        return []
    best = min(scored, key=lambda c: (c[1].non_finite, c[1].mean_bits))[1]
    return [
        c
        for c in scored
        if c[1].non_finite == best.non_finite and c[1].mean_bits <= best.mean_bits + 0.5
    ]


def _scalar_ends(inputs: Sequence[Input]) -> list[dict[str, float]]:
    """One point per scalar input and finite end of its domain other than its value."""
    ends = []
    for inp in inputs:
        if not inp.is_tensor:
            for end in inp.domain:
                if math.isfinite(end) and end != scalar_value(inp):
                    ends.append({inp.name: end})
    return ends


def symbol_points(
    inputs: Sequence[Input],
    symbols: Mapping[str, sympy.Symbol],
    extra: Sequence[sympy.Symbol] = (),
    n: int = POINTS,
    seed: str = "symgrad",
) -> list[dict[sympy.Symbol, float]]:
    """Sample points keyed by symbol; ``extra`` symbols (upstream gradients) are 1."""
    from symgrad.reference import extreme_points

    points = [{symbols[k]: v for k, v in p.items()} for p in sample(inputs, n, seed)]
    base = points[0] if points else {}
    for inp in inputs:
        if inp.is_tensor:
            lo, hi = inp.domain
            # the test extremes, and the ends of each dtype's range
            edges = [v for v in RANGE_ENDS if lo <= v <= hi]
            for v in extreme_points(inp) + edges:
                points.append({**base, symbols[inp.name]: v})
            # scalars at the ends of their domain too: beta*x overflows for beta = 10
            for scalar in _scalar_ends(inputs):
                values = {symbols[name]: v for name, v in scalar.items()}
                points += [{**base, **values, symbols[inp.name]: v} for v in edges]
    for p in points:
        p.update({g: 1.0 for g in extra})
    return points


_ = F  # the primitives must be registered before lambdify sees their names
