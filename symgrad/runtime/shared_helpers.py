"""Helpers of the generated modules that need no framework: plain Python on the operators
that torch tensors, TF tensors and NumPy arrays all have.

Copied into generated torch and TF modules alike (symgrad.runtime.copy_in), and run by the
NumPy model of the accuracy choice (symgrad.numerics.native), so that the choice measures
the very arithmetic the generated code does. Tested with each (tests/test_runtime.py).
"""

from __future__ import annotations


def _root_newton(root, x, q: int):
    """One Newton step for the q-th root of ``x`` from ``root``, pow's: it squares pow's
    error (NaN where root is 0 or inf: 0 / 0, inf / inf; the caller keeps pow's there)."""
    return root + (x / root ** (q - 1) - root) / q


def _root_powers(root, x, p: int, q: int):
    """``x**(p/q)`` from ``root``, the q-th root of x: root**s * |x|**n with n = trunc(p/q)
    and s = p - n*q of one sign, so that each part lies between 1 and the value and
    neither overflows where the value does not (|x|: -0.0 gives pow's +0.0)."""
    n = int(p / q)
    s = abs(p - n * q)
    value = root if s == 1 else root**s
    if p < 0:
        value = 1 / value
    if n:
        power = abs(x) if abs(n) == 1 else abs(x) ** abs(n)
        value = value * power if n > 0 else value / power
    return value
