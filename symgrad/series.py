"""Series the generated modules evaluate where a compiler's own op is slow or inaccurate.

Computed here with mpmath, at generation time, so that every coefficient in generated code
can be re-derived (``tests/test_series.py`` checks them against the functions they stand for).
"""

from __future__ import annotations

import math
from functools import cache

import mpmath

#: The Chebyshev variable of :func:`erfc_chebyshev` is t = (a - ERFC_SCALE) / (a + ERFC_SCALE).
ERFC_SCALE = 3
#: Terms of the series that reach float64's (float32's) precision: the terms left out sum
#: to below 2**-56 (2**-27) of the first (tests/test_series.py).
ERFC_TERMS_FLOAT64 = 25
ERFC_TERMS_FLOAT32 = 12
#: Below this |x|, erfc(x) is 1 -+ erf(|x|) from erf's Taylor series (:func:`erf_taylor`):
#: there erfc is near 1, and the product of rounded factors above would cost ulps.
ERF_TAYLOR_BELOW = 0.5
#: Taylor terms that reach float64's (float32's) precision below ERF_TAYLOR_BELOW.
ERF_TAYLOR_TERMS_FLOAT64 = 12
ERF_TAYLOR_TERMS_FLOAT32 = 6
#: Below this |x|, expm1(x) is its Taylor polynomial (:func:`expm1_taylor`); above, exp(x) - 1
#: loses at most an ulp to the subtraction.
EXPM1_TAYLOR_BELOW = 0.5
EXPM1_TAYLOR_TERMS_FLOAT64 = 14
EXPM1_TAYLOR_TERMS_FLOAT32 = 8


@cache
def erfc_chebyshev(terms: int = ERFC_TERMS_FLOAT64, nodes: int = 80) -> tuple[float, ...]:
    """Chebyshev coefficients c_k of ``(1 + 2a) * exp(a**2) * erfc(a)`` for a >= 0, in
    t = (a - 3) / (a + 3) on [-1, 1]: the function is smooth on the whole half line, its
    limit at infinity (t = 1) is 2 / sqrt(pi), and the coefficients fall off
    geometrically (Shepherd and Laframboise, Math. Comp. 36 (1981) 249-253, use this
    map). Computed by interpolation at ``nodes`` Chebyshev points with 60 digits and
    rounded to float64: c_0 / 2 is folded into c_0, so the sum is c_0 + sum c_k T_k(t).
    """
    with mpmath.workdps(60):
        scale = mpmath.mpf(ERFC_SCALE)

        def f(t: mpmath.mpf) -> mpmath.mpf:
            if t == 1:
                return 2 / mpmath.sqrt(mpmath.pi)
            a = scale * (1 + t) / (1 - t)
            return (1 + 2 * a) * mpmath.erfc(a) * mpmath.exp(a * a)

        angles = [mpmath.pi * (k + mpmath.mpf(1) / 2) / nodes for k in range(nodes)]
        values = [f(mpmath.cos(angle)) for angle in angles]
        coefficients = [
            2 * mpmath.fsum(v * mpmath.cos(j * angle) for v, angle in zip(values, angles)) / nodes
            for j in range(terms)
        ]
        coefficients[0] /= 2
        return tuple(float(c) for c in coefficients)


@cache
def erf_taylor(terms: int = ERF_TAYLOR_TERMS_FLOAT64) -> tuple[float, ...]:
    """Coefficients p_n of erf(a) = a * sum p_n (a**2)**n, the Taylor series at 0:
    p_n = 2 / sqrt(pi) * (-1)**n / (n! (2n + 1)), rounded to float64."""
    with mpmath.workdps(40):
        return tuple(
            float(2 / mpmath.sqrt(mpmath.pi) * (-1) ** n / (mpmath.factorial(n) * (2 * n + 1)))
            for n in range(terms)
        )


@cache
def expm1_taylor(terms: int = EXPM1_TAYLOR_TERMS_FLOAT64) -> tuple[float, ...]:
    """Coefficients 1 / k! (k = 1 ... ``terms``) of expm1(x) = x + x**2 / 2 + ..., each
    correctly rounded (k! is exact in float64 for k <= 18)."""
    return tuple(1 / math.factorial(k) for k in range(1, terms + 1))
