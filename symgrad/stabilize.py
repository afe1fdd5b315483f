"""Rewrite rules that turn naive formulas into numerically stable ones.

Each rule is a plain function ``rule(node) -> replacement | None`` looking at one SymPy
node whose arguments are already rewritten; :func:`stabilize` applies them bottom-up to a
fixed point. The rules follow PyTensor's stabilize phase: exact identities whose
right-hand side has no overflow, cancellation or unused-branch NaN where the left has.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy
from sympy import Add, Mul, Pow, exp, log

from symgrad.functions import (
    erfcx,
    expm1,
    hypot,
    log1mexp,
    log1p,
    logaddexp,
    one_plus_erf,
    sigmoid,
    softplus,
    xlogy,
)

Rule = Callable[[sympy.Basic], sympy.Basic | None]


def _split_add(node: sympy.Basic, constant: sympy.Expr) -> sympy.Expr | None:
    """For an Add containing ``constant`` as a term, the sum of the other terms."""
    if isinstance(node, Add) and constant in node.args:
        rest = list(node.args)
        rest.remove(constant)
        return Add(*rest)
    return None


def log_one_plus(node):
    """log(1 + u) -> log1p(u)."""
    if isinstance(node, log):
        rest = _split_add(node.args[0], sympy.S.One)
        if rest is not None:
            return log1p(rest)
    return None


def log1p_exp(node):
    """log1p(exp(a)) -> softplus(a)."""
    if isinstance(node, log1p) and isinstance(node.args[0], exp):
        return softplus(node.args[0].args[0])
    return None


def exp_minus_one(node):
    """c*exp(a) - c -> c*expm1(a) (SymPy distributes c over exp(a) - 1 on its own)."""
    if not isinstance(node, Add):
        return None
    for term in node.args:
        coeff, rest = term.as_coeff_Mul()
        if isinstance(rest, exp) and -coeff in node.args:
            others = list(node.args)
            others.remove(term)
            others.remove(-coeff)
            return coeff * expm1(rest.args[0]) + Add(*others)
    return None


def reciprocal_one_plus_exp(node):
    """1 / (1 + exp(a)) -> sigmoid(-a), also for other negative integer powers."""
    if isinstance(node, Pow) and node.exp.is_Integer and node.exp < 0:
        rest = _split_add(node.base, sympy.S.One)
        if isinstance(rest, exp):
            return sigmoid(-rest.args[0]) ** (-node.exp)
    return None


def exp_times_sigmoid(node):
    """exp(a) * sigmoid(-a) -> sigmoid(a) (what exp(a) / (1 + exp(a)) becomes)."""
    if not isinstance(node, Mul):
        return None
    exps = [f for f in node.args if isinstance(f, exp)]
    sigs = [f for f in node.args if isinstance(f, sigmoid)]
    for e in exps:
        for s in sigs:
            if sympy.expand(s.args[0] + e.args[0]) == 0:
                others = list(node.args)
                others.remove(e)
                others.remove(s)
                return Mul(*others) * sigmoid(e.args[0])
    return None


def exp_over_expm1_power(node):
    """exp(a) / expm1(a)**k -> 1 / (expm1(a)**(k-1) * -expm1(-a)): no inf/inf for large a."""
    if not isinstance(node, Mul):
        return None
    for e in (f for f in node.args if isinstance(f, exp)):
        for p in (f for f in node.args if isinstance(f, Pow) and isinstance(f.base, expm1)):
            if p.base.args[0] == e.args[0] and p.exp.is_Integer and p.exp <= -2:
                others = list(node.args)
                others.remove(e)
                others.remove(p)
                a = e.args[0]
                return Mul(*others) * expm1(a) ** (p.exp + 1) / (-expm1(-a))
    return None


def log_sigmoid(node):
    """log(sigmoid(a)) -> -softplus(-a)."""
    if isinstance(node, log) and isinstance(node.args[0], sigmoid):
        return -softplus(-node.args[0].args[0])
    return None


def one_minus_sigmoid(node):
    """1 - sigmoid(a) -> sigmoid(-a)."""
    rest = _split_add(node, sympy.S.One)
    if rest is None:
        return None
    for term in Add.make_args(rest):
        if isinstance(-term, sigmoid):
            return sigmoid(-(-term).args[0]) + (rest - term)
    return None


def one_minus_two_sigmoid(node):
    """1 - 2 sigmoid(u) -> -tanh(u/2): no cancellation for small u."""
    rest = _split_add(node, sympy.S.One)
    if rest is None:
        return None
    for term in Add.make_args(rest):
        coeff, factor = term.as_coeff_Mul()
        if coeff == -2 and isinstance(factor, sigmoid):
            return -sympy.tanh(factor.args[0] / 2) + (rest - term)
    return None


def log_sum_exp(node):
    """log(exp(a) + exp(b) + ...) -> logaddexp(logaddexp(a, b), ...)."""
    if isinstance(node, log) and isinstance(node.args[0], Add):
        terms = node.args[0].args
        if len(terms) >= 2 and all(isinstance(t, exp) for t in terms):
            result = terms[0].args[0]
            for t in terms[1:]:
                result = logaddexp(result, t.args[0])
            return result
    return None


def exp_ratio(node):
    """exp(a) / (exp(a) + exp(b)) -> sigmoid(a - b) (a two-way softmax)."""
    if not isinstance(node, Mul):
        return None
    for e in (f for f in node.args if isinstance(f, exp)):
        for p in (f for f in node.args if isinstance(f, Pow) and f.exp == -1):
            terms = p.base.args if isinstance(p.base, Add) else ()
            if len(terms) == 2 and e in terms and all(isinstance(t, exp) for t in terms):
                other = terms[1] if terms[0] == e else terms[0]
                others = list(node.args)
                others.remove(e)
                others.remove(p)
                return Mul(*others) * sigmoid(e.args[0] - other.args[0])
    return None


def log_asinh(node):
    """log(x + sqrt(x**2 + 1)) -> asinh(x): the sum cancels for x << 0, x**2 overflows."""
    if isinstance(node, log) and isinstance(node.args[0], Add) and len(node.args[0].args) == 2:
        for x, root in (node.args[0].args, node.args[0].args[::-1]):
            if isinstance(root, Pow) and root.exp == sympy.S.Half:
                if sympy.expand(root.base - x**2 - 1) == 0:
                    return sympy.asinh(x)
    return None


def one_minus_erf(node):
    """1 - erf(a) -> erfc(a); 1 + erf(a) -> erfc(-a) (no cancellation on either side)."""
    rest = _split_add(node, sympy.S.One)
    if rest is None:
        return None
    for term in Add.make_args(rest):
        if isinstance(-term, sympy.erf):
            return sympy.erfc((-term).args[0]) + (rest - term)
        if isinstance(term, sympy.erf):
            return one_plus_erf(term.args[0]) + (rest - term)
    return None


def log_minus_expm1(node):
    """log(-expm1(a)) (what log(1 - exp(a)) becomes) -> log1mexp(a)."""
    if isinstance(node, log):
        arg = node.args[0]
        if isinstance(-arg, expm1):
            return log1mexp((-arg).args[0])
    return None


def sqrt_difference(node):
    """sqrt(a) - sqrt(b) -> (a - b) / (sqrt(a) + sqrt(b)) when a - b is simpler."""
    if not isinstance(node, Add) or len(node.args) != 2:
        return None
    first, second = node.args
    if isinstance(-first, Pow):
        first, second = second, first
    if not (isinstance(first, Pow) and first.exp == sympy.S.Half):
        return None
    if not (isinstance(-second, Pow) and (-second).exp == sympy.S.Half):
        return None
    a, b = first.base, (-second).base
    difference = sympy.expand(a - b)
    if sympy.count_ops(difference) >= sympy.count_ops(a):
        return None
    return difference / (sympy.sqrt(a) + sympy.sqrt(b))


def sqrt_sum_squares(node):
    """sqrt(x**2 + y**2) -> hypot(x, y)."""
    if isinstance(node, Pow) and node.exp == sympy.S.Half and isinstance(node.base, Add):
        terms = node.base.args
        if len(terms) == 2 and all(isinstance(t, Pow) and t.exp == 2 for t in terms):
            return hypot(terms[0].base, terms[1].base)
    return None


def log_reciprocal(node):
    """log(1/x) -> -log(x)."""
    if isinstance(node, log) and isinstance(node.args[0], Pow) and node.args[0].exp == -1:
        return -log(node.args[0].base)
    return None


def exp_square_erfc(node):
    """exp(a**2) * erfc(a) -> erfcx(a): exp overflows and erfc underflows for large a."""
    if not isinstance(node, Mul):
        return None
    for e in (f for f in node.args if isinstance(f, exp)):
        for c in (f for f in node.args if isinstance(f, sympy.erfc)):
            if sympy.expand(e.args[0] - c.args[0] ** 2) == 0:
                others = list(node.args)
                others.remove(e)
                others.remove(c)
                return Mul(*others) * erfcx(c.args[0])
    return None


def x_log_x(node):
    """x * log(x) -> xlogy(x, x): 0 at x = 0 instead of 0 * -inf = NaN."""
    if not isinstance(node, Mul):
        return None
    for factor in node.args:
        if isinstance(factor, log) and factor.args[0] in node.args:
            others = list(node.args)
            others.remove(factor)
            others.remove(factor.args[0])
            return Mul(*others) * xlogy(factor.args[0], factor.args[0])
    return None


def log_cosh(node):
    """log(cosh(a)) -> |a| + softplus(-2|a|) - log(2): cosh overflows long before the result."""
    if isinstance(node, log) and isinstance(node.args[0], sympy.cosh):
        a = sympy.Abs(node.args[0].args[0])
        return a + softplus(-2 * a) - log(2)
    return None


#: The rules, in the order they are tried on each node.
RULES: tuple[Rule, ...] = (
    log_reciprocal,
    log_one_plus,
    log1p_exp,
    log_sum_exp,
    log_asinh,
    log_cosh,
    exp_minus_one,
    reciprocal_one_plus_exp,
    exp_times_sigmoid,
    exp_ratio,
    exp_over_expm1_power,
    log_sigmoid,
    one_minus_sigmoid,
    one_minus_two_sigmoid,
    one_minus_erf,
    log_minus_expm1,
    sqrt_difference,
    sqrt_sum_squares,
    exp_square_erfc,
    x_log_x,
)

_MAX_PASSES = 32


def _rewrite_node(node: sympy.Basic, rules: tuple[Rule, ...]) -> sympy.Basic:
    for _ in range(_MAX_PASSES):
        for rule in rules:
            new = rule(node)
            if new is not None and new != node:
                node = _rewrite(new, rules)
                break
        else:
            return node
    return node


def _rewrite(expr: sympy.Basic, rules: tuple[Rule, ...]) -> sympy.Basic:
    if expr.is_Atom or not expr.args:
        return expr
    args = tuple(_rewrite(a, rules) for a in expr.args)
    if args != expr.args:
        expr = expr.func(*args)
    return _rewrite_node(expr, rules)


def stabilize(expr: sympy.Expr, rules: tuple[Rule, ...] = RULES) -> sympy.Expr:
    """Apply the stabilizing rewrites bottom-up until none applies."""
    return _rewrite(expr, rules)


# ----------------------------------------------------------------------------- regimes
_SERIES_TERMS = 4
_EPS = 2.0**-53


def _series_regime(node: sympy.Basic) -> sympy.Basic | None:
    """x - tanh(x), x - sin(x), ...: the linear terms cancel near 0, so below a threshold
    use the Taylor polynomial, truncated where the next term is under float64's epsilon."""
    if not isinstance(node, Add) or len(node.free_symbols) != 1 or sympy.count_ops(node) > 30:
        return None
    (x,) = node.free_symbols
    if not any(
        term.has(x) and sympy.degree(term, x) == 1 for term in node.args if term.is_polynomial(x)
    ):
        return None
    if node.has(sympy.Piecewise) or node.subs(x, 0) != 0:
        return None
    try:
        poly = sympy.series(node, x, 0, 16).removeO()
    except Exception:  # noqa: BLE001 - SymPy cannot expand it: keep the formula
        return None
    terms = sorted(sympy.Add.make_args(sympy.expand(poly)), key=lambda t: sympy.degree(t, x))
    terms = [t for t in terms if t != 0]
    if len(terms) <= _SERIES_TERMS or sympy.degree(terms[0], x) < 2:
        return None
    lead, nxt = terms[0], terms[_SERIES_TERMS]
    k, n = sympy.degree(lead, x), sympy.degree(nxt, x)
    ratio = abs(float(lead.coeff(x, k)) / float(nxt.coeff(x, n)))
    threshold = sympy.Float(float(f"{(_EPS * ratio) ** (1.0 / (n - k)):.3g}"), 3)
    return sympy.Piecewise((Add(*terms[:_SERIES_TERMS]), sympy.Abs(x) < threshold), (node, True))


#: exp(-800) ~ 1e-348 underflows to 0 in every dtype.
_UNDERFLOW_EXPONENT = 800


def _gaussian_tail(node: sympy.Basic) -> sympy.Basic | None:
    """p(x) * exp(-c x**2 + ...) -> 0 where the exponential underflows.

    Beyond that point the exact value is below any float, but p(x) can overflow first
    (x**2 at |x| > 1e154) and make inf * 0 = NaN.
    """
    if not isinstance(node, Mul) or len(node.free_symbols) == 0:
        return None
    exps = [f for f in node.args if isinstance(f, exp)]
    if len(exps) != 1:
        return None
    arg = exps[0].args[0]
    symbols = arg.free_symbols
    if len(symbols) != 1 or not arg.is_polynomial(*symbols):
        return None
    (x,) = symbols
    poly = sympy.Poly(arg, x)
    lead = poly.LC()
    if poly.degree() < 2 or not (lead.is_Number and lead < 0):
        return None
    others = Mul(*(f for f in node.args if f is not exps[0]))
    if not others.has(x):
        return None  # nothing that could overflow before the exponential underflows
    cut = float(f"{(_UNDERFLOW_EXPONENT / -float(lead)) ** (1.0 / poly.degree()):.3g}")
    return sympy.Piecewise((node, sympy.Abs(x) < cut), (0, True))


def _rational_tail(node: sympy.Basic, params: frozenset) -> sympy.Basic | None:
    """P(x)/Q(x) with deg Q >= 2 -> (P/x^k)/(Q/x^k) for |x| >= 1.

    (nu - x**2)/(nu + x**2)**2 is inf/inf once x**2 overflows (|x| > 1e154, 1e19 in float32);
    divided through by x**k every power is at most 1. ``params`` are the scalar inputs, which
    are coefficients here, never the variable.
    """
    if not isinstance(node, (Mul, Pow)):
        return None
    for x in sorted(node.free_symbols - params, key=lambda s: s.name):
        if not node.is_rational_function(x):
            continue
        numerator, denominator = sympy.fraction(sympy.together(node))
        if not denominator.is_polynomial(x) or not numerator.is_polynomial(x):
            continue
        k = sympy.degree(denominator, x)
        if k < 2 or not sympy.expand(denominator).is_Add:
            continue
        top = sympy.expand(numerator / x**k)
        if top.has(x) and not top.is_Add:
            # a lone x**-m would be printed as 1/(x**m * ...) and overflow again
            continue
        scaled = top / sympy.expand(denominator / x**k)
        return sympy.Piecewise((node, sympy.Abs(x) < 1), (scaled, True))
    return None


def split_regimes(expr: sympy.Expr, params: frozenset = frozenset()) -> sympy.Expr:
    """Branches by input regime: a Taylor polynomial where a sum cancels near 0, zero where a
    Gaussian factor underflows, rational functions rescaled where their powers overflow.

    One bottom-up pass: a branch made here is not visited again (its fallback is the sum).
    """
    if expr.is_Atom or not expr.args or isinstance(expr, sympy.Piecewise):
        return expr
    # Rational functions as a whole (top-down): rescaling only the denominator of a
    # quotient would leave the numerator's powers to overflow.
    whole = _rational_tail(expr, params)
    if whole is not None:
        return whole
    args = tuple(split_regimes(a, params) for a in expr.args)
    node = expr.func(*args) if args != expr.args else expr
    return _series_regime(node) or _gaussian_tail(node) or _rational_tail(node, params) or node
