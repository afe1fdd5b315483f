"""Exact values of SymPy formulas with mpmath, at adaptive precision.

The lowest layer of symgrad's numerics: it knows formulas and points, nothing of specs'
functions or of derived gradients (the test-case builder, :mod:`symgrad.cases`, and the
accuracy report sit on top of it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import mpmath
import sympy

from symgrad.ops import OPS

PREC_BITS = 256
MAX_PREC_BITS = 65536

#: SymPy class -> its exact value with mpmath (the rows' ``mp``).
_MP_FUNCS = {op.sympy: op.mp for op in OPS if op.mp is not None}
#: Functions of one argument whose condition number can be large -> their derivative
#: (the rows' ``mp_derivative``; see :func:`_condition`).
_DERIVATIVES = {op.sympy: op.mp_derivative for op in OPS if op.mp_derivative is not None}


class Undefined(ArithmeticError):
    """The exact value does not exist (log of a negative number, pole, ...)."""


def _real(value) -> mpmath.mpf:
    if isinstance(value, mpmath.mpc):
        if (
            abs(value.imag) > abs(value.real) * mpmath.mpf(2) ** (-PREC_BITS // 2)
            and value.imag != 0
        ):
            raise Undefined("complex result")
        value = value.real
    if mpmath.isnan(value):
        raise Undefined("nan")
    return mpmath.mpf(value)


class Trace:
    """What an evaluation lost to cancellation, node by node: the bits of the working
    precision that a node's value does not hold, its arguments' losses carried through it.

    A sum's value loses the bits its terms cancel, counted on the terms' own errors (inf
    where rounded terms sum to exactly 0): ``sin(x)/x**2 - 2*(1 - cos(x))/x**3`` at
    x = 1e-125 loses 830 bits in ``1 - cos(x)`` and 834 more in the difference, so 1024
    bits hold no digit of it (they give -x/6, not -x/12). A function loses what its
    argument lost, times its condition number where that can be large (:func:`_condition`).
    ``lost`` is the most any node lost (a Piecewise's conditions included)."""

    def __init__(self) -> None:
        self.lost = 0.0
        self._nodes: dict[sympy.Basic, float] = {}

    def of(self, expr: sympy.Basic) -> float:
        """The bits ``expr``'s value lost (0 for inputs and numbers)."""
        return self._nodes.get(expr, 0.0)

    def record(self, expr: sympy.Basic, lost: float) -> None:
        """Set the bits ``expr``'s value lost."""
        self._nodes[expr] = lost
        self.lost = max(self.lost, lost)

    def sum_lost(self, args, terms, total) -> float:
        """The bits a sum ``total`` of ``terms`` (the values of ``args``) lost: the
        largest of the terms' errors, each its size times its lost bits, against the sum."""
        losses = [self.of(a) for a in args]
        lost = max(losses, default=0.0)
        if not all(mpmath.isfinite(t) for t in terms) or not mpmath.isfinite(total):
            return lost
        if not math.isfinite(lost):
            return math.inf
        error = mpmath.fsum(mpmath.ldexp(abs(t), math.ceil(k)) for t, k in zip(terms, losses))
        if error == 0:
            return lost
        if total == 0:
            return math.inf
        return max(lost, _log2(error, abs(total)))

    def conditioned(self, args, condition) -> float:
        """The bits a function's value lost: its arguments' losses, the first's times the
        condition number ``condition`` (None or below 1: not amplified)."""
        lost = max((self.of(a) for a in args), default=0.0)
        if condition is None or condition <= 1:
            return lost
        if not mpmath.isfinite(condition):
            return math.inf
        return max(lost, self.of(args[0]) + _log2(condition))


def _log2(value, over=1) -> float:
    """log2(value / over) of positive finite mpfs, to float precision, cheap at any working
    precision and for exponents past float64's (exp(-x**2/2) at x = 1e293)."""
    mantissa, exponent = mpmath.frexp(value)
    below, shift = mpmath.frexp(over)
    return float(exponent - shift) + math.log2(mantissa) - math.log2(below)


def _binary_fraction(r: sympy.Rational) -> bool:
    """``r`` is a binary fraction (its denominator a power of 2): a float holds it exactly
    (given the bits)."""
    q = int(r.q)
    return q & (q - 1) == 0


def _exact_node(expr: sympy.Basic, env: Mapping[sympy.Symbol, mpmath.mpf]) -> bool:
    """``expr`` at ``env`` is exact at the working precision: inputs, dyadic rationals, and
    sums, products and integer powers of them that need no more bits than the precision.

    Such a sum that cancels to 0 is 0 (x + 3 at x = -3), not a precision artefact.
    """
    if isinstance(expr, sympy.Symbol):
        return True
    if expr.is_Float:
        return True  # a binary float: exact
    if expr.is_Rational:
        return _binary_fraction(expr)
    if isinstance(expr, sympy.Pow):
        e = expr.args[1]
        if not (e.is_Integer and 0 < e <= 8 and _exact_node(expr.args[0], env)):
            return False
        return _fits(mpmath.power(_exact_value(expr.args[0], env), int(e)))
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        return all(_exact_node(a, env) for a in expr.args) and _fits(_exact_value(expr, env))
    return False


def _exact_value(expr: sympy.Basic, env: Mapping[sympy.Symbol, mpmath.mpf]) -> mpmath.mpf:
    """The value of a node :func:`_exact_node` accepts, without rounding."""
    if isinstance(expr, sympy.Symbol):
        return env[expr]
    if expr.is_Float:
        return mpmath.mpf(expr)
    if expr.is_Rational:
        return mpmath.mpf(int(expr.p)) / int(expr.q)  # dyadic: exact
    args = [_exact_value(a, env) for a in expr.args]
    if isinstance(expr, sympy.Add):
        total = mpmath.mpf(0)
        for a in args:
            total = mpmath.fadd(total, a, exact=True)
        return total
    if isinstance(expr, sympy.Mul):
        total = mpmath.mpf(1)
        for a in args:
            total = mpmath.fmul(total, a, exact=True)
        return total
    total = mpmath.mpf(1)
    for _ in range(int(expr.args[1])):
        total = mpmath.fmul(total, args[0], exact=True)
    return total


def _fits(value: mpmath.mpf) -> bool:
    """``value`` is representable at the working precision."""
    return value == +value  # unary plus rounds to the working precision


def evaluate(expr: sympy.Basic, env: Mapping[sympy.Symbol, mpmath.mpf], trace: Trace | None = None):
    """Evaluate ``expr`` at ``env`` with mpmath (the working precision set by the caller).

    ``trace``, where given, records the bits lost to cancellation (see :func:`exact`).
    """
    return _evaluate(expr, env, trace, {})


#: Exponents of more bits than this are raised through exp and log: mpmath raises an
#: integer-valued exponent exactly, by squaring, with an integer of that many bits (a
#: float's 1/y at y = 1e-300 has 997; exp(w) at w = 1e308 has 1.4e308).
_HUGE_BITS = 4096


def _power(base: mpmath.mpf, e: mpmath.mpf) -> mpmath.mpf:
    """base**e, also where e is too large to raise by squaring: l**exp(w) at w = 1e308
    (Herbie's exp-w regression) asked mpmath for an integer of 1e308 bits. Then |base|**e
    is exp(e*log|base|), inf or 0 where that exponent is itself that large (beyond every
    float); for a base < 0 (e is then an integer) the sign is e's parity."""
    if not (mpmath.isfinite(e) and mpmath.mag(e) > _HUGE_BITS and base != 0):
        return mpmath.power(base, e)
    t = e * mpmath.log(abs(base))
    if t != 0 and mpmath.mag(t) > _HUGE_BITS:
        magnitude = mpmath.inf if t > 0 else mpmath.mpf(0)
    else:
        magnitude = mpmath.exp(t)
    man, exp = e.man_exp
    odd = exp <= 0 and (man >> -exp) & 1
    return -magnitude if base < 0 and odd else magnitude


def _evaluate(expr: sympy.Basic, env, trace: Trace | None, memo: dict):
    """:func:`evaluate`'s recursion; ``memo`` holds the values of the subexpressions seen
    (derivatives repeat theirs many times)."""
    if expr not in memo:
        memo[expr] = _node(expr, env, trace, memo)
    return memo[expr]


def _node(expr: sympy.Basic, env, trace: Trace | None, memo: dict):
    """The value of one node of :func:`evaluate`."""

    def evaluate(e, env):
        return _evaluate(e, env, trace, memo)

    if isinstance(expr, sympy.Symbol):
        return env[expr]
    if expr.is_Number or expr in (sympy.pi, sympy.E):
        if expr is sympy.oo:
            return mpmath.inf
        if expr is sympy.S.NegativeInfinity:
            return -mpmath.inf
        if expr is sympy.nan or expr is sympy.zoo:
            raise Undefined("nan")
        return mpmath.mpf(sympy.Float(expr, mpmath.mp.dps + 5))
    if expr is sympy.true:
        return True
    if expr is sympy.false:
        return False
    args = expr.args
    if isinstance(expr, sympy.Add):
        terms = [evaluate(a, env) for a in args]
        total = _real(mpmath.fsum(terms))
        if trace is not None:
            lost = trace.sum_lost(args, terms, total)
            if lost > 1 and _exact_node(expr, env):
                lost = 0.0  # an exact sum cancels nothing (x + 3 at x = -3 is 0)
            trace.record(expr, lost)
        return total
    if isinstance(expr, sympy.Mul):
        result = mpmath.mpf(1)
        for a in args:
            result *= evaluate(a, env)
        if trace is not None:  # relative errors add: within a few bits, the largest
            trace.record(expr, max(trace.of(a) for a in args))
        return _real(result)
    if isinstance(expr, sympy.Pow):
        base, e = evaluate(args[0], env), evaluate(args[1], env)
        if base == 0 and e < 0:
            raise Undefined("division by zero")
        if base < 0 and not mpmath.isint(e):
            # complex, however small its imaginary part: (-1e300)**1e-200 is
            # 1 + 3e-200i, real to the threshold of _real but no real number (NaN in IEEE)
            raise Undefined("a negative number to a power that is not an integer")
        value = _real(_power(base, e))
        if trace is not None:
            # relative error |e| times the base's, plus |e*log(base)| times the exponent's
            lost = max(trace.of(args[0]), trace.of(args[1]))
            if abs(e) > 1 and mpmath.isfinite(e):
                lost = max(lost, trace.of(args[0]) + _log2(abs(e)))
            if base > 0 and not _exact_node(args[1], env):
                scale = abs(e * mpmath.log(base))
                if scale > 1 and mpmath.isfinite(scale):
                    lost = max(lost, trace.of(args[1]) + _log2(scale))
            trace.record(expr, lost)
        return value
    if isinstance(expr, sympy.Piecewise):
        for value, cond in args:
            if evaluate(cond, env):
                chosen = evaluate(value, env)
                if trace is not None:
                    trace.record(expr, trace.of(value))
                return chosen
        raise Undefined("no Piecewise branch")
    if isinstance(expr, sympy.core.relational.Relational):
        lhs, rhs = evaluate(expr.lhs, env), evaluate(expr.rhs, env)
        return {
            "<": lhs < rhs,
            "<=": lhs <= rhs,
            ">": lhs > rhs,
            ">=": lhs >= rhs,
            "==": lhs == rhs,
            "!=": lhs != rhs,
        }[expr.rel_op]
    if isinstance(expr, sympy.And):
        return all(evaluate(a, env) for a in args)
    if isinstance(expr, sympy.Or):
        return any(evaluate(a, env) for a in args)
    if isinstance(expr, sympy.Not):
        return not evaluate(args[0], env)
    func = _MP_FUNCS.get(type(expr))
    if func is None:
        raise NotImplementedError(f"no mpmath evaluation for {type(expr).__name__}")
    values = [evaluate(a, env) for a in args]
    try:
        value = _real(func(*values))
    except (ValueError, ZeroDivisionError) as exc:
        raise Undefined(str(exc)) from None
    if trace is not None:
        trace.record(expr, trace.conditioned(args, _condition(expr, values, value, env)))
    return value


def _condition(expr: sympy.Basic, values, value, env):
    """The condition number |a f'(a) / f(a)| of a function of :data:`_DERIVATIVES` at its
    argument a, where a is not exact (None: not known, taken as 1): the relative error of
    the rounded argument becomes the value's times it. Periodic functions without bound as
    |a| grows (sin(x + e) at x = 30, e = 1e131 is sin(e) at 256 bits: the reduction
    cancels the rounded argument against multiples of the period), exp as |a| grows, log
    near 1, the inverse functions near their branch points."""
    derivative = _DERIVATIVES.get(type(expr))
    a = values[0]
    if derivative is None or a == 0 or not mpmath.isfinite(value) or _exact_node(expr.args[0], env):
        return None  # (at 0 the argument's relative error is no error: log(0) is -inf)
    if value == 0:
        return mpmath.inf
    try:
        return abs(a * derivative(a) / value)
    except (ValueError, ZeroDivisionError):  # at a branch point: no digit is safe
        return mpmath.inf


def to_float(value) -> float | None:
    """The value as a Python float; +-inf when it overflows float64; None if undefined."""
    if value is None:
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


class Unresolved(ArithmeticError):
    """No two precisions up to :data:`MAX_PREC_BITS` agree on the value: unknown."""


#: Bits a value must keep past its cancellations to be trusted for a float64 comparison:
#: float64's 53 and a margin for the rounding that cancellation does not show.
TRUSTED_BITS = 64


def at_precision(expr: sympy.Basic, point: Mapping[sympy.Symbol, float], prec: int):
    """The value rounded to float64 at ``prec`` bits (None where undefined), the bits it
    lost to cancellation, and its binary exponent (None where it is 0 or not finite)."""
    trace = Trace()
    with mpmath.workprec(prec):
        env = {s: mpmath.mpf(v) for s, v in point.items()}
        try:
            raw = evaluate(expr, env, trace)
        except (Undefined, ZeroDivisionError, OverflowError):
            # OverflowError: mpmath gives up on e.g. erfc(1e300); no reference there.
            raw = None
        finite = raw is not None and raw != 0 and mpmath.isfinite(raw)
        magnitude = int(mpmath.mag(raw)) if finite else None
    return to_float(raw), trace.lost, magnitude


#: A value that lost everything to cancellation at each precision still counts once it is
#: the same over a rise of precision this large: 1 + tanh(-1e300) is 0 at any precision.
#: (A cancellation that needs more than 16 x 256 = 4096 bits and gives the same value at
#: 256, 1024 and 4096 is taken for that value; higher costs seconds a point: mpmath's erf
#: at 16384 bits takes 1.5 s.)
SETTLED_RISE = 16


def _pole(history: Sequence[tuple[int, bool, int | None]]) -> bool:
    """The values at the precisions tried so far, ``(precision, trusted, exponent)``, are
    those of a pole: the latest ones, none trusted, each at least ``2**(r/2)`` times as large
    as the one before where the precision rose by r bits, over a :data:`SETTLED_RISE`-fold
    rise of precision. tan(pi*l) at l = 0.5 is about 2**p at p bits (pi/2 rounded to p bits
    is 2**-p from the pole), so no precision settles it: undefined, not a value that more
    precision would reach."""
    run: list[tuple[int, int]] = []  # (precision, exponent), newest first
    for prec, trusted, exponent in reversed(history):
        if trusted or exponent is None:
            break
        if run and 2 * (run[-1][1] - exponent) < run[-1][0] - prec:
            break
        run.append((prec, exponent))
    return len(run) >= 2 and run[0][0] >= SETTLED_RISE * run[-1][0]


def exact(expr: sympy.Basic, point: Mapping[sympy.Symbol, float]) -> float | None:
    """The exact value rounded to float64 (None where undefined).

    Evaluated at rising precision until two precisions agree, each keeping
    :data:`TRUSTED_BITS` past its cancellations, or until one value holds over a
    :data:`SETTLED_RISE`-fold rise: a naive formula such as log(1 - sigmoid(710)) cancels
    2**-1024 against 1 and needs over a thousand bits, and squareplus at x = -1e156 is 0
    at both 256 and 1024 bits (x**2 + 4 rounds to x**2). The next precision covers the
    bits the last one lost. Raises :class:`Unresolved` where no value settles up to
    :data:`MAX_PREC_BITS`.
    """
    previous: tuple[float | None, bool] | None = None
    history: list[tuple[int, bool, int | None]] = []
    since = prec = PREC_BITS  # the precision since which the value has not changed
    while prec <= MAX_PREC_BITS + 2 * TRUSTED_BITS:  # (the last check is a little higher)
        value, lost, exponent = at_precision(expr, point, prec)
        trusted = prec - lost >= TRUSTED_BITS
        history.append((prec, trusted, exponent))
        if _pole(history):
            return None
        if previous is not None and previous[0] == value:
            # an infinity that cancellation made (log(1 - sigmoid(1e4)) is log(0) below
            # 14,000 bits) is no settled value: only a finite one settles untrusted
            settled = prec >= SETTLED_RISE * since and value is not None and math.isfinite(value)
            if (trusted and previous[1]) or settled:
                return value
        else:
            since = prec
        previous = (value, trusted)
        # a trusted value is checked a little higher; else past the bits lost (the same
        # at any precision where they are finite), at least four times as high
        if trusted:
            prec += 2 * TRUSTED_BITS
        else:
            past = int(lost) + 2 * TRUSTED_BITS if math.isfinite(lost) else 0
            prec = max(4 * prec, min(past, MAX_PREC_BITS))
    raise Unresolved(f"no value settles up to {MAX_PREC_BITS} bits")


def rounding_bound(
    expr: sympy.Expr, point: Mapping[sympy.Symbol, float], eps: float
) -> float | None:
    """A first-order bound on the error of ``expr`` evaluated at ``point`` in floating
    point with machine epsilon ``eps``, as written (running error analysis): inputs exact,
    each constant, sum, product and function value rounded once, libm functions within an
    ulp, and each rounding carried to the result by the derivative of what follows.

    A sum of n terms may be off by (n - 1) * eps * (the sum of their sizes) however small
    the sum is: at an exact 0 (``a - b`` where a = b) this bound, not a relative one, says
    how far from 0 a correct evaluation may land. None where a value or derivative has no
    exact value there.
    """
    memo: dict[sympy.Basic, tuple[float, float]] = {}

    def value(e: sympy.Basic, env) -> float:
        v = exact(e, env)
        if v is None or not math.isfinite(v):
            raise Undefined(str(e))
        return v

    def bound(e: sympy.Expr) -> tuple[float, float]:
        if e in memo:
            return memo[e]
        if e.is_Symbol:
            result = (value(e, point), 0.0)
        elif e.is_number:
            v = value(e, point)
            exact_float = e.is_Rational and _binary_fraction(e)
            result = (v, 0.0 if exact_float else eps * abs(v))
        elif isinstance(e, (sympy.Add, sympy.Mul)):
            parts = [bound(a) for a in e.args]
            values = [v for v, _ in parts]
            if isinstance(e, sympy.Add):
                v = math.fsum(values)
                err = sum(b for _, b in parts) + (len(parts) - 1) * eps * sum(map(abs, values))
            else:
                v = math.prod(values)
                err = sum(
                    b * math.prod(abs(w) for j, w in enumerate(values) if j != i)
                    for i, (_, b) in enumerate(parts)
                ) + (len(parts) - 1) * eps * abs(v)
            result = (v, err)
        elif isinstance(e, sympy.Piecewise):  # the branch taken there
            result = next(bound(b) for b, c in e.args if _holds(c, point))
        elif isinstance(e, sympy.Pow) and e.exp.is_Integer:
            v, b = bound(e.base)
            n = int(e.exp)
            if v == 0:  # 0**n, n > 0: the base's error to the n-th power (n < 0: a pole)
                if n < 0:
                    raise Undefined(str(e))
                result = (0.0, b**n)
            else:  # |n| - 1 products (and a division for n < 0), each rounded
                result = (v**n, abs(n * v ** (n - 1)) * b + abs(n) * eps * abs(v**n))
        else:  # a function of its arguments (or a non-integer power): its derivatives
            # carry their errors
            parts = [bound(a) for a in e.args]
            dummies = [sympy.Dummy(real=True) for _ in e.args]
            at = dict(zip(dummies, (v for v, _ in parts)))
            call = e.func(*dummies)
            v = value(call, at)
            err = eps * abs(v) + sum(
                abs(value(sympy.diff(call, s), at)) * b for s, (_, b) in zip(dummies, parts) if b
            )
            result = (v, err)
        memo[e] = result
        return result

    try:
        return bound(expr)[1]
    except (Undefined, Unresolved, TypeError, ValueError, ZeroDivisionError, OverflowError):
        return None


def _holds(cond: sympy.Basic, point: Mapping[sympy.Symbol, float]) -> bool:
    """A Piecewise condition at ``point`` (its sides compared exactly)."""
    if cond in (sympy.true, sympy.false):
        return bool(cond)
    if isinstance(cond, (sympy.And, sympy.Or, sympy.Not)):
        parts = [_holds(c, point) for c in cond.args]
        if isinstance(cond, sympy.Not):
            return not parts[0]
        return all(parts) if isinstance(cond, sympy.And) else any(parts)
    if isinstance(cond, sympy.core.relational.Relational):
        lhs, rhs = (exact(side, point) for side in (cond.lhs, cond.rhs))
        if lhs is None or rhs is None:
            raise Undefined(str(cond))
        return bool(cond.func(lhs, rhs))
    raise Undefined(str(cond))
