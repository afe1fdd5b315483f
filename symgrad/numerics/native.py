"""Formulas evaluated with NumPy as the frameworks compute them (float64 and float32).

Transcendental functions go through the C library so that the bits, and with them the
accuracy choice and the generated files, do not depend on the CPU's SIMD loops.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import sympy
from sympy.printing.numpy import NumPyPrinter

from symgrad import functions as F
from symgrad.cse import common_subexpressions, fresh_symbols
from symgrad.functions import (
    ROOT_POWER_HELPER,
    Temporaries,
    hypot_power_parts,
    print_interleaved,
    root_exponent,
)
from symgrad.ops import LIBM, OPS, REGIMES, libm
from symgrad.runtime.shared_helpers import _root_newton, _root_powers


@functools.cache
def _regimes_numpy(cls: type[F.StableFunction], fixed: tuple[int | None, ...]):
    """NumPy code for ``cls``'s regimes, with the integer arguments in ``fixed`` (exprel_d's
    order) fixed and the others (``None``) as parameters; built once per signature."""
    symbols = [sympy.Symbol(f"a{k}", real=True) for k in range(len(fixed))]
    args = [s if f is None else f for f, s in zip(fixed, symbols)]
    free = [s for f, s in zip(fixed, symbols) if f is None]
    regimes = _python_constants(cls(*args, evaluate=False).regimes())
    return sympy.lambdify(free, regimes, modules=_numpy_modules())


def _by_regimes(cls: type[F.StableFunction]):
    def evaluate(*args):
        fixed = tuple(a if isinstance(a, int) else None for a in args)
        return _regimes_numpy(cls, fixed)(*(a for a in args if not isinstance(a, int)))

    return evaluate


@functools.cache
def _numpy_modules() -> list:
    return [stable_numpy(), {ROOT_POWER_HELPER: root_power}, "numpy"]


#: pow through the C library, built once: root_power runs at every evaluation of the choice
_POWER = libm("power")


def root_power(x, p: int, q: int):
    """``x**(p/q)`` as the generated modules' ``_root_power`` computes it (see
    symgrad/runtime/torch_helpers.py), with the same framework-free helpers: pow's q-th
    root (the C library's) and one Newton step, then its powers and x's."""
    with np.errstate(all="ignore"):
        root = _POWER(x, 1.0 / q)
        newton = _root_newton(root, x, q)
        root = np.where(np.isnan(newton), root, newton)
        return _root_powers(root, x, p, q)


def stable_numpy() -> dict[str, object]:
    """NumPy evaluations of symgrad's primitives, as the frameworks compute them: the
    C library's for the ufuncs of :data:`~symgrad.ops.LIBM`, the rows' ``numpy``
    functions, and the regimes of those the printers write out by regime."""
    table: dict[str, object] = {name: libm(name) for name in LIBM}
    for op in OPS:
        if callable(op.numpy):
            table[op.name] = op.numpy
        elif op.numpy == REGIMES:  # the same regimes as the printers write
            table[op.name] = _by_regimes(op.sympy)
    return table


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
        # the framework printers' order of a product with powers, so that the accuracy
        # choice measures the overflow the generated code has (or has not)
        return self._hypot_ratios(expr) or print_interleaved(self, expr) or super()._print_Mul(expr)

    def _print_Pow(self, expr, rational=False):
        base, e = expr.as_base_exp()
        root = root_exponent(e) if base.free_symbols else None
        if root is not None:  # as the framework printers write it
            return f"{ROOT_POWER_HELPER}({self._print(base)}, {root[0]}, {root[1]})"
        return self._hypot_ratios(expr) or super()._print_Pow(expr, rational)


def evaluator(expr: sympy.Expr, symbols: Sequence[sympy.Symbol]):
    # lambdify prints our own (whitelisted, parsed) SymPy tree; nothing from the spec text.
    modules = _numpy_modules()
    printer = _NumPyPrinter(
        {"fully_qualified_modules": False, "inline": True, "allow_unknown_functions": True}
    )
    printer.temporaries = Temporaries()

    def shared(e):
        replacements, reduced = _shared(e)
        for temp, value in replacements:  # as plan.emit records them for its printer
            printer.temporaries.record(temp, value)
        return replacements, reduced

    # the same common subexpressions, so the same order of operations, as the generated
    # code (plan.emit), where an intermediate product may overflow first
    return sympy.lambdify(symbols, expr, modules=modules, printer=printer, cse=shared)


def _python_constants(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each constant that NumPy would compute (sqrt(2), log(13/2)) as its
    value, a Float: printed as a Python number, as the frameworks' code has it.

    NumPy's ``sqrt(2)`` is a float64 scalar, which makes ``sqrt(2) * x`` float64 for a
    float32 ``x``: the whole float32 evaluation would run in float64 and miss every
    float32 overflow. A Python float leaves ``x``'s dtype alone (NEP 50), as in torch
    and TF."""

    def constant(e: sympy.Basic) -> bool:
        return (
            isinstance(e, sympy.Expr)
            and not e.is_Atom
            and not e.free_symbols
            and not e.is_Rational
            and e.is_extended_real is True
        )

    def value(e: sympy.Expr) -> sympy.Expr:
        folded = e.evalf(20)
        return sympy.Float(folded, 17) if folded.is_Float else e

    return expr.replace(constant, value)


def _shared(expr):
    """lambdify's ``cse`` hook: :func:`~symgrad.cse.common_subexpressions` of one
    expression or a tuple of them."""
    several = isinstance(expr, (tuple, list))
    exprs = list(expr) if several else [expr]
    replacements, reduced = common_subexpressions(exprs, fresh_symbols(exprs, "_t"))
    # constants as Python floats after the sharing, which sees them as the code's CSE does
    replacements = [(t, _python_constants(v)) for t, v in replacements]
    reduced = [_python_constants(e) for e in reduced]
    return replacements, (type(expr)(reduced) if several else reduced[0])


def call(fn, args: Sequence[float], dtype) -> float:
    try:
        return float(fn(*(dtype(a) for a in args)))
    except (ValueError, ZeroDivisionError, OverflowError):
        return math.nan
