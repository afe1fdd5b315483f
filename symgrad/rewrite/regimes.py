"""Regime rewrites: a formula split by input range where one form cannot be accurate
everywhere (a series near a removable singularity, tails past overflow, conjugate forms),
other forms of a whole formula for the measured choice, and the chosen form's tails: the
``whole``, ``asymptotes``, ``limits``, ``regimes``, ``candidates`` and ``tails`` phases
(:mod:`symgrad.rewrite.phases`).

Every rule of the first four is called ``rule(node, params, positive)`` by
:func:`split_regimes` (``params``: the scalar inputs' symbols; ``positive``: those known to
be positive).
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import math
from collections.abc import Callable

import mpmath
import sympy
from sympy import Add, Mul, Pow, exp, log

from symgrad.functions import (
    EXP_SHIFT,
    StableFunction,
    bounded_by_one,
    cospi,
    dsigmoid,
    erfcx,
    erfcx_inv,
    expm1,
    hypot,
    hypot_ratio,
    known_nonpositive,
    log1p,
    log1p_square,
    one_plus_erf,
    piecewise_folded,
    sigmoid,
    softplus,
    upstream_gradient,
    varying_power,
    xlog1py,
    xlogy,
)
from symgrad.functions import round as nearest_integer  # (not the builtin round)
from symgrad.numerics.floats import FLOAT_MAX
from symgrad.rewrite.phases import phase, register

_SERIES_TERMS = 4
#: Most terms a series keeps where its first :data:`_SERIES_TERMS` reach too short a way
#: (:func:`_series_cut`), and the series' order in x that gives them.
_MAX_SERIES_TERMS = 16
_LONG_SERIES_ORDER = 40
#: Bits a formula may lose to cancellation past its series' cut.
_WRITTEN_LOSS_BITS = 1.0
#: Working precision at which those losses are measured.
_LOSS_PREC = 256
_EPS = 2.0**-53


def _series_terms(poly: sympy.Expr, x: sympy.Symbol) -> list[sympy.Expr] | None:
    """The terms of a polynomial in ``x`` with number coefficients, lowest degree first;
    None where there are too few to truncate (the polynomial is the formula) or it has a
    coefficient that is not a number."""
    terms = [t for t in sympy.Add.make_args(sympy.expand(poly)) if t != 0]
    if len(terms) <= _SERIES_TERMS or not all(t.is_polynomial(x) for t in terms):
        return None
    terms.sort(key=lambda t: sympy.degree(t, x))
    if any(not (t / x ** sympy.degree(t, x)).is_number for t in terms):
        return None
    return terms


def _cut(terms: list[sympy.Expr], x: sympy.Symbol, count: int = _SERIES_TERMS) -> sympy.Float:
    """Where the first term dropped from ``terms[:count]`` falls under float64's epsilon
    relative to the first kept one."""
    lead, nxt = terms[0], terms[count]
    k, n = sympy.degree(lead, x), sympy.degree(nxt, x)
    ratio = abs(float(lead.coeff(x, k)) / float(nxt.coeff(x, n)))
    return sympy.Float(float(f"{(_EPS * ratio) ** (1.0 / (n - k)):.3g}"), 3)


def _series_cut(
    terms: list[sympy.Expr], x: sympy.Symbol, written: sympy.Expr, most: int = _MAX_SERIES_TERMS
) -> tuple[int, sympy.Float, bool]:
    """How many of a series' ``terms`` to keep, and the cut below which they stand for
    the formula ``written``: :data:`_SERIES_TERMS`, and more (up to
    :data:`_MAX_SERIES_TERMS`) while the formula still cancels past the cut.

    Four terms reach float64's epsilon only close to 0, and the formula as written loses
    there what its terms cancel: x - sin(x) past 0.072 loses log2(6/x**2) = 10 bits,
    log(1 + x) - x/(1 + x) past 9e-5 loses 14. The kept terms reach up to where the
    formula loses at most :data:`_WRITTEN_LOSS_BITS` (x - sin(x): 12 terms, to 2.42), or
    as far as the series' convergence allows (log(1 + x) - x/(1 + x): 16 terms, to 0.0967,
    where 5.4 bits are left). The third value: the terms ran out before that point.
    ``most``: the most terms to keep."""
    count = _SERIES_TERMS
    cut = _cut(terms, x, count)
    if most <= count:
        return count, cut, False
    needed = _tame_from(written, x, float(cut))
    while cut < needed and count + 1 < min(len(terms), most + 1):
        count += 1
        cut = _cut(terms, x, count)
    return count, cut, bool(cut < needed)


def _tame_from(written: sympy.Expr, x: sympy.Symbol, start: float) -> float:
    """The least binade from ``start`` up (to 2**4) from which ``written``'s sums cancel
    at most :data:`_WRITTEN_LOSS_BITS` on both sides of 0 (``start`` where they already
    do: no more than the series' first terms are needed)."""
    sums = [s for s in sympy.preorder_traversal(written) if isinstance(s, Add) and s.has(x)]
    at = start
    while at < 2.0**4:
        if all(_cancelled(s, x, side * at) <= _WRITTEN_LOSS_BITS for s in sums for side in (1, -1)):
            return at
        at *= 2
    return at


def _cancelled(terms: Add, x: sympy.Symbol, at: float) -> float:
    """The bits the sum ``terms`` cancels at x = ``at``: log2 of the sum of its terms'
    sizes over its value's (0 where it cannot be evaluated there)."""
    from symgrad.numerics.mp import Undefined, evaluate

    with mpmath.workprec(_LOSS_PREC):
        try:
            values = [evaluate(t, {x: mpmath.mpf(at)}) for t in terms.args]
        except (Undefined, ArithmeticError, ValueError, NotImplementedError):
            return 0.0
        total = abs(mpmath.fsum(values))
        if not all(mpmath.isfinite(v) for v in values):
            return 0.0
        if total == 0:
            return math.inf
        return float(mpmath.log(mpmath.fsum(abs(v) for v in values) / total, 2))


def _expands_cheaply(node: sympy.Expr, x: sympy.Symbol) -> bool:
    """SymPy expands ``node`` to :data:`_LONG_SERIES_ORDER` in a second or so: two
    functions at most, and only polynomials divided by. A quotient of sines takes 20 s
    (``(cos(x/2) - sin(x/2)*cos(x)/sin(x))*sin(x/2)/sin(x)``, the derivative of NMSE 3.4's
    (1 - cos(x))/sin(x)), and keeps its first terms."""
    divisors = [p.base for p in node.atoms(Pow) if p.exp.is_negative]
    return len(node.atoms(sympy.Function)) <= 2 and all(d.is_polynomial(x) for d in divisors)


def _polynomial(terms: list[sympy.Expr], x: sympy.Symbol) -> sympy.Expr:
    """The sum of ``terms``: in Horner's form past :data:`_SERIES_TERMS` of them (x**35
    written out is a power for each term)."""
    if len(terms) <= _SERIES_TERMS:
        return Add(*terms)
    return sympy.horner(Add(*terms), x)


def _two_sided_series(f: sympy.Expr, x: sympy.Symbol, order: int) -> tuple[sympy.Expr, sympy.Expr]:
    """The Taylor polynomials of ``f`` at x = 0 to ``order`` from the right and from the
    left: SymPy expands from the right, where sqrt(x**2) is x (a derivative of acos(u(x))
    has |x|/x, whose two sides differ).

    Of ``f`` with symgrad's functions as the elementary formulas they equal: SymPy expands
    a function it does not know by differentiating it again and again, and dsigmoid's
    derivatives grow (the logistic distribution's second derivative: 26 s a side to order
    16, as exp 0.6 s). Not expm1, whose derivative is exp: SymPy expands it as it is in a
    third of the time of exp(x) - 1 (NMSE 3.4.4's sqrt(expm1(2x)/expm1(x)), 3.3 s against
    10.5 s).
    """
    f = f.replace(
        lambda e: isinstance(e, StableFunction) and not isinstance(e, expm1),
        lambda e: e.naive(*e.args),
    )
    right = sympy.series(f, x, 0, order, dir="+").removeO()
    left = sympy.series(f, x, 0, order, dir="-").removeO()
    return right, left


def _or_none(call, *args):
    """``call(*args)``, or None where SymPy fails (it raises many kinds; the rule then
    keeps the formula). A time limit is no failure: ``finish``'s TimeoutError (SIGALRM,
    :func:`symgrad.derive._time_limit`) goes on to it. Caught, the rule went on to its next
    choice with no limit left: 850 s of series under a 60 s limit."""
    try:
        return call(*args)
    except TimeoutError:
        raise
    except Exception:  # noqa: BLE001 - SymPy raises many kinds
        return None


def _leading_order(term: sympy.Expr, x: sympy.Symbol) -> int | None:
    """The degree in x of ``term``'s leading term at x = 0 (None where not a power)."""
    lead = term.as_leading_term(x)
    return sympy.degree(lead, x) if lead.is_polynomial(x) else None


def _expanded_at(node: sympy.Expr, x: sympy.Symbol, value: sympy.Expr) -> sympy.Expr:
    return sympy.expand(node.subs(x, value))


#: Largest formula (SymPy op count) expanded in series at a removable singularity: the
#: bound is on size, so that the cost of a derivation is bounded by its formula's.
_REMOVABLE_MAX_OPS = 60


#: Series order at a removable singularity: five terms of an even or odd function.
_REMOVABLE_ORDER = 10


# The whole phase.


@register("whole")
def ratio_tail(node: sympy.Basic, params: frozenset, positive: frozenset) -> sympy.Basic | None:
    """R*r**j/(A + c*r)**m -> R*r**(j - t)/(A + c*r)**(m - t)/(c + A/r)**t, divided through
    by x**k for |x| >= 1: a rational function whose denominator is a polynomial A(x) of
    degree k >= 2 plus an input r, with the numerator's power of r paired with the
    denominator's.

    r/(A + c*r) is 1/(c + A/r) (at r = 0 too, where A/r is infinite), bounded where A
    and r are positive: where r**j overflows (r > 1e154 in float64 for j = 2) the value
    need not. The Kalman gain's second derivative in dt,
    8*r*(c0(dt) + c1(dt)*r)/(dt**4 + 20*dt**2 + 2*r + 50)**3, is inf/inf (NaN) at r =
    1e160 for every dt, its numerator expanded over dt**12 or not
    (:func:`rational_tail`); as 8*(c0 + c1*r)/B**2/(2 + A/r) it is finite. R keeps as
    many powers of the denominator as it needs to stay bounded for large x (t is at most
    (k*m - deg R)/k): r**2*P'/(P + r)**2 is P'*r/(P + r)/(1 + P/r), as P' alone overflows
    where the value does not. R is kept as it is factored (x**2 - nu is not spread over
    the terms of a sum that cancels where it does). ``None`` where ``node`` is not such a
    function, R grows faster than the denominator or no power of r pairs.
    """
    if not isinstance(node, (Mul, Pow)) or node.atoms(sympy.Function):
        return None
    if not node.is_rational_function():
        return None
    numerator, denominator = sympy.fraction(sympy.together(node))
    numerator = sympy.factor_terms(numerator)
    for r in sorted(node.free_symbols - params, key=lambda s: s.name):
        with_r = [f for f in Mul.make_args(denominator) if f.has(r)]
        rest = Mul(*(f for f in Mul.make_args(denominator) if not f.has(r)))
        if len(with_r) != 1:
            continue
        base, m = with_r[0].as_base_exp()
        if not (base.is_Add and m.is_Integer and m > 0) or sympy.degree(base, r) != 1:
            continue
        c = base.coeff(r, 1)
        a = sympy.expand(base - c * r)
        if not (c.is_number and c > 0) or a.has(r):
            continue
        j = sum(int(e) for f in Mul.make_args(numerator) for b, e in [f.as_base_exp()] if b == r)
        if j == 0:
            continue
        found = _ratio_tail(numerator / r**j, j, rest, a, c, r, int(m), params)
        if found is not None:
            return found
    return None


def _ratio_tail(
    rest_of_numerator: sympy.Expr,
    j: int,
    rest: sympy.Expr,
    a: sympy.Expr,
    c: sympy.Expr,
    r: sympy.Symbol,
    m: int,
    params: frozenset,
) -> sympy.Expr | None:
    """:func:`ratio_tail` of rest_of_numerator * r**j / (rest * (a + c*r)**m), or None."""
    for x in sorted(a.free_symbols - params, key=lambda s: s.name):
        if not a.is_polynomial(x) or rest.has(x) or not rest_of_numerator.is_polynomial(x):
            continue
        k = int(sympy.degree(a, x))
        d = int(sympy.degree(rest_of_numerator, x)) if rest_of_numerator.has(x) else 0
        if k < 2 or d > k * m:
            continue
        t = min(j, (k * m - d) // k)
        if t == 0:
            continue
        near = rest_of_numerator * r ** (j - t) * (a + c * r) ** (t - m) * (c + a / r) ** -t / rest
        a_scaled = sympy.expand(a / x**k)
        tail = (
            sympy.expand(rest_of_numerator / x ** (k * (m - t)))
            * r ** (j - t)
            * (a_scaled + c * r / x**k) ** (t - m)
            * (c + a_scaled * x**k / r) ** -t
            / rest
        )
        return sympy.Piecewise((near, sympy.Abs(x) < 1), (tail, True))
    return None


@register("whole")
def rational_tail(node: sympy.Basic, params: frozenset, positive: frozenset) -> sympy.Basic | None:
    """P(x)/Q(x) with deg Q >= 2 -> (P/x^k)/(Q/x^k) for |x| >= 1; the same for the factors
    of a product that are rational in x, its other factors (exp(x**2)) kept as they are.

    (nu - x**2)/(nu + x**2)**2 is inf/inf once x**2 overflows (|x| > 1e154, 1e19 in float32);
    divided through by x**k every power is at most 1. ``params`` are the scalar inputs, which
    are coefficients here, never the variable. In a product with other factors the
    denominator may be a lone power: (16*x**8 - 105)*exp(x**2)/x**8 is NaN (inf/inf) from
    x = 1e38 where the value is inf.
    """
    if not isinstance(node, (Mul, Pow)):
        return None
    for x in sorted(node.free_symbols - params, key=lambda s: s.name):
        if node.is_rational_function(x):
            cofactor, rational = sympy.S.One, node
        else:
            factors = Mul.make_args(node)
            rational = Mul(*(f for f in factors if f.is_rational_function(x)))
            cofactor = Mul(*(f for f in factors if not f.is_rational_function(x)))
            if not rational.has(x):
                continue
        numerator, denominator = sympy.fraction(sympy.together(rational))
        if not denominator.is_polynomial(x) or not numerator.is_polynomial(x):
            continue
        k = sympy.degree(denominator, x)
        if k < 2:
            continue
        if FACTORED_TAILS.get() and (rational.free_symbols - {x}) - params:
            factored = _factored_tail(cofactor, numerator, denominator, x)
            if factored is not None:
                if (fired := FACTORED_FIRED.get()) is not None:
                    fired.append(node)
                near = _cancelled_near(node, cofactor, numerator, denominator, x)
                return sympy.Piecewise((near, sympy.Abs(x) < 1), (factored, True))
        if not sympy.expand(denominator).is_Add and (
            cofactor == 1 or not sympy.expand(numerator).is_Add
        ):
            continue
        top = sympy.expand(numerator / x**k)
        if top.has(x) and not top.is_Add and sympy.degree(top.as_numer_denom()[1], x) > 1:
            # a lone x**-m (m > 1) would be printed as 1/(x**m * ...) and overflow again
            continue
        scaled = cofactor * top / sympy.expand(denominator / x**k)
        near = _cancelled_near(node, cofactor, numerator, denominator, x)
        return sympy.Piecewise((near, sympy.Abs(x) < 1), (scaled, True))
    return None


def _cancelled_near(
    node: sympy.Expr,
    cofactor: sympy.Expr,
    numerator: sympy.Expr,
    denominator: sympy.Expr,
    x: sympy.Symbol,
) -> sympy.Expr:
    """``node`` for |x| < 1 with the terms of its numerator that cancel symbolically
    cancelled (the tail branch expands them away too): d/dt of P/(P + r) is P'/(P + r) -
    P*P'/(P + r)**2 as derived, 0 for r << P where the value is r*P'/(P + r)**2. ``node``
    where no leading terms in x cancel (a polynomial fit's own form is kept)."""
    try:
        if sympy.degree(sympy.expand(numerator), x) >= _written_degree(numerator, x):
            return node  # no leading terms cancel: the formula as written
        cancelled = sympy.factor(numerator)
    except sympy.PolynomialError:  # a coefficient SymPy's polynomials refuse (log(a))
        return node
    if sympy.count_ops(cancelled) >= sympy.count_ops(numerator):
        return node
    return cofactor * cancelled / denominator


def _written_degree(expr: sympy.Expr, x: sympy.Symbol) -> int:
    """The degree of polynomial ``expr`` in ``x`` as written, before any term cancels."""
    if expr == x:
        return 1
    if isinstance(expr, sympy.Add):
        return max(_written_degree(a, x) for a in expr.args)
    if isinstance(expr, Mul):
        return sum(_written_degree(a, x) for a in expr.args)
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
        return int(expr.exp) * _written_degree(expr.base, x)
    return 0


#: Whether :func:`rational_tail` keeps the factors of a quotient with another tensor
#: input (:func:`_factored_tail`). Neither form is the more accurate everywhere: derive
#: splits each form both ways and the measured choice decides.
FACTORED_TAILS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "FACTORED_TAILS", default=True
)
#: The nodes :func:`rational_tail` gave a factored tail, for whoever set a list here.
FACTORED_FIRED: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "FACTORED_FIRED", default=None
)


def _factored_tail(
    cofactor: sympy.Expr, numerator: sympy.Expr, denominator: sympy.Expr, x: sympy.Symbol
) -> sympy.Expr | None:
    """cofactor * P/Q with each polynomial factor f**e of P and Q divided by x**deg(f)
    apart, and x to the degrees' difference: (dt**4/2 + 10*dt**2 + 25)/(dt**4/2 + 10*dt**2
    + r + 25)**3 keeps its factors, where Q expanded and divided by dt**12 has r**2/dt**8
    (inf at r = 1e217 with the other tensor input r large: no coefficient is bounded).
    None where the denominator has no compound factor to keep."""

    def scaled(product: sympy.Expr) -> tuple[sympy.Expr, int, bool]:
        parts, total, compound = [], 0, False
        for f in Mul.make_args(product):
            base, e = f.as_base_exp()
            if base.has(x) and base.is_polynomial(x) and e.is_Integer and e > 0:
                d = int(sympy.degree(base, x))
                parts.append(sympy.expand(base / x**d) ** e)
                total += d * int(e)
                compound = compound or (base.is_Add and base.free_symbols != {x})
            else:
                parts.append(f)
        return Mul(*parts), total, compound

    top, p, _ = scaled(numerator)
    bottom, q, compound = scaled(denominator)
    if not compound:
        return None
    return cofactor * top / bottom * x ** (p - q)


# The asymptotes phase.


#: Past this, erfcx_inv(a) is sqrt(pi) (a + 1/(2a) - 1/(2a**3)) to a relative 1e-48.
_ERFCX_INV_ASYMPTOTIC = 1e8


@register("asymptotes")
def erfcx_inv_tail(
    node: sympy.Basic, params: frozenset, positive: frozenset
) -> tuple[sympy.Expr, sympy.Basic] | None:
    """f(erfcx_inv(a)) -> (f(sqrt(pi) (a + 1/(2a) - 1/(2a**3))) expanded, a > 1e8), a linear
    in one symbol: the asymptotic series. erfcx_inv(a) ~ a sqrt(pi) overflows first (float32 log_ndtr's
    gradient sqrt(2/pi) erfcx_inv(-z/sqrt(2)) at z = -3e38: 3.8e38 before the factor), and
    its second derivative cancels a**2 terms; expanded, what is left is -z - 1/z, -1...
    """
    calls = node.atoms(erfcx_inv)
    if len(calls) != 1:
        return None
    (call,) = calls
    a = call.args[0]
    if len(a.free_symbols) != 1 or not sympy.Poly(a, *a.free_symbols).is_linear:
        return None
    if node.has(sympy.Piecewise):
        return None  # erfcx_inv's derivative carries its own series; not expanded here
    if sympy.count_ops(node) > _REMOVABLE_MAX_OPS:
        return None
    series = sympy.sqrt(sympy.pi) * (a + 1 / (2 * a) - 1 / (2 * a**3))
    asymptote = sympy.expand(node.xreplace({call: series}))
    return asymptote, a > _ERFCX_INV_ASYMPTOTIC


# The limits phase.


def _bounded_near_zero(node: sympy.Basic, x: sympy.Symbol) -> bool:
    """``node`` is finite and below 2**50 in magnitude at x = +-2**-100 (512 bits): a
    limit at 0 is likely, where a pole would be near 2**100 (a cheap test before a series).
    """
    from symgrad.numerics.mp import Undefined, evaluate

    with mpmath.workprec(512):
        for at in (mpmath.ldexp(1, -100), -mpmath.ldexp(1, -100)):
            try:
                value = evaluate(node, {x: at})
            except (Undefined, ArithmeticError, ValueError, NotImplementedError):
                return False
            if not mpmath.isfinite(value) or abs(value) > mpmath.ldexp(1, 50):
                return False
    return True


@register("limits")
def removable_regime(
    node: sympy.Basic, params: frozenset, positive: frozenset
) -> tuple[sympy.Expr, sympy.Basic] | None:
    """f(x) -> (Taylor polynomial of f, |x| < cut) where f is 0/0 or inf - inf at x = 0 and
    has a limit there: (x - sin(x))/x**3, 1/x - 1/tan(x), (1 - cos(x))/x**2. Near 0 the
    parts underflow or overflow (x**3 is 0 below 1e-108) while the value is tame.
    """
    if not isinstance(node, (Add, Mul)) or node.has(sympy.Piecewise):
        return None
    if sympy.count_ops(node) > _REMOVABLE_MAX_OPS:
        return None
    # a factor free of x (an upstream gradient) multiplies the polynomial
    common = sympy.factor_terms(node)
    for x in sorted(node.free_symbols, key=sympy.default_sort_key):
        factor, rest = common.as_independent(x, as_Add=False)
        if rest.free_symbols != {x} or rest.subs(x, 0).is_finite:
            continue  # no singularity at x = 0
        if not _bounded_near_zero(rest, x):
            return None  # a pole: nothing to remove
        kept = _removable_series(rest, x, _REMOVABLE_ORDER)
        if kept is None:
            return None
        (right, right_cut, short), (left, left_cut, _) = kept
        if short and _expands_cheaply(rest, x):  # more terms than this order has
            kept = _removable_series(rest, x, _LONG_SERIES_ORDER) or kept
            (right, right_cut, _), (left, left_cut, _) = kept
        cut = min(right_cut, left_cut)
        if sympy.expand(right - left) != 0:  # a polynomial for each side (|x|/x)
            return factor * sympy.Piecewise((right, x >= 0), (left, True)), sympy.Abs(x) < cut
        return factor * right, sympy.Abs(x) < cut
    return None


@functools.lru_cache(maxsize=1024)
def _removable_series(rest: sympy.Expr, x: sympy.Symbol, order: int) -> list[tuple] | None:
    """Per side of 0 (right, left), the polynomial that stands for ``rest`` near its
    removable singularity at 0 (see :func:`_series_cut`), its cut, and whether the terms of
    this ``order`` ran out before the cut the formula needs. None where SymPy cannot expand
    it or it has a pole."""
    sides = _or_none(_two_sided_series, rest, x, order)
    if sides is None:  # SymPy cannot expand it: keep the formula
        return None
    kept = []
    for poly in sides:
        terms = _series_terms(poly, x)
        if terms is None or sympy.degree(terms[0], x) < 0:
            return None
        count, cut, short = _series_cut(terms, x, rest)
        kept.append((_polynomial(terms[:count], x), cut, short))
    return kept


# The regimes phase: tried on each node in this order.


def _roots(node: sympy.Basic, positive: frozenset) -> list[tuple[sympy.Expr, sympy.Expr]]:
    """The square roots in ``node``, each as (radicand R, its stable form sqrt(R)):
    hypot(a, c) as it is; sqrt(a**2 + c) for c > 0 (a number or a ``positive`` scalar) as
    hypot(a, sqrt(c)), whose square does not overflow; other radicands as sqrt(R)."""
    roots = {}
    for h in node.atoms(hypot):
        roots[h.args[0] ** 2 + h.args[1] ** 2] = h
    for p in node.atoms(Pow):
        if p.exp.is_Rational and p.exp.q == 2 and p.base.free_symbols:
            roots.setdefault(p.base, _stable_root(p.base, positive))
    return sorted(roots.items(), key=lambda r: sympy.default_sort_key(r[0]))


def _stable_root(radicand: sympy.Expr, positive: frozenset) -> sympy.Expr:
    """sqrt(radicand), as hypot(a, sqrt(c)) where it is a**2 + c with c > 0."""
    if isinstance(radicand, Add) and len(radicand.args) == 2:
        for square, c in (radicand.args, radicand.args[::-1]):
            known = c.is_positive or (c in positive)
            if known and isinstance(square, Pow) and square.exp == 2:
                return hypot(square.base, sympy.sqrt(c))
    return sympy.sqrt(radicand)


def _degree(expr: sympy.Expr) -> int:
    """The total degree of ``expr`` as a polynomial in its symbols (a large number where it
    is not one)."""
    if not expr.free_symbols:
        return 0
    try:
        return sympy.Poly(
            expr, *sorted(expr.free_symbols, key=sympy.default_sort_key)
        ).total_degree()
    except (sympy.PolynomialError, sympy.GeneratorsNeeded):
        return 1 << 30


def _scaled_power(term: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr] | None:
    """(c, a, k) for a term c*a**k with k not an integer constant; else None. Powers of
    one base are one power first (Herbie's pow-plus: a**k/a is a**(k - 1)): SymPy keeps (x + 1)**(1/n)/(n*(x + 1)), the derivative of (x + 1)**(1/n),
    as two factors, which is (x + 1)**(1/n - 1) with c = 1/n."""
    c, rest = term.as_coeff_Mul()
    if isinstance(rest, Pow):
        powers = [rest]
    else:
        rest = sympy.powsimp(rest, combine="exp")
        powers = [f for f in Mul.make_args(rest) if isinstance(f, Pow) and _no_integer(f.exp)]
        if len(powers) != 1:
            return None
    a, k = powers[0].args
    if not a.free_symbols or not _no_integer(k):
        return None
    return c * Mul(*(f for f in Mul.make_args(rest) if f != powers[0])), a, k


@register("regimes")
def power_difference(
    node: sympy.Basic, params: frozenset, positive: frozenset
) -> sympy.Basic | None:
    """c*a**k - c*b**k -> c*b**k*expm1(k*log1p((a - b)/b)) where a and b share a term
    (which cancels in a - b) and |(a - b)/b| < 1/2 (or, for an exponent that is not a
    number, where |k*log1p((a - b)/b)| < 1/2: (a/b)**k near 1), for an exponent k that
    is not an integer constant and c the same in both terms (a number, or 1/n in the derivative of
    (x + 1)**(1/n) - x**(1/n): (x + 1)**(1/n - 1)/n - x**(1/n - 1)/n, its powers merged
    by :func:`_scaled_power`); as written elsewhere. For an exponent that is not a
    number, the form is the one whose expm1 argument is at most 0 (no overflow of
    (a/b)**k where b**k underflows).

    (x + 1)**(1/3) - x**(1/3) at x = 1e15 keeps 4 digits (the two cube roots agree in 11);
    x**(1/3)*expm1(log1p(1/x)/3) all of them (Herbie's difference of cube roots, for any
    exponent: x**(-3/2)/2 - (x + 1)**(-3/2)/2, the gradient of 1/sqrt(x) - 1/sqrt(x + 1)).
    Away from a/b = 1 the powers differ by a factor and cancel little. Square roots are the
    stabilize rules' (:func:`~symgrad.rewrite.rules.sqrt_difference`)."""
    if not isinstance(node, Add):
        return None
    scaled = [(term, _scaled_power(term)) for term in node.args]
    scaled = [(term, p) for term, p in scaled if p is not None]
    # the terms of each power a**k, with their cofactors summed (the second derivative of
    # (x + 1)**(1/n) has (x + 1)**(1/n - 2) twice, with 1/n**2 and -1/n); then, where no
    # two sums pair, term by term (2*a**k - 2*b**k + x*a**k: 2 + x does not pair with -2)
    collected: dict[tuple[sympy.Expr, sympy.Expr], tuple[list[sympy.Expr], sympy.Expr]] = {}
    for term, (c, a, k) in scaled:
        terms, total = collected.get((a, k), ([], sympy.S.Zero))
        collected[a, k] = ([*terms, term], total + c)
    one_by_one = [((a, k), ([term], c)) for term, (c, a, k) in scaled]
    for groups in (list(collected.items()), one_by_one):
        pair = _power_pair(groups)
        if pair is not None:
            terms, form = pair
            from symgrad.rewrite.rules import _drop

            # the other terms may pair too (the mixed second derivative has a power
            # difference and a power-log difference)
            rest = _drop(node, *terms)
            return (power_difference(rest, params, positive) or rest) + form
    return None


def _power_pair(groups: list) -> tuple[list[sympy.Expr], sympy.Expr] | None:
    """:func:`power_difference`'s first pair of ``groups`` ((a, k), (terms, c)): the
    terms it takes and their form."""
    for i, ((a, k), (firsts, c)) in enumerate(groups):
        for (b, k2), (seconds, c2) in groups[i + 1 :]:
            if k2 != k:
                continue
            logged = None if sympy.expand(c + c2) == 0 else _log_weights(c, c2, a, b)
            if logged is None and sympy.expand(c + c2) != 0:
                continue
            difference = _cancelled_difference(a, b)
            if difference is None:
                continue
            w = difference / b
            if logged is not None:
                return [*firsts, *seconds], _power_log_pair(logged, a, b, k, w)
            c = sympy.factor_terms(c)
            near = c * b**k * expm1(k * log1p(w))
            if not k.is_number:
                # an input's exponent has either sign: for k*log1p(w) > 0, (a/b)**k - 1
                # may overflow where b**k underflows (inf*0 at n = -1e-228 in the
                # derivative of (x + 1)**(1/n) - x**(1/n)); as -a**k*((b/a)**k - 1)
                # there, whose expm1 lies in (-1, 0] and whose power is the larger one
                near = sympy.Piecewise(
                    (near, k * log1p(w) <= 0), (-c * a**k * expm1(-k * log1p(w)), True)
                )
            # far from a/b = 1, the difference with its cofactors collected: c*a**k - c*b**k
            # (the second derivative as SymPy writes it is inf - inf where a**k overflows,
            # c*a**k - c*b**k is inf)
            far = c * a**k - c * b**k
            near_one = sympy.Abs(w) < sympy.Rational(1, 2)
            if not k.is_number:
                # the powers cancel wherever (a/b)**k is near 1, which for an input's
                # exponent is not only near a/b = 1: (x + 1)**(1/n) - x**(1/n) at
                # x = 1e-99, n = -2e33 is 1 - (1 + 1e-31), nothing left of it as written
                near_one = near_one | (sympy.Abs(k * log1p(w)) < sympy.Rational(1, 2))
            form = sympy.Piecewise((near, near_one), (far, True))
            return [*firsts, *seconds], form
    return None


def _log_of(f: sympy.Expr) -> sympy.Expr | None:
    """u for a factor log(u) or log1p(u - 1); else None."""
    if isinstance(f, log):
        return f.args[0]
    if isinstance(f, log1p):
        return f.args[0] + 1
    return None


def _log_form(u: sympy.Expr) -> sympy.Expr:
    """log(u), as log1p(u - 1) where u is 1 plus a sum (log(x + 1) keeps no digit of a
    small x)."""
    one, rest = u.as_coeff_Add()
    return log1p(rest) if one == 1 and rest != 0 else log(u)


def _log_weights(
    c: sympy.Expr, c2: sympy.Expr, a: sympy.Expr, b: sympy.Expr
) -> tuple[sympy.Expr, int] | None:
    """(d, m) for cofactors c = d*log(a)**m and c2 = -d*log(b)**m, m >= 1 (log1p(x)
    standing for log(x + 1), and log(x + 1)*log1p(x) for log(x + 1)**2); else None."""

    def logs(c: sympy.Expr, u: sympy.Expr) -> tuple[sympy.Expr, int]:
        """c without its factors log(u) (as powers), and their multiplicity."""
        m, rest = 0, []
        for f in Mul.make_args(c):
            base, e = f.as_base_exp()
            if _log_of(base) == u and e.is_Integer and e > 0:
                m += int(e)
            else:
                rest.append(f)
        return Mul(*rest), m

    d, m = logs(c, a)
    d2, m2 = logs(c2, b)
    if m == 0 or m2 != m or sympy.expand(d + d2) != 0:
        return None
    return d, m


def _power_log_pair(
    logged: tuple[sympy.Expr, int], a: sympy.Expr, b: sympy.Expr, k: sympy.Expr, w: sympy.Expr
) -> sympy.Expr:
    """d*(a**k*log(a)**m - b**k*log(b)**m) for a = b*(1 + w), ``logged`` = (d, m): the
    power difference's derivatives in its exponent (d/dn of (x + 1)**(1/n) - x**(1/n) is
    -((x + 1)**(1/n)*log(x + 1) - x**(1/n)*log(x))/n**2, whose terms agree in all their
    digits past x = 1e16: 0 at x = 1e38, where the value is -2.4e41; d2/dn2 has the
    squares of the logarithms). With l = log1p(w), a**k = b**k*exp(k*l) and log(a) =
    log(b) + l, so log(a)**m - log(b)**m is l*S, S = the sum of log(a)**j*log(b)**(m-1-j),
    and the difference is a**k*l*S + b**k*log(b)**m*expm1(k*l), nothing left to cancel
    (for m = 1: a**k*l + b**k*log(b)*expm1(k*l)); where k*l > 0, b**k*l*S -
    a**k*log(a)**m*expm1(-k*l) (the larger power and an expm1 in (-1, 0], as
    :func:`power_difference` mirrors). Near a/b = 1, as there; as written elsewhere."""
    d, m = logged
    lw = log1p(w)
    log_a, log_b = _log_form(a), _log_form(b)
    sum_ = Add(*(log_a**j * log_b ** (m - 1 - j) for j in range(m)))
    forms = (
        d * (a**k * lw * sum_ + b**k * log_b**m * expm1(k * lw)),
        d * (b**k * lw * sum_ - a**k * log_a**m * expm1(-k * lw)),
    )
    near = sympy.Piecewise((forms[0], k * lw <= 0), (forms[1], True))
    near_one = sympy.Abs(w) < sympy.Rational(1, 2)
    if not k.is_number:
        near_one = near_one | (sympy.Abs(k * lw) < sympy.Rational(1, 2))
    far = d * (a**k * log_a**m - b**k * log_b**m)
    return sympy.Piecewise((near, near_one), (far, True))


@register("regimes")
def hypot_minus_one(
    node: sympy.Basic, params: frozenset, positive: frozenset
) -> sympy.Basic | None:
    """hypot(x, 1) - 1 -> x**2/(hypot(x, 1) + 1) for |x| < 1, where the difference cancels;
    beyond, x**2 would overflow (|x| > 1e154) and the difference is exact enough. (Before
    conjugate_regime, whose form this is, there for every x.)"""
    if not (isinstance(node, Add) and len(node.args) == 2 and sympy.S.NegativeOne in node.args):
        return None
    (root,) = (t for t in node.args if t != -1)
    if not (isinstance(root, hypot) and sympy.S.One in root.args):
        return None
    x = root.args[0] if root.args[1] == 1 else root.args[1]
    return sympy.Piecewise((x**2 / (root + 1), sympy.Abs(x) < 1), (node, True))


@register("regimes")
def conjugate_regime(
    node: sympy.Basic, params: frozenset, positive: frozenset
) -> sympy.Basic | None:
    """a + b*sqrt(R) -> (a**2 - b**2 R)/(a - b*sqrt(R)) where a and b*sqrt(R) have opposite
    signs, when a**2 - b**2 R is simpler (the squares cancel): squareplus
    (x + sqrt(x**2 + c))/2 is c/(2 (sqrt(x**2 + c) - x)) for x < 0, the quadratic formula's
    (-p + sqrt(p**2 - 4q))/2 is 2q/(p + sqrt(p**2 - 4q)) for p > 0, and a sum over a
    common root, 1/2 + x/(2 sqrt(x**2 + c)), is the same cancellation; so is the real part
    of a complex square root, sqrt(x + hypot(x, y)), whose squares leave -y**2 (as high a
    degree, one term fewer). Where the signs agree the sum does not cancel (and the
    conjugate would): the formula as written.
    """
    if not isinstance(node, Add) or node.has(sympy.Piecewise):
        return None
    for radicand, root in _roots(node, positive):
        s = sympy.Dummy("s", positive=True)
        powers = node.replace(
            lambda e, r=radicand: isinstance(e, Pow) and e.base == r and e.exp.q == 2,
            lambda e, s=s: s ** (2 * e.exp),
        ).xreplace({h: s for h in node.atoms(hypot) if h == root})
        num, den = sympy.fraction(sympy.together(powers))
        try:
            poly = sympy.Poly(sympy.expand(num), s)
        except sympy.PolynomialError:
            continue
        even = Add(*(c * radicand ** (k // 2) for (k,), c in poly.terms() if k % 2 == 0))
        odd = Add(*(c * radicand ** (k // 2) for (k,), c in poly.terms() if k % 2 == 1))
        if even == 0 or odd == 0 or even.has(s) or odd.has(s):
            continue
        difference = sympy.factor_terms(sympy.expand(even**2 - odd**2 * radicand))
        squares = len(Add.make_args(sympy.expand(even**2))) + len(
            Add.make_args(sympy.expand(odd**2 * radicand))
        )
        if _degree(difference) >= _degree(even**2) and (
            len(Add.make_args(sympy.expand(difference))) >= squares
        ):
            continue  # the squares do not cancel (no term of the two): nothing gained
        # halves: a - b*sqrt(R) overflows for |a| past half the largest float (float32's
        # squareplus at x = -3e38), its halves do not; the number factor stays outside
        # (SymPy would distribute it over the sum)
        halves = Add(even / 2, -odd * s / 2)
        # the difference may cancel in turn: 1 - sqrt((1 + 1/hypot(1, x))/2) leaves
        # 1 - 1/hypot(1, x), which is (hypot(1, x) - 1)/hypot(1, x), split near x = 0
        inner = split_regimes(sympy.together(difference), params, positive)
        if inner.has(sympy.Piecewise):
            difference = inner
        conjugate = (difference / (2 * den) * Pow(halves, -1)).xreplace({s: root})
        written = (powers).xreplace({s: root})
        return sympy.Piecewise((conjugate, even * odd < 0), (written, True))
    return None


@register("regimes")
def series_regime(node: sympy.Basic, params: frozenset, positive: frozenset) -> sympy.Basic | None:
    """f(x) -> Piecewise((Taylor polynomial of f, |x| < cut), (f(x), True)) where a sum's
    leading terms cancel near 0 (x - tanh(x), x - sin(x), x*cosh(x) - sinh(x), ...); the
    polynomial is truncated where the next term is under float64's epsilon, the cut."""
    if not isinstance(node, Add) or len(node.free_symbols) != 1 or sympy.count_ops(node) > 30:
        return None
    (x,) = node.free_symbols
    polynomial = _cancelling_series(node, x)
    if polynomial is None:
        return None
    terms, cut = polynomial
    return sympy.Piecewise((_polynomial(terms, x), sympy.Abs(x) < cut), (node, True))


#: The variable of :func:`product_series`' coefficients (one for all: their series are
#: cached, and the same sums come back in every candidate of a formula)
_PRODUCT = sympy.Dummy("u", real=True)


@functools.lru_cache(maxsize=4096)
def _cancelling_series(
    node: sympy.Expr, x: sympy.Symbol, most: int = _MAX_SERIES_TERMS
) -> tuple[list, sympy.Float] | None:
    """The Taylor polynomial of the sum ``node`` at x = 0, as the terms it keeps (lowest
    degree first; see :func:`_series_cut`) and the cut below which they are the value to
    float64's epsilon, where the sum's leading terms cancel there: a term of the sum is of
    a lower order in x than the sum (x*cosh(x) and sinh(x) are of order 1, their
    difference x**3/3). None where nothing cancels, the sum is not 0 at 0 (a term 0/0 there,
    (log(1 + x) - x/(1 + x))/x, is as its limit), or it has no one polynomial on both
    sides of 0. ``most``: the most terms to keep (see :func:`_series_cut`)."""
    if node.has(sympy.Piecewise):
        return None
    at_zero = node.subs(x, 0)
    if at_zero.is_finite and not at_zero.is_zero:
        return None
    orders = [_or_none(_leading_order, term, x) for term in node.args]
    if not any(k is not None and k >= 1 for k in orders):
        return None
    terms = _one_sided_terms(node, x, 16)
    if terms is None:
        return None
    order = sympy.degree(terms[0], x)
    if order < 2 or not any(k is not None and 1 <= k < order for k in orders):
        return None
    count, cut, short = _series_cut(terms, x, node, most)
    if short and count < most and _expands_cheaply(node, x):
        longer = _one_sided_terms(node, x, _LONG_SERIES_ORDER)
        if longer is not None:
            terms = longer
            count, cut, short = _series_cut(terms, x, node, most)
    return terms[:count], cut


def _one_sided_terms(node: sympy.Expr, x: sympy.Symbol, order: int) -> list[sympy.Expr] | None:
    """The terms of ``node``'s Taylor polynomial at 0 to ``order`` (see
    :func:`_series_terms`), None where SymPy cannot expand it or its two sides differ."""
    sides = _or_none(_two_sided_series, node, x, order)
    if sides is None:  # SymPy cannot expand it: keep the formula
        return None
    right, left = sides
    if sympy.expand(right - left) != 0:
        return None  # no one polynomial on both sides of 0
    return _series_terms(right, x)


@register("regimes")
def product_series(node: sympy.Basic, params: frozenset, positive: frozenset) -> sympy.Basic | None:
    """sum of e**k * c_k(u) -> Piecewise((sum of e**k * (c_k's Taylor polynomial), |u| <
    cut), (the sum, True)) where a coefficient c_k cancels near u = 0 (as
    :func:`series_regime`'s sums in one input do), u the one argument the sum's functions
    take: the product e*x of its two inputs, or one input x alone.

    A sum in two inputs whose functions take their product: 2*e*x*cosh(e*x) + 2*(e**2*x -
    1)*sinh(e*x) (NMSE section 6.1's derivative in e, paired) is, with u = e*x, 2*u*cosh(u)
    - 2*sinh(u) + e*2*u*sinh(u); the first coefficient is 2*u**3/3 + ... where its terms
    cancel (at e = 1e-8, x = 0.5: 0, the value 1.7e-25). Past the cut the sum as written
    (u/e**2 may overflow where x/e does not). Functions of one input: N*e*cosh(N) -
    e*sinh(N) + N (Basilisk's N2H over one denominator) is e*(N*cosh(N) - sinh(N)) + N, 0 at
    N = 1.9e-13, e = 2e20 where the value is 1.9e-13. ``None`` where the inputs are not only
    in such arguments (and powers of e), or no coefficient cancels.

    The product may be a ratio, and the sum's terms may share a factor, taken out first:
    compound interest's second derivative in n, (i/n + 1)**n*(-i/(n**2*(i/n + 1)**2) +
    2*(log1p(i/n) - i/(n*(i/n + 1)))/i + ...) is, with u = i/n, (u + 1)**n*((2*log1p(u)/u -
    2/(u + 1) - u/(u + 1)**2)/n + ...), whose first coefficient is 2*u**2/3 + ... (12 bits
    lost at i = 0.5, n = 1e4).
    """
    if not isinstance(node, Add) or node.has(sympy.Piecewise) or sympy.count_ops(node) > 80:
        return None
    split = _product_series(node)
    if split is not None:
        return split
    common = sympy.factor_terms(node)
    sums = [a for a in Mul.make_args(common) if isinstance(a, Add)]
    if common == node or len(sums) != 1:
        return None
    split = _product_series(sums[0])
    if split is None:
        return None
    (near, cut), _ = split.args
    return sympy.Piecewise((common.xreplace({sums[0]: near}), cut), (node, True))


def _product_series(node: Add) -> sympy.Basic | None:
    """:func:`product_series` of a sum as it is written."""
    inputs = node.free_symbols
    if len(inputs) != 2:
        return None
    arguments = {a for f in node.atoms(sympy.Function) for a in f.args}
    products = sorted(
        {a for a in arguments if isinstance(a, Mul) and a.free_symbols == inputs},
        key=sympy.default_sort_key,
    )
    # (the product, e): x = u / (product / x)
    choices = [(p, e) for p in products for e in sorted(inputs, key=lambda v: v.name)]
    alone = set().union(*(a.free_symbols for a in arguments))
    if len(alone) == 1:  # every function's argument in one input
        (x,) = alone
        (e,) = inputs - alone
        choices.append((x, e))  # u = x
    u = _PRODUCT
    for product, e in choices:
        (x,) = inputs - {e}
        coefficient = product / x  # the product is coefficient * x
        if x in coefficient.free_symbols:
            continue
        written = _or_none(_expanded_at, node, x, u / coefficient)
        if written is None or x in written.free_symbols:  # (None: SymPy cannot substitute)
            continue
        parts = _powers_of(written, e)
        if parts is None:
            continue
        near, cuts = [], []
        for power, c in parts.items():
            # four terms: the choice also differentiates this form as written (derive's
            # ``written``), in e and x apart, where more nested powers of u come apart
            # (e**k/x**k): NMSE 6.1 A's d/deps went 0.8 -> 9.6 bits, NaN at eps = 4e-162
            polynomial = _cancelling_series(c, u, _SERIES_TERMS) if isinstance(c, Add) else None
            if polynomial is not None:
                terms, cut = polynomial
                # nested in u: written out in e and x, e**9*x**9 is inf*0 at e = 2e91, x =
                # -5e-162 (u = -1e-70)
                c = sympy.horner(Add(*terms), u)
                cuts.append(cut)
            near.append(power * c)
        if not cuts:
            continue
        value = Add(*near).xreplace({u: product})
        return sympy.Piecewise((value, sympy.Abs(product) < min(cuts)), (node, True))
    return None


def _powers_of(written: sympy.Expr, e: sympy.Symbol) -> dict | None:
    """The expanded sum ``written`` as {power of e: coefficient free of e}, or None. Where
    expanding spread e over a denominator (-u/(n**2*(u + 1)**2) * n expands to
    -u/(u**2*n + 2*u*n + n)), each term over one denominator with e taken out of it."""
    parts = sympy.collect(written, e, evaluate=False)
    if not any(c.has(e) for c in parts.values()):
        return parts
    terms = [sympy.factor_terms(sympy.together(t)) for t in Add.make_args(written)]
    parts = sympy.collect(Add(*terms), e, evaluate=False)
    return None if any(c.has(e) for c in parts.values()) else parts


def _exp_factor(node: sympy.Basic) -> tuple[sympy.Expr, sympy.Expr] | None:
    """(w, the other factors) of a product of inputs with one factor exp(w), or None."""
    if not isinstance(node, Mul) or len(node.free_symbols) == 0:
        return None
    exps = [f for f in node.args if isinstance(f, exp)]
    if len(exps) != 1:
        return None
    return exps[0].args[0], Mul(*(f for f in node.args if f is not exps[0]))


#: exp(-800) ~ 1e-348 underflows to 0 in every dtype.
_UNDERFLOW_EXPONENT = 800


@register("regimes")
def gaussian_tail(node: sympy.Basic, params: frozenset, positive: frozenset) -> sympy.Basic | None:
    """p(x) * exp(-c x**2 + ...) -> 0 where the exponential underflows.

    Beyond that point the exact value is below any float, but p(x) can overflow first
    (x**2 at |x| > 1e154) and make inf * 0 = NaN.
    """
    split = _exp_factor(node)
    if split is None:
        return None
    arg, others = split
    symbols = arg.free_symbols
    if len(symbols) != 1 or not arg.is_polynomial(*symbols):
        return None
    (x,) = symbols
    poly = sympy.Poly(arg, x)
    lead = poly.LC()
    if poly.degree() < 2 or not (lead.is_Number and lead < 0):
        return None
    if not others.has(x):
        return None  # nothing that could overflow before the exponential underflows
    if others.has(exp, sympy.erfc, one_plus_erf, erfcx, sympy.cosh, sympy.sinh, sympy.gamma):
        return None  # a factor that may grow as fast as the exponential decays
    cut = float(f"{(_UNDERFLOW_EXPONENT / -float(lead)) ** (1.0 / poly.degree()):.3g}")
    return sympy.Piecewise((node, sympy.Abs(x) < cut), (0, True))


#: exp_tail: below this exponent exp is 1e-4343, which no polynomial of degree
#: EXP_TAIL_MAX_DEGREE in float inputs (each below 1.8e308, a product below 1e4000) lifts
#: to a float
_TAIL_EXPONENT = -10000
EXP_TAIL_MAX_DEGREE = 12


@register("regimes")
def exp_tail(node: sympy.Basic, params: frozenset, positive: frozenset) -> sympy.Basic | None:
    """p * exp(w) -> 0 where w < -10000, for p and w polynomials in the inputs (p of degree
    at most 12, sharing an input with w): the exact value is below any float there, but p
    can overflow first.

    The mixed second derivative of exp(-a*b) is (a*b - 1)*exp(-a*b), inf*0 = NaN where
    a*b overflows (a = 1.4e235, b = 6.7e188), and the gradient of exp(-x) times 2*x is
    inf*0 past x = 9e307. :func:`gaussian_tail` first, which puts its cut on the input.
    NaN inputs stay NaN (the comparison is false).
    """
    split = _exp_factor(node)
    if split is None:
        return None
    w, others = split
    if not (others.free_symbols & w.free_symbols and w.is_polynomial(*w.free_symbols)):
        return None  # (grad*exp(x): nothing grows with x but the exponential)
    if not others.is_polynomial(*others.free_symbols) or _degree(others) > EXP_TAIL_MAX_DEGREE:
        return None
    return sympy.Piecewise((0, w < _TAIL_EXPONENT), (node, True))


def _decays(f: sympy.Basic) -> bool:
    """``f`` is a sigmoid, a dsigmoid or a positive power of one."""
    base, power = f.as_base_exp()
    return isinstance(base, (sigmoid, dsigmoid)) and power.is_number and power > 0


@register("regimes")
def sigmoid_tail(node: sympy.Basic, params: frozenset, positive: frozenset) -> sympy.Basic | None:
    """q(x) * sigmoid(p(x)) -> 0 where p(x) < -800 for a polynomial p.

    There sigmoid is below exp(-800), under every float, but q(x) (x**2 in gelu's
    derivative, gamma**2 * softplus(-z) in the focal loss's) can overflow first and make
    0 * inf = NaN.
    """
    if not isinstance(node, Mul):
        return None
    decaying = [f.as_base_exp()[0] for f in node.args if _decays(f)]
    arg_symbols = {s for f in decaying for s in f.args[0].free_symbols}
    if len(arg_symbols) != 1:
        return None
    (x,) = arg_symbols
    others = Mul(*(f for f in node.args if not _decays(f)))
    bounded = (sigmoid, dsigmoid, sympy.tanh, sympy.erf, sympy.sin, sympy.cos)
    if not others.replace(lambda e: isinstance(e, bounded), lambda e: sympy.S.One).has(x):
        return None  # nothing that grows: the product underflows with the sigmoid
    # dsigmoid(p) = sigmoid(p) * sigmoid(-p) decays both ways
    arguments = [f.args[0] for f in decaying]
    arguments += [-f.args[0] for f in decaying if isinstance(f, dsigmoid)]
    conditions = []
    for argument in arguments:
        arg = sympy.expand(argument)
        if not arg.is_polynomial(x) or sympy.degree(arg, x) < 1:
            continue
        poly = sympy.Poly(arg, x)
        d, coeffs = poly.degree(), [float(c) for c in poly.all_coeffs()]
        lead = coeffs[0]
        # beyond this |x| each lower term is at most 2**-i of the leading one, which is
        # 1600 or more: |p(x)| >= 1600 / 2**d (800 for d = 1; sigmoid(-200) is 1e-87)
        bound = max(
            [(1600 / abs(lead)) ** (1 / d)]
            + [2 * abs(c / lead) ** (1 / i) for i, c in enumerate(coeffs[1:], 1) if c]
        )
        cut = sympy.Float(float(f"{bound:.3g}"), 3)
        if lead < 0:  # p -> -inf as x -> +inf
            conditions.append(x > cut)
        if (lead > 0) == (d % 2 == 1):  # p -> -inf as x -> -inf
            conditions.append(x < -cut)
    if not conditions:
        return None
    return sympy.Piecewise((0, sympy.Or(*conditions)), (node, True))


#: log1p(u) for u above this is evaluated as log(u) + log1p(1/u), log(u) from its factors.
_LOG1P_TAIL_FROM = 2**20


@register("regimes")
def log1p_tail(node: sympy.Basic, params: frozenset, positive: frozenset) -> sympy.Basic | None:
    """log1p(c * x**k * y**j...) -> log|c| + k log|x| + j log|y| + log1p(1/u) where u = c *
    x**k * y**j... is large; log1p(c * x**2) -> :class:`~symgrad.functions.log1p_square`
    (sqrt(c) * x), no branch.

    log1p(x**2/nu) is inf once x**2 overflows (|x| > 1e154, 1.8e19 in float32) although
    the exact value is about 2 log|x|; log1p(-y/x) once y/x does (x = 1e-300, y = -1e10),
    near log|y| - log|x|. ``c`` may hold scalar inputs (``params``) and numbers. Where u
    is large it is positive, so the logarithms of the factors' magnitudes add up to
    log(u). Not for u = c*x with |c| <= 1, which cannot overflow.
    """
    if not isinstance(node, log1p):
        return None
    u = node.args[0]
    logs = []
    degree, scale, scaled_by_params = 0, sympy.Integer(1), False
    for factor in Mul.make_args(u):
        base, power = factor.as_base_exp()
        if base.free_symbols - params:
            if not (base.is_Symbol and power.is_Integer):
                return None
            degree += abs(int(power)) if power > 0 else 2  # 1/x overflows where x is tiny
            logs.append(power * log(sympy.Abs(base)))
        elif factor.is_number:
            if factor.is_zero or not factor.is_real:
                return None
            scale *= abs(factor)
            logs.append(sympy.expand_log(log(abs(factor)), force=True))
        else:
            scaled_by_params = True
            logs.append(sympy.expand_log(log(factor), force=True))
    if degree == 0 or (degree == 1 and scale <= 1 and not scaled_by_params):
        return None
    q = _square_root(u, params, positive)
    if q is not None:
        return log1p_square(q)
    tail = Add(*logs) + log1p(1 / u)
    return sympy.Piecewise((node, u < _LOG1P_TAIL_FROM), (tail, True))


def _square_root(u: sympy.Expr, params: frozenset, positive: frozenset) -> sympy.Expr | None:
    """q with q**2 = u for u = c * x**2 (one tensor symbol x, c > 0 of numbers and
    ``params``, the ``positive`` ones known to be); else None."""
    c, x = sympy.S.One, None
    for factor in Mul.make_args(u):
        base, power = factor.as_base_exp()
        if base.free_symbols - params:
            if x is not None or not (base.is_Symbol and power == 2):
                return None
            x = base
        else:
            c *= factor
    if x is None or not c.subs({p: sympy.Dummy(positive=True) for p in positive}).is_positive:
        return None
    return sympy.sqrt(c) * x


@register("regimes")
def log_erfc_tail(node: sympy.Basic, params: frozenset, positive: frozenset) -> sympy.Basic | None:
    """log(c * erfc(a)) -> log(c) + log(erfcx(a)) - a**2 for a >= 1: erfc underflows to 0
    for a > 26.5 (9.2 in float32) where the log is still about -a**2; log(c) +
    log1p(-erf(a)) for |a| < 1/2, where erfc(a) rounds away the small part; log(2c) +
    log1p(-erfc(-a)/2) for a < -1, where erfc(a) rounds to 2 (the normal log-CDF at x > 38)."""
    if not isinstance(node, log):
        return None
    coeff, f = node.args[0].as_coeff_Mul()
    if not coeff.is_positive:
        return None
    if isinstance(f, one_plus_erf):
        a = -f.args[0]
    elif isinstance(f, sympy.erfc):
        a = f.args[0]
    else:
        return None
    tail = log(coeff) + log(erfcx(a)) - a**2
    # near a = 0 erfc(a) is 1 - 2a/sqrt(pi): log1p(-erf(a)) keeps the small part exact
    small = log(coeff) + log1p(-sympy.erf(a))
    # for a << 0, erfc(a) = 2 - erfc(-a) rounds to 2: log1p keeps erfc(-a)
    negative = log(2 * coeff) + log1p(-sympy.erfc(-a) / 2)
    return sympy.Piecewise(
        (small, sympy.Abs(a) < 0.5), (negative, a < -1), (node, a < 1), (tail, True)
    )


#: Largest formula (SymPy op count) whose difference with another
#: :func:`_cancelled_difference` expands (:func:`log_ratio`, :func:`power_difference`).
_DIFFERENCE_MAX_OPS = 30


@register("regimes")
def log_ratio(node: sympy.Basic, params: frozenset, positive: frozenset) -> sympy.Basic | None:
    """log(x/y) -> log1p((x - y)/y) where x/y is near 1 and x - y cancels symbolically;
    log|x| - log|y| where x/y over- or underflows (outside [2**-100, 2**100]) and x and y
    have one sign; log(x/y) between (and where the signs differ: NaN).

    Near 1 the rounding of x/y is all log(x/y) keeps: log((1 + u)/(1 - u)) at u = 1e-10 has
    6 correct digits, log1p(2u/(1 - u)) all of them. Where |x/y - 1| >= 1/2, |log(x/y)| >
    0.4 and the quotient's rounding costs a few ulps at most. Where x/y over- or
    underflows, |log(x/y)| > 69 and the difference of the logs cannot cancel much.
    """
    if not isinstance(node, log) or not isinstance(node.args[0], Mul):
        return None
    q = node.args[0]
    numerator, denominator = q.as_numer_denom()
    if not (numerator.free_symbols and denominator.free_symbols):
        return None
    inside = sympy.And(q > sympy.Float(2.0**-100), q < sympy.Float(2.0**100))
    # the magnitudes' logs: x and y may both be negative (x = -1e-247, y = -3e98); where
    # their signs differ the logarithm is undefined and stays log(x/y), NaN
    same_signs = sympy.sign(numerator) * sympy.sign(denominator) > 0
    branches = [
        (node, inside),
        (log(sympy.Abs(numerator)) - log(sympy.Abs(denominator)), same_signs),
        (node, True),
    ]
    difference = _cancelled_difference(numerator, denominator)
    if difference is not None:
        w = difference / denominator
        branches.insert(0, (log1p(w), sympy.Abs(w) < sympy.Rational(1, 2)))
    return sympy.Piecewise(*branches)


def _cancelled_difference(x: sympy.Expr, y: sympy.Expr) -> sympy.Expr | None:
    """x - y where x and y share a term, which cancels in it (1 + u - (1 - u) = 2u);
    else None."""
    if sympy.count_ops(x) > _DIFFERENCE_MAX_OPS or sympy.count_ops(y) > _DIFFERENCE_MAX_OPS:
        return None
    x, y = sympy.expand(x), sympy.expand(y)
    if not set(Add.make_args(x)) & set(Add.make_args(y)):
        return None
    difference = sympy.expand(x - y)
    return None if difference == 0 else sympy.factor_terms(difference)


#: Largest sum (SymPy op count, expanded) that :func:`exp_pair` groups by exponential.
_EXP_PAIR_MAX_OPS = 80


def _one_exp(term: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """A product as (its exponentials' argument, summed; the other factors): exp(e*x) *
    exp(-x*(e + 1)) * c is (-x, c)."""
    factors = Mul.make_args(term)
    argument = sympy.expand(Add(*(f.args[0] for f in factors if isinstance(f, exp))))
    return argument, Mul(*(f for f in factors if not isinstance(f, exp)))


@register("regimes")
def exp_pair(node: sympy.Basic, params: frozenset, positive: frozenset) -> sympy.Basic | None:
    """c1*exp(a) + c2*exp(b) -> exp(m)*((c1 + c2)*cosh(d) + (c1 - c2)*sinh(d)) for |d| <= 1,
    with m = (a + b)/2 and d = (a - b)/2, where c1 + c2 is 0 or simpler than c1 and c2.

    The two terms cancel where a is near b and c1 near -c2: ((1 + 1/e)*exp(-(1 - e)*x) -
    (1/e - 1)*exp(-(1 + e)*x))/2 (NMSE section 6.1) is exp(-x)*(cosh(e*x) + sinh(e*x)/e),
    nothing left to cancel at e = 1e-9; exp(a*x) - exp(b*x) is 2*exp(m)*sinh((a - b)*x/2)
    (Herbie's difference of exponentials). Terms free of exp are exp(0)'s: eps + (eps +
    1)*exp(2*eps*x) - 1 pairs too. Past |d| = 1 the terms differ by e**2 or more (little
    cancels) and exp(m) may overflow where neither term does: the sum as it is there.
    ``None`` where the sum (expanded) has not exactly two exponentials so.
    """
    if not isinstance(node, Add) or not node.has(exp) or node.has(sympy.Piecewise):
        return None
    return _paired(node, sympy.expand(node, power_exp=False, log=False))


@register("whole")
def exp_product(node: sympy.Basic, params: frozenset, positive: frozenset) -> sympy.Basic | None:
    """c*exp(b)*(c1*exp(a) + c2) -> :func:`exp_pair` of c*c1*exp(a + b) + c*c2*exp(b), and
    c*exp(b)*expm1(a) so as c*exp(a + b) - c*exp(b): the product multiplied out, each term's
    exponentials one.

    expm1(2*e*x)*exp(-(1 + e)*x) (NMSE section 6.1's derivative in x) is inf*0 at x = 710,
    e = 0.5 (the value 5e-155); paired it is 2*exp(-x)*sinh(e*x) for |e*x| <= 1 and
    exp(-(1 - e)*x) - exp(-(1 + e)*x) past that. Of the whole product (top-down), before its
    sum is paired on its own: that pair's outer branch would still be multiplied by exp(b).
    ``None`` where ``node`` is no product of an exponential and a sum with one (or an
    expm1), or the product multiplied out has not two exponentials as :func:`exp_pair`
    pairs them.
    """
    if not isinstance(node, Mul) or node.has(sympy.Piecewise):
        return None
    factors = Mul.make_args(node)
    exps = [f for f in factors if isinstance(f, exp)]
    sums = [f for f in factors if isinstance(f, expm1) or (isinstance(f, Add) and f.has(exp))]
    if not exps or len(sums) != 1:
        return None
    rest = Mul(*(f for f in factors if f not in exps and f != sums[0]))
    ones = sums[0].replace(expm1, lambda u: exp(u) - 1)
    terms = Add.make_args(sympy.expand(ones, power_exp=False, log=False))
    paired = _paired(None, Add(*(Mul(*exps, t) for t in terms)))
    # the other factors stay outside: multiplied in, (e - 1)*(e + 1) overflows at e = 1e200
    return None if paired is None else rest * paired


def _paired(node: sympy.Expr | None, expanded: sympy.Expr) -> sympy.Expr | None:
    """:func:`exp_pair` of the sum ``expanded``: ``node`` past |d| = 1 (the sum as
    written), or where that is None the two exponentials' terms, each coefficient
    factored."""
    if sympy.count_ops(expanded) > _EXP_PAIR_MAX_OPS:
        return None
    groups: dict[sympy.Expr, list[sympy.Expr]] = {}
    for term in Add.make_args(expanded):
        argument, coefficient = _one_exp(term)
        if coefficient.has(exp):
            return None  # an exponential inside a coefficient (exp(exp(x)))
        groups.setdefault(argument, []).append(coefficient)
    if len(groups) != 2:
        return None
    (a, ca), (b, cb) = sorted(groups.items(), key=lambda g: sympy.default_sort_key(g[0]))
    c1, c2 = Add(*ca), Add(*cb)
    plus = sympy.cancel(c1 + c2)
    if plus != 0 and sympy.count_ops(plus) >= sympy.count_ops(c1) + sympy.count_ops(c2):
        return None  # the coefficients do not cancel (exp(x) + exp(y) has nothing to)
    d = sympy.factor_terms(sympy.expand((a - b) / 2))
    if not d.free_symbols:
        return None
    m = sympy.factor_terms(sympy.expand((a + b) / 2))
    # factored: 1 - eps**2 overflows at eps = 1e200, (1 - eps)*(1 + eps) spreads
    plus, minus = sympy.factor(plus), sympy.factor(c1 - c2)
    from symgrad.rewrite.rules import stabilize

    paired = stabilize(exp(m) * (plus * sympy.cosh(d) + minus * sympy.sinh(d)))
    # what is left may cancel where d is near 0 (a series in d, see product_series)
    paired = paired.replace(
        lambda e: isinstance(e, Add) and e.has(sympy.sinh),
        lambda e: (
            product_series(e, frozenset(), frozenset())
            or series_regime(e, frozenset(), frozenset())
            or e
        ),
    )
    if node is None:
        node = sympy.factor(c1) * exp(a) + sympy.factor(c2) * exp(b)
    return sympy.Piecewise((paired, sympy.Abs(d) <= 1), (node, True))


def _two_parts(s: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr] | None:
    """(a, b) with a + b = s: a the terms with the first input of s's terms (by name), b
    the rest; None where s is no sum of two such parts."""
    if not isinstance(s, Add):
        return None
    symbols = sorted(s.free_symbols, key=lambda v: v.name)
    if not symbols:
        return None
    a = Add(*(t for t in s.args if t.has(symbols[0])))
    b = s - a
    return (a, b) if b != 0 else None


@register("regimes")
def trig_sum(node: sympy.Basic, params: frozenset, positive: frozenset) -> sympy.Basic | None:
    """sin(a + b) -> sin(a) cos(b) + cos(a) sin(b), cos(a + b) -> cos(a) cos(b) - sin(a)
    sin(b), tan as their ratio, for |a + b| > 1; as written within, where a + b is exact
    or correctly rounded and the expansion would cancel (sin(a + b) near a + b = 0).

    a + b rounds to a multiple of its ulp: sin(x + e) at x = 1e20 is sin(x) for any |e| <
    1e4, and at x = 1e4 keeps 12 bits fewer than sin(x) does. The expansion evaluates the
    functions at a and b as they are (Herbie's sin-sum and cos-sum)."""
    if not isinstance(node, (sympy.sin, sympy.cos, sympy.tan)):
        return None
    parts = _two_parts(node.args[0])
    if parts is None:
        return None
    a, b = parts
    sin_sum = sympy.sin(a) * sympy.cos(b) + sympy.cos(a) * sympy.sin(b)
    cos_sum = sympy.cos(a) * sympy.cos(b) - sympy.sin(a) * sympy.sin(b)
    expanded = {sympy.sin: sin_sum, sympy.cos: cos_sum, sympy.tan: sin_sum / cos_sum}
    return sympy.Piecewise((node, sympy.Abs(node.args[0]) <= 1), (expanded[node.func], True))


def split_regimes(
    expr: sympy.Expr,
    params: frozenset = frozenset(),
    positive: frozenset = frozenset(),
    near_zero: bool = True,
) -> sympy.Expr:
    """Branches by input regime: a Taylor polynomial where a sum cancels near 0 or the
    formula has a removable singularity there, zero where a Gaussian factor underflows,
    rational functions rescaled where their powers overflow, a conjugate where a sum with a
    square root cancels.

    Each formula top-down: the first ``whole`` rule that applies replaces it, its parts
    left as they are; else the ``asymptotes`` and ``limits`` rules on the formula before
    its parts; then its parts; then the first ``regimes`` rule that applies to the formula
    with its parts split. One pass: a branch made here is not visited again (its
    fallback is the sum); a formula's own branches (a where, a stabilize rule's select)
    are each split, their conditions left as they are. ``near_zero``: whether to try the
    ``limits`` rules (not inside a formula that has its own polynomial near 0).
    """
    if expr.is_Atom or not expr.args:
        return expr
    if isinstance(expr, sympy.Piecewise):
        # branches the formula came with (a where, a select of a stabilize rule, derive's
        # split by the sign of u; folded outermost): each branch's formula gets its own
        # regimes, the conditions none
        return sympy.Piecewise(
            *((split_regimes(v, params, positive, near_zero), c) for v, c in expr.args)
        )
    # Rational functions as a whole (top-down): rescaling only the denominator of a
    # quotient would leave the numerator's powers to overflow.
    whole = _first(phase("whole").rewrites, expr, params, positive)
    if whole is not None:
        return whole
    # the formula's own asymptotes and limit at 0 (top-down): of the formula, not of its
    # parts' branches, so that leading terms cancel symbolically
    branches = [
        branch
        for rule in phase("asymptotes").rewrites
        if (branch := rule(expr, params, positive)) is not None
    ]
    limit = _first(phase("limits").rewrites, expr, params, positive) if near_zero else None
    if limit is not None:
        branches.append(limit)
    inner = near_zero and limit is None
    args = tuple(split_regimes(a, params, positive, inner) for a in expr.args)
    node = expr.func(*args) if args != expr.args else expr
    split = _first(phase("regimes").rewrites, node, params, positive)
    if split is None and node is not expr:
        split = _series_of_whole(expr, node, params, positive)
    split = node if split is None else split
    for branch in reversed(branches):  # the first registered outermost
        split = sympy.Piecewise(branch, (split, True))
    return split


def _series_of_whole(
    expr: sympy.Expr, node: sympy.Expr, params: frozenset, positive: frozenset
) -> sympy.Expr | None:
    """A series of the sum ``expr`` as a whole where its parts got branches of their own
    (``node``, which the series rules do not expand), ``node`` past its cut; None where
    its terms do not cancel. Compound interest's second derivative in n has
    log1p(u) - u/(1 + u), which cancels to u**2/2 and has its own series, inside
    2*(log1p(u) - u/(1 + u))/u - u/(u + 1)**2, which cancels to 2*u**2/3 in turn."""
    for rule in (series_regime, product_series):
        whole = rule(expr, params, positive)
        if isinstance(whole, sympy.Piecewise) and whole.args[-1] == (expr, True):
            return sympy.Piecewise(*whole.args[:-1], (node, True))
    return None


def _first(rules, node: sympy.Basic, params: frozenset, positive: frozenset):
    """What the first of ``rules`` that applies to ``node`` makes of it (None if none does)."""
    for rule in rules:
        new = rule(node, params, positive)
        if new is not None:
            return new
    return None


# The candidates phase.


#: Largest power of the exponential in :func:`exp_rational`'s polynomials.
_EXP_RATIONAL_MAX_DEGREE = 6
#: exp(-b) is 0 in float64 (and float32) past this.
_EXP_UNDERFLOW = 745.2


#: Within |b| <= this, :func:`exp_rational` keeps the formula as written where its
#: polynomials have coefficients with calls of their own.
_EXP_RATIONAL_MIDDLE = 10
_HYPERBOLIC = (sympy.sinh, sympy.cosh, sympy.tanh, sympy.coth, sympy.sech, sympy.csch)


def _ones(poly: sympy.Poly, u: sympy.Symbol) -> tuple[int, sympy.Poly]:
    """(m, q) with ``poly`` = (u - 1)**m * q and q(1) != 0 (m = 0 for a constant)."""
    m = 0
    while poly.degree() > 0 and sympy.expand(poly.eval(1)) == 0:
        poly, m = poly.quo(sympy.Poly(u - 1, u)), m + 1
    return m, poly


@register("candidates")
def exp_rational(expr: sympy.Expr) -> sympy.Expr | None:
    """f(exp(b)) -> P(t)/Q(t) with t = exp(-|b|), by the sign of b: ``expr`` as a rational
    function of one exponential.

    Where every exponential and hyperbolic function in ``expr`` is a function of ``exp(b)``
    for one argument ``b`` (sigmoid, softplus inside tanh, tanh, their derivatives...),
    the whole formula is ``P(u)/Q(u)`` with ``u = exp(b)``: mish's gradient, softplus then
    tanh then sigmoid and a squared sech, is one exp and a dozen multiplies. Evaluated as ``P(t)/Q(t)`` for
    ``b < 0`` and, multiplied through by ``t**deg``, as the reversed polynomials of ``t``
    for ``b >= 0``, no power overflows. Other calls are coefficients of the polynomials:
    atan2(sinh(x), cos(y))'s gradient, cos(y)*cosh(x)/(cos(y)**2 + sinh(x)**2), is inf/inf
    past |x| = 710 (then the formula as written is kept for |b| <= 10, where the
    polynomials may cancel and it does not overflow). ``None`` where ``expr`` is not such a
    function, the sign of ``b`` is fixed, or ``expr`` makes a single call. Whether the
    result is accurate (the polynomials may cancel) is for the measured choice to say.
    """
    return _exp_rational(expr, written_near_zero=False)


@register("candidates")
def exp_rational_written_near_zero(expr: sympy.Expr) -> sympy.Expr | None:
    """f(exp(b)) -> Piecewise((f(exp(b)), |b| <= 10), (P(t)/Q(t), True)): :func:`exp_rational`
    with the formula as written kept near b = 0 where the polynomials' coefficients hold
    inputs other than b's (and make no calls: those are :func:`exp_rational`'s own), a
    second candidate beside it.

    Such coefficients may cancel near b = 0 for some values of those inputs where the
    formula does not: N - (e*sinh(N) - 2*N)/(e*cosh(N) - 1) (Basilisk's N2H) has, in t =
    exp(-|N|), the numerator e*(N - 1)*t**2 + 2*N*t + e*(N + 1), whose e terms cancel to
    O(N**3) near N = 0 (0 at N = 1e-8, e = 2, where the value is 1e-8); its gradient in
    N had 21 float32 results of 85 NaN or inf, none with the middle as written. Where
    the coefficients do not cancel the exp_rational form alone may be the more accurate;
    the measured choice takes either.
    """
    return _exp_rational(expr, written_near_zero=True)


def _one_exponential(
    expr: sympy.Expr,
) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr, dict[sympy.Expr, sympy.Expr], sympy.Dummy] | None:
    """(factor, rest, b, powers, u): ``expr`` in its naive form, hyperbolic functions as
    exponentials, as factor*rest with the factor free of b's inputs (an upstream
    gradient), where every exponential in it is exp(k*b) for one argument b of no fixed
    sign and rational k; ``powers`` maps each exp(k*b) to u**k. None where there is no
    such b."""
    # only the hyperbolic functions as exponentials: cos(y) stays a coefficient (of
    # atan2(sinh(x), cos(y))'s gradient), where exp(I*y) would have no sign to split on
    naive = expr.rewrite("naive").replace(
        lambda e: isinstance(e, _HYPERBOLIC), lambda e: e.rewrite(exp)
    )
    exps = naive.atoms(exp)
    if not exps:
        return None
    first, *rest = sorted({e.args[0] for e in exps}, key=sympy.default_sort_key)
    ratios = [sympy.nsimplify(a / first) for a in rest]
    if not all(r.is_Rational for r in ratios):
        return None
    scale = sympy.ilcm(1, 1, *(r.q for r in ratios))
    base = first / scale
    # (y/kR is real but for kR = 0, where SymPy cannot say)
    if base.is_extended_real is False or base.is_nonnegative or base.is_nonpositive:
        return None
    if not base.free_symbols:
        return None
    u = sympy.Dummy("u", positive=True)
    factor, naive = naive.as_independent(*base.free_symbols, as_Add=False)
    return factor, naive, base, {exp(a): u ** (a / base) for a in {first, *rest}}, u


def _exp_rational(expr: sympy.Expr, written_near_zero: bool) -> sympy.Expr | None:
    """:func:`exp_rational`; ``written_near_zero``: with the formula as written for |b| <= 10
    (:func:`exp_rational_written_near_zero`), None where its coefficients are b's alone."""
    calls = {f for f in expr.atoms(sympy.Function) if not isinstance(f, sympy.Abs)}
    if expr.has(sympy.Piecewise) or sum(expr.count(c) for c in calls) < 2:
        # one call (sigmoid(x)) is best left to the framework's op; the same call in
        # several places (w*exp(w) / (exp(w) + w*exp(w))) is a rational function of it
        return None
    one = _one_exponential(expr)
    if one is None:
        return None
    # a factor free of b's symbols (the upstream gradient) multiplies the result once
    factor, naive, base, powers, u = one
    rational = sympy.cancel(sympy.together(naive.xreplace(powers)))
    num, den = sympy.fraction(rational)
    try:
        num, den = sympy.Poly(num, u), sympy.Poly(den, u)
    except sympy.PolynomialError:
        return None
    if any(c.has(exp, log) for c in (*num.coeffs(), *den.coeffs())):
        return None
    degree = max(num.degree(), den.degree())
    # coefficients with calls of their own (cos(y)): the formula as written is kept near
    # b = 0 (below), and past it the higher powers of t are below the rounding
    opaque = any(c.atoms(sympy.Function) for c in (*num.coeffs(), *den.coeffs()))
    if not 0 < degree <= _EXP_RATIONAL_MAX_DEGREE * (1 + opaque):
        return None
    # the coefficients' common factors (x in mish: x*(1 + 2t)) multiply once, outside,
    # factored: (w + 1)**2 is exact near w = -1 where w**2 + 2*w + 1 cancels
    (num_content, num), (den_content, den) = num.primitive(), den.primitive()
    factor *= sympy.factor(num_content) / sympy.factor(den_content)
    t = sympy.Dummy("t", positive=True)
    coeffs = (*num.coeffs(), *den.coeffs())
    if written_near_zero and (
        opaque or not any(c.free_symbols - base.free_symbols for c in coeffs)
    ):
        return None  # (exp_rational's own)
    # Past the exponential's underflow t is 0, and a coefficient like 4*x may overflow there:
    # inf * 0 = NaN where the value is the limit. Where b = k*x and the coefficients are in
    # x alone, x is clamped where it meets a power of t (|x| beyond the clamp has t = 0, so
    # nothing changes); otherwise the limits are branches of their own.
    bounded: dict[sympy.Symbol, sympy.Expr] = {}
    limits = False
    if any(c.free_symbols for c in coeffs):
        (var, *others) = sorted(base.free_symbols, key=sympy.default_sort_key)
        slope = sympy.diff(base, var)
        linear = not others and slope.is_number and sympy.expand(base - slope * var) == 0
        if linear and set().union(*(c.free_symbols for c in coeffs)) == {var}:
            # rounded up: beyond it t is still 0
            bound = sympy.Float(math.ceil(_EXP_UNDERFLOW / abs(float(slope)) * 1e4) / 1e4)
            bounded = {var: sympy.Min(sympy.Max(var, -bound), bound)}
        else:
            limits = True

    # A root at u = 1 (b = 0: tanh, sinh) cancels there as a polynomial in t, 1 - t**2 at
    # t = exp(-2e-8): its factors (u - 1) are expm1(-|b|) instead (up to a power of t)
    (num_ones, num), (den_ones, den) = _ones(num, u), _ones(den, u)

    def horner(poly: sympy.Poly, reverse: bool, ones: int) -> sympy.Expr:
        coeffs = poly.all_coeffs()  # highest power first
        coeffs = [sympy.S.Zero] * (degree - ones + 1 - len(coeffs)) + coeffs
        if reverse:  # u = 1/t, times t**(degree - ones); (1/t - 1)**ones makes up the rest
            coeffs.reverse()
        value = sympy.S.Zero
        for c in coeffs[:-1]:  # those that meet a power of t
            value = (value + c.xreplace(bounded)) * t
        return value + coeffs[-1]

    def at(small: sympy.Expr, reverse: bool) -> sympy.Expr:
        # u - 1 is t - 1 (b < 0), or (1 - t)/t (b >= 0) whose 1/t is in horner's power
        one = (small - 1 if small == 0 else expm1(-sympy.Abs(base))) * (-1 if reverse else 1)
        value = horner(num, reverse, num_ones) / horner(den, reverse, den_ones)
        return value.xreplace({t: small}) * one ** (num_ones - den_ones)

    small = exp(-sympy.Abs(base))
    branches = [(at(small, True), base >= 0), (at(small, False), True)]
    if limits:
        # a ratio of the polynomials' coefficients, cancelled: (e + N*e)/e is 1 + N, where
        # N*e may overflow (N2H at N = -6e31, e = 1.6e13 in float32)
        ends = [
            (sympy.cancel(at(sympy.S.Zero, True)), base > _EXP_UNDERFLOW),
            (sympy.cancel(at(sympy.S.Zero, False)), base < -_EXP_UNDERFLOW),
        ]
        # (a limit that is a pole, x / 0, is left to the branches below: inf there too)
        finite = [(v, c) for v, c in ends if not v.has(sympy.zoo, sympy.nan, sympy.oo)]
        branches = [*finite, *branches]

    def grows(f: sympy.Expr) -> bool:
        """``f`` is a power of b's inputs other than the first (y**2, 1/k**4)."""
        root, e = f.as_base_exp()
        return bool(root.free_symbols & base.free_symbols) and not (e == 1 or e == -1)

    if limits or any(grows(f) for f in Mul.make_args(factor)):
        # the factor into the branches: where the limit is 0 it is 0, not factor * 0, and
        # a product with exp(-|b|) multiplies it first (y**2/k**4 times a function of
        # exp(y/k) is inf * 0 = NaN at y = 1e300, k = 1e-10; the value is 0)
        rescaled = sympy.Piecewise(*((v if v == 0 else factor * v, c) for v, c in branches))
    else:
        rescaled = factor * sympy.Piecewise(*branches)
    if opaque or written_near_zero:
        # Coefficients with calls of their own (cos(y)): the polynomials may cancel near
        # b = 0 where the formula does not (1 - 2t**2 + t**4 + 4t**2*cos(y)**2 is
        # (1 - t**2)**2 + ...), so there the formula as written: within |b| <= 10 its
        # terms are at most exp(b)**6 (degree 12 in u counts 1/u too), e**60 even in float32.
        return sympy.Piecewise((expr, sympy.Abs(base) <= _EXP_RATIONAL_MIDDLE), (rescaled, True))
    return rescaled


@register("candidates")
def rational_scaled(expr: sympy.Expr) -> sympy.Expr | None:
    """A rational function of one tensor symbol with its numerator's degree divided out:
    -(nu + 1)*x/(nu + x**2) -> -(nu + 1)/(x + nu/x).

    No power of x is formed, so nothing overflows for large |x| (nor, where the numerator
    is x, for small |x|: nu/x -> inf gives 0), and there is no branch: Student-t's gradient
    in three passes instead of two regimes. ``None`` where ``expr`` is not such a function
    or the numerator has degree 0 or no less than the denominator's.
    """
    if expr.has(sympy.Piecewise) or any(
        not isinstance(f, sympy.Abs) for f in expr.atoms(sympy.Function)
    ):
        return None
    symbols = [s for s in expr.free_symbols if not s.is_positive]  # not nu-like parameters
    for x in sorted(symbols, key=sympy.default_sort_key):
        # the factor free of x (an upstream gradient, -(nu + 1)) multiplies the result once
        factor, rest = expr.as_independent(x, as_Add=False)
        num, den = sympy.fraction(sympy.cancel(sympy.together(rest)))
        try:
            num, den = sympy.Poly(num, x), sympy.Poly(den, x)
        except sympy.PolynomialError:
            continue
        if any(c.has(x) for c in (*num.coeffs(), *den.coeffs())):
            continue
        low = min(m[0] for m in num.monoms())
        if not 1 <= low < num.degree() + 1 <= den.degree():
            continue
        (num_content, num), (den_content, den) = num.primitive(), den.primitive()
        factor *= sympy.factor_terms(num_content / den_content)
        terms = [
            sympy.Add(*(c * x ** (m[0] - low) for c, m in zip(p.coeffs(), p.monoms())))
            for p in (num, den)
        ]
        return factor * terms[0] / terms[1]
    return None


def _linear_scale(node: sympy.Expr) -> sympy.Expr | None:
    """:func:`linear_terms_unscaled`'s scale of one sum: the largest power of two above 1
    among the coefficients of its terms that are linear in an input, or None."""
    scales = []
    for term in node.args:
        c, rest = term.as_coeff_Mul()
        powers = rest.as_powers_dict()
        if any(isinstance(b, sympy.Symbol) and e == 1 for b, e in powers.items()):
            scales.append(abs(c))
    top = max(scales, default=sympy.S.One)
    if top > 1 and top.is_Integer and top & (top - 1) == 0:
        return top
    return None


def linear_terms_unscaled(expr: sympy.Expr) -> sympy.Expr | None:
    """Each sum with a term c*x*(...) that is linear in an input x, c a power of two above
    1, divided by the largest such c (and multiplied by it outside): dt**4 + 2*r + 50 ->
    2*(dt**4/2 + r + 25).

    SymPy clears fractions to integer coefficients (N/(N + r) with N = dt**4/2 + 25 is
    (dt**4 + 50)/(dt**4 + 2*r + 50)), and c*x overflows where x is within a factor c of
    the top of the range, where the value is finite: the Kalman gain's gradient is 0/0 at
    r = 1e308. A term linear in its input is one that reaches the range's end (a power
    overflows far earlier, a matter for the regimes); powers of two divide exactly. The
    constant joins the product's coefficient, applied after the quotient. Offered beside
    every candidate of the choice (:func:`symgrad.derive.finish`): regime branches
    included, where the other inputs' overflow is already handled.
    """
    changed = False

    def unscaled(node: sympy.Expr) -> sympy.Expr:
        nonlocal changed
        base, power = (node.base, node.exp) if isinstance(node, Pow) else (node, sympy.S.One)
        if not (isinstance(base, Add) and power.is_Integer):
            return node
        c = _linear_scale(base)
        if c is None:
            return node
        changed = True
        return c**power * Pow(Add(*(t / c for t in base.args)), power)

    def factors(node: sympy.Expr) -> sympy.Expr:
        return Mul(*(unscaled(f) for f in node.args))

    result = expr.replace(lambda e: isinstance(e, Mul), factors)
    if isinstance(result, Pow):
        result = unscaled(result)
    return result if changed else None


def linear_ratios(expr: sympy.Expr) -> sympy.Expr | None:
    """x**j/(x + b)**m in a product, x an input -> 1/(1 + b/x)**p times what is left
    (p = min(j, m)): the ratio of x to a sum it is a term of, computed as one number.

    A product multiplies its numerator before it divides: x*N'/((x + N)*(2 + 2*N/x)) is
    inf/inf at x = 1e308 (the Kalman filter's covariance gradient, r*N/(N + r) in dt, at
    r = 1e308, where the value is 10.25); 1/(1 + N/x) is at most 1 where N and x are
    positive, and 0 at x = 0 (N/0 is inf). Offered beside every candidate of the choice,
    which measures where b/x cancels against 1 (x near -b).
    """
    changed = False

    def paired(node: sympy.Expr) -> sympy.Expr:
        nonlocal changed
        factors = list(node.args)
        for k, f in enumerate(factors):
            base, power = f.as_base_exp()
            if not (isinstance(base, Add) and power.is_Integer and power < 0):
                continue
            for x in sorted(base.free_symbols, key=sympy.default_sort_key):
                if x not in base.args:
                    continue
                own = [j for j, g in enumerate(factors) if g.as_base_exp()[0] == x]
                if not own:
                    continue
                j = own[0]
                xp = factors[j].as_base_exp()[1]
                if not (xp.is_Integer and xp > 0):
                    continue
                p = min(xp, -power)
                rest = Add(*(t / x for t in base.args if t != x))
                factors[j] = x ** (xp - p)
                factors[k] = base ** (power + p) * Pow(1 + rest, -p)
                changed = True
                break
        return Mul(*factors)

    result = expr.replace(lambda e: isinstance(e, Mul), paired)
    return result if changed else None


#: homogeneous_scaled: the largest total degree of a polynomial it rescales
HOMOGENEOUS_MAX_DEGREE = 8


@register("candidates")
def homogeneous_scaled(expr: sympy.Expr, anyway: bool = False) -> sympy.Expr | None:
    """R(x, y) homogeneous of degree d -> R(1, y/x)*x**d for |y| <= |x|, R(x/y, 1)*y**d
    otherwise: a function of two inputs scaled by the larger (as hypot is, or Smith's
    complex division).

    (x - y)*(x + y)/(x**2 + y**2) is inf/inf once a square overflows (|y| > 1e154, 1e19 in
    float32) and 0/0 once both underflow, where the value is between -1 and 1; with t =
    y/x no power of t exceeds 1, and x**d is what the value itself is made of. A rational
    function's polynomials are factored, each factor scaled apart (roots where the
    formula's are); other formulas are scaled as written, through square roots
    (sqrt(x**2 + y**2) is |x|*sqrt(1 + t**2)), absolute values and calls of degree 0
    (atan(y/x) is atan(t)). Factors free of x and y (the upstream gradient) ride along.
    ``None`` where ``expr`` is not such a function of any pair of its inputs, or has no sum
    of degree 2 or more to overflow (unless ``anyway``: radical_factored's forms have
    powers of H, hypot(x, y)**3, that overflow as well).
    """
    if isinstance(expr, sympy.Piecewise):
        # branch by branch (what simplify makes of a derivative through |u|: its value
        # where u = 0, and elsewhere), the conditions as they are
        return _by_branch(lambda v: homogeneous_scaled(v, anyway), expr)
    if expr.has(sympy.Piecewise):
        return None
    symbols = sorted(expr.free_symbols, key=sympy.default_sort_key)
    for x, y in itertools.combinations(symbols, 2):
        scaled = _rational_scaled_by_larger(expr, x, y)
        if scaled is None and not expr.is_rational_function(x, y):
            scaled = _scaled_by_larger(expr, x, y, anyway)
        if scaled is not None:
            return scaled
    return None


def _by_branch(
    rewrite: Callable[[sympy.Expr], sympy.Expr | None], expr: sympy.Piecewise
) -> sympy.Expr | None:
    """``rewrite`` on each branch of ``expr``, its conditions as they are, a branch it
    leaves (None) as written; None where it rewrites none or a condition has a Piecewise."""
    if any(c.has(sympy.Piecewise) for _, c in expr.args):
        return None
    values = [rewrite(v) for v, _ in expr.args]
    if all(v is None for v in values):
        return None
    return sympy.Piecewise(*((v if s is None else s, c) for s, (v, c) in zip(values, expr.args)))


def _rational_scaled_by_larger(
    expr: sympy.Expr, x: sympy.Symbol, y: sympy.Symbol
) -> sympy.Expr | None:
    """:func:`homogeneous_scaled` for a rational function of ``x`` and ``y``."""
    factor, rest = expr.as_independent(x, y, as_Add=False)
    if rest.atoms(sympy.Function) or not rest.is_rational_function(x, y):
        return None
    fraction = _homogeneous_fraction(rest, x, y)
    if fraction is None:
        return None
    (numerator, denominator), _, degrees = fraction
    if degrees[1] < 2 or not denominator.has(x) or not denominator.has(y):
        return None
    factored = sympy.factor(numerator) / sympy.factor(denominator)
    d = degrees[0] - degrees[1]
    branches = [
        (_at_one(factored, x, y) * x**d, sympy.Abs(y) <= sympy.Abs(x)),
        (_at_one(factored, y, x) * y**d, True),
    ]
    return factor * _branches_stabilized(branches)


def _scaled_by_larger(
    expr: sympy.Expr, x: sympy.Symbol, y: sympy.Symbol, anyway: bool = False
) -> sympy.Expr | None:
    """:func:`homogeneous_scaled` for a formula with roots or calls, scaled as written."""
    branches = []
    for big, small in ((x, y), (y, x)):
        t = sympy.Dummy("t")
        overflows: list[bool] = []
        walked = _walk_scaled(expr, big, small, t, overflows)
        if walked is None or not (anyway or any(overflows)):
            return None
        value, d, s = walked
        # |big|**d * sign(big)**s: big**d where the parities agree
        if d.is_Integer:
            scale = big**d * (sympy.sign(big) if (d - s) % 2 else 1)
        else:
            scale = sympy.Abs(big) ** d * sympy.sign(big) ** s
        # |t| and sign(t) of the inputs, not of the ratio (y*|x/y|/x**2 is 0/x**2 where x/y
        # underflows, y*|x|/(x**2*|y|) is sign(y)/|x|); t's plain powers are the inputs'
        # powers already, once substituted
        value = value.xreplace(
            {
                sympy.Abs(t): sympy.Abs(small) / sympy.Abs(big),
                sympy.sign(t): sympy.sign(small) * sympy.sign(big),
            }
        )
        branches.append(
            (value.xreplace({t: small / big}) * scale, sympy.Abs(small) <= sympy.Abs(big))
        )
    return _branches_stabilized([branches[0], (branches[1][0], True)])


def _branches_stabilized(branches: list[tuple[sympy.Expr, sympy.Basic]]) -> sympy.Expr:
    """The branches of :func:`homogeneous_scaled`, each stabilised by the rules (scaled,
    sqrt(x**2 + y**2) is |x|*sqrt(1 + t**2): hypot(t, 1) again). Not split by regime: on an analog, the
    splits of 1 + t**2 made 2*x*y/(x**2 + y**2) 0.1 -> 2.0 bits."""
    from symgrad.rewrite.rules import stabilize

    return sympy.Piecewise(*((stabilize(v), c) for v, c in branches))


def _walk_scaled(
    node: sympy.Expr, big: sympy.Symbol, small: sympy.Symbol, t: sympy.Dummy, overflows: list
) -> tuple[sympy.Expr, sympy.Rational, int] | None:
    """``node`` as (R, d, s) with node = R * |big|**d * sign(big)**s, R a function of t =
    small/big and the other inputs, d an integer or half one (a square root of an odd
    degree); None where ``node`` is not homogeneous in big and small. ``overflows`` gets
    whether each sum has degree 2 or more."""
    if node == big:
        return sympy.S.One, sympy.S.One, 1
    if node == small:
        return t, sympy.S.One, 1
    if node.is_Atom:
        return node, sympy.S.Zero, 0
    if node.has(Add) and not node.atoms(sympy.Function) and node.is_rational_function(big, small):
        return _rational_walked(node, big, small, t, overflows)
    parts = [_walk_scaled(a, big, small, t, overflows) for a in node.args]
    if any(p is None for p in parts):
        return None
    if isinstance(node, Add):
        degrees = {d for _, d, _ in parts}
        if len(degrees) > 1:
            return None
        d = degrees.pop()
        overflows.append(abs(d) >= 2)
        parities = {s for _, _, s in parts}
        if len(parities) == 1:
            return Add(*(r for r, _, _ in parts)), d, parities.pop()
        return Add(*(r * sympy.sign(big) ** s for r, _, s in parts)), d, 0
    if isinstance(node, Mul):
        return (
            Mul(*(r for r, _, _ in parts)),
            Add(*(d for _, d, _ in parts)),
            sum(s for _, _, s in parts) % 2,
        )
    if isinstance(node, Pow):
        (r, d, s), (e, de, _) = parts
        if de != 0 or e.has(t):
            return None
        if e.is_Integer:
            return r**e, d * e, (s * int(e)) % 2
        if e.is_Rational and e.q == 2 and s == 0:
            # sqrt(|x|)**d where d is odd; the even powers of r's factors out of the root
            # as their absolute values (sqrt(P*t**-2) is sqrt(P)/|t|: no t**2 to underflow)
            even = [f for f in Mul.make_args(r) if f.as_base_exp()[1].is_even]
            rest = Mul(*(f for f in Mul.make_args(r) if f not in even))
            pulled = Mul(*(sympy.Abs(b) ** (k * e) for b, k in (f.as_base_exp() for f in even)))
            return pulled * rest**e, d * e, 0
        return None
    if isinstance(node, hypot) and len({d for _, d, _ in parts}) == 1:
        return hypot(*(r for r, _, _ in parts)), parts[0][1], 0
    if isinstance(node, sympy.Abs):
        ((r, d, _),) = parts
        # factor by factor: a square root of it then splits (sqrt(|1 - t|)*sqrt(|1 + t|),
        # no product of the two to overflow), and t's powers stay t's
        return _by_factor(sympy.Abs, r), d, 0
    if isinstance(node, sympy.sign):
        ((r, _, s),) = parts
        return _by_factor(sympy.sign, r), sympy.S.Zero, s
    if isinstance(node, sympy.Function) and all(d == 0 for _, d, _ in parts):
        return node.func(*(r * sympy.sign(big) ** s for r, _, s in parts)), sympy.S.Zero, 0
    return None


def _by_factor(func: type[sympy.Function], r: sympy.Expr) -> sympy.Expr:
    """|r| or sign(r), factor by factor (|(1 - t)*(1 + t)/t**2| as |1 - t|*|1 + t|/|t|**2):
    a square root of it then splits (no product of the factors to overflow), and powers of
    t stay t's, not powers of the inputs that the ratio t = y/x stands for."""
    factors = []
    for f in Mul.make_args(r):
        base, e = f.as_base_exp()
        if not e.is_Integer:
            factors.append(func(f))
        elif func is sympy.sign:  # sign(b)**2 is 1 (but at b = 0, where t**2 is 0 too)
            factors.append(func(base) ** (e % 2))
        else:
            factors.append(func(base) ** e)
    return Mul(*factors)


def _homogeneous_fraction(expr: sympy.Expr, x: sympy.Symbol, y: sympy.Symbol) -> tuple | None:
    """``expr`` over one denominator: ((numerator, denominator), their polynomials in ``x``
    and ``y``, their degrees); None where either is not homogeneous in ``x`` and ``y`` or
    its degree is above :data:`HOMOGENEOUS_MAX_DEGREE`."""
    parts = sympy.fraction(sympy.cancel(sympy.together(expr)))
    try:
        polys = [sympy.Poly(p, x, y) for p in parts]
    except sympy.PolynomialError:
        return None
    degrees = [p.homogeneous_order() for p in polys]
    if None in degrees or max(degrees) > HOMOGENEOUS_MAX_DEGREE:
        return None
    return parts, polys, degrees


def _rational_walked(
    node: sympy.Expr, big: sympy.Symbol, small: sympy.Symbol, t: sympy.Dummy, overflows: list
) -> tuple[sympy.Expr, sympy.Rational, int] | None:
    """:func:`_walk_scaled` for a rational function of ``big`` and ``small`` inside a
    formula (the radicand of sqrt(|1 - y**2/x**2)|)): over one denominator, its polynomials
    factored and each factor scaled apart, as :func:`homogeneous_scaled` scales a rational
    formula (1 - y**2/x**2 is (1 - t)*(1 + t) for |y| <= |x|, (t - 1)*(t + 1)/t**2 with t =
    x/y otherwise: no square of an input overflows, and the factors vanish where the
    formula does, up to the one rounding of t)."""
    fraction = _homogeneous_fraction(node, big, small)
    if fraction is None:
        return None
    (numerator, denominator), polys, degrees = fraction
    overflows.append(any(len(p.terms()) > 1 and k >= 2 for p, k in zip(polys, degrees)))
    factored = sympy.factor(numerator) / sympy.factor(denominator)
    d = degrees[0] - degrees[1]
    value = _at_one(factored, big, small).xreplace({small: t * big})  # in t = small/big
    return value, sympy.Integer(d), d % 2


def _at_one(factored: sympy.Expr, big: sympy.Symbol, small: sympy.Symbol) -> sympy.Expr:
    """A product of powers of homogeneous polynomials in ``big`` and ``small``, each
    polynomial divided by ``big`` to its degree (:func:`_part_at_one`)."""
    return Mul(
        *(
            _part_at_one(base, big, [small]) ** e if base.has(big, small) else base**e
            for base, e in (f.as_base_exp() for f in Mul.make_args(factored))
        )
    )


#: radical_factored: at most this many factors a + b*sqrt(Q) conjugated by regime (each
#: doubles the branches)
RADICAL_MAX_FACTORS = 3


@register("candidates")
def radical_factored(expr: sympy.Expr) -> sympy.Expr | None:
    """R(u, v, sqrt(a*u**2 + q(v)), sqrt(g)) -> over one denominator with u**2 written as
    (H**2 - q)/a (H the root), its polynomials factored in H, and each factor c*H + b
    that cancels (c*b < 0) written as (c**2*(a*u**2 + q) - b**2)/(c*H - b); then scaled by
    the larger input (:func:`homogeneous_scaled`). g, a nested radicand, is factored the
    same way.

    The second derivative of Givens' sqrt((1 + x/sqrt(4*p**2 + x**2))/2) in p is, as
    SymPy writes it, a sum of fractions whose terms cancel to 25 bits at p = 0.5, x = -1e4
    (and to 0/0 where p/x underflows): with u = p eliminated the numerator is
    x*(H + x)**2*(4*H - 5*x)/2, and H + x is 4*p**2/(H - x) for x < 0, where it cancels.
    The polynomials' roots are then where the formula's are, and what is left of each
    cancellation is a factor computed exactly (4*p**2), as conjugate_regime makes of one
    sum a + b*sqrt(R). ``None`` where ``expr`` has no root of a quadratic in two or more
    inputs with a square-only input, or nothing cancels.
    """
    if isinstance(expr, sympy.Piecewise):
        return _by_branch(radical_factored, expr)
    if expr.has(sympy.Piecewise):
        return None
    expr = expr.replace(
        lambda e: isinstance(e, (hypot, hypot_ratio)), lambda e: type(e).naive(*e.args)
    )
    from symgrad.rewrite.rules import stabilize

    # each way of eliminating an input tried; kept: the one whose polynomials factor the
    # furthest (the least of H's powers left in factors above its first), then the shortest
    forms = [_radical_factored(found, expr) for found in _quadratic_radicands(expr)]
    forms = [form for form in forms if form is not None]
    if not forms:
        return None
    _, form = min(forms, key=lambda f: (f[0], sympy.count_ops(f[1])))
    form = stabilize(form)
    return homogeneous_scaled(form, anyway=True) or form


def _quadratic_radicands(expr: sympy.Expr) -> list[tuple]:
    """The radicands Q of ``expr``'s square roots that are quadratics in two or more
    inputs, each with every input u that Q has only as a*u**2 (a a number): (Q, u, a,
    Q - a*u**2). At most the first nine (the caller tries each)."""
    found = []
    for q in sorted(
        {e.base for e in expr.atoms(Pow) if e.exp.is_Rational and e.exp.q == 2},
        key=sympy.default_sort_key,
    ):
        symbols = sorted(q.free_symbols, key=sympy.default_sort_key)
        if len(symbols) < 2 or not q.is_polynomial(*symbols) or q.atoms(sympy.Function):
            continue
        if sympy.Poly(q, *symbols).total_degree() != 2:
            continue
        for u in symbols:
            in_u = sympy.Poly(q, u)
            if in_u.degree() == 2 and in_u.coeff_monomial(u) == 0 and in_u.LC().is_Number:
                found.append((q, u, in_u.LC(), sympy.expand(q - in_u.LC() * u**2)))
    return found[:9]


def _radical_factored(found: tuple, expr: sympy.Expr) -> tuple[int, sympy.Expr] | None:
    """:func:`radical_factored` with one radicand and input to eliminate: (how much of H's
    powers is left unfactored, the form)."""
    q, u, a, rest = found
    # (no assumptions: SymPy would split sqrt((H + x)/H) into two roots for a positive H)
    h = sympy.Dummy("H")
    e = expr.replace(
        lambda n: isinstance(n, Pow) and n.base == q and n.exp.is_Rational and n.exp.q == 2,
        lambda n: h ** (2 * n.exp),
    )
    # calls are symbols of their own here (|p|, sign(x), log(x)): the identities used hold
    # whatever their values
    opaque: dict[sympy.Dummy, sympy.Expr] = {}

    def hide(node: sympy.Expr) -> sympy.Expr:
        # the outermost calls, whole (exp(|y|) one symbol, not exp of another)
        if isinstance(node, sympy.Function):
            opaque[d := sympy.Dummy("c")] = node
            return d
        if node.is_Atom:
            return node
        return node.func(*map(hide, node.args))

    e = hide(e)
    # a nested radical, sqrt(g) with g in H (Givens' sqrt(1/2 + x/(2*H))): one, as F
    nested = {
        n.base for n in e.atoms(Pow) if n.exp.is_Rational and n.exp.q == 2 and not n.base.is_Number
    }
    f = g = None
    if nested:
        bases = {b: sympy.cancel(sympy.together(b)) for b in nested}
        g = next(iter(bases.values()))
        if any(not sympy.cancel(b / g).is_Number for b in bases.values()):
            return None
        f = sympy.Dummy("F", positive=True)
        e = e.replace(
            lambda n: isinstance(n, Pow) and n.base in bases and n.exp.is_Rational and n.exp.q == 2,
            lambda n: (bases[n.base] / g) ** n.exp * f ** (2 * n.exp),
        )
    sides, f_power = [], 0
    for k, side in enumerate(sympy.fraction(sympy.together(e))):
        side = sympy.expand(side)
        if f is not None and side.has(f):
            try:
                terms = sympy.Poly(side, f).terms()
            except sympy.PolynomialError:
                return None
            even = Add(*(c * g ** (n // 2) for (n,), c in terms if n % 2 == 0))
            odd = Add(*(c * g ** (n // 2) for (n,), c in terms if n % 2 == 1))
            if (even != 0 and odd != 0) or even.has(f) or odd.has(f):
                return None  # a + b*F: conjugate_regime's (or F not a plain power)
            if odd != 0:
                side, f_power = odd, f_power + (1 if k == 0 else -1)
            else:
                side = even
        sides.append(side)
    relation = u**2 - (h**2 - rest) / a

    def factored(poly: sympy.Expr) -> sympy.Expr:
        return sympy.factor(sympy.rem(sympy.expand(poly), relation, u))

    num, den = sympy.fraction(sympy.together(sides[0] / sides[1]))
    pieces = [num, den]
    if f_power:
        pieces += sympy.fraction(sympy.together(g))
    try:
        pieces = [_conjugates_paired(factored(p), h, q) for p in pieces]
    except sympy.PolynomialError:
        return None
    cancelling = []
    for piece in pieces:
        for base, _ in (t.as_base_exp() for t in Mul.make_args(piece)):
            if _linear_in(base, h) and sympy.Poly(base, h).all_coeffs()[1] != 0:
                if base not in cancelling and -base not in cancelling:
                    cancelling.append(base)
    if not cancelling or len(cancelling) > RADICAL_MAX_FACTORS:
        return None
    unfactored = sum(
        abs(k) * (sympy.degree(base, h) - 1)
        for piece in pieces
        for base, k in (t.as_base_exp() for t in Mul.make_args(piece))
        if base.has(h) and base.is_polynomial(h) and sympy.degree(base, h) > 1
    )
    root = sympy.sqrt(q)

    def conjugated(piece: sympy.Expr) -> sympy.Expr:
        out = []
        for base, k in (t.as_base_exp() for t in Mul.make_args(piece)):
            if _linear_in(base, h):
                c, b = sympy.Poly(base, h).all_coeffs()
                if b != 0:
                    conjugate = sympy.factor(sympy.expand(c**2 * q - b**2)) / (c * root - b)
                    base = sympy.Piecewise((conjugate, c * b < 0), (base, True))
            out.append(base.xreplace({h: root}) ** k)
        return Mul(*out)

    value = conjugated(pieces[0]) / conjugated(pieces[1])
    if f_power:
        value *= sympy.sqrt(conjugated(pieces[2]) / conjugated(pieces[3])) ** f_power
    # the calls back first: theirs may hold H (exp(H), log(H + x))
    value = value.xreplace(opaque).xreplace({h: root})
    if value.has(h, *opaque) or (f is not None and value.has(f)):
        return None
    return unfactored, prune_branches(value)


def _linear_in(base: sympy.Expr, h: sympy.Symbol) -> bool:
    """Whether ``base`` is c*H + b (c, b free of H)."""
    return base.has(h) and base.is_polynomial(h) and sympy.degree(base, h) == 1


def _conjugates_paired(piece: sympy.Expr, h: sympy.Symbol, q: sympy.Expr) -> sympy.Expr:
    """A product of factors with each pair (c*H + b)*(c*H - b) written as c**2*Q - b**2
    (H = sqrt(Q)): H**2 - x**2 is 4*p**2, not a difference to compute."""
    powers: dict[sympy.Expr, sympy.Expr] = {}
    for base, k in (t.as_base_exp() for t in Mul.make_args(piece)):
        powers[base] = powers.get(base, 0) + k
    for base in list(powers):
        if not _linear_in(base, h) or not powers.get(base):
            continue
        c, b = sympy.Poly(base, h).all_coeffs()
        for other, sign in ((sympy.expand(c * h - b), 1), (sympy.expand(b - c * h), -1)):
            k, m = powers.get(base, 0), powers.get(other, 0)
            if b == 0 or not k or not m or (k > 0) != (m > 0):
                continue
            both = min(k, m) if k > 0 else max(k, m)
            powers[base], powers[other] = k - both, m - both
            product = sign * sympy.factor(sympy.expand(c**2 * q - b**2))
            powers[product] = powers.get(product, 0) + both
    return Mul(*(b**k for b, k in powers.items() if k))


#: polynomial_tails: the largest total degree of a polynomial it rewrites
POLYNOMIAL_MAX_DEGREE = 12


@register("candidates")
def polynomial_tails(expr: sympy.Expr) -> sympy.Expr | None:
    """P(x, y) of degree n -> (((P_n(1, t)*x + P_(n-1)(1, t))*x + ...)*x + P_0 with t = y/x
    for |y| <= |x| (P_k its terms of degree k; x and y swapped otherwise), P_0 at x = y = 0:
    Horner's rule in the larger input. One input: Horner's rule in it.

    Past the overflow of its highest power a polynomial is inf - inf = NaN where its value
    is the infinity of its leading part: the Krovak projection's correction polynomial
    (degree 4 in Xr and Yr, coefficients down to 1e-24) is NaN at a third of the points of
    float64's range. Nested, each step multiplies by |x|, where |x| >= 1 growing towards
    the value: no step overflows before the value does (x**3*(...) would overflow in float32
    at x = 4e19 where 1.5e-23*x**3 does not), and past it the result is the infinity of the
    leading part; below, the terms are the formula's, with one rounding of y/x. A power
    of y common to every term multiplies each coefficient as it is, not as a power of y/x
    (see :func:`_horner_in_larger`). A factor free of the inputs (the upstream gradient)
    multiplies the result once. ``None`` where
    ``expr`` is not a polynomial in one input or two (and nothing else), or is a single
    term, or has degree below 2.
    """
    if expr.has(sympy.Piecewise) or expr.atoms(sympy.Function):
        return None
    symbols = sorted(expr.free_symbols, key=sympy.default_sort_key)
    groups = [*itertools.combinations(symbols, 2), *((s,) for s in symbols)]
    for group in groups:
        factor, rest = expr.as_independent(*group, as_Add=False)
        if rest.free_symbols != set(group) or not rest.is_polynomial(*group):
            continue
        terms = Add.make_args(sympy.expand(rest))
        parts: dict[int, sympy.Expr] = {}
        for term in terms:
            k = sympy.Poly(term, *group).total_degree()
            parts[k] = parts.get(k, 0) + term
        n = max(parts)
        if len(terms) < 2 or not 2 <= n <= POLYNOMIAL_MAX_DEGREE:
            continue
        if len(group) == 1:  # no ratio, no branch
            return factor * _horner(parts, n, *group, [])
        x, y = group
        # at 0 the ratio is 0/0: the constant term. Elsewhere no bare power of an input:
        # the code's common subexpressions would share x**2 with x**2/y**2 and undo the
        # scaling (so not the formula as written inside the unit square either)
        return sympy.Piecewise(
            (factor * parts.get(0, sympy.S.Zero), sympy.Eq(x, 0) & sympy.Eq(y, 0)),
            (factor * _horner_in_larger(terms, x, y), sympy.Abs(y) <= sympy.Abs(x)),
            (factor * _horner_in_larger(terms, y, x), True),
        )
    return None


def _horner_in_larger(terms: tuple[sympy.Expr, ...], big: sympy.Symbol, small: sympy.Symbol):
    """The polynomial with these terms by Horner's rule in ``big``, its coefficients
    polynomials in small/big, where |small| <= |big|. A power of ``small`` common to
    every term multiplies each coefficient as it is, never as (small/big)**j * big**j:
    where small/big underflows (|small| < 1e-308 |big|) that product is 0, and the
    derivative 4*b*(a**2 + b**2) + 8*b would be 0 at a = -5e144, b = 2e-290, where its
    value is 1.9."""
    j = min(sympy.degree(term, small) for term in terms)
    common = small**j
    parts: dict[int, sympy.Expr] = {}
    for term in terms:
        kept = sympy.expand(term / common)
        k = sympy.Poly(kept, big, small).total_degree()
        parts[k] = parts.get(k, 0) + kept
    return _horner(parts, max(parts), big, [small], common)


def _horner(
    parts: dict[int, sympy.Expr],
    n: int,
    big: sympy.Symbol,
    small: list,
    common: sympy.Expr = sympy.S.One,
) -> sympy.Expr:
    """Horner's rule in ``big`` for ``common`` times the polynomial whose terms of degree
    k are ``parts[k]``, each coefficient a polynomial in small/big times ``common``: for
    |big| >= 1 each step grows towards the value, so no step overflows before it does
    (x**3 * (...) overflows in float32 at x = 4e19 where 1.5e-23 times it does not);
    below 1 the steps shrink, and nothing overflows."""
    nested = sympy.S.Zero
    for k in range(n, -1, -1):
        at_one = _part_at_one(parts[k], big, small) if k in parts else sympy.S.Zero
        nested = nested * big + common * at_one
    return nested


def _part_at_one(part: sympy.Expr, big: sympy.Symbol, small: list) -> sympy.Expr:
    """A homogeneous polynomial of degree k in ``big`` (and ``small``), divided by big**k:
    a polynomial in small/big."""
    t = sympy.Dummy("t")
    k = sympy.Poly(part, big, *small).total_degree()
    at_one = sympy.expand(part.xreplace({s: t * big for s in small}) / big**k)
    return at_one.xreplace({t: small[0] / big}) if small else at_one


# The tails phase: on the chosen form, in this order.

_NONE: frozenset = frozenset()


@register("candidates")
def common_factor_out(expr: sympy.Expr) -> sympy.Expr | None:
    """a*b - a*c -> a*(b - c): the common factors of a sum's terms taken out front
    (Herbie's distribute-lft-out), so that a large factor multiplies once, after the
    cancellation: 1.7e308*t - 1.7e308 overflows at t = 1.01, 1.7e308*(t - 1) does not.
    ``None`` where no sum has a common factor."""
    factored = sympy.factor_terms(expr)
    if factored == expr:
        return None
    from symgrad.rewrite.rules import stabilize

    return stabilize(factored)


#: Largest sum of coefficients :func:`collected_terms` factors (SymPy's count_ops).
_COLLECT_MAX_OPS = 40


def _coefficient_and_rest(term: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """``term`` as (its factors that are rational in the inputs: numbers and integer
    powers of polynomials, upstream gradients among them; the rest: powers with an
    exponent that varies or is not an integer, calls)."""
    rational, rest = [], []
    for f in Mul.make_args(term):
        base, e = f.as_base_exp()
        if f.is_number or (e.is_Integer and base.is_polynomial(*base.free_symbols)):
            rational.append(f)
        else:
            rest.append(f)
    return Mul(*rational), Mul(*rest)


@register("candidates")
def collected_terms(expr: sympy.Expr) -> sympy.Expr | None:
    """a*T + b*T -> (a + b)*T: in each sum, the terms that share their transcendental
    factors T (calls, powers with an exponent that varies: one of those among them)
    collected, their rational coefficients over one denominator and factored (Herbie's
    distribute-lft-out, for a part of a sum). SymPy writes the second derivative of
    (x + 1)**(1/n) - x**(1/n) in x as four terms, (x + 1)**(1/n)/(n**2*(x + 1)**2) -
    (x + 1)**(1/n)/(n*(x + 1)**2) + ..., whose pairs are inf - inf where the power
    overflows (NaN where the value is inf); collected, each power is multiplied once by
    (1 - n)/n**2, as the power's own derivative a*(a - 1)*b**(a - 2) is. ``None`` where
    no two terms of a sum share such factors, or the coefficients are too large to factor
    (:data:`_COLLECT_MAX_OPS`). Only around a power whose exponent varies: collected
    around exponentials alone (the second derivative of pbrt's trimmed logistic sample in
    s), the choice took a form that overflows in float32 at 7 of 69 points the choice's
    own did not see."""

    found: dict[sympy.Basic, dict[sympy.Expr, list[sympy.Expr]]] = {}  # sum -> groups

    def splits(node: sympy.Basic) -> bool:
        if not isinstance(node, Add):
            return False
        shared: dict[sympy.Expr, list[sympy.Expr]] = {}
        for term in node.args:
            coefficient, rest = _coefficient_and_rest(term)
            shared.setdefault(rest, []).append(coefficient)
        if not any(
            len(cs) > 1 and any(varying_power(f) for f in Mul.make_args(rest))
            for rest, cs in shared.items()
        ):
            return False
        if any(sympy.count_ops(Add(*cs)) > _COLLECT_MAX_OPS for cs in shared.values()):
            return False
        found[node] = shared
        return True

    def collected(node: sympy.Expr) -> sympy.Expr:
        return Add(
            *(
                rest * (sympy.factor(sympy.together(Add(*cs))) if rest != 1 else Add(*cs))
                for rest, cs in found[node].items()
            )
        )

    new = expr.replace(splits, collected)
    if new == expr:
        return None
    from symgrad.rewrite.rules import stabilize

    return stabilize(new)


#: expanded_powers: the most operations the expanded form may have
EXPAND_MAX_OPS = 60


@register("candidates")
def expanded_powers(expr: sympy.Expr) -> sympy.Expr | None:
    """(x + e)**5 - x**5 -> e*(5*x**4 + 10*x**3*e + ... + e**4): integer powers of sums
    expanded, so that terms that cancel exactly cancel symbolically (Herbie's difference of
    powers), and the common factors taken out. At x = 1e8, e = 0.1 the two fifth powers
    agree in their first 40 bits. ``None`` where expanding changes nothing, or the
    expanded form is too large (:data:`EXPAND_MAX_OPS`)."""
    if not any(p.exp.is_Integer and p.exp > 1 and p.base.is_Add for p in expr.atoms(sympy.Pow)):
        return None
    expanded = sympy.factor_terms(sympy.expand(expr, power_exp=False, log=False))
    if expanded == expr or sympy.count_ops(expanded) > EXPAND_MAX_OPS:
        return None
    from symgrad.rewrite.rules import stabilize

    return stabilize(expanded)


@register("candidates")
def distributed_products(expr: sympy.Expr) -> sympy.Expr | None:
    """c*(a*b - 1) -> c*a*b - c: the factors of a product with one sum among them
    multiplied into each of its terms (Herbie's distribute-lft-in), upstream gradients left
    outside, where the factors are a polynomial (no quotient: kept outside, it guards the
    terms' size) and the sum has a term of degree 2 or more (a power or a product), where
    the term overflows before the factor outside brings it back:
    (2*Ci*(delta - 1)**2 - 1)*2*Ci is inf at Ci = 2.5e-110, delta = -4.4e257, where the
    value 4*(Ci*(delta - 1))**2 - 2*Ci is 4.7e296 (Herbie's d2PSI-dDelta2-over-PSI); the
    product's powers then share a power (:func:`~symgrad.functions.interleaved_product`).
    The inverse of :func:`common_factor_out`; ``None`` where no product has such a sum,
    or the result is too large (:data:`EXPAND_MAX_OPS`)."""

    def one_sum(node: sympy.Basic) -> sympy.Expr | None:
        sums = [f for f in node.args if isinstance(f, Add) and f.free_symbols]
        if len(sums) != 1:
            return None
        (s,) = sums
        return s if any(_factor_count(t) >= 2 for t in s.args) else None

    def splits(node: sympy.Basic) -> bool:
        s = one_sum(node) if isinstance(node, Mul) else None
        if s is None:
            return False
        rest = [f for f in node.args if f is not s and not upstream_gradient(f)]
        # a monomial (or a polynomial's power) outside: a quotient moved into each term
        # would make the terms longer products of powers, with partial products that
        # overflow where the sum's did not (r**2*dt**3/D**2 at r = 2e282, dt = 2e20)
        outside = Mul(*rest)
        return bool(outside.free_symbols) and outside.is_polynomial(*outside.free_symbols)

    def distributed(node: sympy.Expr) -> sympy.Expr:
        s = one_sum(node)
        grads = [f for f in node.args if upstream_gradient(f)]
        rest = Mul(*[f for f in node.args if f is not s and f not in grads])
        return Mul(*grads) * Add(*[rest * t for t in s.args])

    new = expr.replace(splits, distributed)
    if new == expr or sympy.count_ops(new) > EXPAND_MAX_OPS:
        return None
    from symgrad.rewrite.rules import stabilize

    return stabilize(new)


def _factor_count(term: sympy.Expr) -> int:
    """The factors of ``term`` with inputs in them, a power counted by its exponent (a
    positive integer one; x**2*y is 3)."""
    count = 0
    for f in Mul.make_args(term):
        _, e = f.as_base_exp()
        if f.free_symbols:
            count += int(e) if e.is_Integer and e > 0 else 1
    return count


def _root_tail(node: sympy.Basic) -> sympy.Basic | None:
    """c * prod p_i(x)**e_i, some p_i of even degree under a square root -> c * sign(x)**b *
    x**(a + b) * prod (p_i/x**deg p_i)**e_i for |x| >= 1 (x**a from the integer powers,
    |x|**b from the roots, sqrt(x**2) = |x|): rational_tail for square roots of polynomials.

    v/sqrt(v**2 - 19.6*H) is inf/inf = NaN once v**2 overflows (|v| > 1e154) where the
    value is sign(v)/sqrt(1 - 19.6*H/v**2). Factors that are no polynomial power in x
    are kept as they are; a root of odd degree in x (sqrt(x*y + 1)) has no |x| to take out.
    None where ``node`` is no such product."""
    factors = Mul.make_args(node)
    lone = isinstance(node, Pow) and node.exp.is_Rational and node.exp.q == 2
    if not lone and (not isinstance(node, Mul) or sum(1 for f in factors if not f.is_number) < 2):
        return None
    # (a lone root too: sqrt(x**2 + y) is inf from |x| = 1.3e154, |x|*sqrt(1 + y/x**2)
    # is not; the rules leave it, as it is no hypot)
    for x in sorted(node.free_symbols, key=lambda s: s.name):
        parts, integer_power, root_power, overflows = [], 0, sympy.S.Zero, False
        for f in factors:
            base, e = f.as_base_exp()
            if not (base.has(x) and base.is_polynomial(x) and e.is_Rational and e.q in (1, 2)):
                parts.append(f)
                continue
            d = int(sympy.degree(base, x))
            if e.q == 2 and d % 2:
                break
            parts.append(sympy.expand(base / x**d) ** e)
            if e.q == 2:
                root_power += d * e
                overflows = overflows or (d >= 2 and base.is_Add)
            else:
                integer_power += d * e
        else:
            if not overflows:
                continue
            # x**a * |x|**b = sign(x)**b * x**(a + b) (SymPy would write |x|**-3 as |x|/x**4)
            a, b = int(integer_power), int(root_power)
            scale = x ** (a + b) * (sympy.sign(x) if b % 2 else 1)
            return sympy.Piecewise((node, sympy.Abs(x) < 1), (scale * Mul(*parts), True))
    return None


@register("candidates")
def root_tails(expr: sympy.Expr) -> sympy.Expr | None:
    """c * prod p_i(x)**e_i -> a branch for |x| >= 1 with each p_i divided by x**deg p_i, for
    each outermost product in ``expr`` with a square root of a polynomial of even degree in
    x (:func:`_root_tail`): v/sqrt(v**2 - 19.6*H) -> sign(v)/sqrt(1 - 19.6*H/v**2) for
    |v| >= 1. A candidate, not a split: inside a sum the root's conjugate form may be the
    one that counts (1 - x/sqrt(x**2 - e) cancels for x >> e)."""

    def walk(node: sympy.Basic) -> sympy.Basic:
        if node.is_Atom or isinstance(node, sympy.Piecewise):
            return node
        tail = _root_tail(node)
        if tail is not None:
            return tail
        args = tuple(walk(a) for a in node.args)
        return node.func(*args) if args != node.args else node

    new = walk(expr)
    return None if new == expr else new


#: Largest sum :func:`factored_polynomials` factors (SymPy's count_ops).
_FACTOR_MAX_OPS = 30


@register("candidates")
def factored_polynomials(expr: sympy.Expr) -> sympy.Expr | None:
    """p(x, ...) -> its factors over the rationals, for each sum in ``expr`` that is a
    polynomial of degree 2 or more: 1 - e**2 -> (1 - e)*(1 + e) (Herbie's difference of
    squares). Near a root the factor 1 - e is exact, where 1 - e**2 keeps the rounding
    of e**2 (a relative 2**-53/|1 - e|); and a*(1 - e**2) overflows in e**2 at e = 1e160
    where a = 1e-200 keeps the product small. ``None`` where no sum factors."""

    def splits(node: sympy.Basic) -> bool:
        return (
            isinstance(node, Add)
            and bool(node.free_symbols)
            and node.is_polynomial(*node.free_symbols)
            and sympy.Poly(node, *node.free_symbols).total_degree() >= 2
            and sympy.count_ops(node) <= _FACTOR_MAX_OPS
        )

    def factored(node: sympy.Expr) -> sympy.Expr:
        f = sympy.factor(node)
        return f if sum(1 for m in Mul.make_args(f) if not m.is_number) >= 2 else node

    new = expr.replace(splits, factored)
    return None if new == expr else new


def _no_integer(e: sympy.Expr) -> bool:
    """``e`` is not an integer constant (a symbol, or a non-integer number)."""
    return not (e.is_number and e.is_integer)


def _minus_one(base: sympy.Expr) -> sympy.Expr | None:
    """``base - 1`` as one fraction where its numerator and denominator cancel terms:
    (1 + e*s)/(1 - e*s) - 1 = 2*e*s/(1 - e*s), x/(x + 1) - 1 = -1/(x + 1). None where
    nothing cancels (x/y - 1)."""
    num, den = sympy.fraction(sympy.together(base))
    if den == 1:
        return None
    num, den = sympy.expand(num), sympy.expand(den)
    difference = sympy.expand(num - den)

    def monomials(e: sympy.Expr) -> set[sympy.Expr]:
        return {t.as_coeff_Mul()[1] for t in Add.make_args(e)}

    if not (monomials(num) | monomials(den)) - monomials(difference):
        return None  # no term cancelled: -x - (x + 1) = -2*x - 1 only adds
    return difference / den


@register("candidates")
def power_through_log1p(expr: sympy.Expr) -> sympy.Expr | None:
    """b**v -> exp(v*log1p(b - 1)) for an exponent v that is not an integer constant, with
    b - 1 written without cancellation, where b > 0 (the formula as written elsewhere):

    - b = c + u, c a number > 0: exp(v*log(c) + v*log1p(u/c)), the compound-interest form,
      (1 + i/n)**n - 1 = expm1(n*log1p(i/n)) (Herbie's pow-to-exp with log1p), where
      1 + i/n rounds i/n away and the power overflows long before the result does;
    - b a fraction whose numerator and denominator cancel a term in b - 1
      (:func:`_minus_one`): exp(v*log1p(b - 1)), and cospi(v)*exp(v*log1p(-b - 1)) where
      b < 0, v is an integer and -b - 1 cancels too (cospi(v) is (-1)**v there, and its
      derivative 0). ((1 + e*s)/(1 - e*s))**(e/2) (PROJ's pj_tsfn) rounds to 1**v or
      (-1)**v where e*s is past 2**53 and v is huge: the value is exp(v*2/(e*s)).

    Floats past 2**53 are all integers, so a negative base has a power there; pow's
    relative error is v times the base's, all of it where v is past 2**53. ``None`` where
    no such power appears."""

    conditions = []

    def times_log1p(e: sympy.Expr, w: sympy.Expr) -> sympy.Expr:
        # v*log1p(w) as xlog1py: 0 where v = 0, also where w is inf (i/n at n = 0)
        return xlog1py(e, w) if e.free_symbols else e * log1p(w)

    def through(node: sympy.Expr) -> sympy.Expr:
        base, e = node.args
        c, u = base.as_coeff_Add()
        if c.is_number and c.is_positive and u.free_symbols:
            conditions.append(u / c > -1)
            return exp(e * log(c) + times_log1p(e, u / c))
        above = _minus_one(base)
        if above is None:
            return node
        below = None if e.is_number else _minus_one(-base)
        positive = exp(times_log1p(e, above))
        if below is None:
            conditions.append(above > -1)
            return positive
        # (-1)**v as cospi(v): exactly +-1 at an integer (its derivative, 0 there, too)
        negative = cospi(e) * exp(times_log1p(e, below))
        integer = sympy.Eq(nearest_integer(e), e)
        return sympy.Piecewise(
            (positive, above > -1), (negative, (below > -1) & integer), (node, True)
        )

    rewritten = expr.replace(
        lambda n: isinstance(n, Pow) and n.args[0].free_symbols and _no_integer(n.args[1]),
        through,
    )
    if rewritten == expr:
        return None
    from symgrad.rewrite.rules import stabilize

    # where a base is not positive the power is defined only for integer v (floats past
    # 2**53 are all integers): the formula as written there
    return sympy.Piecewise((stabilize(rewritten), sympy.And(*conditions)), (expr, True))


@register("candidates")
def sqrt_of_product(expr: sympy.Expr) -> sympy.Expr | None:
    """sqrt(a*b) -> sqrt(|a|)*sqrt(|b|): equal wherever the square root is defined
    (a*b >= 0), and a*b overflows (or underflows) where the result does not:
    sqrt(mu*p) at mu = p = 1e200. ``None`` where no square root has a product of two
    factors that are not numbers."""

    def split(node: sympy.Expr) -> sympy.Expr:
        factors = [f for f in Mul.make_args(node.args[0]) if not f.is_number]
        if len(factors) < 2:
            return node
        number = sympy.Mul(*(f for f in Mul.make_args(node.args[0]) if f.is_number))
        parts = [sympy.sqrt(f if f.is_nonnegative else sympy.Abs(f)) for f in factors]
        return sympy.sqrt(abs(number)) * sympy.Mul(*parts)

    rewritten = expr.replace(
        lambda n: isinstance(n, Pow) and n.args[1] == sympy.S.Half and n.args[0].is_Mul, split
    )
    return None if rewritten == expr else rewritten


#: Largest formula (SymPy's count_ops) :func:`half_angles` cancels.
_HALF_ANGLE_MAX_OPS = 80


@register("candidates")
def half_angles(expr: sympy.Expr) -> sympy.Expr | None:
    """sin(2h), cos(2h), tan(2h) -> 2*s*c, c**2 - s**2, 2*s*c/(c**2 - s**2) with s =
    sin(h), c = cos(h), where ``expr`` has sin(h) or cos(h) too (what 1 - cos(u) ->
    2*sin(u/2)**2 leaves), and the formula cancelled as a rational function of s and c.

    Terms in both angles can cancel where neither does alone: the second derivative of
    (1 - cos(x))/sin(x), -4*s**2*cos(x)/sin(x)**3 + 2*s*c/sin(x)**2 (s = sin(x/2)), is
    1/d - 1/d at x = 2*pi*k + d (32 bits lost at x = 710); in s and c it is s/(2*c**3).
    ``None`` where no angle appears with its double, or nothing cancels."""
    ops = sympy.count_ops(expr)
    if expr.has(sympy.Piecewise) or ops > _HALF_ANGLE_MAX_OPS:
        return None
    trig = (sympy.sin, sympy.cos, sympy.tan)
    angles = {f.args[0] for f in expr.atoms(*trig)}
    for h in sorted(angles, key=sympy.default_sort_key):
        double = sympy.expand(2 * h)
        if double not in angles:
            continue
        s, c = sympy.Dummy("s"), sympy.Dummy("c")
        written = expr.xreplace(
            {
                sympy.sin(double): 2 * s * c,
                sympy.cos(double): c**2 - s**2,
                sympy.tan(double): 2 * s * c / (c**2 - s**2),
                sympy.sin(h): s,
                sympy.cos(h): c,
                sympy.tan(h): s / c,
            }
        )
        if written.has(*trig) and any(f.args[0] in (h, double) for f in written.atoms(*trig)):
            continue  # a call the substitution missed (sin(-h))
        cancelled = sympy.factor(sympy.cancel(sympy.together(written)))
        new = cancelled.xreplace({s: sympy.sin(h), c: sympy.cos(h)})
        if sympy.count_ops(new) < ops:
            return new
    return None


#: :func:`_log_through_log1p` writes log(a/b) through log1p while a/b and b/a are below this; past
#: it the formula as written has no cancellation to lose (log(a/b) >= 44) and a/b may
#: overflow (1/N for N below 2.9e-39 in float32).
_LOG_RATIO_MAX = sympy.Integer(2) ** 64


def _log_through_log1p(
    a: sympy.Expr, b: sympy.Expr, c: sympy.Expr, written: sympy.Expr, positive: bool = False
) -> sympy.Expr:
    """c*log(a/b) through log1p of a ratio that is never below 0: c*log1p((a - b)/b) where
    a/b >= 1, -c*log1p((b - a)/a) where a/b < 1, the formula ``written`` where either is
    past :data:`_LOG_RATIO_MAX`. a - b is expanded where that cancels terms ((N + 1) - N
    = 1); the products are xlog1py where c has an input in it (0 where c = 0, as
    N*log(N) is at N = 0). Equal to c*log(a/b) wherever a/b > 0, whatever the signs of a
    and b; where a/b < 0 both ratios are below -1: ``written``. ``positive``: only where
    a > 0 and b > 0 (``written`` elsewhere), the branches taken by the sign of a - b
    (which SymPy decides where it is a number: (N + 1) - N), the guard without the
    condition the other implies (N > 0 makes N + 1 > 0)."""

    def difference(p: sympy.Expr, q: sympy.Expr) -> sympy.Expr:
        expanded = sympy.expand(p - q)
        return expanded if sympy.count_ops(expanded) <= sympy.count_ops(p - q) else p - q

    def times_log1p(w: sympy.Expr) -> sympy.Expr:
        return xlog1py(c, w) if c.free_symbols else c * log1p(w)

    rise = difference(a, b)
    up, down = rise / b, difference(b, a) / a
    if positive:
        guard = sympy.And(
            *(
                p > 0
                for p, other in ((a, b), (b, a))
                if not p.is_positive and not (p - other).is_nonnegative
            )
        )
        # (a - b >= 0, not a >= b: SymPy 1.14's Piecewise recurses without end on some of
        # those, sigmoid(pi/s) - u*tanh(pi/(2*s)) >= u*tanh(pi/(2*s)) + sigmoid(-pi/s))
        rising, falling = guard & (rise >= 0), guard & (rise < 0)
    else:
        rising, falling = up >= 0, down >= 0
    return sympy.Piecewise(
        (times_log1p(up), rising & (up < _LOG_RATIO_MAX)),
        (-times_log1p(down), falling & (down < _LOG_RATIO_MAX)),
        (written, True),
    )


def _log_ratios(expr: sympy.Expr, keep_first: bool) -> tuple[sympy.Expr | None, bool]:
    """:func:`log_ratios`, and whether it has a pair whose coefficients do not cancel;
    ``keep_first``: of such a pair c1*log(a) + c2*log(b), (c1 + c2)*log(a) is kept (else
    (c1 + c2)*log(b))."""
    from symgrad.rewrite.rules import _drop, stabilize

    uneven = []  # the pairs whose coefficients do not cancel

    def quotient(node: sympy.Expr) -> sympy.Expr:
        num, den = sympy.fraction(node.args[0])
        return node if den.is_number else _log_through_log1p(num, den, sympy.S.One, node)

    def logs(node: Add) -> list[tuple[sympy.Expr, sympy.Expr, sympy.Expr]]:
        """(term, c, a) for each term of ``node`` that is c*log(a): log1p(u) is log(1 + u),
        xlogy(w, a) w*log(a), xlog1py(w, u) w*log(1 + u)."""
        out = []
        for term in node.args:
            c, f = term.as_independent(log, log1p, xlogy, xlog1py, as_Add=False)
            if isinstance(f, (xlogy, xlog1py)):
                c, f = c * f.args[0], f.func(1, f.args[1])
            if isinstance(f, (log, xlogy)) and f.args[-1].free_symbols:
                out.append((term, c, f.args[-1]))
            elif isinstance(f, (log1p, xlog1py)) and f.args[-1].free_symbols:
                out.append((term, c, 1 + f.args[-1]))
        return out

    def pair(node: sympy.Expr) -> sympy.Expr:
        terms = logs(node)
        for (t1, c1, a), (t2, c2, b) in itertools.permutations(terms, 2):
            k = sympy.nsimplify(sympy.expand(c1 + c2))
            if not k.is_number or sympy.default_sort_key(a) > sympy.default_sort_key(b):
                continue  # (each pair once: a before b)
            if k != 0:
                uneven.append(node)
                if not keep_first:
                    (t1, c1, a), (t2, c2, b) = (t2, c2, b), (t1, c1, a)
            # c1*log(a) + c2*log(b) = k*log(a) - c2*log(a/b); log(a) - log(b) is
            # log(a/b) only where both are positive: the formula as written elsewhere
            ratio = _log_through_log1p(a, b, -c2, t1 + t2 - k * log(a), positive=True)
            return k * log(a) + ratio + _drop(node, t1, t2)
        return node

    # log(Piecewise((p/q, c), ...)) (tan(pi/4 + x/2) by its sign) as a log per branch
    folded = piecewise_folded(expr)
    new = folded.replace(lambda n: isinstance(n, log) and n.args[0].is_Mul, quotient)
    new = new.replace(lambda n: isinstance(n, Add) and len(logs(n)) >= 2, pair)
    return (None if new == folded else stabilize(new)), bool(uneven)


@register("candidates")
def log_ratios(expr: sympy.Expr) -> sympy.Expr | None:
    """log(a/b) -> log1p((a - b)/b) where a/b >= 1, -log1p((b - a)/a) where not; also
    c*log(a) - c*log(b) (where a, b > 0; the formula as written elsewhere), and c1*log(a) +
    c2*log(b) with c1 + c2 = k a number as k*log(a) - c2*log(a/b) (Herbie's log-div and
    diff-log, with log1p; the log counterpart of atan(a) - atan(b) ->
    atan2(a - b, 1 + a*b)).

    The logarithm of a number near 1 keeps its rounding, not its digits:
    log(N + 1) - log(N) keeps none at N = 1e16, log1p(1/N) all; log((1 + sin(x))/cos(x))
    keeps none at x = 1e-17 (the Mercator projection's y), log1p((sin(x) + 2*sin(x/2)**2)/cos(x))
    all. The argument of log1p is never below 0, so never near -1 where it would cancel
    in turn. (N + 1)*log(N + 1) - N*log(N) is log(N + 1) + N*log1p(1/N) (Hamming's
    NMSE 3.8). The regimes rule :func:`log_ratio` splits log(a/b) where a and b share a
    term that cancels in a - b; this form needs none, and has no log(a/b) of a rounded
    quotient near 1 between its branches. ``None`` where no logarithm has a quotient and no
    two logarithms pair."""
    return _log_ratios(expr, keep_first=True)[0]


@register("candidates")
def log_ratios_kept_second(expr: sympy.Expr) -> sympy.Expr | None:
    """c1*log(a) + c2*log(b) -> k*log(b) + c1*log(a/b) (c1 + c2 = k a number, k != 0):
    :func:`log_ratios` with the other logarithm kept, a candidate beside it (which of the
    two cancels depends on the coefficients' signs). ``None`` where there is no such pair
    (the form would be :func:`log_ratios`'s)."""
    other, uneven = _log_ratios(expr, keep_first=False)
    return other if uneven else None


@register("candidates")
def exp_powers_factored(expr: sympy.Expr) -> sympy.Expr | None:
    """c*prod(p_i(exp(b))**k_i) -> c*exp(D*b)*prod(q_i(t)**k_i) with t = exp(-b) for b >= 0,
    c*prod(p_i(exp(b))**k_i) for b < 0: a product of powers of polynomials p_i in one
    exponential, some powers not integers (the rational functions are
    :func:`exp_rational`'s), each p_i(u) = u**d_i*q_i(1/u) (q_i its reversed
    polynomial), D = sum(d_i*k_i). A radicand is cancelled first.

    exp(b) overflows past b = 709.8 (88.7 in float32) where the power does not:
    sqrt(exp(x) + 1) is inf from x = 710 where its value is exp(355); its second
    derivative, (exp(x) + 2)*exp(x)/(4*(exp(x) + 1)**(3/2)), is inf/inf from x = 355.
    As exp(x/2)*(1 + 2*t)/(4*(1 + t)**(3/2)) nothing overflows before the value.
    ``None`` where ``expr`` is not such a product, or has no power that is not an
    integer."""
    if expr.has(sympy.Piecewise):
        return None
    one = _one_exponential(expr)
    if one is None:
        return None
    factor, rest, base, powers, u = one
    in_u = rest.xreplace(powers).replace(
        lambda e: isinstance(e, Pow) and not e.exp.is_integer,
        lambda e: sympy.cancel(e.base) ** e.exp,
    )
    product = sympy.factor(sympy.together(in_u))
    t = sympy.Dummy("t", positive=True)
    large, small, degree, fractional = sympy.S.One, sympy.S.One, sympy.S.Zero, False
    for f in Mul.make_args(product):
        p, k = f.as_base_exp()
        if not p.has(u):
            large, small = large * f, small * f
            continue
        if not k.is_Rational:
            return None
        try:
            poly = sympy.Poly(p, u)
        except sympy.PolynomialError:
            return None
        if any(c.has(u, exp, log) for c in poly.coeffs()):
            return None
        fractional = fractional or not k.is_integer
        d = poly.degree()
        degree += d * k
        reversed_ = sympy.Poly(list(reversed(poly.all_coeffs())), t).as_expr()
        large *= reversed_**k
        small *= p.xreplace({u: t}) ** k
    if not fractional:
        return None
    from symgrad.rewrite.rules import stabilize

    beyond = factor * exp(degree * base) * large.xreplace({t: exp(-base)})
    below = factor * small.xreplace({t: exp(base)})
    return stabilize(sympy.Piecewise((beyond, base >= 0), (below, True)))


#: Largest formula (SymPy's count_ops) :func:`cancelled_arguments` cancels in.
_CANCEL_MAX_OPS = 80


@register("candidates")
def cancelled_arguments(expr: sympy.Expr) -> sympy.Expr | None:
    """f(p/q) -> f(r) where p and q share a factor, r = p/q cancelled: each function's
    argument and each root's radicand as a rational function of its generators (exp(2*x)
    is exp(x)**2, the stable functions in their naive forms), then the rules again.

    SymPy's simplify cancels a quotient, but not one inside a square root or a call:
    sqrt((exp(2*x) - 1)/(exp(x) - 1)) is sqrt(exp(x) + 1), and as written its two
    expm1's keep their roundings in the ratio near x = 0 (and their derivatives, terms of
    order 1/x that cancel); cancelled, neither the value nor its derivatives cancel (and
    the removable 0/0 at x = 0 is gone). ``None`` where no argument cancels, or the
    formula is too large (:data:`_CANCEL_MAX_OPS`)."""
    if sympy.count_ops(expr) > _CANCEL_MAX_OPS:
        return None

    def cancelled(arg: sympy.Expr) -> sympy.Expr | None:
        naive = arg.rewrite("naive")
        num, den = sympy.fraction(sympy.together(naive))
        if den.is_number or not num.free_symbols:
            return None
        try:
            common = sympy.gcd(num, den)
        except (sympy.PolynomialError, sympy.GeneratorsNeeded):
            return None
        return sympy.cancel(naive) if common.free_symbols else None

    def takes(node: sympy.Basic) -> bool:
        if isinstance(node, Pow):
            return not node.exp.is_integer and node.base.free_symbols
        return (
            isinstance(node, sympy.Function)
            and len(node.args) == 1
            and not isinstance(node, sympy.Abs)
            and node.args[0].free_symbols
        )

    def rewritten(node: sympy.Expr) -> sympy.Expr:
        arg = node.base if isinstance(node, Pow) else node.args[0]
        new = cancelled(arg)
        if new is None:
            return node
        return Pow(new, node.exp) if isinstance(node, Pow) else node.func(new)

    new = expr.replace(takes, rewritten)
    if new == expr:
        return None
    from symgrad.rewrite.rules import stabilize

    return stabilize(new)


@register("candidates")
def number_factor_apart(expr: sympy.Expr) -> sympy.Expr | None:
    """(c*u)**e -> c**e*u**e and log(c*u) -> log(c) + log(u) for a number c > 0 (not 1)
    and an exponent that is not a number (Herbie's unpow-prod-down and log-prod), where
    |u| >= 1 for c > 1 (|u| <= 1 for c < 1): c*u overflows before the power or the
    logarithm brings it back. Migdal et al.'s equation (51), (2*pi*n)**((1 - k)/2)/sqrt(k),
    is inf at n = 1e308, k = 1/2, where the value is 2.6e77, and its derivative in k has
    log(2*pi*n). Where u is on the other side of 1, c**e and u**e grow against each
    other (inf*0 at n = 0.5, k = 1e4) and log(c) + log(u) cancels near c*u = 1: as
    written there. One condition for the whole formula where all its parts have the same
    u (else one each). A candidate beside the formula (one power and one rounding more):
    the choice measures both. ``None`` where there is no such power or logarithm."""

    def parts(node: sympy.Basic) -> tuple[sympy.Expr, sympy.Expr] | None:
        """(c, u) of a power (c*u)**e with an exponent that is not a number, or of
        log(c*u); else None."""
        if isinstance(node, Pow) and not node.exp.is_number:
            base = node.base
        elif isinstance(node, log):
            base = node.args[0]
        else:
            return None
        if not isinstance(base, Mul):
            return None
        c, u = base.as_independent(*base.free_symbols, as_Add=False)
        return (c, u) if c.is_positive and c != 1 and u.free_symbols else None

    def takes(node: sympy.Basic) -> bool:
        return parts(node) is not None

    def same_side(node: sympy.Expr) -> sympy.Boolean:
        c, u = parts(node)
        return sympy.Abs(u) >= 1 if c > 1 else sympy.Abs(u) <= 1

    def apart(node: sympy.Expr) -> sympy.Expr:
        c, u = parts(node)
        if isinstance(node, Pow):
            return Mul(Pow(c, node.exp), Pow(u, node.exp), evaluate=False)
        return Add(log(c), log(u), evaluate=False)

    nodes = [n for n in sympy.preorder_traversal(expr) if takes(n)]
    if not nodes:
        return None
    sides = {same_side(n) for n in nodes}
    if len(sides) == 1:
        (side,) = sides
        return sympy.Piecewise((expr.replace(takes, apart), side), (expr, True))
    return expr.replace(takes, lambda n: sympy.Piecewise((apart(n), same_side(n)), (n, True)))


def _monic(base: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr] | None:
    """(c, m) with base = c*m, c a positive number and m a sum whose first term's
    coefficient is 1 (9*a - 3 is 9*(a - 1/3)); None where base is no such sum."""
    if not isinstance(base, Add) or not base.free_symbols:
        return None
    lead = base.as_ordered_terms()[0].as_coeff_Mul()[0]
    if not (lead.is_Rational and lead.is_positive):
        return None
    return lead, sympy.expand(base / lead)


@register("candidates")
def common_bases_merged(expr: sympy.Expr) -> sympy.Expr | None:
    """(c*u)**q -> c**q * u**q for a number c > 0, where the formula has powers of two
    sums that are positive multiples of one another (u and c*u): over one base, SymPy
    merges the powers in each product and collects the terms that differ by a number
    (Herbie's pow-prod-down, after factoring the number out; SymPy writes 9*(a - 1/3) as
    9*a - 3). The gradient of Marsaglia and Tsang's (a - 1/3)*(1 + r/sqrt(9*(a - 1/3)))
    in r is (a - 1/3)/sqrt(9*a - 3), 0 at a = 1e308 (9*a is inf) where the value is
    sqrt(a - 1/3)/3 = 3.3e153; merged, it is that, one square root and no division; its
    derivative in a, 1/sqrt(9*a - 3) - 9*(a - 1/3)/(2*(9*a - 3)**(3/2)), is
    1/(6*sqrt(a - 1/3)). Equal wherever both are defined (the powers of c > 0 split off
    exactly; SymPy merges u**p*u**q only where that holds). ``None`` where the formula
    has no two such sums."""
    bases = {
        f.as_base_exp()[0]
        for n in sympy.preorder_traversal(expr)
        if isinstance(n, Mul)
        for f in n.args
    }
    bases |= {n.base for n in sympy.preorder_traversal(expr) if isinstance(n, Pow)}
    monic = {b: m for b in bases if (m := _monic(b)) is not None}
    by_sum: dict[sympy.Expr, set[sympy.Expr]] = {}
    for b, (_, m) in monic.items():
        by_sum.setdefault(m, set()).add(b)
    targets = {b: monic[b] for group in by_sum.values() if len(group) > 1 for b in group}
    if not targets:
        return None

    def rebased(node: sympy.Expr) -> sympy.Expr:
        if isinstance(node, Pow):
            c, m = targets[node.base]
            return Mul(Pow(c, node.exp), Pow(m, node.exp))
        return Mul(*(Mul(*targets[f], evaluate=False) if f in targets else f for f in node.args))

    def takes(node: sympy.Basic) -> bool:
        if isinstance(node, Pow):
            return node.base in targets
        return isinstance(node, Mul) and any(f in targets for f in node.args)

    new = expr.replace(takes, rebased)
    if new == expr:
        return None
    from symgrad.rewrite.rules import stabilize

    return stabilize(new)


def _holds_fraction(node: sympy.Expr) -> bool:
    """Whether a term of the sum ``node`` divides by something (``1 - y/x``)."""
    return any(
        isinstance(f, Pow) and f.exp.is_negative and f.base.free_symbols
        for term in Add.make_args(node)
        for f in Mul.make_args(term)
    )


@register("candidates")
def nested_fractions_cancelled(expr: sympy.Expr) -> sympy.Expr | None:
    """y/(x*(1 - y/x)) -> y/(x - y): each product's rational factors over a sum that
    holds a fraction of its own, cancelled to one fraction of polynomials, term by term
    (a sum's other terms, log1p(-y/x) beside it, kept as they are). The derivative of
    x*log(1 - y/x) in x has that term, which the code computes as t/(1 - t) with t = y/x:
    inf/inf where y/x overflows (x = 0.5, y = -1e308), where y/(x - y) is -1. Equal
    wherever both are defined. ``None`` where no product has such a denominator."""

    def nested(factor: sympy.Expr) -> bool:
        return (
            isinstance(factor, Pow)
            and factor.exp.is_negative
            and isinstance(factor.base, Add)
            and _holds_fraction(factor.base)
        )

    def takes(node: sympy.Basic) -> bool:
        return isinstance(node, Mul) and any(
            nested(f) and f.is_rational_function() for f in node.args
        )

    def cancelled(node: Mul) -> sympy.Expr:
        rational = [f for f in node.args if f.is_rational_function()]
        rest = [f for f in node.args if not f.is_rational_function()]
        return Mul(sympy.factor(Mul(*rational)), *rest)

    new = expr.replace(takes, cancelled)
    return None if new == expr else new


@register("candidates")
def log_arguments_together(expr: sympy.Expr) -> sympy.Expr | None:
    """log(1 - (x - y)/(1 - y)) -> log((x - 1)/(y - 1)), log1p(u) as log(1 + u) so: the
    argument of each logarithm, a sum with a fraction, as one fraction (factored), then
    split as :func:`log_ratio` splits a logarithm of a quotient. The inverse incomplete
    gamma's guess (the tuning half of draw 2) is 1 - log1p((x - y)/(y - 1)), whose
    argument rounds to -1 at y = -2.2e30 (inf; the value is 71); (x - 1)/(y - 1) is 4.5e-31
    there. Equal wherever both are defined. ``None`` where no logarithm has such an
    argument."""

    def argument(node: sympy.Basic) -> sympy.Expr | None:
        if isinstance(node, log):
            arg = node.args[0]
        elif isinstance(node, log1p):
            arg = 1 + node.args[0]
        else:
            return None
        if isinstance(arg, Add) and _holds_fraction(arg) and arg.is_rational_function():
            return arg
        return None

    def together(node: sympy.Expr) -> sympy.Expr:
        whole = log(sympy.factor(sympy.together(argument(node))))
        split = log_ratio(whole, frozenset(), frozenset())
        return whole if split is None else split

    new = expr.replace(lambda node: argument(node) is not None, together)
    return None if new == expr else new


@register("candidates")
def root_as_variable(expr: sympy.Expr) -> sympy.Expr | None:
    """R(x, sqrt(x)) -> R(t**2, t) split by input range, t = sqrt(x) put back: a rational
    function of an input and its square root is one of t, whose powers
    :func:`rational_tail` divides out where t is large. The approximate log of
    Data.Approximate (draw 2's tuning half), 6*(x - 1)/(x + 1 + 4*sqrt(x)), is inf/1e308
    at x = 1e308, where its value is 6; in t, 6*(1 - 1/t**2)/(1 + 1/t**2 + 4/t) past t =
    1. Equal wherever both are defined (x >= 0, where sqrt(x) is). ``None`` where no
    input's square root is in a rational function of it, or splitting changes nothing."""
    roots = {p.base for p in expr.atoms(Pow) if p.base.is_Symbol and p.exp == sympy.S.Half}
    for x in sorted(roots, key=sympy.default_sort_key):
        t = sympy.Dummy("t", positive=True)
        in_t = expr.subs(x, t**2)
        if in_t.has(x) or not in_t.is_rational_function(t):
            continue
        split = split_regimes(in_t)
        if split != in_t:
            return split.subs(t, sympy.sqrt(x))
    return None


def _bottom_up(
    expr: sympy.Basic, rewrite: Callable[[sympy.Basic], sympy.Basic | None]
) -> sympy.Basic:
    """``rewrite`` on every node of ``expr``, arguments first (conditions left alone), a
    node kept where it gives None: the walk of the tail passes."""

    def visit(node: sympy.Basic) -> sympy.Basic:
        if node.is_Atom or not node.args or isinstance(node, sympy.logic.boolalg.Boolean):
            return node
        args = tuple(visit(a) for a in node.args)
        node = node.func(*args) if args != node.args else node
        return rewrite(node) or node

    return visit(expr)


def _overflow_shifted(node: sympy.Basic) -> sympy.Basic | None:
    """:func:`exp_bounded_product` of one product, or None.

    exp(w) * f -> exp(w - 64) * (f * e**64) where exp(w) overflows, for a product f with
    a factor bounded by 1 (sin, cos, tanh, erf, sigmoid): there the product can be finite
    although exp(w) is not; cosh(w) * f and sinh(w) * f the same way, as exp(|w|)/2 (and
    sign(w)) past their overflow. exp(re)*sin(im) (the imaginary part of the complex exp)
    is 1.07e308 at re = 710, im = 0.5, inf as written; shifted, exp(646) * (sin(0.5) *
    6.2e27). Past the overflow only (the condition compares the function with the largest
    float64, which in float32 is inf: either dtype's overflow), so no rounding is added
    where it is finite; past it, w - 64 is exact and e**64 one more rounding.
    """
    if not isinstance(node, Mul) or not node.free_symbols:
        return None
    grows = [f for f in node.args if isinstance(f, (exp, sympy.sinh, sympy.cosh))]
    if len(grows) != 1:
        return None
    (g,) = grows
    w = g.args[0]
    others = Mul(*(f for f in node.args if f is not g))
    if not any(bounded_by_one(f) for f in Mul.make_args(others)):
        return None
    if isinstance(g, exp):
        if known_nonpositive(w):
            return None
        shifted = exp(w - EXP_SHIFT) * (others * sympy.Float(math.exp(EXP_SHIFT), 17))
    else:
        half = sympy.Float(math.exp(EXP_SHIFT) / 2, 17)
        shifted = exp(sympy.Abs(w) - EXP_SHIFT) * (others * half)
        if isinstance(g, sympy.sinh):
            shifted *= sympy.sign(w)
    return sympy.Piecewise(
        (node, sympy.Abs(g) < sympy.Float(FLOAT_MAX["float64"])), (shifted, True)
    )


@register("tails")
def exp_bounded_product(expr: sympy.Expr) -> sympy.Expr:
    """exp(w) * f -> Piecewise((exp(w) * f, exp(w) finite), (exp(w - 64) * (f * e**64),
    True)) for a product f with a factor bounded by 1 (cosh and sinh as exp(|w|)/2),
    wherever it is in the chosen form, whatever the choice said (its points seldom fall
    where exp overflows and such a factor is small: float32's sinh(110.7) * sin(-2.3e-14)
    is 1.4e34, inf as written, in the complex sine's imaginary part). It costs an exp and
    a select, and changes no value where exp(w) is finite. See :func:`_overflow_shifted`.
    """
    if not expr.has(exp, sympy.sinh, sympy.cosh):
        return expr
    return _bottom_up(expr, _overflow_shifted)


def _log_apart(node: sympy.Basic) -> sympy.Basic | None:
    """:func:`log_growing_product` of one log, or None.

    log(g * r) -> log(r) + w where g = exp(w) overflows, |w| - log(2) + log(sign(w) * r)
    for g = sinh(w) (log(r) + |w| - log(2) for cosh): past the overflow, where e**-2|w| is
    below 1e-616 (1e-77 in float32) beside 1, sinh and cosh are exp(|w|)/2 to the last
    bit. log(sinh(x)/x) (Herbie's bug500 discussion) is inf from |x| = 1420 on (178 in
    float32, where the printed sinh overflows), where its value is |x| - log(2|x|). The
    condition compares g with the largest float64 (inf in float32), so nothing changes
    where g is finite, the series and the cancellation near 0 included.
    """
    from symgrad.rewrite.rules import stabilize

    if not isinstance(node, log):
        return None
    arg = node.args[0]
    factors = Mul.make_args(arg)
    grows = [f for f in factors if isinstance(f, (exp, sympy.sinh, sympy.cosh))]
    if len(grows) != 1 or not arg.free_symbols:
        return None
    (g,) = grows
    w = g.args[0]
    rest = Mul(*(f for f in factors if f is not g))
    if isinstance(g, exp) and known_nonpositive(w):
        return None
    # sinh's sign as w/|w| (|w| > 700 here): sign(x)/x is 1/|x|
    sign = w / sympy.Abs(w) if isinstance(g, sympy.sinh) else sympy.S.One
    # the rest's log as any log is made stable (1/(1 + x**2) overflows before its log)
    rest_log = split_regimes(stabilize(log(sign * rest)))
    if isinstance(g, exp):
        apart = w + rest_log
    else:
        apart = sympy.Abs(w) - log(2) + rest_log
    return sympy.Piecewise((node, sympy.Abs(g) < sympy.Float(FLOAT_MAX["float64"])), (apart, True))


@register("tails")
def log_growing_product(expr: sympy.Expr) -> sympy.Expr:
    """log(exp(w) * r) -> Piecewise((log(exp(w) * r), exp(w) finite), (w + log(r), True)),
    sinh and cosh as exp(|w|)/2 (the sign of sinh into r), wherever it is in the chosen
    form: the log of a product is finite long after the growing factor overflows (Herbie's
    log-prod, applied past the overflow only; log(cosh(a)) alone is ``logcosh``). It
    costs a log and a select, and changes no value where the factor is finite. See
    :func:`_log_apart`.
    """
    if not expr.has(log):
        return expr
    return _bottom_up(expr, _log_apart)


@register("tails")
def guard_tails(expr: sympy.Expr) -> sympy.Expr:
    """q(x) * sigmoid(p(x)) -> Piecewise((0, p(x) < -800), (q(x) * sigmoid(p(x)), True))
    (:func:`sigmoid_tail`) wherever a cofactor q can overflow on its own (a power of x >= 2,
    or softplus, log or |x|), whatever the choice said.

    The choice measures in NumPy; the generated code groups numbers and updates temporaries
    in place, so gamma**2 * softplus(-z) may be computed (and overflow, in float32) before it
    meets sigmoid(z)**2 = 0. Where the tail applies the exact value is below 1e-300.
    """

    if not expr.has(sigmoid, dsigmoid):
        return expr

    def risky(node: sympy.Basic) -> bool:
        if not isinstance(node, Mul):
            return False
        cofactors = [
            f for f in node.args if not isinstance(f.as_base_exp()[0], (sigmoid, dsigmoid))
        ]
        return any(
            f.has(softplus, log, sympy.Abs)
            or any(p.exp.is_number and p.exp >= 2 for p in f.atoms(Pow) if p.base.is_Symbol)
            for f in cofactors
        )

    def visit(node: sympy.Basic) -> sympy.Basic:
        if node.is_Atom or not node.args or isinstance(node, sympy.Piecewise):
            return node
        args = tuple(visit(a) for a in node.args)
        node = node.func(*args) if args != node.args else node
        if risky(node):
            return sigmoid_tail(node, _NONE, _NONE) or node
        return node

    return visit(expr)


#: The largest |cofactor| at the cut that :func:`tails_as_clamps` clamps: an upstream
#: gradient up to 3e30 times it stays finite in float32 before it meets the sigmoid's 0.
_CLAMPED_COFACTOR_MAX = 1e8


@register("tails")
def tails_as_clamps(expr: sympy.Expr) -> sympy.Expr:
    """Piecewise((0, x > cut), (q(x) * sigmoid(p(x)), True)) -> q(min(x, cut)) * sigmoid(p(x)):
    sigmoid tails (:func:`sigmoid_tail`) with a polynomial cofactor, clamped instead.

    ``max(x, -cut)`` for a tail at ``x < -cut``; both, each at its own cut, where it has
    both: one pass over memory in eager code, where the select is four or more (two
    comparisons, their or, the select).

    Past the cut the sigmoid is below exp(-1600 / 2**d) for p of degree d, 0 or below
    exp(-100) for d <= 4, and the clamped cofactor is finite: the product is the select's
    0, or below 1e-35. Clamped only where that holds for every float:

    - every decaying factor is a sigmoid or dsigmoid of a polynomial of degree 4 at most
      whose terms cannot cancel as inf - inf (:func:`_no_cancelling_terms`);
    - the cofactor is a polynomial with numeric coefficients, below
      :data:`_CLAMPED_COFACTOR_MAX` at the cut;
    - nothing around the tail grows with x (in ``x * (tail + ...)`` that x would meet the
      0 unclamped, where the select, folded around it, covers it).

    Other tails keep the select.
    """

    if not expr.has(sympy.Piecewise):
        return expr

    def visit(node: sympy.Basic, around: frozenset) -> sympy.Basic:
        if isinstance(node, sympy.Piecewise):
            clamped = _tail_clamped(node)
            if clamped is not None and clamped[1] not in around:
                return clamped[0]
            return node
        if isinstance(node, Add):
            return Add(*(visit(a, around) for a in node.args))
        if isinstance(node, Mul):
            new = []
            for k, a in enumerate(node.args):
                rest = node.args[:k] + node.args[k + 1 :]
                new.append(visit(a, around.union(*(r.free_symbols for r in rest))))
            return Mul(*new)
        return node  # inside another function: as it is

    return visit(expr, frozenset())


def _tail_clamped(node: sympy.Piecewise) -> tuple[sympy.Expr, sympy.Symbol] | None:
    """:func:`tails_as_clamps`'s form of one tail and the symbol clamped, or None."""
    if len(node.args) != 2 or node.args[0].expr != 0 or node.args[1].cond is not sympy.true:
        return None
    cond, product = node.args[0].cond, node.args[1].expr
    if not isinstance(product, Mul):
        return None
    cuts = {}
    for rel in cond.args if isinstance(cond, sympy.Or) else (cond,):
        if not (
            isinstance(rel, (sympy.StrictGreaterThan, sympy.StrictLessThan))
            and rel.lhs.is_Symbol
            and rel.rhs.is_number
        ):
            return None
        cuts[rel.rel_op] = (rel.lhs, rel.rhs)
    symbols = {x for x, _ in cuts.values()}
    if len(symbols) != 1:
        return None
    (x,) = symbols
    decaying = [f for f in product.args if _decays(f)]
    if not decaying or not all(
        _no_cancelling_terms(f.as_base_exp()[0].args[0], x) for f in decaying
    ):
        return None
    scale, cofactor = Mul(*(f for f in product.args if not _decays(f))).as_independent(
        x, as_Add=False
    )
    if not cofactor.is_polynomial(x):
        return None
    coeffs = sympy.Poly(cofactor, x).all_coeffs()
    if not all(c.is_number for c in coeffs):
        return None
    reach = max(abs(float(c)) for _, c in cuts.values())
    if (
        sum(abs(float(c)) * reach**k for k, c in enumerate(reversed(coeffs)))
        > _CLAMPED_COFACTOR_MAX
    ):
        return None
    clamped = x
    if "<" in cuts:
        clamped = sympy.Max(clamped, cuts["<"][1])
    if ">" in cuts:
        clamped = sympy.Min(clamped, cuts[">"][1])
    return scale * cofactor.xreplace({x: clamped}) * Mul(*decaying), x


def _no_cancelling_terms(p: sympy.Expr, x: sympy.Symbol) -> bool:
    """``p`` is a polynomial in x of degree 1 to 4 with numeric coefficients whose
    non-constant terms all have one sign for every x (degrees of one parity, coefficients
    of one sign): however large x, its printed sum is never inf - inf."""
    p = sympy.expand(p)
    if not p.is_polynomial(x):
        return False
    terms = [
        (monomial[0], coeff) for monomial, coeff in sympy.Poly(p, x).terms() if monomial[0] > 0
    ]
    if not terms or max(d for d, _ in terms) > 4 or not all(c.is_number for _, c in terms):
        return False
    return len({d % 2 for d, _ in terms}) == 1 and len({c > 0 for _, c in terms}) == 1


@register("tails")
def prune_branches(expr: sympy.Expr) -> sympy.Expr:
    """Piecewise((a, c), ...) -> the same, folded, without the branches whose condition no
    real input satisfies: folding two regime splits pairs every condition of one with every
    condition of the other ((z > 1600) & (z < -1600) in focal loss), and each branch is a
    pass in the code."""
    if not expr.has(sympy.Piecewise):
        return expr

    def possible(cond) -> bool:
        if cond is sympy.true or len(cond.free_symbols) != 1:
            return True
        if cond.has(sympy.functions.elementary.trigonometric.TrigonometricFunction):
            # as_set has no periodic sets (NotImplementedError), and solveset takes
            # seconds to fail on a quotient of them ((sin(x) + 2*sin(x/2)**2)/cos(x) >= 0)
            return True
        try:
            return cond.as_set() != sympy.S.EmptySet
        except (NotImplementedError, TypeError, ValueError):
            return True

    def prune(node: sympy.Piecewise) -> sympy.Expr:
        pairs = [(e, c) for e, c in node.args if possible(c)]
        return sympy.Piecewise(*pairs) if pairs and pairs != list(node.args) else node

    return piecewise_folded(expr).replace(lambda e: isinstance(e, sympy.Piecewise), prune)
