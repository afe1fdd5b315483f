"""Formulas evaluated with NumPy as the frameworks compute them (float64 and float32).

Transcendental functions go through the C library so that the bits, and with them the
accuracy choice and the generated files, do not depend on the CPU's SIMD loops.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import mpmath
import numpy as np
import sympy
from sympy.printing.numpy import NumPyPrinter

from symgrad import functions as F
from symgrad.functions import hypot_power_parts


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
    return [stable_numpy(), "numpy"]


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


def stable_numpy() -> dict[str, object]:
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


def evaluator(expr: sympy.Expr, symbols: Sequence[sympy.Symbol]):
    # lambdify prints our own (whitelisted, parsed) SymPy tree; nothing from the spec text.
    modules = _numpy_modules()
    printer = _NumPyPrinter(
        {"fully_qualified_modules": False, "inline": True, "allow_unknown_functions": True}
    )
    # cse=True: the same common subexpressions, so the same order of operations, as the
    # generated code (plan.emit), where an intermediate product may overflow first
    return sympy.lambdify(symbols, expr, modules=modules, printer=printer, cse=True)


def call(fn, args: Sequence[float], dtype) -> float:
    try:
        return float(fn(*(dtype(a) for a in args)))
    except (ValueError, ZeroDivisionError, OverflowError):
        return math.nan
