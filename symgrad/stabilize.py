"""Rewrite rules that turn naive formulas into numerically stable ones.

Each rule is a plain function ``rule(node) -> replacement | None`` looking at one SymPy
node whose arguments are already rewritten; :func:`stabilize` applies them bottom-up to a
fixed point. The rules follow PyTensor's stabilize phase: exact identities whose
right-hand side has no overflow, cancellation or unused-branch NaN where the left has.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import mpmath
import sympy
from sympy import Add, Mul, Pow, exp, log

from symgrad.functions import (
    dsigmoid,
    erfcx,
    erfcx_inv,
    expm1,
    exprel,
    hypot,
    hypot_ratio,
    log1mexp,
    log1p,
    log1p_square,
    logaddexp,
    logcosh,
    one_plus_erf,
    sigmoid,
    softplus,
    xlogy,
)

Rule = Callable[[sympy.Basic], sympy.Basic | None]


def _drop(node: sympy.Basic, *args: sympy.Basic) -> sympy.Basic:
    """``node`` (an Add or a Mul) without one occurrence of each of ``args``."""
    rest = list(node.args)
    for a in args:
        rest.remove(a)
    return node.func(*rest)


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
            return coeff * expm1(rest.args[0]) + _drop(node, term, -coeff)
    return None


def reciprocal_one_plus_exp(node):
    """1 / (1 + exp(a)) -> sigmoid(-a), also for other negative integer powers."""
    if isinstance(node, Pow) and node.exp.is_Integer and node.exp < 0:
        rest = _split_add(node.base, sympy.S.One)
        if isinstance(rest, exp):
            return sigmoid(-rest.args[0]) ** (-node.exp)
    return None


def exp_times_sigmoid(node):
    """exp(a) * sigmoid(-a)**k -> sigmoid(a) * sigmoid(-a)**(k-1) (what exp(a) / (1 + exp(a))
    becomes, k = 1; its derivative has k = 2)."""
    if not isinstance(node, Mul):
        return None
    exps = [f for f in node.args if isinstance(f, exp)]
    for e in exps:
        for f in node.args:
            base, k = f.as_base_exp()
            if not (isinstance(base, sigmoid) and k.is_Integer and k >= 1):
                continue
            if sympy.expand(base.args[0] + e.args[0]) == 0:
                return _drop(node, e, f) * sigmoid(e.args[0]) * base ** (k - 1)
    return None


def exp_over_expm1_power(node):
    """exp(a) / expm1(a)**k -> 1 / (expm1(a)**(k-1) * -expm1(-a)): no inf/inf for large a.

    k = 1 is the derivative of log(expm1(a)): exp(a)/expm1(a) -> -1/expm1(-a).
    """
    if not isinstance(node, Mul):
        return None
    for e in (f for f in node.args if isinstance(f, exp)):
        for p in (f for f in node.args if isinstance(f, Pow) and isinstance(f.base, expm1)):
            if p.base.args[0] == e.args[0] and p.exp.is_Integer and p.exp <= -1:
                a = e.args[0]
                return _drop(node, e, p) * expm1(a) ** (p.exp + 1) / (-expm1(-a))
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
                return _drop(node, e, p) * sigmoid(e.args[0] - other.args[0])
    return None


def log_asinh(node):
    """log(x + sqrt(x**2 + 1)) -> asinh(x): the sum cancels for x << 0, x**2 overflows."""
    if isinstance(node, log) and isinstance(node.args[0], Add) and len(node.args[0].args) == 2:
        for x, root in (node.args[0].args, node.args[0].args[::-1]):
            if isinstance(root, Pow) and root.exp == sympy.S.Half:
                if sympy.expand(root.base - x**2 - 1) == 0:
                    return sympy.asinh(x)
            if isinstance(root, hypot) and set(root.args) in ({x, 1}, {-x, 1}):
                return sympy.asinh(x)
    return None


def one_minus_erf(node):
    """c - c*erf(a) -> c*erfc(a); c + c*erf(a) -> c*erfc(-a) (no cancellation on either
    side; c = 1/2 in the normal CDF (1 + erf(x/sqrt(2)))/2)."""
    if not isinstance(node, Add):
        return None
    for term in node.args:
        coeff, factor = term.as_coeff_Mul()
        if not isinstance(factor, sympy.erf):
            continue
        for c, replacement in ((-coeff, sympy.erfc), (coeff, one_plus_erf)):
            if c in node.args:
                return c * replacement(factor.args[0]) + _drop(node, term, c)
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
    """(x**2 + y**2)**(k/2) -> hypot(x, y)**k."""
    if isinstance(node, Pow) and node.exp.is_Rational and node.exp.q == 2:
        terms = node.base.args if isinstance(node.base, Add) else ()
        if len(terms) == 2 and all(isinstance(t, Pow) and t.exp == 2 for t in terms):
            return hypot(terms[0].base, terms[1].base) ** node.exp.p
    return None


def log_reciprocal(node):
    """log(1/x) -> -log(x)."""
    if isinstance(node, log) and isinstance(node.args[0], Pow) and node.args[0].exp == -1:
        return -log(node.args[0].base)
    return None


def exp_square_erfc(node):
    """exp(a**2) * erfc(a) -> erfcx(a), and exp(-a**2) / erfc(a) -> erfcx_inv(a) (the
    derivative of log(erfc(a))): exp overflows or underflows and erfc underflows for large a."""
    if not isinstance(node, Mul):
        return None
    for e in (f for f in node.args if isinstance(f, exp)):
        for c in node.args:
            base, power = c.as_base_exp()
            if not (isinstance(base, (sympy.erfc, one_plus_erf)) and power in (1, -1)):
                continue
            a = base.args[0] if isinstance(base, sympy.erfc) else -base.args[0]
            if sympy.expand(power * e.args[0] - a**2) == 0:
                return _drop(node, e, c) * (erfcx(a) if power == 1 else erfcx_inv(a))
    return None


def x_log_x(node):
    """x * log(x) -> xlogy(x, x): 0 at x = 0 instead of 0 * -inf = NaN."""
    if not isinstance(node, Mul):
        return None
    for factor in node.args:
        if isinstance(factor, log) and factor.args[0] in node.args:
            return _drop(node, factor, factor.args[0]) * xlogy(factor.args[0], factor.args[0])
    return None


def log_cosh(node):
    """log(cosh(a)) -> logcosh(a): cosh overflows long before the result."""
    if isinstance(node, log) and isinstance(node.args[0], sympy.cosh):
        return logcosh(node.args[0].args[0])
    return None


def log_expm1(node):
    """log(expm1(a)) -> a + log1mexp(-a): expm1 overflows for a > 709.8, the log does not."""
    if isinstance(node, log) and isinstance(node.args[0], expm1):
        a = node.args[0].args[0]
        return a + log1mexp(-a)
    return None


def sigmoid_difference(node):
    """c*sigmoid(a) - c*sigmoid(-a) -> c*tanh(a/2): the difference cancels near a = 0."""
    if not isinstance(node, Add):
        return None
    for term in node.args:
        coeff, factor = term.as_coeff_Mul()
        if not isinstance(factor, sigmoid):
            continue
        a = factor.args[0]
        partner = -coeff * sigmoid(-a)
        if partner in node.args:
            return coeff * sympy.tanh(a / 2) + _drop(node, term, partner)
    return None


def one_minus_cos(node):
    """c - c*cos(a) -> 2c sin(a/2)**2: no cancellation near a = 0."""
    if not isinstance(node, Add):
        return None
    for term in node.args:
        coeff, factor = term.as_coeff_Mul()
        if isinstance(factor, sympy.cos) and -coeff in node.args:
            return -2 * coeff * sympy.sin(factor.args[0] / 2) ** 2 + _drop(node, term, -coeff)
    return None


def cosh_minus_one(node):
    """c*cosh(a) - c -> 2c sinh(a/2)**2: no cancellation near a = 0."""
    if not isinstance(node, Add):
        return None
    for term in node.args:
        coeff, factor = term.as_coeff_Mul()
        if isinstance(factor, sympy.cosh) and -coeff in node.args:
            return 2 * coeff * sympy.sinh(factor.args[0] / 2) ** 2 + _drop(node, term, -coeff)
    return None


def sinh_over_cosh(node):
    """sinh(a)**m / cosh(a)**k -> tanh(a)**m / cosh(a)**(k-m) (k >= m): no inf/inf."""
    if not isinstance(node, Mul):
        return None
    powers = {}
    for f in node.args:
        base, power = f.as_base_exp()
        if isinstance(base, (sympy.sinh, sympy.cosh)) and power.is_Integer:
            powers[base] = power
    for base, m in powers.items():
        if not isinstance(base, sympy.sinh) or m < 1:
            continue
        cosh = sympy.cosh(base.args[0])
        k = -powers.get(cosh, 0)
        if k >= m:
            others = [f for f in node.args if f.as_base_exp()[0] not in (base, cosh)]
            return Mul(*others) * sympy.tanh(base.args[0]) ** m * cosh ** (m - k)
    return None


def gamma_difference(node):
    """loggamma(a + n) - loggamma(a) -> sum of log(a + j); the same for polygamma.

    For large a both terms are huge and nearly equal: loggamma(x + 1) - loggamma(x) at
    x = 1e15 keeps no correct digit of log(x).
    """
    if not isinstance(node, Add):
        return None
    for term in node.args:
        coeff, factor = term.as_coeff_Mul()
        if not isinstance(factor, (sympy.loggamma, sympy.polygamma)):
            continue
        for other in node.args:
            c2, f2 = other.as_coeff_Mul()
            if c2 != -coeff or f2.func is not factor.func or f2 == factor:
                continue
            if isinstance(factor, sympy.polygamma):
                if f2.args[0] != factor.args[0] or not factor.args[0].is_Integer:
                    continue
                m, big, small = factor.args[0], factor.args[1], f2.args[1]
            else:
                m, big, small = None, factor.args[0], f2.args[0]
            n = sympy.expand(big - small)
            if not (n.is_Integer and 1 <= n <= 4):
                continue
            if m is None:
                value = Add(*(log(small + j) for j in range(n)))
            else:
                # psi^(m)(a + 1) - psi^(m)(a) = (-1)^m m! / a^(m + 1)
                value = Add(
                    *((-1) ** m * sympy.factorial(m) / (small + j) ** (m + 1) for j in range(n))
                )
            return coeff * value + _drop(node, term, other)
    return None


def sqrt_square_plus_constant(node):
    """(x**2 + c)**(k/2) -> hypot(x, sqrt(c))**k for a positive number c: x**2 overflows."""
    if not (isinstance(node, Pow) and isinstance(node.base, Add) and node.exp.is_Rational):
        return None
    if node.exp.q != 2 or len(node.base.args) != 2:
        return None
    for square, c in (node.base.args, node.base.args[::-1]):
        if c.is_number and c.is_positive and isinstance(square, Pow) and square.exp == 2:
            return hypot(square.base, sympy.sqrt(c)) ** node.exp.p
    return None


def sqrt_minus_one(node):
    """sqrt(a) - 1 -> (a - 1)/(sqrt(a) + 1) when a - 1 is simpler: cancels near a = 1.

    hypot(x, 1) - 1 (what sqrt(x**2 + 1) - 1 becomes) is split by regime instead, see
    :func:`_hypot_minus_one`.
    """
    if not isinstance(node, Add) or sympy.S.NegativeOne not in node.args or len(node.args) != 2:
        return None
    (root,) = (t for t in node.args if t != -1)
    if isinstance(root, Pow) and root.exp == sympy.S.Half:
        difference = sympy.expand(root.base - 1)
        if sympy.count_ops(difference) < sympy.count_ops(root.base):
            return difference / (root + 1)
    return None


def one_plus_tanh(node):
    """c + c*tanh(u) -> 2c sigmoid(2u), c - c*tanh(u) -> 2c sigmoid(-2u): no cancellation
    where tanh(u) is near -1 or 1 (gelu's tail)."""
    if not isinstance(node, Add):
        return None
    for term in node.args:
        coeff, factor = term.as_coeff_Mul()
        if not isinstance(factor, sympy.tanh):
            continue
        for c, sign in ((coeff, 1), (-coeff, -1)):
            if c in node.args:
                return 2 * c * sigmoid(2 * sign * factor.args[0]) + _drop(node, term, c)
    return None


def one_minus_tanh_squared(node):
    """c - c*tanh(u)**2 -> 4c sigmoid(2u) sigmoid(-2u): the difference is 0 once tanh
    rounds to 1 (u > 19), the product keeps its value down to the underflow."""
    if not isinstance(node, Add):
        return None
    for term in node.args:
        coeff, factor = term.as_coeff_Mul()
        base, power = factor.as_base_exp()
        if isinstance(base, sympy.tanh) and power == 2 and -coeff in node.args:
            u = base.args[0]
            return -4 * coeff * sigmoid(2 * u) * sigmoid(-2 * u) + _drop(node, term, -coeff)
    return None


def expm1_over_x(node):
    """expm1(a) / a -> exprel(a) (also c*expm1(a)/a' when a = c*a'): 0/0 at 0, and inf/a
    for a in [709.8, 716] where exp overflows but the quotient does not."""
    if not isinstance(node, Mul):
        return None
    for e in (f for f in node.args if isinstance(f, expm1)):
        a = e.args[0]
        for p in (f for f in node.args if isinstance(f, Pow) and f.exp == -1):
            ratio = sympy.cancel(a / p.base)
            if ratio.is_number and ratio != 0:
                return _drop(node, e, p) * ratio * exprel(a)
    return None


def exp_difference(node):
    """c*exp(a) - c*exp(-a) -> 2c sinh(a), c*exp(a) + c*exp(-a) -> 2c cosh(a): no
    cancellation near a = 0, and one overflow-safe function instead of two exps."""
    if not isinstance(node, Add):
        return None
    for term in node.args:
        coeff, factor = term.as_coeff_Mul()
        if not isinstance(factor, exp):
            continue
        a = factor.args[0]
        for sign, hyperbolic in ((-1, sympy.sinh), (1, sympy.cosh)):
            partner = sign * coeff * exp(-a)
            if partner in node.args and (sign == 1 or not a.could_extract_minus_sign()):
                return 2 * coeff * hyperbolic(a) + _drop(node, term, partner)
    return None


def sigmoid_product(node):
    """sigmoid(a) * sigmoid(-a) -> dsigmoid(a): one exp, exact down to the subnormals."""
    if not isinstance(node, Mul):
        return None
    sigmoids = [f for f in node.args if isinstance(f, sigmoid)]
    for s in sigmoids:
        partner = sigmoid(-s.args[0])
        if partner in sigmoids:
            return _drop(node, s, partner) * dsigmoid(s.args[0])
    return None


def hypot_power_ratio(node):
    """y**m / hypot(x, y)**k -> hypot_ratio(y, x, y)**m / hypot(x, y)**(k-m) (m < k): each
    ratio is at most 1, where hypot**k overflows long before the value (y**2/hypot**3)."""
    if not isinstance(node, Mul):
        return None
    for h in node.args:
        base, power = h.as_base_exp()
        if not (isinstance(base, hypot) and power.is_Integer and power <= -2):
            continue
        for f in node.args:
            b, m = f.as_base_exp()
            if b in base.args and m.is_Integer and 1 <= m < -power:
                return _drop(node, h, f) * hypot_ratio(b, *base.args) ** m * base ** (power + m)
    return None


def _symmetric_bound(cond: sympy.Basic) -> tuple[sympy.Expr, sympy.Expr] | None:
    """(a, c) where ``cond`` says -c <= a <= c (or |a| <= c, strict or not), c > 0."""
    if isinstance(cond, (sympy.Le, sympy.Lt)) and isinstance(cond.lhs, sympy.Abs):
        a, c = cond.lhs.args[0], cond.rhs
    elif isinstance(cond, (sympy.Ge, sympy.Gt)) and isinstance(cond.rhs, sympy.Abs):
        a, c = cond.rhs.args[0], cond.lhs  # c >= |a|, as SymPy writes |a| <= c for a symbol c
    elif isinstance(cond, sympy.And) and len(cond.args) == 2:
        room = []  # big - small of each side: c - a and a + c
        for rel in cond.args:
            if isinstance(rel, (sympy.Le, sympy.Lt)):
                room.append(rel.rhs - rel.lhs)
            elif isinstance(rel, (sympy.Ge, sympy.Gt)):
                room.append(rel.lhs - rel.rhs)
            else:
                return None
        c, a = sympy.expand((room[0] + room[1]) / 2), sympy.expand((room[1] - room[0]) / 2)
    else:
        return None
    if c.is_positive is not True or a == 0 or c.free_symbols & a.free_symbols:
        return None
    return a, c


def clamp_select(node):
    """Piecewise((k*a, |a| <= c), (k*c*sign(a), True)) -> k*Min(Max(a, -c), c), for k
    free of a and c > 0 (Huber's and hardtanh's gradients).

    The same value everywhere, +-inf included, in one clamp where the select is five
    passes over memory in eager code (two comparisons, their and, the sign, the select).
    A NaN stays NaN (as in F.huber_loss's gradient; torch's sign(NaN) is 0, so the select
    gave 0 there). Either sign of a: the clamp is odd. Not a rule of :data:`RULES`:
    applied to the chosen form only, never to what is differentiated (SymPy's derivative
    of Min/Max is Heaviside(0) = 1/2 at |a| = c, the select's is the branch its condition
    takes there).
    """
    if not isinstance(node, sympy.Piecewise) or len(node.args) != 2:
        return None
    (inside, cond), (outside, otherwise) = node.args
    if otherwise is not sympy.true:
        return None
    bound = _symmetric_bound(cond)
    if bound is None:
        return None
    a, c = bound
    for x in (a, -a):  # (SymPy keeps sign(b - a) and -sign(a - b) apart)
        k = sympy.cancel(inside / x)
        # k free of a's symbols: Piecewise((1, |x| <= 1), (sign(x)/x, True)) is no clamp
        # times 1/x (NaN at 0, where the select gives 1)
        if k != 0 and not k.has(sympy.Piecewise) and not k.free_symbols & a.free_symbols:
            if sympy.expand(outside - k * c * sympy.sign(x)) == 0:
                return k * sympy.Min(sympy.Max(x, -c), c)
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
    log_expm1,
    sigmoid_difference,
    one_minus_cos,
    cosh_minus_one,
    sinh_over_cosh,
    gamma_difference,
    sqrt_square_plus_constant,
    sqrt_minus_one,
    one_plus_tanh,
    one_minus_tanh_squared,
    expm1_over_x,
    exp_difference,
    sigmoid_product,
    hypot_power_ratio,
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
    terms = _series_terms(poly, x)
    if terms is None or sympy.degree(terms[0], x) < 2:
        return None
    return sympy.Piecewise(
        (Add(*terms[:_SERIES_TERMS]), sympy.Abs(x) < _cut(terms, x)), (node, True)
    )


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


def _cut(terms: list[sympy.Expr], x: sympy.Symbol) -> sympy.Float:
    """Where the first term dropped from ``terms[:_SERIES_TERMS]`` falls under float64's
    epsilon relative to the first kept one."""
    lead, nxt = terms[0], terms[_SERIES_TERMS]
    k, n = sympy.degree(lead, x), sympy.degree(nxt, x)
    ratio = abs(float(lead.coeff(x, k)) / float(nxt.coeff(x, n)))
    return sympy.Float(float(f"{(_EPS * ratio) ** (1.0 / (n - k)):.3g}"), 3)


#: Largest formula (SymPy op count) expanded in series at a removable singularity: the
#: bound is on size, so that the cost of a derivation is bounded by its formula's.
_REMOVABLE_MAX_OPS = 60


#: Series order at a removable singularity: five terms of an even or odd function.
_REMOVABLE_ORDER = 10


def _bounded_near_zero(node: sympy.Basic, x: sympy.Symbol) -> bool:
    """``node`` is finite and below 2**50 in magnitude at x = +-2**-100 (512 bits): a
    limit at 0 is likely, where a pole would be near 2**100 (a cheap test before a series).
    """
    from symgrad.reference import Undefined, evaluate

    with mpmath.workprec(512):
        for at in (mpmath.ldexp(1, -100), -mpmath.ldexp(1, -100)):
            try:
                value = evaluate(node, {x: at})
            except (Undefined, ArithmeticError, ValueError, NotImplementedError):
                return False
            if not mpmath.isfinite(value) or abs(value) > mpmath.ldexp(1, 50):
                return False
    return True


#: Past this, erfcx_inv(a) is sqrt(pi) (a + 1/(2a) - 1/(2a**3)) to a relative 1e-48.
_ERFCX_INV_ASYMPTOTIC = 1e8


def _erfcx_inv_tail(node: sympy.Basic) -> tuple[sympy.Expr, sympy.Basic] | None:
    """A formula in erfcx_inv(a), a linear in one symbol, for a > 1e8: its asymptotic
    series, expanded. erfcx_inv(a) ~ a sqrt(pi) overflows first (float32 log_ndtr's
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


def _removable_regime(node: sympy.Basic) -> tuple[sympy.Expr, sympy.Basic] | None:
    """(x - sin(x))/x**3, 1/x - 1/tan(x), (1 - cos(x))/x**2: 0/0 or inf - inf at x = 0
    where the value has a limit. Near 0 the parts underflow or overflow (x**3 is 0 below
    1e-108) while the value is tame: there, the Taylor polynomial and the condition.
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
        try:
            poly = sympy.series(rest, x, 0, _REMOVABLE_ORDER).removeO()
        except Exception:  # noqa: BLE001 - SymPy cannot expand it: keep the formula
            return None
        terms = _series_terms(poly, x)
        if terms is None or sympy.degree(terms[0], x) < 0:
            return None
        return factor * Add(*terms[:_SERIES_TERMS]), sympy.Abs(x) < _cut(terms, x)
    return None


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
    if others.has(exp, sympy.erfc, one_plus_erf, erfcx, sympy.cosh, sympy.sinh, sympy.gamma):
        return None  # a factor that may grow as fast as the exponential decays
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
        if top.has(x) and not top.is_Add and sympy.degree(top.as_numer_denom()[1], x) > 1:
            # a lone x**-m (m > 1) would be printed as 1/(x**m * ...) and overflow again
            continue
        scaled = top / sympy.expand(denominator / x**k)
        return sympy.Piecewise((node, sympy.Abs(x) < 1), (scaled, True))
    return None


#: log1p(u) for u above this is evaluated as log(u) + log1p(1/u), log(u) from its factors.
_LOG1P_TAIL_FROM = 2**20


def _log1p_tail(node: sympy.Basic, params: frozenset, positive: frozenset) -> sympy.Basic | None:
    """log1p(c * x**k) -> log(c) + k log|x| + log1p(1/u) where u = c * x**k is large;
    log1p(c * x**2) -> :class:`~symgrad.functions.log1p_square` (sqrt(c) * x), no branch.

    log1p(x**2/nu) is inf once x**2 overflows (|x| > 1e154, 1.8e19 in float32) although
    the exact value is about 2 log|x|. ``c`` may hold scalar inputs (``params``) and numbers.
    """
    if not isinstance(node, log1p):
        return None
    u = node.args[0]
    logs = []
    has_power = False
    for factor in Mul.make_args(u):
        base, power = factor.as_base_exp()
        if base.free_symbols - params:
            if not (base.is_Symbol and power.is_Integer and power >= 2):
                return None
            has_power = True
            logs.append(power * log(sympy.Abs(base)))
        elif factor.is_number and not factor.is_positive:
            return None
        else:
            logs.append(sympy.expand_log(log(factor), force=True))
    if not has_power:
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


def _decays(f: sympy.Basic) -> bool:
    """``f`` is a sigmoid, a dsigmoid or a positive power of one."""
    base, power = f.as_base_exp()
    return isinstance(base, (sigmoid, dsigmoid)) and power.is_number and power > 0


def _sigmoid_tail(node: sympy.Basic) -> sympy.Basic | None:
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


#: The largest |cofactor| at the cut that :func:`tails_as_clamps` clamps: an upstream
#: gradient up to 3e30 times it stays finite in float32 before it meets the sigmoid's 0.
_CLAMPED_COFACTOR_MAX = 1e8


def tails_as_clamps(expr: sympy.Expr) -> sympy.Expr:
    """Sigmoid tails (:func:`_sigmoid_tail`) with a polynomial cofactor, clamped instead.

    ``Piecewise((0, x > cut), (q(x) * sigmoid(p(x)), True))`` becomes
    ``q(min(x, cut)) * sigmoid(p(x))`` (``max(x, -cut)`` for a tail at ``x < -cut``; both,
    each at its own cut, where it has both): one pass over memory in eager code, where the
    select is four or more (two comparisons, their or, the select).

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


def _log_erfc_tail(node: sympy.Basic) -> sympy.Basic | None:
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


def _log_ratio(node: sympy.Basic) -> sympy.Basic | None:
    """log(x/y) -> log(x) - log(y) where x/y over- or underflows (outside [2**-100, 2**100],
    inside every dtype's normal range): there |log(x/y)| > 69 and the difference of the logs
    cannot cancel much. Inside, log(x/y) is exact where the difference of logs would cancel."""
    if not isinstance(node, log) or not isinstance(node.args[0], Mul):
        return None
    q = node.args[0]
    numerator, denominator = q.as_numer_denom()
    if not (numerator.free_symbols and denominator.free_symbols):
        return None
    inside = sympy.And(q > sympy.Float(2.0**-100), q < sympy.Float(2.0**100))
    return sympy.Piecewise((node, inside), (log(numerator) - log(denominator), True))


def _hypot_minus_one(node: sympy.Basic) -> sympy.Basic | None:
    """hypot(x, 1) - 1 -> x**2/(hypot(x, 1) + 1) for |x| < 1, where the difference cancels;
    beyond, x**2 would overflow (|x| > 1e154) and the difference is exact enough."""
    if not (isinstance(node, Add) and len(node.args) == 2 and sympy.S.NegativeOne in node.args):
        return None
    (root,) = (t for t in node.args if t != -1)
    if not (isinstance(root, hypot) and sympy.S.One in root.args):
        return None
    x = root.args[0] if root.args[1] == 1 else root.args[1]
    return sympy.Piecewise((x**2 / (root + 1), sympy.Abs(x) < 1), (node, True))


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


def _conjugate_regime(node: sympy.Basic, positive: frozenset) -> sympy.Basic | None:
    """a + b*sqrt(R) -> (a**2 - b**2 R)/(a - b*sqrt(R)) where a and b*sqrt(R) have opposite
    signs, when a**2 - b**2 R is simpler (the squares cancel): squareplus
    (x + sqrt(x**2 + c))/2 is c/(2 (sqrt(x**2 + c) - x)) for x < 0, the quadratic formula's
    (-p + sqrt(p**2 - 4q))/2 is 2q/(p + sqrt(p**2 - 4q)) for p > 0, and a sum over a
    common root, 1/2 + x/(2 sqrt(x**2 + c)), is the same cancellation. Where the signs
    agree the sum does not cancel (and the conjugate would): the formula as written.
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
        if _degree(difference) >= _degree(even**2):
            continue  # the squares do not cancel: nothing gained
        # halves: a - b*sqrt(R) overflows for |a| past half the largest float (float32's
        # squareplus at x = -3e38), its halves do not; the number factor stays outside
        # (SymPy would distribute it over the sum)
        halves = Add(even / 2, -odd * s / 2)
        conjugate = (difference / (2 * den) * Pow(halves, -1)).xreplace({s: root})
        written = (powers).xreplace({s: root})
        return sympy.Piecewise((conjugate, even * odd < 0), (written, True))
    return None


def guard_tails(expr: sympy.Expr) -> sympy.Expr:
    """The sigmoid tail (:func:`_sigmoid_tail`) wherever a cofactor can overflow on its own
    (a power of x >= 2, or softplus, log or |x|), whatever the choice said.

    The choice measures in NumPy; the generated code groups numbers and updates temporaries
    in place, so gamma**2 * softplus(-z) may be computed (and overflow, in float32) before it
    meets sigmoid(z)**2 = 0. Where the tail applies the exact value is below 1e-300.
    """

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
            return _sigmoid_tail(node) or node
        return node

    return visit(expr)


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

    One bottom-up pass: a branch made here is not visited again (its fallback is the sum).
    ``near_zero``: whether to look for removable singularities (not inside a formula that
    has its own polynomial near 0).
    """
    if expr.is_Atom or not expr.args or isinstance(expr, sympy.Piecewise):
        return expr
    # Rational functions as a whole (top-down): rescaling only the denominator of a
    # quotient would leave the numerator's powers to overflow.
    whole = _rational_tail(expr, params)
    if whole is not None:
        return whole
    # the formula's own asymptote and limit at 0 (top-down): of the formula, not of its
    # parts' branches, so that leading terms cancel symbolically
    tail = _erfcx_inv_tail(expr)
    rest = _split_parts(expr, params, positive, near_zero)
    return rest if tail is None else sympy.Piecewise(tail, (rest, True))


def _split_parts(
    expr: sympy.Expr, params: frozenset, positive: frozenset, near_zero: bool
) -> sympy.Expr:
    """:func:`split_regimes` but for the formula's asymptote."""
    removable = _removable_regime(expr) if near_zero else None
    inner = near_zero and removable is None
    args = tuple(split_regimes(a, params, positive, inner) for a in expr.args)
    node = expr.func(*args) if args != expr.args else expr
    if removable is not None:
        return sympy.Piecewise(removable, (_regime(node, params, positive), True))
    return _regime(node, params, positive)


def _regime(node: sympy.Basic, params: frozenset, positive: frozenset) -> sympy.Basic:
    """``node`` split by the first regime rule that applies to it (itself if none does)."""
    return (
        _conjugate_regime(node, positive)
        or _series_regime(node)
        or _gaussian_tail(node)
        or _sigmoid_tail(node)
        or _rational_tail(node, params)
        or _log1p_tail(node, params, positive)
        or _hypot_minus_one(node)
        or _log_erfc_tail(node)
        or _log_ratio(node)
        or node
    )


#: Largest power of the exponential in :func:`exp_rational`'s polynomials.
_EXP_RATIONAL_MAX_DEGREE = 6
#: exp(-b) is 0 in float64 (and float32) past this.
_EXP_UNDERFLOW = 745.2


def exp_rational(expr: sympy.Expr) -> sympy.Expr | None:
    """``expr`` as a rational function of one exponential, evaluated from ``t = exp(-|b|)``.

    Where every transcendental in ``expr`` is a function of ``exp(b)`` for one argument
    ``b`` (sigmoid, softplus inside tanh, tanh, their derivatives...), the whole formula is
    ``P(u)/Q(u)`` with ``u = exp(b)``: mish's gradient, softplus then tanh then sigmoid and
    a squared sech, is one exp and a dozen multiplies. Evaluated as ``P(t)/Q(t)`` for
    ``b < 0`` and, multiplied through by ``t**deg``, as the reversed polynomials of ``t``
    for ``b >= 0``, no power overflows. ``None`` where ``expr`` is not such a function,
    the sign of ``b`` is fixed, or ``expr`` makes a single call. Whether the result is
    accurate (the polynomials may cancel) is for the measured choice to say.
    """
    calls = {f for f in expr.atoms(sympy.Function) if not isinstance(f, sympy.Abs)}
    if expr.has(sympy.Piecewise) or len(calls) < 2:
        return None  # one call (sigmoid(x)) is best left to the framework's op
    naive = expr.rewrite("naive").rewrite(exp)
    exps = naive.atoms(exp)
    if not exps:
        return None
    first, *rest = sorted({e.args[0] for e in exps}, key=sympy.default_sort_key)
    ratios = [sympy.nsimplify(a / first) for a in rest]
    if not all(r.is_Rational for r in ratios):
        return None
    scale = sympy.ilcm(1, 1, *(r.q for r in ratios))
    base = first / scale
    # trigonometric functions rewrite to exp(I*x): complex, with no sign to split on
    if not base.is_extended_real or base.is_nonnegative or base.is_nonpositive:
        return None
    if not base.free_symbols:
        return None
    # a factor free of b's symbols (the upstream gradient) multiplies the result once
    factor, naive = naive.as_independent(*base.free_symbols, as_Add=False)
    u = sympy.Dummy("u", positive=True)
    powers = {exp(a): u ** (a / base) for a in {first, *rest}}
    rational = sympy.cancel(sympy.together(naive.xreplace(powers)))
    num, den = sympy.fraction(rational)
    try:
        num, den = sympy.Poly(num, u), sympy.Poly(den, u)
    except sympy.PolynomialError:
        return None
    if any(c.has(exp, log) for c in (*num.coeffs(), *den.coeffs())):
        return None
    degree = max(num.degree(), den.degree())
    if not 0 < degree <= _EXP_RATIONAL_MAX_DEGREE:
        return None
    # the coefficients' common factors (x in mish: x*(1 + 2t)) multiply once, outside
    (num_content, num), (den_content, den) = num.primitive(), den.primitive()
    factor *= num_content / den_content
    t = sympy.Dummy("t", positive=True)
    coeffs = (*num.coeffs(), *den.coeffs())
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

    def horner(poly: sympy.Poly, reverse: bool) -> sympy.Expr:
        coeffs = poly.all_coeffs()  # highest power first
        coeffs = [sympy.S.Zero] * (degree + 1 - len(coeffs)) + coeffs
        if reverse:  # u = 1/t, times t**degree
            coeffs.reverse()
        value = sympy.S.Zero
        for c in coeffs[:-1]:  # those that meet a power of t
            value = (value + c.xreplace(bounded)) * t
        return value + coeffs[-1]

    def at(small: sympy.Expr, reverse: bool) -> sympy.Expr:
        return (horner(num, reverse) / horner(den, reverse)).xreplace({t: small})

    small = exp(-sympy.Abs(base))
    branches = [(at(small, True), base >= 0), (at(small, False), True)]
    if limits:
        branches = [
            (at(sympy.S.Zero, True), base > _EXP_UNDERFLOW),
            (at(sympy.S.Zero, False), base < -_EXP_UNDERFLOW),
            *branches,
        ]
    return factor * sympy.Piecewise(*branches)


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
