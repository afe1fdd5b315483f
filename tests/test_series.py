"""The series generated modules evaluate in compiled code (symgrad.series), and the compiled
erfc built on one."""

from __future__ import annotations

import math
from pathlib import Path

import mpmath
import numpy as np
import pytest

from symgrad.series import (
    ERF_TAYLOR_BELOW,
    ERF_TAYLOR_TERMS_FLOAT32,
    ERF_TAYLOR_TERMS_FLOAT64,
    ERFC_SCALE,
    ERFC_TERMS_FLOAT32,
    ERFC_TERMS_FLOAT64,
    EXPM1_TAYLOR_BELOW,
    EXPM1_TAYLOR_TERMS_FLOAT32,
    EXPM1_TAYLOR_TERMS_FLOAT64,
    erf_taylor,
    erfc_chebyshev,
    expm1_taylor,
)


def _scaled_erfc(a: mpmath.mpf) -> mpmath.mpf:
    return (1 + 2 * a) * mpmath.exp(a * a) * mpmath.erfc(a)


def _clenshaw(coefficients, t):
    b1, b2 = mpmath.mpf(0), mpmath.mpf(0)
    for c in reversed(coefficients[1:]):
        b1, b2 = 2 * t * b1 - b2 + c, b1
    return t * b1 - b2 + coefficients[0]


def test_erfc_series_terms_reach_each_precision():
    """The terms left out by each dtype's cut sum to below 2**-56 (float64) or 2**-27
    (float32) of the first: the truncation costs no float's digit."""
    longer = erfc_chebyshev(45)
    assert erfc_chebyshev()[:ERFC_TERMS_FLOAT64] == longer[:ERFC_TERMS_FLOAT64]
    first = abs(longer[0])
    assert sum(map(abs, longer[ERFC_TERMS_FLOAT64:])) < 2**-56 * first
    assert sum(map(abs, longer[ERFC_TERMS_FLOAT32:])) < 2**-27 * first
    # and they are needed: one term fewer is not enough
    assert sum(map(abs, longer[ERFC_TERMS_FLOAT64 - 1 :])) > 2**-56 * first
    assert sum(map(abs, longer[ERFC_TERMS_FLOAT32 - 1 :])) > 2**-27 * first


@pytest.mark.parametrize("a", [0.0, 1e-8, 0.3, 1.0, 2.9, 3.0, 7.5, 26.0, 1e3, 1e8])
def test_erfc_series_is_the_scaled_erfc(a):
    """Summed exactly (mpmath), the float64 coefficients give (1 + 2a) exp(a^2) erfc(a)
    within 2**-53 relative, from 0 to far past float64's erfc underflow."""
    series = erfc_chebyshev()
    with mpmath.workdps(40):
        a = mpmath.mpf(a)
        t = (a - ERFC_SCALE) / (a + ERFC_SCALE)
        got, want = _clenshaw(series, t), _scaled_erfc(a)
        assert abs(got - want) < 2**-53 * want


@pytest.mark.parametrize(
    ("coefficients", "below", "terms", "bits"),
    [
        (erf_taylor, ERF_TAYLOR_BELOW, ERF_TAYLOR_TERMS_FLOAT64, 54),
        (erf_taylor, ERF_TAYLOR_BELOW, ERF_TAYLOR_TERMS_FLOAT32, 25),
        (expm1_taylor, EXPM1_TAYLOR_BELOW, EXPM1_TAYLOR_TERMS_FLOAT64, 54),
        (expm1_taylor, EXPM1_TAYLOR_BELOW, EXPM1_TAYLOR_TERMS_FLOAT32, 25),
    ],
)
def test_taylor_cuts_leave_less_than_half_an_ulp(coefficients, below, terms, bits):
    """At the edge of its range, each Taylor cut's first left-out term (the series
    alternate or fall off geometrically: it bounds the rest) is below 2**-bits of the
    first term, half an ulp; one term fewer is not."""
    longer = coefficients(terms + 2)
    assert coefficients(terms) == longer[:terms]
    # erf's series is in a**2, expm1's in x
    step = below**2 if coefficients is erf_taylor else below

    def relative(k):
        return abs(longer[k]) * step**k / abs(longer[0])

    assert relative(terms) < 2.0**-bits
    assert relative(terms - 1) > 2.0**-bits


def test_taylor_coefficients_are_the_functions_series():
    with mpmath.workdps(30):
        x = mpmath.mpf("0.3")
        erf = x * sum(c * x ** (2 * n) for n, c in enumerate(erf_taylor()))
        expm1 = sum(c * x ** (k + 1) for k, c in enumerate(expm1_taylor()))
        assert abs(erf - mpmath.erf(x)) < 1e-16 * mpmath.erf(x)
        assert abs(expm1 - mpmath.expm1(x)) < 1e-16 * mpmath.expm1(x)


ERFC_SPEC = """\
module: ec
functions:
  gelu_erf:
    inputs: {x: {}}
    output: x/2*(1 + erf(x/sqrt(2)))
"""


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_compiled_erfc_is_accurate_and_vectorised(generate_module, dtype):
    """Compiled for a CPU, ``_erfc`` is the series, not inductor's erfc (a scalar loop):
    within 4 ulp (float64) or 5 ulp (float32) of the correctly rounded erfc (relative;
    below the smallest normal, absolute), special values and dtypes as torch.erfc, and the
    generated gelu's fused path uses it."""
    import torch

    dtype = getattr(torch, dtype)
    m = generate_module(ERFC_SPEC)
    source = Path(m.__file__).read_text()
    assert "_erfc(" in source and "_ERFC_SERIES" in source
    gen = torch.Generator().manual_seed(3)
    limit = 27.5 if dtype == torch.float64 else 10.5  # erfc underflows past these
    x = torch.cat(
        [
            torch.rand(6000, generator=gen, dtype=torch.float64) * (limit + 6) - 6,
            10.0 ** (torch.rand(2000, generator=gen, dtype=torch.float64) * 30 - 30),
            -(10.0 ** (torch.rand(500, generator=gen, dtype=torch.float64) * 30 - 30)),
        ]
    ).to(dtype)
    erfc = torch.compile(m._erfc, dynamic=True, fullgraph=True)
    got = erfc(x).double()
    with mpmath.workdps(40):
        want = torch.tensor(
            [float(mpmath.erfc(mpmath.mpf(v))) for v in x.double().tolist()],
            dtype=torch.float64,
        ).to(dtype)
    ulp = torch.tensor([math.ulp(v) for v in want.double().tolist()], dtype=torch.float64)
    if dtype == torch.float32:  # float32's ulp, not float64's
        ulp = ulp * 2.0**29
    tiny = torch.finfo(dtype).smallest_normal
    bound = 4 if dtype == torch.float64 else 5
    err = (got - want.double()).abs()
    assert bool((err <= torch.maximum(bound * ulp, torch.full_like(ulp, tiny))).all()), (
        f"max error {float((err / ulp).max()):.1f} ulp at {float(x[(err / ulp).argmax()])}"
    )
    if dtype == torch.float32:
        # densely where the tail's five rounded factors meet: float64 erfc, rounded, is
        # float32's correctly rounded value (up to double rounding, far below an ulp)
        dense = torch.rand(1 << 21, generator=gen, dtype=torch.float64).mul_(10).add_(0.5)
        dense = dense.float()
        want = torch.erfc(dense.double()).float()
        ulp = torch.from_numpy(np.spacing(want.numpy())).double()
        err = (erfc(dense).double() - want.double()).abs()
        normal = want >= tiny
        assert float((err[normal] / ulp[normal]).max()) <= bound
    special = torch.tensor(
        [0.0, -0.0, 1e-300, 30.0, 1e30, -1e30, math.inf, -math.inf, math.nan], dtype=dtype
    )
    torch.testing.assert_close(erfc(special), torch.erfc(special), equal_nan=True)
    # integers and half precision: erfc's result dtype, as eagerly
    for integers in (torch.tensor([0, 1, 2, -3]), torch.tensor([True, False])):
        torch.testing.assert_close(erfc(integers), torch.erfc(integers))
    half = torch.tensor([-1.0, 0.5, 3.0], dtype=torch.float16)
    torch.testing.assert_close(erfc(half), torch.erfc(half))
    # the fused gelu (its forward and gradient call _erfc) agrees with the eager one
    x = x[x.abs() < 20].requires_grad_()
    eager = m.gelu_erf(x)
    (grad_eager,) = torch.autograd.grad(eager.sum(), x)
    m.use_fused(True)
    try:
        fused = m.gelu_erf(x)
        (grad_fused,) = torch.autograd.grad(fused.sum(), x)
    finally:
        m.use_fused(False)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(fused, eager, rtol=8 * eps, atol=tiny)
    # the gradient, Phi(x) + x phi(x), cancels near its zero (x = -0.75): terms below 1
    torch.testing.assert_close(grad_fused, grad_eager, rtol=8 * eps, atol=4 * eps)
