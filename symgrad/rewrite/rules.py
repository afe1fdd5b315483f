"""Rewrite rules that turn naive formulas into numerically stable ones: the ``stabilize``
and ``clamp`` phases (:mod:`symgrad.rewrite.phases`).

Each rule is a plain function ``rule(node) -> replacement | None`` looking at one SymPy
node whose arguments are already rewritten, registered with its phase; :func:`stabilize`
applies a phase's rules bottom-up to a fixed point, in the order they are written here.
The rules follow PyTensor's stabilize phase: exact identities whose right-hand side has no
overflow, cancellation or unused-branch NaN where the left has. Pure SymPy: nothing here
evaluates (the plan imports this module).
"""

from __future__ import annotations

from collections.abc import Callable

import sympy
from sympy import Add, Mul, Pow, exp, log

from symgrad.functions import (
    arctan2,
    cospi,
    dsigmoid,
    erfcx,
    erfcx_inv,
    expm1,
    exprel,
    hypot,
    hypot_ratio,
    hypot_ratio_scaled,
    log1mexp,
    log1p,
    log1prel,
    logaddexp,
    logcosh,
    one_plus_erf,
    sigmoid,
    sinc_d,
    sincpi_d,
    sinpi,
    softplus,
    xlog1py,
    xlogy,
)
from symgrad.rewrite.phases import phase, register

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


# The stabilize phase: tried on each node in this order.


@register("stabilize")
def log_reciprocal(node):
    """log(1/x) -> -log(x)."""
    if isinstance(node, log) and isinstance(node.args[0], Pow) and node.args[0].exp == -1:
        return -log(node.args[0].base)
    return None


@register("stabilize")
def log_one_plus(node):
    """log(1 + u) -> log1p(u)."""
    if isinstance(node, log):
        rest = _split_add(node.args[0], sympy.S.One)
        if rest is not None:
            return log1p(rest)
    return None


@register("stabilize")
def log1p_exp(node):
    """log1p(exp(a)) -> softplus(a)."""
    if isinstance(node, log1p) and isinstance(node.args[0], exp):
        return softplus(node.args[0].args[0])
    return None


@register("stabilize")
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


@register("stabilize")
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


@register("stabilize")
def log_acosh(node):
    """log(x + sqrt(x**2 - 1)) -> acosh(x) (Herbie's acosh-def, read right to left): the sum
    is 2x and overflows where x is past half the largest float (1e308; 1.7e38 in float32),
    while the value is about 710 (89). Where the left side is defined (x >= 1) they agree;
    below it both are NaN. The root as sqrt(x - 1)*sqrt(x + 1) too."""
    if not (isinstance(node, log) and isinstance(node.args[0], Add)):
        return None
    if len(node.args[0].args) != 2:
        return None
    for x, root in (node.args[0].args, node.args[0].args[::-1]):
        if isinstance(root, Pow) and root.exp == sympy.S.Half:
            if sympy.expand(root.base - x**2 + 1) == 0:
                return sympy.acosh(x)
        elif isinstance(root, Mul) and len(root.args) == 2:
            bases = []
            for factor in root.args:
                if isinstance(factor, Pow) and factor.exp == sympy.S.Half:
                    bases.append(sympy.expand(factor.base - x))
            if sorted(bases, key=sympy.default_sort_key) == [-1, 1]:
                return sympy.acosh(x)
    return None


@register("stabilize")
def log_cosh(node):
    """log(cosh(a)) -> logcosh(a): cosh overflows long before the result."""
    if isinstance(node, log) and isinstance(node.args[0], sympy.cosh):
        return logcosh(node.args[0].args[0])
    return None


@register("stabilize")
def exp_minus_one(node):
    """c*exp(a) - c -> c*expm1(a) (SymPy distributes c over exp(a) - 1 on its own)."""
    if not isinstance(node, Add):
        return None
    for term in node.args:
        coeff, rest = term.as_coeff_Mul()
        if isinstance(rest, exp) and -coeff in node.args:
            return coeff * expm1(rest.args[0]) + _drop(node, term, -coeff)
    return None


@register("stabilize")
def reciprocal_one_plus_exp(node):
    """1 / (1 + exp(a)) -> sigmoid(-a), also for other negative integer powers."""
    if isinstance(node, Pow) and node.exp.is_Integer and node.exp < 0:
        rest = _split_add(node.base, sympy.S.One)
        if isinstance(rest, exp):
            return sigmoid(-rest.args[0]) ** (-node.exp)
    return None


@register("stabilize")
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


@register("stabilize")
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


@register("stabilize")
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


@register("stabilize")
def log_sigmoid(node):
    """log(sigmoid(a)) -> -softplus(-a)."""
    if isinstance(node, log) and isinstance(node.args[0], sigmoid):
        return -softplus(-node.args[0].args[0])
    return None


@register("stabilize")
def one_minus_sigmoid(node):
    """1 - sigmoid(a) -> sigmoid(-a)."""
    rest = _split_add(node, sympy.S.One)
    if rest is None:
        return None
    for term in Add.make_args(rest):
        if isinstance(-term, sigmoid):
            return sigmoid(-(-term).args[0]) + (rest - term)
    return None


@register("stabilize")
def one_minus_two_sigmoid(node):
    """c - 2c sigmoid(u) -> -c tanh(u/2) (c a number: 1 - 2 sigmoid(u), 2 sigmoid(u) - 1):
    no cancellation for small u."""
    if not isinstance(node, Add):
        return None
    for c in node.args:
        if not c.is_Number:
            continue
        for term in node.args:
            coeff, factor = term.as_coeff_Mul()
            if coeff == -2 * c and isinstance(factor, sigmoid):
                return -c * sympy.tanh(factor.args[0] / 2) + _drop(node, c, term)
    return None


@register("stabilize")
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


@register("stabilize")
def log_minus_expm1(node):
    """log(-expm1(a)) (what log(1 - exp(a)) becomes) -> log1mexp(a)."""
    if isinstance(node, log):
        arg = node.args[0]
        if isinstance(-arg, expm1):
            return log1mexp((-arg).args[0])
    return None


@register("stabilize")
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


@register("stabilize")
def sqrt_sum_squares(node):
    """(x**2 + y**2)**(k/2) -> hypot(x, y)**k."""
    if isinstance(node, Pow) and node.exp.is_Rational and node.exp.q == 2:
        terms = node.base.args if isinstance(node.base, Add) else ()
        if len(terms) == 2 and all(isinstance(t, Pow) and t.exp == 2 for t in terms):
            return hypot(terms[0].base, terms[1].base) ** node.exp.p
    return None


@register("stabilize")
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


@register("stabilize")
def x_log_x(node):
    """x * log(x) -> xlogy(x, x): 0 at x = 0 instead of 0 * -inf = NaN."""
    if not isinstance(node, Mul):
        return None
    for factor in node.args:
        if isinstance(factor, log) and factor.args[0] in node.args:
            return _drop(node, factor, factor.args[0]) * xlogy(factor.args[0], factor.args[0])
    return None


@register("stabilize")
def log_expm1(node):
    """log(expm1(a)) -> a + log1mexp(-a): expm1 overflows for a > 709.8, the log does not."""
    if isinstance(node, log) and isinstance(node.args[0], expm1):
        a = node.args[0].args[0]
        return a + log1mexp(-a)
    return None


@register("stabilize")
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


@register("stabilize")
def one_minus_cos(node):
    """c - c*cos(a) -> 2c sin(a/2)**2: no cancellation near a = 0."""
    if not isinstance(node, Add):
        return None
    for term in node.args:
        coeff, factor = term.as_coeff_Mul()
        if isinstance(factor, sympy.cos) and -coeff in node.args:
            return -2 * coeff * sympy.sin(factor.args[0] / 2) ** 2 + _drop(node, term, -coeff)
    return None


@register("stabilize")
def cosh_minus_one(node):
    """c*cosh(a) - c -> 2c sinh(a/2)**2: no cancellation near a = 0."""
    if not isinstance(node, Add):
        return None
    for term in node.args:
        coeff, factor = term.as_coeff_Mul()
        if isinstance(factor, sympy.cosh) and -coeff in node.args:
            return 2 * coeff * sympy.sinh(factor.args[0] / 2) ** 2 + _drop(node, term, -coeff)
    return None


@register("stabilize")
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


@register("stabilize")
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


@register("stabilize")
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


@register("stabilize")
def sqrt_minus_one(node):
    """sqrt(a) - 1 -> (a - 1)/(sqrt(a) + 1) when a - 1 is simpler: cancels near a = 1.

    hypot(x, 1) - 1 (what sqrt(x**2 + 1) - 1 becomes) is split by regime instead, see
    :func:`~symgrad.rewrite.regimes.hypot_minus_one`.
    """
    if not isinstance(node, Add) or sympy.S.NegativeOne not in node.args or len(node.args) != 2:
        return None
    (root,) = (t for t in node.args if t != -1)
    if isinstance(root, Pow) and root.exp == sympy.S.Half:
        difference = sympy.expand(root.base - 1)
        if sympy.count_ops(difference) < sympy.count_ops(root.base):
            return difference / (root + 1)
    return None


@register("stabilize")
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


@register("stabilize")
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


@register("stabilize")
def abs_of_power(node):
    """|u**e| -> |u|**e for a fractional e: equal for every u (on the principal branch
    |u**e| = exp(e*log|u|) for real e), and u**e is NaN in floats for u < 0 (what simplify
    makes of the derivative of sqrt(|u|): u*|u**(-3/2)|)."""
    if isinstance(node, sympy.Abs) and isinstance(node.args[0], Pow):
        base, e = node.args[0].args
        if e.is_Rational and not e.is_Integer:
            return sympy.Abs(base) ** e
    return None


@register("stabilize")
def sign_from_abs(node):
    """u**a * |u|**b -> sign(u)**a * |u|**(a + b) (integers a, b; equal for u != 0): SymPy's
    simplify writes sign(x) as x/|x|, and x * g(|x|/s) / |x| divides by a tiny x before the
    product has the g that makes it tame (a logistic density's gradient at x = 1e-216,
    s = 1e-85: inf where the value is 1e253)."""
    if not isinstance(node, Mul):
        return None
    for f in node.args:
        a_base, b = f.as_base_exp()
        if not (isinstance(a_base, sympy.Abs) and b.is_Integer):
            continue
        u = a_base.args[0]
        for g in node.args:
            base, a = g.as_base_exp()
            if base == u and a.is_Integer:
                sign = sympy.sign(u) if a % 2 else sympy.Integer(1)
                return _drop(node, f, g) * sign * a_base ** (a + b)
    return None


def _log1p_relative(a: sympy.Expr) -> sympy.Expr:
    """``a`` with log1p(v) written v*log1prel(v) and xlog1py(w, v) written w*v*log1prel(v)."""

    def relative(f: sympy.Expr) -> sympy.Expr:
        v = f.args[-1]
        return sympy.Mul(*f.args[:-1], v, log1prel(v))

    return a.replace(lambda f: isinstance(f, (log1p, xlog1py)), relative)


def _divides_out(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
    """a/b with a factor of b cancelled (i*log1prel(i/n) / i -> log1prel(i/n)), or None
    where a and b share no factor with an input in it."""
    try:
        if not sympy.gcd(sympy.fraction(sympy.cancel(a))[0], b).free_symbols:
            return None
    except sympy.PolynomialError:  # a generator SymPy's gcd cannot take
        return None
    ratio = sympy.cancel(a / b)
    return None if ratio == 0 else ratio


@register("stabilize")
def expm1_over_x(node):
    """expm1(a) / a -> exprel(a) (also c*expm1(a)/a' when a = c*a'): 0/0 at 0, and inf/a
    for a in [709.8, 716] where exp overflows but the quotient does not. Also where a has
    a log1p(v) or xlog1py(w, v) whose v shares a factor with the denominator b: expm1(a)/b
    -> exprel(a) * a/b with log1p(v) = v*log1prel(v): ((1 + i/n)**n - 1)/(i/n), that is
    n*expm1(xlog1py(n, i/n))/i, -> n*log1prel(i/n)*exprel(i*log1prel(i/n)), which is n
    where i/n underflows (0 or NaN before: n/i is inf) and has derivatives that do not cancel
    near i = 0 (compound interest)."""
    if not isinstance(node, Mul):
        return None
    for e in (f for f in node.args if isinstance(f, expm1)):
        a = e.args[0]
        relative = _log1p_relative(a)
        for p in (f for f in node.args if isinstance(f, Pow) and f.exp == -1):
            ratio = sympy.cancel(a / p.base)
            if ratio.is_number and ratio != 0:
                return _drop(node, e, p) * ratio * exprel(a)
            if relative != a and (ratio := _divides_out(relative, p.base)) is not None:
                return _drop(node, e, p) * ratio * exprel(relative)
    return None


@register("stabilize")
def log1p_over_x(node):
    """log1p(v) / b -> (v/b) * log1prel(v) where v and b share a factor (also
    xlog1py(w, v) / b -> (w*v/b) * log1prel(v)): log1p(x)/x is 0/0 at 0 and its
    derivative, (x/(1 + x) - log1p(x))/x**2, keeps about x**2 of its digits; log1prel's
    derivatives do not cancel."""
    if not isinstance(node, Mul):
        return None
    for f in (f for f in node.args if isinstance(f, (log1p, xlog1py))):
        relative = _log1p_relative(f)
        for p in (g for g in node.args if isinstance(g, Pow) and g.exp == -1):
            ratio = _divides_out(relative, p.base)
            if ratio is not None:
                return _drop(node, f, p) * ratio
    return None


@register("stabilize")
def sine_over_argument(node):
    """sin(a)**k/a**k -> sinc_d(0, a)**k and sinpi(a)**k/a**k -> (pi*sincpi_d(0, a))**k
    (also sin(a)/a' where a = c*a', c free of the inputs: sin(pi*x)/x; the denominator's
    powers spread over the product: sin(pi*t*x) / (pi**2 * t * x**2)): 0/0 at 0, and a
    derivative that does not cancel. d/dx sin(x)/x, (x*cos(x) - sin(x))/x**2, keeps about
    x**2 of its digits (none of float32's at x = 1e-4); the derivative of sinc_d(n, x) is
    sinc_d(n + 1, x), which has a Taylor regime there."""
    if not isinstance(node, Mul):
        return None
    powers = node.as_powers_dict()
    for f in node.args:
        sine, k = f.as_base_exp()
        if not (isinstance(sine, (sympy.sin, sinpi)) and k.is_Integer and k > 0):
            continue
        a = sine.args[0]
        c, rest = a.as_independent(*a.free_symbols, as_Add=False)
        if not rest.free_symbols:
            continue
        need = rest.as_powers_dict()
        have = {b: sympy.sympify(powers.get(b, 0)) for b in need}  # x**p: p is no number
        if all(
            e.is_Integer and e > 0 and have[b].is_Integer and have[b] <= -e * k
            for b, e in need.items()
        ):
            sinc = sympy.pi * sincpi_d(0, a) if isinstance(sine, sinpi) else sinc_d(0, a)
            return node / f * (rest * c * sinc) ** k
    return None


@register("stabilize")
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


@register("stabilize")
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


def _hypot_sum_ratios(f: sympy.Expr, h: hypot) -> sympy.Expr | None:
    """``f / h`` term by term, for ``f`` a sum of terms c*x, c*y or c*h (c a number, x and
    y the arguments of ``h``) with at least one of x or y; else None."""
    if not isinstance(f, Add):
        return None
    ratios = []
    for term in f.args:
        c, b = term.as_coeff_Mul()
        if b == h:
            ratios.append(c)
        elif b in h.args:
            ratios.append(c * hypot_ratio.of(b, *h.args))
        else:
            return None
    return None if all(r.is_Number for r in ratios) else Add(*ratios)


@register("stabilize")
def hypot_power_ratio(node):
    """y**m / hypot(x, y)**k -> hypot_ratio(y, x, y)**m / hypot(x, y)**(k-m) (m < k): each
    ratio is at most 1, where hypot**k overflows long before the value (y**2/hypot**3).
    Where x or y is computed, m = k too: y/hypot(x, y) is inf/inf where y overflows
    (sinh(Ce)/hypot(cos(Cn), sinh(Ce)) at Ce = 1000, whose value is 1), and the ratio is
    then :class:`~symgrad.functions.hypot_ratio_scaled`.

    A sum of such terms of degree 1 (c*x, c*y, c*hypot(x, y), c a number) over hypot**k
    is divided by one hypot term by term: (2*re + hypot(im, re))/hypot(im, re)**2, in the
    complex square root's second derivative, is inf/inf at re = 1e308 (2*re overflows),
    (2*hypot_ratio(re, im, re) + 1)/hypot(im, re) is 0 there, as the value nearly is."""
    if not isinstance(node, Mul):
        return None
    for h in node.args:
        base, power = h.as_base_exp()
        if not (isinstance(base, hypot) and power.is_Integer and power <= -1):
            continue
        for f in node.args:
            ratios = _hypot_sum_ratios(f, base)
            if ratios is not None:
                return _drop(node, h, f) * ratios * base ** (power + 1)
            b, m = f.as_base_exp()
            if not (b in base.args and m.is_Integer and 1 <= m <= -power):
                continue
            ratio = hypot_ratio.of(b, *base.args)
            if m < -power or isinstance(ratio, hypot_ratio_scaled):
                return _drop(node, h, f) * ratio**m * base ** (power + m)
    return None


@register("stabilize")
def sum_to_product(node):
    """c*sin(a) - c*sin(b) -> 2c cos((a+b)/2) sin((a-b)/2), c*sin(a) + c*sin(b) ->
    2c sin((a+b)/2) cos((a-b)/2), c*cos(a) - c*cos(b) -> -2c sin((a+b)/2) sin((a-b)/2),
    c*tan(a) -+ c*tan(b) -> c sin(a -+ b)/(cos(a) cos(b)),
    where a - b (a + b for the sum) has fewer symbols than a or b: sin(x + e) - sin(x)
    keeps no digit of cos(x) e for small e, sin(e/2) keeps them all. (The sum is the
    difference as SymPy writes it: sin(x + e) - sin(x - e) is sin(e + x) + sin(e - x).)"""
    if not isinstance(node, Add):
        return None
    for term in node.args:
        coeff, factor = term.as_coeff_Mul()
        if not isinstance(factor, (sympy.sin, sympy.cos, sympy.tan)):
            continue
        for other in node.args:
            c2, f2 = other.as_coeff_Mul()
            if f2.func is not factor.func or f2 == factor:
                continue
            a, b = factor.args[0], f2.args[0]
            half_sum, half_difference = (a + b) / 2, (a - b) / 2
            if isinstance(factor, sympy.tan) and c2 in (coeff, -coeff):
                cancels = (a - b,) if c2 == -coeff else (a + b,)
                value = sympy.sin(cancels[0]) / (2 * sympy.cos(a) * sympy.cos(b))
            elif c2 == -coeff and isinstance(factor, sympy.sin):
                cancels, value = (a - b,), sympy.cos(half_sum) * sympy.sin(half_difference)
            elif c2 == coeff and isinstance(factor, sympy.sin):
                cancels, value = (a + b,), sympy.sin(half_sum) * sympy.cos(half_difference)
            elif c2 == -coeff:
                cancels = (a - b, a + b)
                value = -sympy.sin(half_sum) * sympy.sin(half_difference)
            else:
                continue
            most = max(len(a.free_symbols), len(b.free_symbols))
            if any(len(c.free_symbols) < most for c in cancels):
                return 2 * coeff * value + _drop(node, term, other)
    return None


#: Past this |y|, tan_quarter_turn writes tan(pi/4 + y) through tan(y) where 2y could
#: overflow (float32 from 1.7e38); pi/4 is lost in the sum from 2**53 * pi/4 on.
_QUARTER_TURN_DOUBLE_MAX = sympy.Float(1e38)


@register("stabilize")
def tan_quarter_turn(node):
    """tan(pi/4 + y) -> (1 + sin(2y))/cos(2y) where sin(2y) >= 0, cos(2y)/(1 - sin(2y))
    where not; cot(pi/4 + y) -> their reciprocals, tan(-pi/4 + y) -> -cot(pi/4 + y) and
    cot(-pi/4 + y) -> -tan(pi/4 + y) (the constant taken modulo pi; SymPy writes
    tan(pi/4 - y) as cot(pi/4 + y)). Herbie's hang-p-tan, tan((a + b)/2) = (sin(a) +
    sin(b))/(cos(a) + cos(b)), at a = +-pi/2.

    The sum pi/4 + y is rounded before tan sees it: where it is near a multiple of pi
    (tan(pi/4 - phi/2) at phi = pi/2 - 1e-8, the map projections' tsfn) its digits are
    gone, and past |y| = 2**53 pi/4 is gone altogether; 2y is exact and sin and cos
    reduce it against pi to the last bit. Each branch divides by 1 + |sin(2y)| or
    multiplies by it over a cosine: no cancellation on either side. Where 2y is not y's
    half undone (tan(pi/4 + x): 2x overflows past |x| = 1.7e38 in float32, where the value
    is finite), (1 + tan(y))/(1 - tan(y)) past |y| = 1e38 (_QUARTER_TURN_DOUBLE_MAX),
    where pi/4 is long gone from the sum and tan(y) is reduced to the last bit."""
    if not isinstance(node, (sympy.tan, sympy.cot)) or not isinstance(node.args[0], Add):
        return None
    angle = node.args[0]
    c, y = angle.as_independent(*angle.free_symbols, as_Add=True)
    if not (y.free_symbols and c.is_number and c.has(sympy.pi)):
        return None
    turns = sympy.nsimplify(c / (sympy.pi / 4))
    if not (turns.is_Integer and turns % 2 == 1):
        return None
    double = 2 * y
    s, co = sympy.sin(double), sympy.cos(double)
    tan = [(co / (1 - s), s < 0), ((1 + s) / co, True)]  # tan(pi/4 + y)
    cot = [((1 - s) / co, s < 0), (co / (1 + s), True)]  # cot(pi/4 + y)
    if sympy.count_ops(double) >= sympy.count_ops(y):  # 2y may overflow where y does not
        t, big = sympy.tan(y), sympy.Abs(y) > _QUARTER_TURN_DOUBLE_MAX
        tan, cot = [((1 + t) / (1 - t), big), *tan], [((1 - t) / (1 + t), big), *cot]
    tan, cot = sympy.Piecewise(*tan), sympy.Piecewise(*cot)
    if turns % 4 == 1:
        return tan if isinstance(node, sympy.tan) else cot
    return -cot if isinstance(node, sympy.tan) else -tan  # a quarter turn back: -pi/4


#: c*pi/4 and c*pi/2 as c*atan(b): b = 1 and b infinite (None).
_ATAN_CONSTANTS = {sympy.pi / 4: sympy.S.One, sympy.pi / 2: None}


def _atan_terms(node: Add) -> list[tuple[sympy.Basic, sympy.Expr, sympy.Expr | None]]:
    """(term, c, b) for each term of ``node`` that is c*atan(b), pi/4 and pi/2 multiples
    included (b = 1 and b = None, infinite)."""
    out = []
    for term in node.args:
        c, factor = term.as_independent(sympy.atan, as_Add=False)
        if isinstance(factor, sympy.atan):
            out.append((term, c, factor.args[0]))
        elif term.is_number and term.has(sympy.pi):
            for angle, b in _ATAN_CONSTANTS.items():
                c = sympy.nsimplify(term / angle)
                if c.is_Rational:
                    out.append((term, c, b))
    return out


@register("stabilize")
def atan_difference(node):
    """c*atan(a) - c*atan(b) -> c*atan2(a - b, 1 + a*b), c*atan(a) + c*atan(b) ->
    c*atan2(a + b, 1 - a*b), b a formula, 1 (c*pi/4) or infinite (c*pi/2: atan(a) - pi/2 ->
    atan2(-1, a)). atan(N + 1) - atan(N) keeps no digit at N = 1e8, atan2(1, 1 + N*(N + 1))
    keeps them all. For every real a and b: (1 + i a)(1 - i b) = 1 + a b + i (a - b), whose
    argument is atan(a) - atan(b), in (-pi, pi) (Herbie's diff-atan)."""
    if not isinstance(node, Add):
        return None
    terms = _atan_terms(node)
    for i, (term, c, a) in enumerate(terms):
        if a is None or not a.free_symbols:
            continue
        for other, c2, b in terms[i + 1 :] + terms[:i]:
            if other == term or not ((c2 + c).is_zero or (c2 - c).is_zero):
                continue  # (is_zero: 2.0 == 2 is False in SymPy)
            sign = -1 if (c2 + c).is_zero else 1  # atan(a) + sign*atan(b)
            if sign == -1 and b is not None and c.could_extract_minus_sign():
                c, a, b = -c, b, a  # atan(N + 1) - atan(N): atan2(1, ...), not -atan2(-1, ...)
            if b is None:
                value = arctan2(-1, a) if sign == -1 else arctan2(1, -a)
            else:
                value = arctan2(a - b, 1 + a * b) if sign == -1 else arctan2(a + b, 1 - a * b)
            return c * value + _drop(node, term, other)
    return None


#: Largest condition (SymPy op count, and total degree) whose sign :func:`sign_of_factors`
#: factors: factoring is fast up to there (x**60 - y**60 took SymPy 28 s).
_SIGN_MAX_OPS = 40
_SIGN_MAX_DEGREE = 8


@register("stabilize")
def sign_of_factors(node):
    """u >= 0 -> sign(f1)*sign(f2)*... >= 0 (and >, <, <=) for u a rational function,
    its factors f1, f2, ... (u factored; a factor of even power in the denominator left
    out, in the numerator sign(f)**2), with exact coefficients and a total degree of at
    most :data:`_SIGN_MAX_DEGREE`, where that leaves out a power or more than one factor,
    and u is a quotient or a sum (a product's own sign, beta*x <= 0, overflows to the
    infinity of that sign, and is computed already).

    SymPy's derivative of |u| branches on the sign of u as written: (a**2 - b**2)/a**2 >= 0
    is inf - inf, NaN, at a = -6e226, b = 8e213 (and False: the other branch, NaN under
    its root), where sign(a - b)*sign(a + b) is 1. The sign of a product is the product
    of the signs, which neither overflow nor underflow. The same wherever u is defined
    (u is 0 where a factor is, and so is the product), but at a NaN: torch's sign(NaN) is
    0, so a NaN input takes a non-strict comparison's branch, where u as written takes the
    other (either branch computes with the NaN)."""
    if not isinstance(node, (sympy.Ge, sympy.Gt, sympy.Le, sympy.Lt)):
        return None
    if node.rhs != 0:
        return None
    u = node.lhs
    symbols = sorted(u.free_symbols, key=sympy.default_sort_key)
    if (
        not isinstance(u, (Add, Mul, Pow))
        or u.has(sympy.Piecewise, sympy.sign, sympy.Float)  # (floats factor inexactly)
        or sympy.count_ops(u) > _SIGN_MAX_OPS
        or not u.is_rational_function(*symbols)
    ):
        return None
    num, den = sympy.fraction(sympy.together(u))
    if not den.free_symbols and not isinstance(num, Add):
        return None  # a product's sign as written: it overflows to inf of its sign (beta*x)
    try:
        degree = sum(sympy.Poly(p, *symbols).total_degree() for p in (num, den))
    except sympy.PolynomialError:
        return None
    if degree > _SIGN_MAX_DEGREE:
        return None
    num, den = sympy.fraction(sympy.factor(num / den))
    coeff, signs, powers = sympy.S.One, [], False
    for side in (num, den):
        for f in Mul.make_args(side):
            if f.is_number:
                coeff *= sympy.sign(f)
                continue
            base, e = f.as_base_exp()
            if not e.is_Integer:
                return None
            powers = powers or abs(e) > 1
            if e % 2:
                signs.append(sympy.sign(base))
            elif side is num:
                signs.append(sympy.sign(base) ** 2)
    if len(signs) < 2 and not powers:
        return None  # one factor to the first power: its sign is no safer than it is
    if not coeff.is_number or coeff == 0:
        return None
    product = Mul(*signs) if coeff > 0 else -Mul(*signs)
    return node.func(product, 0)


# The clamp phase: on the chosen form only.


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


@register("clamp")
def clamp_select(node):
    """Piecewise((k*a, |a| <= c), (k*c*sign(a), True)) -> k*Min(Max(a, -c), c), for k
    free of a and c > 0 (Huber's and hardtanh's gradients).

    The same value everywhere, +-inf included, in one clamp where the select is five
    passes over memory in eager code (two comparisons, their and, the sign, the select).
    A NaN stays NaN (as in F.huber_loss's gradient; torch's sign(NaN) is 0, so the select
    gave 0 there). Either sign of a: the clamp is odd. A clamp-phase rule, not a
    stabilize one: applied to the chosen form only, never to what is differentiated
    (SymPy's derivative of Min/Max is Heaviside(0) = 1/2 at |a| = c, the select's is the
    branch its condition takes there).
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


def stabilize(expr: sympy.Expr, rules: tuple[Rule, ...] | None = None) -> sympy.Expr:
    """Apply ``rules`` (the stabilize phase's by default) bottom-up until none applies;
    with the stabilize phase's, then write trigonometric functions of pi times a formula
    with :func:`_pi_turns`."""
    if rules is not None:
        return _rewrite(expr, rules)
    return _pi_turns(_rewrite(expr, phase("stabilize").rewrites))


def _pi_turns(expr: sympy.Expr) -> sympy.Expr:
    """sin(pi*u) -> sinpi(u), cos(pi*u) -> cospi(u), tan(pi*u) -> sinpi(u)/cospi(u),
    sinc_d(n, pi*u) -> sincpi_d(n, u)/pi**n, for u free of pi: u is reduced before pi
    multiplies it (0 at every integer u, where sin(pi*u) is 1.2e-16 at u = 1; the digits
    of u - n near an integer n).

    After the rules, not one of them: the trigonometric rules (1 - cos(a), sin(a) -
    sin(b), the addition theorem) see sin and cos, and their results get the reduction
    too (1 - cos(pi*u) -> 2*sin(pi*u/2)**2 -> 2*sinpi(u/2)**2)."""

    def turns(node: sympy.Expr) -> sympy.Expr:
        argument = node.args[-1]
        u = sympy.expand(argument / sympy.pi)
        if u.has(sympy.pi) or not u.free_symbols:
            return node
        if isinstance(node, sinc_d):  # f(pi*u) where g(u) = f(pi*u): g^(n) = pi**n f^(n)
            n = node.args[0]
            return sincpi_d(n, u) / sympy.pi**n
        if isinstance(node, sympy.sin):
            return sinpi(u)
        if isinstance(node, sympy.cos):
            return cospi(u)
        return sinpi(u) / cospi(u)

    return expr.replace(
        lambda e: (
            (
                isinstance(e, (sympy.sin, sympy.cos, sympy.tan))
                or (isinstance(e, sinc_d) and not isinstance(e, sincpi_d))
            )
            and e.args[-1].has(sympy.pi)
        ),
        turns,
    )
