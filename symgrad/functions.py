"""symgrad's own SymPy functions: the numerically stable primitives.

Each one has its derivative in stable terms (``fdiff``), a high-precision mpmath
evaluation (``mp``, used for reference values and accuracy measurement) and a naive
SymPy definition (``naive``, what a user would write; used to cross-check). Each class's
row in :mod:`symgrad.ops` maps it to the best framework op.
"""

from __future__ import annotations

import builtins
import functools
import math
from collections.abc import Callable
from fractions import Fraction

import mpmath
import sympy
from sympy import Heaviside, exp, log, sqrt
from sympy.core.function import ArgumentIndexError
from sympy.printing.precedence import PRECEDENCE

#: :func:`piecewise_folded` folds a formula whose branches combine into at most this many
#: (the product of its Piecewise nodes' branch counts).
FOLD_MAX_BRANCHES = 256


def piecewise_folded(expr: sympy.Expr) -> sympy.Expr:
    """``sympy.piecewise_fold(expr)``, where its branches combine into at most
    :data:`FOLD_MAX_BRANCHES`; ``expr`` as it is beyond (and where it has no Piecewise).

    Folding puts every combination of the nested branches' conditions into one Piecewise,
    and SymPy distributes And over Or to collapse them: exponential in the nesting. The
    gradient of Herbie's "letters hi" (eleven nested Min and Max) did not fold in 20
    minutes. A bound on size, not time, so that the output never depends on the machine;
    the printers write nested Piecewise as nested selects either way.
    """
    if not expr.has(sympy.Piecewise):
        return expr
    combinations = 1
    for node in expr.atoms(sympy.Piecewise):
        combinations *= len(node.args)
        if combinations > FOLD_MAX_BRANCHES:
            return expr
    return sympy.piecewise_fold(expr)


def heaviside_as_piecewise(x: sympy.Expr, h0: sympy.Expr = sympy.S.Half) -> sympy.Piecewise:
    """Heaviside(x, h0) as branches (0 below, h0 at, 1 above zero)."""
    if h0 == 1:
        return sympy.Piecewise((1, x >= 0), (0, True))
    if h0 == 0:
        return sympy.Piecewise((1, x > 0), (0, True))
    return sympy.Piecewise((1, x > 0), (h0, sympy.Eq(x, 0)), (0, True))


class StableFunction(sympy.Function):
    """Base class: a real elementwise function with an mpmath evaluation."""

    @staticmethod
    def mp(*args: mpmath.mpf) -> mpmath.mpf:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def naive(cls, *args: sympy.Expr) -> sympy.Expr:  # pragma: no cover - abstract
        raise NotImplementedError

    def _eval_evalf(self, prec: int) -> sympy.Float | None:
        values = [a.evalf(prec_to_dps(prec)) for a in self.args]
        if not all(v.is_Number for v in values):
            return None
        with mpmath.workprec(prec):
            result = self.mp(*(mpmath.mpf(v) for v in values))
        return sympy.Float(result, precision=prec)

    def _eval_is_real(self) -> bool | None:
        return True if all(a.is_real for a in self.args) else None

    def _eval_rewrite_as_naive(self, *args: sympy.Expr, **kwargs) -> sympy.Expr:
        return self.naive(*args)

    def regimes(self) -> sympy.Expr | None:
        """This function in elementary functions and branches, as the printers (and the
        accuracy choice's NumPy) evaluate it where a framework has no op; ``None`` when the
        printers map it to a framework op."""
        return None


def prec_to_dps(prec: int) -> int:
    return max(1, int(prec * 0.30103) + 1)


class sigmoid(StableFunction):
    """1 / (1 + exp(-x))."""

    nargs = 1

    @classmethod
    def eval(cls, x):
        if x.is_zero:
            return sympy.Rational(1, 2)
        return None

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        x = self.args[0]
        # as the product, so that SymPy cancels it against other powers of sigmoid(-x)
        # (d sigmoid(-z)**gamma); the stabilizer makes the rest dsigmoid
        return sigmoid(x) * sigmoid(-x)

    @staticmethod
    def mp(x):
        return 1 / (1 + mpmath.exp(-x))

    @classmethod
    def naive(cls, x):
        return 1 / (1 + exp(-x))


class dsigmoid(StableFunction):
    """sigmoid(x) * sigmoid(-x), the derivative of sigmoid, as exp(-|x|) / (1 + exp(-|x|))**2:
    exact down to the subnormals (torch.sigmoid(-710) is 0, the product is 4.5e-309)."""

    nargs = 1

    @classmethod
    def eval(cls, x):
        if x.is_zero:
            return sympy.Rational(1, 4)
        if x.could_extract_minus_sign():
            return cls(-x)
        return None

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        x = self.args[0]
        # sigmoid(-x) - sigmoid(x) = -tanh(x/2), without cancellation near 0
        return -dsigmoid(x) * sympy.tanh(x / 2)

    @staticmethod
    def mp(x):
        t = mpmath.exp(-abs(x))
        return t / (1 + t) ** 2

    @classmethod
    def naive(cls, x):
        return exp(-x) / (1 + exp(-x)) ** 2

    def regimes(self) -> sympy.Expr:
        t = exp(-sympy.Abs(self.args[0]))
        return t / (1 + t) ** 2


class softplus(StableFunction):
    """log(1 + exp(x)), without overflow for large x."""

    nargs = 1

    @classmethod
    def eval(cls, x):
        if x.is_zero:
            return log(2)
        return None

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return sigmoid(self.args[0])

    @staticmethod
    def mp(x):
        return mpmath.log1p(mpmath.exp(x))

    @classmethod
    def naive(cls, x):
        return log(1 + exp(x))


class log1p(StableFunction):
    """log(1 + x), accurate for tiny x."""

    nargs = 1

    @classmethod
    def eval(cls, x):
        if x.is_zero:
            return sympy.S.Zero
        return None

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return 1 / (1 + self.args[0])

    @staticmethod
    def mp(x):
        return mpmath.log1p(x)

    @classmethod
    def naive(cls, x):
        return log(1 + x)


class log1p_square(StableFunction):
    """log(1 + q**2) without overflow, as ``2 log1p(q * tan_half_atan(q))``.

    1 + q**2 = h**2 for h = sqrt(1 + q**2), so the value is 2 log1p(h - 1), and h - 1 =
    q**2 / (1 + h) is evaluated as q times a ratio below 1 in magnitude: accurate near 0
    and finite for every finite q, where log1p(q**2) is inf once q**2 overflows (|q| >
    1.3e154, 1.8e19 in float32). One log1p, one hypot and one division (a Student-t or
    Cauchy log density) where the regimes of log1p(q**2) cost two logs and a log1p more.
    """

    nargs = 1

    @classmethod
    def eval(cls, q):
        if q.is_zero:
            return sympy.S.Zero
        return None

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        q = self.args[0]
        return 2 * q / (1 + q**2)

    @staticmethod
    def mp(q):
        return mpmath.log1p(q**2)

    @classmethod
    def naive(cls, q):
        return log(1 + q**2)

    def regimes(self) -> sympy.Expr:
        q = self.args[0]
        return 2 * log1p(q * tan_half_atan(q))


class in_float64(StableFunction):
    """``x`` in float64 where it is a lower precision (the same value): the leaves of a
    formula whose float32 arithmetic loses bits its float64 arithmetic keeps (see
    :func:`symgrad.choose.in_float64`), the result rounded back by :class:`rounded_like`."""

    nargs = 1

    @classmethod
    def eval(cls, x):
        return x if x.is_Number else None

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return sympy.S.One

    @staticmethod
    def mp(x):
        return x

    @classmethod
    def naive(cls, x):
        return x


class rounded_like(StableFunction):
    """``value`` rounded to the dtype the tensors ``like`` give a formula of them (their
    promoted dtype): the end of a formula computed in float64 (:class:`in_float64`). The
    same value; the derivative is ``value``'s."""

    @classmethod
    def eval(cls, value, *like):
        kept = [a for a in like if not a.is_Number]
        if not kept or value.is_Number:
            return value
        if len(kept) < len(like):
            return cls(value, *kept)
        return None

    def fdiff(self, argindex=1):
        return sympy.S.One if argindex == 1 else sympy.S.Zero

    @staticmethod
    def mp(value, *like):
        return value

    @classmethod
    def naive(cls, value, *like):
        return value


def without_float64(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` without :class:`in_float64` and :class:`rounded_like` (the same values)."""
    if not expr.has(in_float64, rounded_like):
        return expr
    return expr.replace(lambda e: isinstance(e, (in_float64, rounded_like)), lambda e: e.args[0])


class tan_half_atan(StableFunction):
    """q / (1 + hypot(q, 1)) = tan(atan(q) / 2), in (-1, 1), finite for every q in every
    dtype (hypot does not square q). A function of its own so that q * tan_half_atan(q)
    (log1p_square's argument) is not merged into q**2 / (1 + ...), which overflows."""

    nargs = 1

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        h = hypot(self.args[0], 1)
        return 1 / (h * (1 + h))

    @staticmethod
    def mp(q):
        return q / (1 + mpmath.hypot(q, 1))

    @classmethod
    def naive(cls, q):
        return q / (1 + sqrt(q**2 + 1))

    def regimes(self) -> sympy.Expr:
        q = self.args[0]
        return q / (1 + hypot(q, 1))


class expm1(StableFunction):
    """exp(x) - 1, accurate for tiny x."""

    nargs = 1

    @classmethod
    def eval(cls, x):
        if x.is_zero:
            return sympy.S.Zero
        return None

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return exp(self.args[0])

    @staticmethod
    def mp(x):
        return mpmath.expm1(x)

    @classmethod
    def naive(cls, x):
        return exp(x) - 1


class logaddexp(StableFunction):
    """log(exp(a) + exp(b)), without overflow."""

    nargs = 2

    def fdiff(self, argindex=1):
        a, b = self.args
        if argindex == 1:
            return sigmoid(a - b)
        if argindex == 2:
            return sigmoid(b - a)
        raise ArgumentIndexError(self, argindex)

    @staticmethod
    def mp(a, b):
        return mpmath.log(mpmath.exp(a) + mpmath.exp(b))

    @classmethod
    def naive(cls, a, b):
        return log(exp(a) + exp(b))


class xlogy(StableFunction):
    """x * log(y), defined as 0 where x == 0 (also for y == 0)."""

    nargs = 2

    def fdiff(self, argindex=1):
        x, y = self.args
        if argindex == 1:
            return log(y)
        if argindex == 2:
            return x / y
        raise ArgumentIndexError(self, argindex)

    @staticmethod
    def mp(x, y):
        return mpmath.mpf(0) if x == 0 else x * mpmath.log(y)

    @classmethod
    def naive(cls, x, y):
        return x * log(y)


class hypot(StableFunction):
    """sqrt(x**2 + y**2), without overflow or underflow of the squares."""

    nargs = 2

    def fdiff(self, argindex=1):
        x, y = self.args
        if argindex == 1:
            return x / hypot(x, y)
        if argindex == 2:
            return y / hypot(x, y)
        raise ArgumentIndexError(self, argindex)

    @staticmethod
    def mp(x, y):
        return mpmath.hypot(x, y)

    @classmethod
    def naive(cls, x, y):
        return sqrt(x**2 + y**2)


class hypot_ratio(StableFunction):
    """b / hypot(x, y) for b one of x, y: at most 1 in magnitude. Powers of hypot in a
    denominator are paired with these (y**2/hypot**3 = hypot_ratio(y, x, y)**2 / hypot):
    hypot**3 overflows for |y| > 5e102 where the value does not, and as a function of its
    own the pair survives SymPy (which merges (y/h)**2/h back) and common subexpressions.

    Evaluated as b / hypot(x, y): where x and y are inputs (finite) that overflows only
    where both pass 1.27e308. Build it with :meth:`of`, which takes
    :class:`hypot_ratio_scaled` where an argument is computed (and can overflow)."""

    nargs = 3

    @classmethod
    def of(cls, b: sympy.Expr, x: sympy.Expr, y: sympy.Expr) -> sympy.Expr:
        """b / hypot(x, y) as the ratio its arguments need: scaled where x or y is computed
        (sinh(Ce) is inf past Ce = 710), plain where both are inputs or numbers."""
        plain = all(a.is_Symbol or a.is_Number for a in (x, y))
        return (hypot_ratio if plain else hypot_ratio_scaled)(b, x, y)

    def fdiff(self, argindex=1):
        _, x, y = self.args
        h = hypot(x, y)
        if argindex == 1:
            return 1 / h
        if argindex in (2, 3):
            other = x if argindex == 2 else y
            return -self * self.func(other, x, y) / h
        raise ArgumentIndexError(self, argindex)

    @staticmethod
    def mp(b, x, y):
        return b / mpmath.hypot(x, y)

    @classmethod
    def naive(cls, b, x, y):
        return b / sqrt(x**2 + y**2)

    def regimes(self) -> sympy.Expr:
        b, x, y = self.args
        return b / hypot(x, y)


class hypot_ratio_scaled(hypot_ratio):
    """b / hypot(x, y) (:class:`hypot_ratio`) for arguments that may overflow: where b is
    the larger argument, sign(b) / hypot(1, other/b), which is sign(b) at b = inf (b/hypot
    is inf/inf there: sinh(Ce)/hypot(cos(Cn), sinh(Ce)) for |Ce| > 710) and where
    hypot(x, y) overflows although x and y do not (x = y = 1.5e308: 0.707, not 0); where
    b is the smaller, b / hypot(x, y) (which overflows there only where the other
    argument passes 1.27e308, and is then about 0)."""

    def regimes(self) -> sympy.Expr:
        b, x, y = self.args
        if b in (x, y):  # the printers' case: the other argument is known
            other = y if b == x else x
            larger = sympy.Abs(other) <= sympy.Abs(b)
            scaled = sympy.sign(b) / hypot(1, other / b)
        else:  # evaluated on three separate symbols: the same values, by magnitudes
            larger = sympy.And(sympy.Abs(x) <= sympy.Abs(b), sympy.Abs(y) <= sympy.Abs(b))
            other = sympy.Min(sympy.Abs(x), sympy.Abs(y))
            scaled = sympy.sign(b) / hypot(1, other / sympy.Abs(b))
        return sympy.Piecewise((scaled, larger), (b / hypot(x, y), True))


class arctan2(StableFunction):
    """atan2(y, x), the angle of the point (x, y), kept as it is written. SymPy's atan2
    becomes atan(y/x) wherever x is known to be positive, and y/x is inf/inf at y = x =
    inf (atan2(expm1(u), exp(u) + 1) at u = 1000, whose value is pi/4); the rewrites
    that produce an atan2 produce this one."""

    nargs = 2

    def fdiff(self, argindex=1):
        y, x = self.args
        if argindex == 1:
            return hypot_ratio.of(x, x, y) / hypot(x, y)
        if argindex == 2:
            return -hypot_ratio.of(y, x, y) / hypot(x, y)
        raise ArgumentIndexError(self, argindex)

    @staticmethod
    def mp(y, x):
        return mpmath.atan2(y, x)

    @classmethod
    def naive(cls, y, x):
        return sympy.atan2(y, x)


class relu(StableFunction):
    """max(x, 0) with PyTorch's subgradient 0 at x == 0."""

    nargs = 1

    @classmethod
    def eval(cls, x):
        if x.is_nonnegative:
            return x
        if x.is_nonpositive:
            return sympy.S.Zero
        return None

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return Heaviside(self.args[0], 0)

    @staticmethod
    def mp(x):
        return x if x > 0 else mpmath.mpf(0)

    @classmethod
    def naive(cls, x):
        return sympy.Max(x, 0)


class log1mexp(StableFunction):
    """log(1 - exp(x)) for x < 0 (Maechler's two regimes, split at -log 2)."""

    nargs = 1

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return -1 / expm1(-self.args[0])

    @staticmethod
    def mp(x):
        return mpmath.log(-mpmath.expm1(x))

    @classmethod
    def naive(cls, x):
        return log(1 - exp(x))


class one_plus_erf(StableFunction):
    """1 + erf(x), computed as erfc(-x): no cancellation for x << 0.

    A function of its own because SymPy rewrites erfc(-x) back to 2 - erfc(x).
    """

    nargs = 1

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return 2 * exp(-(self.args[0] ** 2)) / sqrt(sympy.pi)

    @staticmethod
    def mp(x):
        return mpmath.erfc(-x)

    @classmethod
    def naive(cls, x):
        return 1 + sympy.erf(x)


class erfcx(StableFunction):
    """exp(x**2) * erfc(x), the scaled complementary error function (finite for large x)."""

    nargs = 1

    @classmethod
    def eval(cls, x):
        if x.is_zero:
            return sympy.S.One
        return None

    #: Above this, the derivative 2 x erfcx(x) - 2/sqrt(pi) cancels (relative error ~ eps x**2)
    #: and the derivative of the asymptotic series is used instead.
    SERIES_FROM = 9

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        x = self.args[0]
        t = sympy.Dummy("t", real=True)
        return sympy.Piecewise(
            (2 * x * erfcx(x) - 2 / sqrt(sympy.pi), x < self.SERIES_FROM),
            (sympy.diff(erfcx_series(t), t).subs(t, x), True),
        )

    @staticmethod
    def mp(x):
        if x > 1e6:
            # mpmath's erfc loses its digits where x**2 needs more bits than the working
            # precision; the asymptotic series' 8th term is below 1e-90 of the first here.
            terms = ((-1) ** k * mpmath.fac2(2 * k - 1) / (2 * x * x) ** k for k in range(8))
            return mpmath.fsum(terms) / (x * mpmath.sqrt(mpmath.pi))
        return mpmath.exp(x * x) * mpmath.erfc(x)

    @classmethod
    def naive(cls, x):
        return exp(x**2) * sympy.erfc(x)


class erfcx_inv(StableFunction):
    """1 / erfcx(x) = exp(-x**2) / erfc(x): the derivative of log(erfc(x)) is
    -2/sqrt(pi) * erfcx_inv(x). erfcx overflows for x < -26.6 (-9.4 in float32), where
    its reciprocal is exp(-x**2)/erfc(x) with erfc(x) in [1, 2]."""

    nargs = 1

    @classmethod
    def eval(cls, x):
        if x.is_zero:
            return sympy.S.One
        return None

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        x = self.args[0]
        r = erfcx_inv(x)
        t = sympy.Dummy("t", real=True)
        # r * (2r/sqrt(pi) - 2x) cancels for large x (r ~ x sqrt(pi)): the series' derivative
        series = sympy.diff(1 / erfcx_series(t), t).subs(t, x)
        # below x = -1e10, r = exp(-x**2)/erfc(x) is 0 in every dtype, and 2x may overflow
        # (float32 beyond -1.7e38): 0 * inf
        return sympy.Piecewise(
            (0, x < -1e10),
            (r * (2 * r / sqrt(sympy.pi) - 2 * x), x < erfcx.SERIES_FROM),
            (series, True),
        )

    @staticmethod
    def mp(x):
        return 1 / erfcx.mp(x)

    @classmethod
    def naive(cls, x):
        return exp(-(x**2)) / sympy.erfc(x)

    def regimes(self) -> sympy.Expr:
        x = self.args[0]
        return sympy.Piecewise((exp(-(x**2)) / sympy.erfc(x), x < 0), (1 / erfcx(x), True))


def erfcx_series(x: sympy.Expr, terms: int = 20) -> sympy.Expr:
    """The asymptotic series of erfcx: 1/(x sqrt(pi)) sum_k (-1)^k (2k-1)!! / (2 x^2)^k.

    With 20 terms its truncation error at x = 9 is 39!!/162**20 < 1e-20.
    """
    total = sympy.Add(
        *((-1) ** k * sympy.factorial2(2 * k - 1) / (2 * x**2) ** k for k in range(terms))
    )
    return total / (x * sqrt(sympy.pi))


class xlog1py(StableFunction):
    """x * log1p(y), defined as 0 where x == 0 (also for y == -1)."""

    nargs = 2

    def fdiff(self, argindex=1):
        x, y = self.args
        if argindex == 1:
            return log1p(y)
        if argindex == 2:
            return x / (1 + y)
        raise ArgumentIndexError(self, argindex)

    @staticmethod
    def mp(x, y):
        return mpmath.mpf(0) if x == 0 else x * mpmath.log1p(y)

    @classmethod
    def naive(cls, x, y):
        return x * log(1 + y)


class exprel(StableFunction):
    """(exp(x) - 1) / x, defined as 1 at 0: no 0/0 at 0, no cancellation near it and no
    overflow for x in [709.8, 716] where exp(x) is inf but the quotient is finite."""

    nargs = 1

    @classmethod
    def eval(cls, x):
        if x.is_zero:
            return sympy.S.One
        return None

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return exprel_d(1, self.args[0])

    @staticmethod
    def mp(x):
        return exprel_d.mp(0, x)

    @classmethod
    def naive(cls, x):
        return (exp(x) - 1) / x

    def regimes(self) -> sympy.Expr:
        return exprel_d(0, self.args[0], evaluate=False).regimes()


class exprel_d(StableFunction):
    """The n-th derivative of :class:`exprel`: the integral of t**n exp(x t) over [0, 1].

    Evaluated by regime (:meth:`regimes`): a Taylor polynomial for |x| < 1, where the
    closed form cancels; exp(x/2) * (exp(x/2) * P(1/x)) above x = 80, where exp(x)
    overflows first; the closed form (by the recurrence I_m = (exp(x) - m I_{m-1}) / x)
    in between.
    """

    nargs = 2
    #: |x| below which the Taylor polynomial is used, its terms, and where exp(x) is split
    TAYLOR_BELOW = 1
    TAYLOR_TERMS = 20
    SPLIT_ABOVE = 80

    @classmethod
    def eval(cls, n, x):
        if n.is_Integer and n < 0:
            raise ValueError("exprel_d(n, x) needs n >= 0")
        if x.is_zero and n.is_Integer:
            return sympy.Rational(1, int(n) + 1)
        return None

    def fdiff(self, argindex=2):
        if argindex != 2:
            raise ArgumentIndexError(self, argindex)
        n, x = self.args
        return exprel_d(n + 1, x)

    @staticmethod
    def mp(n, x):
        n = int(n)
        if x == 0:
            return mpmath.mpf(1) / (n + 1)
        # each step of the recurrence cancels about log2(1/|x|) bits near 0: carried
        with mpmath.extraprec(64 + n * max(0, -int(mpmath.mag(x)))):
            value = mpmath.expm1(x) / x
            for m in range(1, n + 1):
                value = (mpmath.exp(x) - m * value) / x
        return +value

    @classmethod
    def naive(cls, n, x):
        d = sympy.Dummy(real=True)
        return sympy.diff((exp(d) - 1) / d, d, int(n)).subs(d, x)

    def regimes(self) -> sympy.Expr:
        """This function in elementary functions, as the printers emit it."""
        n, x = int(self.args[0]), self.args[1]
        taylor = sympy.S.Zero
        for k in reversed(range(self.TAYLOR_TERMS)):  # Horner form
            taylor = sympy.Rational(1, sympy.factorial(k) * (k + n + 1)) + x * taylor
        middle = expm1(x) / x
        for m in range(1, n + 1):
            middle = (exp(x) - m * middle) / x
        # exp(x) * sum_j (-1)^j n!/(n-j)! x^-(j+1); the exp(x)-free term is below 1e-300 here
        poly = sympy.Add(
            *(
                (-1) ** j * sympy.factorial(n) / sympy.factorial(n - j) / x ** (j + 1)
                for j in range(n + 1)
            )
        )
        half = exp(x / 2)
        big = sympy.Mul(half, sympy.Mul(half, poly, evaluate=False), evaluate=False)
        return sympy.Piecewise(
            (taylor, sympy.Abs(x) < self.TAYLOR_BELOW),
            (big, x > self.SPLIT_ABOVE),
            (middle, True),
        )


class log1prel(StableFunction):
    """log1p(u) / u, defined as 1 at 0: no 0/0 at 0, and a derivative that does not cancel
    near it (d/du log1p(u)/u = (u/(1 + u) - log1p(u))/u**2 keeps about u**2 of its digits).
    The log1p member of :class:`exprel`'s family: (1 + u)**n - 1 = expm1(n log1p(u)) is
    u * n * exprel(a) * log1prel(u) with a = n u log1prel(u), which stays finite and exact
    where u underflows to 0 or n u overflows (compound interest)."""

    nargs = 1

    @classmethod
    def eval(cls, u):
        if u.is_zero:
            return sympy.S.One
        return None

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return log1prel_d(1, self.args[0])

    @staticmethod
    def mp(u):
        return log1prel_d.mp(0, u)

    @classmethod
    def naive(cls, u):
        return log(1 + u) / u

    def regimes(self) -> sympy.Expr:
        return log1prel_d(0, self.args[0], evaluate=False).regimes()


class log1prel_d(StableFunction):
    """The n-th derivative of :class:`log1prel`: (-1)**n n! times the integral of
    t**n / (1 + u t)**(n + 1) over [0, 1].

    Evaluated by regime (:meth:`regimes`): log1p(u)/u itself for n = 0 (1 - u/2 for |u|
    < 2**-30); for
    n >= 1 a polynomial in s = u/(2 + u) for -1/2 < u < 1 (|s| < 1/3), where the closed
    form cancels; the closed form beyond (in v = 1/u above u = 1, finite at u = inf), by
    the recurrence u L_m + m L_(m-1) =
    (-1)**(m - 1) (m - 1)!/(1 + u)**m (the m-th derivative of u L_0 = log1p(u)). In s,
    log1p(u)/u = (1 - s) atanh(s)/s, a series in s whose terms fall by 9 every two (a
    series in u would fall by 2 at u = -1/2), and d/du = (1 - s)**2/2 d/ds keeps each
    derivative a polynomial in s. The closed form loses up to about 2 bits per order at
    the regimes' border (u = -1/2 and u = 1), as exprel_d's does at |x| = 1.
    """

    nargs = 2
    #: u in (LOWER, UPPER) takes the polynomial in s (|s| < 1/3 there)
    LOWER = sympy.Rational(-1, 2)
    UPPER = sympy.S.One
    #: a coefficient times |s|**j below 2**-TAIL_BITS of the value at 0 is left out
    TAIL_BITS = 57

    @classmethod
    def eval(cls, n, u):
        if n.is_Integer and n < 0:
            raise ValueError("log1prel_d(n, u) needs n >= 0")
        if u.is_zero and n.is_Integer:
            return sympy.Rational((-1) ** int(n) * sympy.factorial(int(n)), int(n) + 1)
        return None

    def fdiff(self, argindex=2):
        if argindex != 2:
            raise ArgumentIndexError(self, argindex)
        n, u = self.args
        return log1prel_d(n + 1, u)

    @staticmethod
    def mp(n, u):
        n = int(n)
        if u == 0:
            return mpmath.mpf((-1) ** n * math.factorial(n)) / (n + 1)
        # each step of the recurrence cancels about log2(1/|u|) bits near 0: carried
        with mpmath.extraprec(64 + n * max(0, -int(mpmath.mag(u)))):
            value = mpmath.log1p(u) / u
            for m in range(1, n + 1):
                value = ((-1) ** (m - 1) * mpmath.factorial(m - 1) / (1 + u) ** m - m * value) / u
        return +value

    @classmethod
    def naive(cls, n, u):
        d = sympy.Dummy(real=True)
        return sympy.diff(log(1 + d) / d, d, int(n)).subs(d, u)

    @classmethod
    def polynomial(cls, n: int) -> list[sympy.Rational]:
        """The coefficients (lowest first) of the n-th derivative as a polynomial in s =
        u/(2 + u), cut where the terms left out are below 2**-TAIL_BITS of the value at 0
        for |s| < 1/3."""
        return list(_log1prel_polynomial(n, cls.TAIL_BITS))

    def regimes(self) -> sympy.Expr:
        """This function in elementary functions (and log1p, xlogy, xlog1py), as the
        printers emit it. Above u = 1 in v = 1/u: log1p(u)/u = v*log1p(v) - v*log(v), a sum
        of two terms >= 0, is 0 at u = inf (v = 0), where log1p(u)/u is inf/inf (i/n
        overflows at i = 1e250, n = 1e-100); the recurrence multiplies by v."""
        n, u = int(self.args[0]), self.args[1]
        v = 1 / u
        closed, far = log1p(u) / u, xlog1py(v, v) - xlogy(v, v)
        for m in range(1, n + 1):
            c = sympy.Integer((-1) ** (m - 1) * math.factorial(m - 1))
            closed = (c / (1 + u) ** m - m * closed) / u
            far = v * (c * (v / (1 + v)) ** m - m * far)
        if n == 0:
            # no cancellation: only 0/0 at 0, and 1/u's overflow where u is tiny (written
            # log1p(i/n)*(n/i), n/i is inf in float32 at i = -1.3e-16, n = 6.3e27, where the
            # value is 1): 1 - u/2 there, whose next term, u**2/3, is below 2**-61
            tiny = sympy.Abs(u) < sympy.Float(2.0**-30)
            return sympy.Piecewise((far, u > 1), (1 - u / 2, tiny), (closed, True))
        s = u / (2 + u)
        horner = sympy.S.Zero
        for c in reversed(self.polynomial(n)):
            horner = c + s * horner
        return sympy.Piecewise(
            (horner, (u > self.LOWER) & (u < self.UPPER)), (far, u > 1), (closed, True)
        )


@functools.cache
def _log1prel_polynomial(n: int, tail_bits: int) -> tuple[sympy.Rational, ...]:
    """log1prel_d(n, u) as a polynomial in s = u/(2 + u) (see :class:`log1prel_d`)."""
    s = sympy.Symbol("s")
    degree = 120  # far beyond the cut: the low coefficients of each derivative are exact
    g = sympy.Poly(
        (1 - s) * sum(s ** (2 * k) / sympy.Integer(2 * k + 1) for k in range(degree // 2)), s
    )
    for _ in range(n):
        g = sympy.Poly((1 - s) ** 2 / 2, s) * g.diff(s)
    coeffs = [g.coeff_monomial(s**j) for j in range(degree - 2 * n)]
    bound = abs(coeffs[0]) * sympy.Rational(1, 2**tail_bits)
    keep = max(j for j, c in enumerate(coeffs) if abs(c) * sympy.Rational(1, 3) ** j >= bound)
    return tuple(coeffs[: keep + 1])


class logcosh(StableFunction):
    """log(cosh(x)): cosh overflows for |x| > 710 long before the result does, and the
    result cancels to 0 near x = 0 when computed as |x| + log1p(exp(-2|x|)) - log(2)."""

    nargs = 1

    @classmethod
    def eval(cls, x):
        if x.is_zero:
            return sympy.S.Zero
        return None

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return sympy.tanh(self.args[0])

    @staticmethod
    def mp(x):
        return mpmath.log(mpmath.cosh(x))

    @classmethod
    def naive(cls, x):
        return log(sympy.cosh(x))

    def regimes(self) -> sympy.Expr:
        """log1p(cosh(x) - 1) = log1p(2 sinh(x/2)**2) for |x| < 1, |x| + softplus(-2|x|)
        - log(2) beyond."""
        x = self.args[0]
        a = sympy.Abs(x)
        return sympy.Piecewise(
            (log1p(2 * sympy.sinh(x / 2) ** 2), a < 1),
            (a + softplus(-2 * a) - log(2), True),
        )


def _half_turns(x: sympy.Expr) -> sympy.Expr:
    """x - 2*round(x/2), in [-1, 1]: x reduced modulo 2 without rounding (x/2, its
    rounding and the difference are exact in binary floating point)."""
    return x - 2 * round(x / 2)


class sinpi(StableFunction):
    """sin(pi*x) with the argument reduced before pi multiplies it: 0 at every integer x
    (sin(pi*x) is 1.2e-16 at x = 1, and sin(pi*1e17) any value in [-1, 1]), and all the
    digits of x - n near an integer n, which sin(pi*x) loses to pi's rounding."""

    nargs = 1

    @classmethod
    def eval(cls, x):
        if x.is_integer:
            return sympy.S.Zero
        return None

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return sympy.pi * cospi(self.args[0])

    @staticmethod
    def mp(x):
        return mpmath.sinpi(x)

    @classmethod
    def naive(cls, x):
        return sympy.sin(sympy.pi * x)

    def regimes(self) -> sympy.Expr:
        """sin(pi*t) with t = r, or sign(r) - r where |r| > 1/2 (r = x mod 2 in [-1, 1]):
        t in [-1/2, 1/2], exact (Sterbenz), 0 at every integer."""
        r = _half_turns(self.args[0])
        t = sympy.Piecewise((sympy.sign(r) - r, sympy.Abs(r) > sympy.S.Half), (r, True))
        return sympy.sin(sympy.pi * t)


class cospi(StableFunction):
    """cos(pi*x) with the argument reduced before pi multiplies it: 0 at every half
    integer, +-1 at every integer (see :class:`sinpi`)."""

    nargs = 1

    @classmethod
    def eval(cls, x):
        if x.is_integer:
            return sympy.S.NegativeOne**x
        if (x - sympy.S.Half).is_integer:
            return sympy.S.Zero
        return None

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return -sympy.pi * sinpi(self.args[0])

    @staticmethod
    def mp(x):
        return mpmath.cospi(x)

    @classmethod
    def naive(cls, x):
        return sympy.cos(sympy.pi * x)

    def regimes(self) -> sympy.Expr:
        """sin(pi*(1/2 - |r|)) (r = x mod 2 in [-1, 1]): 1/2 - |r| is exact for |r| >= 1/4
        (Sterbenz) and rounds only where the cosine is near 1."""
        r = _half_turns(self.args[0])
        return sympy.sin(sympy.pi * (sympy.S.Half - sympy.Abs(r)))


def _sin_turn(x: sympy.Expr, k: int, turns: bool) -> sympy.Expr:
    """The k-th derivative of sin at x, sin(x + k*pi/2) (of sinpi over pi**k where
    ``turns``: sinpi(x + k/2))."""
    sin_, cos_ = (sinpi, cospi) if turns else (sympy.sin, sympy.cos)
    return (sin_(x), cos_(x), -sin_(x), -cos_(x))[k % 4]


class sinc_d(StableFunction):
    """The n-th derivative of sin(x)/x (1 at 0): the integral of t**n cos(x t + n pi/2)
    over [0, 1].

    Evaluated by regime (:meth:`regimes`): for n >= 1 a Taylor polynomial for |x| < n + 1,
    where the closed form cancels (the first derivative, (x cos(x) - sin(x))/x**2, keeps about
    x**2 of its digits: none of float32's at x = 1e-4); the closed form above, by the
    recurrence f_m = (sin(x + m pi/2) - m f_(m-1)) / x from f_0 = sin(x)/x.
    """

    nargs = 2
    #: Taylor terms (every other one is 0): below |x| < 4 the first left out is under
    #: 2**-60 of the sum
    TAYLOR_TERMS = 40
    #: the Taylor polynomial's sine turns (sincpi_d: sinpi, cospi and pi's powers)
    TURNS = False

    @classmethod
    def eval(cls, n, x):
        if n.is_Integer and n < 0:
            raise ValueError(f"{cls.__name__}(n, x) needs n >= 0")
        if x.is_zero and n.is_Integer:
            return cls._at_zero(int(n))
        return None

    @classmethod
    def _at_zero(cls, n: int) -> sympy.Expr:
        value = sympy.S.Zero if n % 2 else sympy.Rational((-1) ** (n // 2), n + 1)
        return value * sympy.pi**n if cls.TURNS else value

    def fdiff(self, argindex=2):
        if argindex != 2:
            raise ArgumentIndexError(self, argindex)
        n, x = self.args
        return type(self)(n + 1, x)

    @classmethod
    def mp(cls, n, x):
        n = int(n)
        scale = mpmath.pi if cls.TURNS else mpmath.mpf(1)
        y = scale * x
        if abs(y) < 1:  # the Taylor series, summed until its terms are below the precision
            total, m, tiny = mpmath.mpf(0), n % 2, mpmath.mpf(2) ** -(mpmath.mp.prec + 8)
            while True:
                term = y**m / (mpmath.factorial(m) * (m + n + 1))
                total += term if (m + n) // 2 % 2 == 0 else -term
                if abs(term) < tiny:
                    return scale**n * total
                m += 2
        with mpmath.extraprec(64):
            if cls.TURNS:  # x g(x) = sinpi(x)/pi: x g_m + m g_(m-1) = pi**(m-1) sinpi(x + m/2)
                value = mpmath.sinpi(x) / y
                for m in range(1, n + 1):
                    value = (scale ** (m - 1) * mpmath.sinpi(x + mpmath.mpf(m) / 2) - m * value) / x
            else:
                value = mpmath.sin(x) / x
                for m in range(1, n + 1):
                    value = (mpmath.sin(x + m * mpmath.pi / 2) - m * value) / x
        return +value

    @classmethod
    def naive(cls, n, x):
        d = sympy.Dummy(real=True)
        t = sympy.pi * d if cls.TURNS else d
        return sympy.diff(sympy.sin(t) / t, d, int(n)).subs(d, x)

    @classmethod
    def taylor(cls, n: int, x: sympy.Expr) -> sympy.Expr:
        """The Taylor polynomial at 0, in Horner form in x**2: the coefficient of x**m is
        s**(m + n) cos((m + n) pi/2) / (m! (m + n + 1)), s = pi for sincpi_d (a float,
        correctly rounded), else 1 (a rational)."""
        parity = n % 2
        horner = sympy.S.Zero
        for m in reversed(range(parity, cls.TAYLOR_TERMS, 2)):
            c = sympy.Rational((-1) ** ((m + n) // 2), sympy.factorial(m) * (m + n + 1))
            if cls.TURNS:
                with mpmath.workdps(40):
                    c = sympy.Float(float(mpmath.pi ** (m + n) * mpmath.mpf(c.p) / c.q), 17)
            horner = c + x**2 * horner
        return x * horner if parity else horner

    def regimes(self) -> sympy.Expr:
        """This function in elementary functions (and sinpi, cospi), as the printers emit
        it."""
        n, x = int(self.args[0]), self.args[1]
        turns = self.TURNS
        scale = sympy.pi if turns else sympy.S.One
        closed = _sin_turn(x, 0, turns) / (scale * x)
        if n == 0:  # no cancellation: only 0/0 at 0 (sin(x) is x below 1e-8)
            return sympy.Piecewise((sympy.S.One, sympy.Eq(x, 0)), (closed, True))
        for m in range(1, n + 1):
            closed = (scale ** (m - 1) * _sin_turn(x, m, turns) - m * closed) / x
        return sympy.Piecewise((self.taylor(n, x), sympy.Abs(x) < (n + 1) / scale), (closed, True))


class sincpi_d(sinc_d):
    """The n-th derivative of sin(pi x)/(pi x), NumPy's and torch's normalised sinc (1 at
    0), with the sine's argument reduced as :class:`sinpi` reduces it; by the regimes of
    :class:`sinc_d` at pi x (the closed form through sinpi and cospi)."""

    TURNS = True


class _Rounding(StableFunction):
    """A rounding function: piecewise constant, so its derivative is 0 everywhere (the
    gradient torch.round, floor, ceil and trunc give; a straight-through estimator says
    otherwise with ``gradient:``). A number argument rounds exactly (``exact``)."""

    nargs = 1

    @staticmethod
    def exact(q: Fraction) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def eval(cls, x):
        if x.is_Rational or (x.is_Float and x.is_finite):
            q = sympy.Rational(x)
            return sympy.Integer(cls.exact(Fraction(int(q.p), int(q.q))))
        return None

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return sympy.S.Zero

    @classmethod
    def naive(cls, x):
        return cls(x)


class round(_Rounding):  # the spec's name: shadows the builtin here (builtins.round)
    """The nearest integer, ties to even: torch.round, tf.math.round and np.rint round
    0.5 to 0 and 2.5 to 2, not away from zero."""

    exact = staticmethod(builtins.round)  # round(Fraction) ties to even
    mp = staticmethod(mpmath.nint)  # ties to even too


class floor(_Rounding):
    """The largest integer not above x."""

    exact = staticmethod(math.floor)
    mp = staticmethod(mpmath.floor)


class ceil(_Rounding):
    """The smallest integer not below x."""

    exact = staticmethod(math.ceil)
    mp = staticmethod(mpmath.ceil)


class trunc(_Rounding):
    """x rounded toward zero."""

    exact = staticmethod(math.trunc)

    @staticmethod
    def mp(x):
        return mpmath.floor(x) if x >= 0 else mpmath.ceil(x)


def within(u: sympy.Expr, lo: sympy.Expr, hi: sympy.Expr) -> sympy.Boolean:
    """lo <= u <= hi; for u = a*s + b (numbers a != 0, b, lo, hi) as bounds on s itself, so
    that the backward compares the saved input instead of recomputing u."""
    if len(u.free_symbols) == 1 and lo.is_number and hi.is_number:
        (s,) = u.free_symbols
        a = sympy.diff(u, s)
        b = sympy.expand(u - a * s)
        if a.is_number and a.is_nonzero and not b.free_symbols:
            lo, hi = (lo - b) / a, (hi - b) / a
            if a.is_negative:
                lo, hi = hi, lo
            u = s
    return sympy.And(u >= lo, u <= hi)


class clamp(StableFunction):
    """min(max(x, lo), hi), torch.clamp: hi where lo > hi.

    Its gradients are torch.clamp's: x gets it on the closed interval lo <= x <= hi, lo
    where x < lo < hi, hi where x > hi or lo > hi. (F.hardsigmoid and hardtanh use the open
    interval for x; SymPy's Min(Max(...)) would give 1/2 at the ends.)
    """

    nargs = 3

    @classmethod
    def eval(cls, x, lo, hi):
        if x.is_number and lo.is_number and hi.is_number:
            return sympy.Min(sympy.Max(x, lo), hi)
        return None

    def fdiff(self, argindex=1):
        x, lo, hi = self.args
        if argindex == 1:
            return sympy.Piecewise((1, within(x, lo, hi)), (0, True))
        if argindex == 2:
            return sympy.Piecewise((1, sympy.And(x < lo, lo < hi)), (0, True))
        if argindex == 3:
            return sympy.Piecewise((1, sympy.Or(x > hi, lo > hi)), (0, True))
        raise ArgumentIndexError(self, argindex)

    @staticmethod
    def mp(x, lo, hi):
        return min(max(x, lo), hi)

    @classmethod
    def naive(cls, x, lo, hi):
        return sympy.Min(sympy.Max(x, lo), hi)


def as_clamps(expr: sympy.Expr) -> sympy.Expr:
    """``Min(Max(e, lo), hi)`` and ``Max(Min(e, hi), lo)`` with numbers lo < hi as
    :class:`clamp` (torch.clamp's gradient, one op and one mask, where SymPy's derivative
    of the nest is 1/2 at the ends and three selects), and a number factor c of a clamp
    moved into it (c*clamp(e, lo, hi) = clamp(c*e, c*lo, c*hi) for c > 0): in hard-swish
    ``x*clamp(x + 3, 0, 6)/6`` the product x*6 overflows for x > 5.7e37 in float32, where
    ``x*clamp(x/6 + 1/2, 0, 1)`` is x."""

    def nested(node: sympy.Basic) -> sympy.Basic | None:
        if not isinstance(node, (sympy.Min, sympy.Max)) or len(node.args) != 2:
            return None
        inner_type = sympy.Max if isinstance(node, sympy.Min) else sympy.Min
        inner = [a for a in node.args if isinstance(a, inner_type) and len(a.args) == 2]
        outer = [a for a in node.args if a.is_number]
        if len(inner) != 1 or len(outer) != 1:
            return None
        bound = [a for a in inner[0].args if a.is_number]
        if len(bound) != 1:
            return None
        (e,) = (a for a in inner[0].args if a is not bound[0])
        lo, hi = (bound[0], outer[0]) if isinstance(node, sympy.Min) else (outer[0], bound[0])
        return clamp(e, lo, hi) if bool(lo < hi) else None

    def scaled(node: sympy.Basic) -> sympy.Basic | None:
        if not isinstance(node, sympy.Mul):
            return None
        c, rest = node.as_coeff_Mul()
        factors = sympy.Mul.make_args(rest)
        clamps = [f for f in factors if isinstance(f, clamp)]
        if c in (1, -1) or not c.is_Rational or len(clamps) != 1:
            return None
        x, lo, hi = clamps[0].args
        k = abs(c)
        others = [f for f in factors if f is not clamps[0]]
        return sympy.sign(c) * sympy.Mul(*others) * clamp(k * x, k * lo, k * hi)

    expr = expr.replace(lambda e: nested(e) is not None, nested)
    return expr.replace(lambda e: scaled(e) is not None, scaled)


#: The largest denominator q of an exponent p/q that the printers write as a root
#: (:func:`root_exponent`); the root's Newton step takes a power q - 1 of it.
ROOT_MAX_DENOMINATOR = 16
#: ... and the largest |p/q|: x**(p/q) is x**n times the root's power, n = trunc(p/q).
ROOT_MAX_EXPONENT = 8
#: The generated modules' helper for such a power, in each framework's runtime
#: (symgrad/runtime) and the NumPy model of the accuracy choice (numerics.native).
ROOT_POWER_HELPER = "_root_power"


def root_exponent(e: sympy.Basic) -> tuple[int, int] | None:
    """(p, q) for a constant exponent p/q that no binary float holds (q is not a power of
    2: 1/3, -2/3, 1/10), q and |p/q| small; None for any other exponent.

    ``x**(1/3)`` as ``pow(x, 0.333...)`` raises x to a rounded exponent, a relative error
    of |log(x)| * 2**-54: 114 ulps at x = 1e296 in float64, 4 bits lost on average over
    the doubles. The printers (the frameworks' and the NumPy one of the accuracy choice)
    write such a power as the module helper ``_root_power(x, p, q)``: the q-th root by
    pow and one Newton step, which is within an ulp, and integer powers of it and of x.
    """
    if not (isinstance(e, sympy.Rational) and not e.is_Integer):
        return None
    p, q = int(e.p), int(e.q)
    if q & (q - 1) == 0 or q > ROOT_MAX_DENOMINATOR or abs(p) > ROOT_MAX_EXPONENT * q:
        return None
    return p, q


def hypot_power_parts(expr: sympy.Expr):
    """y**2 / hypot(x, y)**3 -> (1, hypot(x, y), 1, [(y, 2)]), to print (1/h)**1 * (y/h)**2.

    h**3 overflows long before the value does (|y| > 5e102), and SymPy merges
    (y/h)**2 / h back into y**2 / h**3, so the pairing is done by the printers (the
    framework printers and the NumPy one the accuracy choice uses). ``None`` for other
    expressions. Returns (rest, h, k, pairs): expr = rest * h**-k * prod((b/h)**m).
    """
    for factor in sympy.Mul.make_args(expr):
        h, power = factor.as_base_exp()
        if not (isinstance(h, hypot) and power.is_Integer and power <= -2):
            continue
        rest, pairs, k = list(sympy.Mul.make_args(expr)), [], -int(power)
        rest.remove(factor)
        for f in list(rest):
            b, m = f.as_base_exp()
            if b in h.args and m.is_Integer and 1 <= m < k:
                rest.remove(f)
                pairs.append((b, int(m)))
                k -= int(m)
        return sympy.Mul(*rest), h, k, pairs
    return None


#: Functions SymPy's simplify writes that symgrad has no op for, as the ones it has.
_RECIPROCALS = {
    sympy.cot: lambda u: 1 / sympy.tan(u),
    sympy.sec: lambda u: 1 / sympy.cos(u),
    sympy.csc: lambda u: 1 / sympy.sin(u),
    sympy.coth: lambda u: 1 / sympy.tanh(u),
    sympy.sech: lambda u: 1 / sympy.cosh(u),
    sympy.csch: lambda u: 1 / sympy.sinh(u),
    sympy.acot: lambda u: sympy.atan(1 / u),
}


def known_functions(expr: sympy.Expr) -> sympy.Expr:
    """cot, sec, csc (and the hyperbolic ones, acot) that simplify brings in, as 1/tan,
    1/cos, ...: symgrad's ops, mpmath and the frameworks have those (tan(pi/2 - x) is cot(x) to
    SymPy, and simplify writes tan(pi/4 - x/2) as cot(x/2 + pi/4))."""
    for cls, form in _RECIPROCALS.items():
        if expr.has(cls):
            expr = expr.replace(
                lambda e, cls=cls: isinstance(e, cls), lambda e, f=form: f(e.args[0])
            )
    return expr


def real_diff(expr: sympy.Expr, wrt: sympy.Symbol) -> sympy.Expr:
    """d expr / d wrt for real inputs, as autograd takes it.

    SymPy leaves ``Derivative(sign(u), x)`` and ``Derivative(Abs(u), x)`` unevaluated where
    it cannot prove ``u`` real (``1 - b**2/a**2`` is ``zoo`` at ``a = 0``). Every input is
    real, so ``|u|' = sign(u)*u'``, and sign has derivative 0 (PyTorch's convention, and the
    value almost everywhere).

    In a branch of a Piecewise whose conditions (its own, and the earlier ones false) fix
    the sign of ``u``, ``|u|`` is ``u`` (or ``-u``) first (:func:`_branch_signs`): the
    branch's derivative is then its own at the branch's edge too. The Lambert W Newton
    step, ``wj - (wj*exp(wj) - x)/(exp(wj) + wj*exp(wj))``, is chosen as branches on the
    sign of wj in ``exp(-|wj|)``; differentiated as written, ``sign(wj)`` is 0 at wj = 0
    and the gradient there -0.5, not -1.
    """
    if expr.has(sympy.Piecewise) and expr.has(sympy.Abs):
        expr = expr.replace(lambda e: isinstance(e, sympy.Piecewise), _branch_signs)
    if expr.has(sympy.Max, sympy.Min):
        expr = expr.replace(lambda e: isinstance(e, (sympy.Max, sympy.Min)), _binary_nested)
    result = sympy.diff(expr, wrt)
    if result.has(sympy.Derivative):
        result = result.replace(lambda e: isinstance(e, sympy.Derivative), _real_derivative)
    return result


def _binary_nested(node: sympy.Expr) -> sympy.Expr:
    """Max(a, b, c, ...) as Max(Max(a, b), c) ..., unevaluated (Min alike), for
    :func:`real_diff`.

    SymPy flattens nested Max into one of n arguments, whose derivative in each is
    Heaviside(a_i - Max(others)), 1/2 at a tie: at a tie of three the weights sum to 3/2,
    not 1. The derivative of "letters hi" (Herbie; eleven nested Min and Max) was -2 at x =
    -1e38, y = 0.5, where -x, 0.45 - x and 0.725 - x are one float and the value -1. Two
    at a time, each level splits a tie in halves, as torch.maximum's gradient does, and
    the weights sum to 1.
    """
    if len(node.args) <= 2:
        return node
    nested = node.args[0]
    for arg in node.args[1:]:
        nested = node.func(nested, arg, evaluate=False)
    return nested


def _branch_signs(pw: sympy.Piecewise) -> sympy.Piecewise:
    """``pw`` with ``|u|`` written ``u`` (or ``-u``) in each branch whose conditions fix
    the sign of ``u`` (see :func:`real_diff`): the branch's own condition, and the
    earlier ones' negations (a later branch is taken where they are false)."""
    args = []
    earlier: dict[sympy.Expr, int] = {}  # what the earlier conditions, all false, say
    for value, cond in pw.args:
        signs: dict[sympy.Expr, int] = {}
        _sign_facts(cond, True, signs)
        for u, sign in earlier.items():
            signs.setdefault(u, sign)
        if signs:
            value = value.xreplace(
                {
                    a: signs[a.args[0]] * a.args[0]
                    for a in value.atoms(sympy.Abs)
                    if a.args[0] in signs
                }
            )
        args.append((value, cond))
        _sign_facts(cond, False, earlier)
    return sympy.Piecewise(*args)


def _sign_facts(cond: sympy.Basic, holds: bool, signs: dict[sympy.Expr, int]) -> None:
    """Into ``signs``: u -> 1 where ``cond`` (or, for ``holds`` False, its negation)
    makes u >= 0, -1 where it makes u <= 0; for u compared with a number, conjunctions
    of such (a disjunction that is false: each part false)."""
    if isinstance(cond, sympy.And if holds else sympy.Or):
        for part in cond.args:
            _sign_facts(part, holds, signs)
        return
    if not isinstance(cond, sympy.core.relational.Relational):
        return
    if not holds:
        cond = cond.negated
    lhs, rhs = cond.lhs, cond.rhs
    if lhs.is_number and not rhs.is_number:
        cond = cond.reversed
        lhs, rhs = cond.lhs, cond.rhs
    if not rhs.is_number or lhs.is_number or not rhs.is_extended_real:
        return
    if isinstance(cond, (sympy.GreaterThan, sympy.StrictGreaterThan)) and rhs >= 0:
        signs.setdefault(lhs, 1)
    elif isinstance(cond, (sympy.LessThan, sympy.StrictLessThan)) and rhs <= 0:
        signs.setdefault(lhs, -1)


def _real_derivative(d: sympy.Derivative) -> sympy.Expr:
    if not isinstance(d.expr, (sympy.sign, sympy.Abs)):
        return d
    result = d.expr
    for var, count in d.variable_count:
        for _ in range(count):
            if isinstance(result, sympy.sign):
                return sympy.S.Zero
            if isinstance(result, sympy.Abs):
                result = sympy.sign(result.args[0]) * real_diff(result.args[0], var)
            else:
                result = real_diff(result, var)
    return result


#: A product is printed in interleaved order (:func:`interleaved_product`) only where that
#: costs at most this many operations more than its power form (elementwise multiplies and
#: divides, cheap beside the transcendental calls around them: the second derivative of
#: sigmoid(x/s) in s, g*x*(2*s - x*tanh(x/2s))*sigmoid(x/s)*sigmoid(-x/s)/s**4, is two
#: more, and its s**4 underflows at s = 1e-80 where the value is 0, not 0 * inf). Four: a
#: half-integer power reaches the printers as its integer part times a square root
#: temporary (symgrad.cse), one multiply where the power form had one power;
#: sin(a)**3*g/(D**5*t*sqrt(t)) spread is four more, and with three it was left to
#: overflow (init_gamma0_from_alpha's d2/dD2, 0.3 -> 2.5 bits)
INTERLEAVE_EXTRA_OPS = 4
#: ... and has at most this many factors, powers counted by their exponent. Sixteen: the
#: products that take shared spread temporaries back (:mod:`symgrad.cse`) are that long;
#: pj_tsfn's d2/dphi2 has e**3*(1 - s)*k * c*w/(d**4*v**2), thirteen, and with twelve its
#: two halves were computed apart: e**3 inf times 1/d**4 zero, NaN at e = -7.4e187.
INTERLEAVE_MAX_FACTORS = 16


def _far_from_one(coeff: sympy.Expr) -> bool:
    """A number that moves where a power overflows by 8 binades or more: a polynomial
    fit's 1e-22 * x * x is finite in float32 up to x = 1e30, where x**2 is inf from 2e19
    (the second derivative of Krovak's mod-dY)."""
    return bool(coeff.is_number and coeff != 0 and not 2**-8 < abs(coeff) < 2**8)


def interleaved_product(
    expr: sympy.Expr,
    roots: bool = False,
    scalar: Callable[[sympy.Expr], bool] = lambda e: False,
    temporaries: Temporaries | None = None,
) -> tuple[sympy.Expr, list[tuple[str, sympy.Expr]]] | None:
    """A product with integer powers as (coefficient, [(op, factor), ...]), to be evaluated
    left to right: each base's factors spread evenly over the product, numerator and
    denominator alike (``op`` is ``"*"`` or ``"/"``, or ``"**"``: the product so far to
    the power ``factor``, where every exponent shares it); None where the product has no
    power to spread out, or where spreading it would cost too many operations.

    SymPy merges repeated factors into powers, and a power overflows (or underflows) long
    before the product does: D**2 * sin(g)**2 at D = 1e200, sin(g) = 1e-201 is inf * 0,
    though (D * sin(g))**2 = 0.01; m * (m - 1)**2 / v**2 overflows at m = 1e103, v = 1e200.
    Evaluated as D * sin(g) * D * sin(g) and ((m - 1)/v) * m * ((m - 1)/v), each partial
    product stays near the size of the result, as in the order the user wrote. A single
    power is spread only beside a coefficient far from 1: one below 1 scales first
    (1e-22 * x * x, where x**2 overflows first), one above 1 last (x * x * 1e22), as does
    any coefficient above 1 (see below). With
    ``roots``, a half-integer power is its integer part and a square root: t**-1.5
    divides by t, then by sqrt(t) (t**1.5 underflows at t = 3e-228). The printers never
    see one: :mod:`symgrad.cse` writes it so, with the square root a temporary; this is
    how it knows which shared powers the products spread. ``scalar`` tells the factors
    that are Python numbers at run time (see :func:`_group_equal_powers`);
    ``temporaries``, the shared temporaries printed so far (a power whose exponent varies,
    shared, is first too: see :func:`_first`).
    """
    coeff = sympy.S.One
    num: dict[sympy.Expr, int] = {}
    den: dict[sympy.Expr, int] = {}
    powers = 0
    for factor in sympy.Mul.make_args(expr):
        for f in sympy.Mul.make_args(factor):
            if f.is_number:
                coeff *= f
                continue
            base, e = f.as_base_exp()
            if e.is_Integer and e != 0:
                side = num if e > 0 else den
                side[base] = side.get(base, 0) + abs(int(e))
                powers += abs(int(e)) >= 2
            elif roots and e.is_Rational and e.q == 2 and abs(e) > 1:
                side = num if e > 0 else den
                side[base] = side.get(base, 0) + abs(e.p) // 2
                side[sqrt(base)] = side.get(sqrt(base), 0) + 1
                powers += 1
            else:
                num[f] = num.get(f, 0) + 1
    total = sum(num.values()) + sum(den.values())
    alone = len(num) + len(den) < 2 and not _far_from_one(coeff)
    if alone or not powers or total > INTERLEAVE_MAX_FACTORS:
        return None
    default_ops = len(num) - 1 + (not num) + len(den) + powers
    ops = total - 1 + (not num)
    if ops > default_ops + INTERLEAVE_EXTRA_OPS:
        return None

    # Each base's factors spread evenly over the product, the k-th of n at (k + 1/2)/n, so
    # that every partial product stays near a power of the whole: r**2/dt**4 is
    # (r/dt) / dt * (r/dt) / dt (a ratio of powers paired by _pair_ratios, below), never
    # r / dt * r (inf at dt = 1e84, r = 3e236, where the value is 1e138); g**2*x/h**2 is
    # (g/h) * x * (g/h). A numerator factor first where
    # there is one (1 / dt * r costs an operation more). Factors bounded by 1 first: where
    # one underflows to 0 and another overflows, 0 * inf is NaN, but 0 * x / s * ... stays
    # 0 (sigmoid(-x/s) * x / s**2 at x/s = inf). Upstream gradients last: the partial
    # products are then those of the value the accuracy choice measured (with the gradient
    # 1), which the gradient scales once at the end (where it came first, grad / t *
    # (w*exp(w) - x) / t overflows at w = -710, t = (1 + w)*exp(w), though the value is
    # 1.6e305).
    upstream = {b: n for b, n in num.items() if upstream_gradient(b)}
    if len(upstream) == len(num):  # (a gradient alone on top stays first: grad / t / t)
        upstream = {}
    _pair_ratios(num, den, upstream)
    # Powers with a common exponent m are the m-th power of one product of fewer factors:
    # a**2*b**2 is (a*b)**2, whose partial products a*b and its square lie between the
    # factor and the value, where the spread a*b*a overflows at a = 3e32, b = 2e-18 in
    # float32 though the value (a*b)**2 = 4e29 does not (and one multiply fewer).
    common = _common_power(num, den, upstream)
    for counts in (num, den):
        for b in counts:
            if b not in upstream:
                counts[b] //= common
    _group_equal_powers(num, den, upstream, scalar)

    def placed(op: str, counts: dict[sympy.Expr, int]) -> list[tuple]:
        """(position, op, factor) of each factor; "*" sorts before "/" at a tie."""
        return [
            (-1.0 if k == 0 and _first(b, temporaries) else (k + 0.5) / n, op, b)
            for b, n in counts.items()
            if b not in upstream
            for k in range(n)
        ]

    # (a stable sort: at a tie, the product's order)
    steps = [s[1:] for s in sorted(placed("*", num) + placed("/", den), key=lambda s: s[:2])]
    first = next((i for i, (op, _) in enumerate(steps) if op == "*"), 0)
    steps.insert(0, steps.pop(first))
    if common > 1:
        steps.append(("**", sympy.Integer(common)))
    # A coefficient above 1 in size scales last: first, it overflows a partial product
    # whose factors do not (8 * t * Ci * t at t = 1e38, Ci = 0 is inf * 0 in float32,
    # where t * Ci * t * 8 is 0); last, only where the value does. One below 1 scales
    # first, for the same reason (1e-22 * x * x).
    if abs(coeff) > 1:
        steps.append(("*", abs(coeff)))
        coeff = sympy.sign(coeff)
    return coeff, steps + [("*", b) for b, n in upstream.items() for _ in range(n)]


def _common_power(
    num: dict[sympy.Expr, int], den: dict[sympy.Expr, int], upstream: dict[sympy.Expr, int]
) -> int:
    """The greatest common divisor of the exponents of the product's factors, upstream
    gradients aside (they scale last, see :func:`interleaved_product`), where it has two
    bases or more; else 1 (a single base is spread out: (m/v)*(m/v))."""
    counts = [n for counts in (num, den) for b, n in counts.items() if b not in upstream]
    return math.gcd(*counts) if len(counts) >= 2 else 1


def _group_equal_powers(
    num: dict[sympy.Expr, int],
    den: dict[sympy.Expr, int],
    upstream: dict[sympy.Expr, int],
    scalar: Callable[[sympy.Expr], bool],
) -> None:
    """In place: the bases of one side that share an exponent of 2 or more as one base,
    their product, where the other side has one factor at most (upstream gradients and
    the coefficient and scalars aside). Spread, ``c / a / b / t * f / a / b / t`` has the partial
    product ``c*f / (a*b*t) / a``, inf at a = -5.2e-204, b = -2.6e75 (1/a is 2e203, 1/(a*b)
    7.5e127) where the value ``c*f/(a*b*t)**2`` is 8.8e255; as ``c * f / (a*b*t) /
    (a*b*t)`` each partial product lies between ``c*f`` and the value. The product of the
    bases over- or underflows only where the value does (it is the value's root, up to
    the one factor of the other side, which cannot bring it back: f / (a*b)**2 with a*b
    past 1.8e308 is below 6e-309). Bounded factors stay apart (first, see
    :func:`interleaved_product`)."""
    for side, other in ((num, den), (den, num)):
        if sum(n for b, n in other.items() if b not in upstream and not scalar(b)) > 1:
            continue
        by_count: dict[int, list[sympy.Expr]] = {}
        for b, n in side.items():
            if b not in upstream and n >= 2 and not bounded_by_one(b):
                by_count.setdefault(n, []).append(b)
        for n, bases in by_count.items():
            if len(bases) >= 2:
                for b in bases:
                    del side[b]
                side[sympy.Mul(*bases)] = n


def _pair_ratios(
    num: dict[sympy.Expr, int], den: dict[sympy.Expr, int], upstream: dict[sympy.Expr, int]
) -> None:
    """Each power over a power, where both are squares or more, as a power of their ratio
    (in place): m**2 / v**2 is (m / v) * (m / v). However it is spread, a product of the
    four factors has a partial product m**2 / v (or m / v**2), which underflows at m =
    5e-233, v = 1.8e-114 where the value (m / v)**2 = 9e-238 does not; the ratio, computed
    each time it is used (one division as before), is as large as the value's root. The
    largest powers pair first, each numerator base with the denominator base it shares
    the most inputs with; a remainder stays a power of its own base (m**3 / v**2 is
    (m / v) * m * (m / v)). Upstream gradients keep their places, and a product with a
    factor bounded by 1 is left as it is: that factor first, 0 where it underflows stays 0
    (exp(-3|y|/k) * y / k / k * y / k / k), where the ratio y / k alone may overflow
    (k = 1e-10, y = 1e300: 0 * inf is NaN; see :func:`interleaved_product`)."""
    if any(bounded_by_one(b) for b in num):
        return
    for a in sorted(num, key=lambda b: -num[b]):
        if num[a] < 2 or a in upstream:
            continue
        candidates = [b for b in den if den[b] >= 2]
        if not candidates:
            return
        b = max(candidates, key=lambda b: (len(a.free_symbols & b.free_symbols), den[b]))
        n = min(num[a], den[b])
        ratio = a / b
        for side, base in ((num, a), (den, b)):
            side[base] -= n
            if not side[base]:
                del side[base]
        num[ratio] = num.get(ratio, 0) + n


def paired_product(
    expr: sympy.Expr,
    scalar: Callable[[sympy.Expr], bool] = lambda e: False,
    temporaries: Temporaries | None = None,
) -> tuple[sympy.Expr, list[tuple[str, sympy.Expr]]] | None:
    """A product with no power to spread out but a quotient, as (coefficient, [(op,
    factor), ...]) like :func:`interleaved_product`: each denominator factor right after
    a numerator factor that shares inputs with it, one that grows as it does where there
    is one (:func:`scaling_degree`: their ratio is of degree 0), else the one that shares
    the most; then the other factors, upstream gradients last; None where there is no
    denominator, or a single numerator factor.

    Written as SymPy prints it, x0*x1/(1 - x1) multiplies first: inf at x0 = x1 = 1e200,
    where the value is -1e200; x1/(1 - x1)*x0 is -1 first. The same operations, another
    order (the printers' only; the common subexpressions are SymPy's). A single numerator
    factor divided by two tensors or more is divided by each in turn: x/(t*r) underflows
    at t = 3e-228, r = sqrt(t) (the half-integer power x*t**-1.5, see
    :mod:`symgrad.cse`), x/t/r does not. ``scalar`` tells the factors that are Python
    numbers at run time (a tensor's shape), which stay one divisor. ``temporaries``: the
    shared temporaries the factors may be or hold (:mod:`symgrad.cse`), whose growth is
    that of their values; a temporary shares the inputs of its value with a factor that
    grows alike (otherwise none: the order of the products that shared nothing stays).
    """
    coeff = sympy.S.One
    num: list[sympy.Expr] = []
    den: list[sympy.Expr] = []
    for f in sympy.Mul.make_args(expr):
        if f.is_number:
            coeff *= f
            continue
        base, e = f.as_base_exp()
        if e == -1:
            den.append(base)
        elif e.is_Integer and abs(e) >= 2:
            return None  # interleaved_product's
        else:
            num.append(f)
    if not den or (len(num) < 2 and not _divided_in_turn(num, den, scalar)):
        return None
    # bounded factors first, upstream gradients last (see interleaved_product)
    num.sort(key=lambda f: (not _first(f, temporaries), upstream_gradient(f)))
    steps: list[tuple[str, sympy.Expr]] = []
    known = Temporaries() if temporaries is None else temporaries
    for d in den:
        if not num:
            break
        degree = known.degree(d)
        shared = [len(f.free_symbols & d.free_symbols) for f in num]
        # of those that share inputs with d, one that grows as d does first (their ratio is
        # then of degree 0 when the inputs scale together): im/hypot(im, re)/sqrt(re +
        # hypot(im, re)), not 1/sqrt(re + hypot)/hypot*im, whose partial product
        # 1/(s**(1/2)*s) is inf at re = 9e-279, im = 1.6e-234 where the value is 2.8e116.
        # A shared temporary shares no input by its name; by its value, it shares those
        # of the factors that grow alike (the same product in the double backward's
        # function, where hypot and re + hypot are temporaries). (Not by its value for
        # the rest: products that shared nothing keep their order, gamma's Lanczos
        # series in float32 among them.)
        alike = [
            degree is not None
            and known.degree(f) == degree
            and (n > 0 or bool(known.inputs(f) & known.inputs(d)))
            for f, n in zip(num, shared)
        ]
        if max(shared) > 0 or any(alike):
            keys = list(zip(alike, shared))
            steps += [("*", num.pop(keys.index(max(keys)))), ("/", d)]
    steps += [("*", f) for f in num if not upstream_gradient(f)]
    steps += [("/", d) for d in den if ("/", d) not in steps]
    steps += [("*", f) for f in num if upstream_gradient(f)]
    return coeff, steps


def scaling_degree(
    expr: sympy.Expr, of: Callable[[sympy.Symbol], sympy.Rational | None] | None = None
) -> sympy.Rational | None:
    """d where ``expr`` at every input times c is c**d times ``expr`` (c > 0): 1 for
    hypot(x, y), -1/2 for 1/sqrt(x + hypot(x, y)), 0 for a number or atan(y/x). None where
    ``expr`` is not homogeneous in its inputs (x + 1, exp(x)) or is not known to be (a
    power with an exponent that is not a rational number, a call of two arguments other
    than hypot). ``of`` gives a symbol's degree (a temporary's: :class:`Temporaries`);
    without it every symbol is an input, of degree 1."""
    if expr.is_number:
        return sympy.S.Zero
    if expr.is_Symbol:
        return sympy.S.One if of is None else of(expr)
    if isinstance(expr, sympy.Pow):
        base = scaling_degree(expr.base, of)
        if base is None or not expr.exp.is_Rational:
            return None
        return base * expr.exp
    args = [scaling_degree(a, of) for a in expr.args]
    if None in args:
        return None
    if isinstance(expr, sympy.Mul):
        return sympy.Add(*args)
    if isinstance(expr, (sympy.Add, hypot, sympy.Abs, sympy.Max, sympy.Min)):
        return args[0] if len(set(args)) == 1 else None
    if isinstance(expr, sympy.sign) or (isinstance(expr, sympy.Function) and set(args) == {0}):
        return sympy.S.Zero
    return None


class Temporaries:
    """What :func:`paired_product` knows of the shared temporaries a printer has printed
    (:mod:`symgrad.cse`): each one's inputs and :func:`scaling_degree`, from its value,
    whose temporaries were recorded before it (so, recorded in order, without expanding
    a temporary into the inputs: a chain of temporaries that each use the one before
    twice would double in size at each step)."""

    def __init__(self) -> None:
        self._inputs: dict[sympy.Symbol, frozenset[sympy.Symbol]] = {}
        self._degrees: dict[sympy.Symbol, sympy.Rational | None] = {}
        self._sweeping: set[sympy.Symbol] = set()

    def record(self, temp: sympy.Symbol, value: sympy.Expr) -> None:
        self._inputs[temp] = self.inputs(value)
        self._degrees[temp] = self.degree(value)
        if varying_power(value):
            self._sweeping.add(temp)

    def sweeping(self, expr: sympy.Expr) -> bool:
        """``expr`` is a temporary whose value is a power with an exponent that varies
        (see :func:`_first`)."""
        return expr in self._sweeping

    def inputs(self, expr: sympy.Expr) -> frozenset[sympy.Symbol]:
        """The inputs ``expr`` depends on, through the temporaries in it."""
        return frozenset().union(*(self._inputs.get(s, {s}) for s in expr.free_symbols))

    def degree(self, expr: sympy.Expr) -> sympy.Rational | None:
        """:func:`scaling_degree` of ``expr``, a temporary's that of its value."""
        return scaling_degree(expr, lambda s: self._degrees.get(s, sympy.S.One))


def _divided_in_turn(num: list[sympy.Expr], den: list[sympy.Expr], scalar) -> bool:
    """``num`` (one factor at most) is divided by each tensor of ``den`` in turn: there are
    two of them or more, and ``num`` is not an upstream gradient (scaled last, see
    :func:`interleaved_product`: grad/(p*(p - 1)) would become 1/p/(p - 1)*grad, one
    operation more)."""
    return (
        len(num) == 1
        and not upstream_gradient(num[0])
        and not scalar(num[0])
        and sum(not scalar(d) for d in den) >= 2
    )


def upstream_gradient(expr: sympy.Expr) -> bool:
    """``expr`` is an upstream gradient (``grad``, ``grad_<output>``, ``grad_grad_<input>``;
    an input may be named ``grad_<name>`` too: it is then ordered as one, to no harm)."""
    return isinstance(expr, sympy.Symbol) and (expr.name == "grad" or expr.name.startswith("grad_"))


#: The shift of an exponential past its overflow: exp(w) * f = exp(w - EXP_SHIFT) * (f *
#: e**EXP_SHIFT) (regimes.exp_bounded_product), where w - 64 is exact for |w| >= 64 (an
#: integer off a float whose ulp is below 1) and e**64 (6.2e27) a float32 number; the
#: CSE never shares the scale with the shifted exponential (exp(w) again).
EXP_SHIFT = 64


def bounded_by_one(expr: sympy.Expr) -> bool:
    """``expr`` is at most 1 in magnitude for every real argument (exp(a) for a <= 0:
    exp(-|y|/k), 0 where y/k overflows, before the -2*y/k that is inf there)."""
    if isinstance(expr, grouped):
        return expr.args[1] == 1
    if isinstance(expr, sympy.exp):
        return known_nonpositive(expr.args[0])
    return isinstance(expr, (sigmoid, dsigmoid, sympy.sin, sympy.cos, sympy.tanh, sympy.erf))


def varying_power(expr: sympy.Expr) -> bool:
    """``expr`` is a power whose exponent varies (x**(1/n), 2**(-z)): at ordinary inputs
    it is 0 or inf, where the rational factors beside it are not."""
    return isinstance(expr, sympy.Pow) and bool(expr.exp.free_symbols)


def _first(expr: sympy.Expr, temporaries: Temporaries | None = None) -> bool:
    """``expr`` is a factor that a product computes first: one bounded by 1, or a power
    whose exponent varies (or a shared temporary that holds one, of ``temporaries``).
    Where it is 0 the product stays 0, and where it is inf, inf; later, its 0 meets a
    partial product of the others that overflowed (NaN): in the second derivative of
    (x + 1)**(1/n) - x**(1/n), (n - 1)/n/x * x**(1/n)/n/x is -inf * 0 at x = 2.8e-55,
    n = 8e-275, x**(1/n)*(n - 1)/n/x/n/x is 0."""
    return (
        bounded_by_one(expr)
        or varying_power(expr)
        or (temporaries is not None and temporaries.sweeping(expr))
    )


def known_nonpositive(a: sympy.Expr) -> bool:
    """``a`` is <= 0: as SymPy knows, or a negative number times factors that are >= 0
    (-|y|/k for k >= 0, which SymPy leaves open since 1/k may be zoo)."""
    if a.is_nonpositive:
        return True
    coeff, rest = a.as_coeff_Mul()
    return bool(coeff < 0) and all(known_nonnegative(f) for f in sympy.Mul.make_args(rest))


def known_nonnegative(f: sympy.Expr) -> bool:
    """``f`` is >= 0: as SymPy knows, |u|, a power of a base >= 0 (1/k), or a product of
    such (|y|/k)."""
    if f.is_nonnegative or isinstance(f, sympy.Abs):
        return True
    if isinstance(f, sympy.Mul):
        return all(known_nonnegative(factor) for factor in f.args)
    return isinstance(f, sympy.Pow) and known_nonnegative(f.base)


class grouped(sympy.Function):
    """A primitive's elementary form (``args[0]``) kept as one factor; ``args[1]`` is 1
    where the primitive is bounded by 1 (dsigmoid), else 0: :func:`of` builds it.

    The generated code writes primitives without a framework op (dsigmoid) in their
    elementary form before sharing subexpressions, so that their pieces (|x|, exp(-|x|))
    are computed once. But SymPy merges a product into the product around it: dsigmoid(u)
    * x / s**2 would become exp(-|u|) * x / (s**2 * (1 + exp(-|u|))**2), a product of
    more factors than is spread out (:data:`INTERLEAVE_MAX_FACTORS`), whose s**2
    underflows where the spread dsigmoid(u) / s * x / s does not. Printed as its form in
    parentheses; a factor bounded by 1 where the primitive is.
    """

    nargs = 2

    @classmethod
    def of(cls, primitive: sympy.Expr, form: sympy.Expr) -> grouped:
        return cls(form, sympy.S.One if bounded_by_one(primitive) else sympy.S.Zero)

    def _eval_is_extended_real(self):
        return self.args[0].is_extended_real


def _plain_product_plan(expr: sympy.Expr) -> tuple[sympy.Expr, list[tuple[str, sympy.Expr]]] | None:
    """A product of a number above 1 in magnitude and two factors or more that are not
    upstream gradients, no divisor among them, as (coefficient, [("*", factor), ...]) in
    SymPy's order (for :func:`_scaled_last`); else None."""
    if not isinstance(expr, sympy.Mul):
        return None
    coeff, rest = expr.as_coeff_Mul()
    factors = sympy.Mul.make_args(rest)
    if not (coeff.is_number and abs(coeff) > 1):
        return None
    if any(f.as_base_exp()[1].is_negative for f in factors):
        return None  # a quotient: paired_product's, or as SymPy prints it
    if sum(not upstream_gradient(f) for f in factors) < 2:
        return None
    return coeff, [("*", f) for f in factors]


def _scaled_last(
    coeff: sympy.Expr, steps: list[tuple[str, sympy.Expr]]
) -> tuple[sympy.Expr, list[tuple[str, sympy.Expr]]]:
    """A coefficient above 1 in magnitude multiplied last, before the upstream gradients
    (as :func:`interleaved_product` does): first, it overflows a partial product whose
    factors do not; last, only where the value does. The derivative of a*(1 - e*e) in e,
    -2*a*e, is -inf at a = 1e308, e = 0.5, where a*e*(-2) is -1e308. Its sign stays with
    it (one multiplication, no negation)."""
    if not (coeff.is_number and abs(coeff) > 1):
        return coeff, steps
    tail = len(steps)
    while tail and steps[tail - 1][0] == "*" and upstream_gradient(steps[tail - 1][1]):
        tail -= 1
    if not any(op == "*" for op, _ in steps[:tail]):
        return coeff, steps  # (1 / t * grad: nothing before the gradients to scale)
    return sympy.S.One, [*steps[:tail], ("*", coeff), *steps[tail:]]


def print_interleaved(printer, expr: sympy.Expr) -> str | None:
    """``expr`` printed by ``printer`` as an interleaved product, or None (see
    :func:`interleaved_product` and :func:`paired_product`)."""
    scalar = getattr(printer, "is_scalar", lambda e: False)  # the NumPy model has none
    temporaries = getattr(printer, "temporaries", None)  # the shared ones printed so far
    plan = (
        interleaved_product(expr, scalar=scalar, temporaries=temporaries)
        or paired_product(expr, scalar, temporaries)
        or _plain_product_plan(expr)
    )
    if plan is None:
        return None
    coeff, steps = _scaled_last(*plan)
    level = PRECEDENCE["Mul"]

    def factor_text(op: str, factor: sympy.Expr) -> str:
        # a divisor that is a product in parentheses too (strictly, 1 / a*b)
        strict = op == "/" and not isinstance(factor, sympy.Mul)
        return printer.parenthesize(factor, level, strict=strict)

    op, first = steps[0]
    text = factor_text(op, first) if op == "*" else f"1 / {factor_text(op, first)}"
    for op, factor in steps[1:]:
        if op == "**":  # the product so far, to a common power (interleaved_product)
            power = getattr(printer, "power_of_text", None)
            text = power(text, int(factor)) if power else f"({text})**{factor}"
        else:
            text += f" {op} {factor_text(op, factor)}"
    if coeff == 1:
        return text
    if coeff == -1:
        return f"-{text}"
    return f"{printer.parenthesize(coeff, level)} * {text}"
