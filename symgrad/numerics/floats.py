"""Float bit patterns: ordinals, ulp distances and Herbie's bits of error."""

from __future__ import annotations

import math
import struct
import sys

#: struct formats (float, same-width signed int) and width of each supported dtype.
DTYPES: dict[str, tuple[str, str, int]] = {
    "float64": ("<d", "<q", 64),
    "float32": ("<f", "<i", 32),
}
#: Largest finite value of each dtype.
FLOAT_MAX: dict[str, float] = {"float64": sys.float_info.max, "float32": 3.4028234663852886e38}


def _check_dtype(dtype: str) -> tuple[str, str, int]:
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use {' or '.join(DTYPES)}") from None


def round_to(value: float, dtype: str) -> float:
    """``value`` rounded to the nearest ``dtype`` float (+-inf past the largest finite)."""
    ffmt, _, _ = _check_dtype(dtype)
    if dtype == "float64" or not math.isfinite(value):
        return value
    try:
        return struct.unpack(ffmt, struct.pack(ffmt, value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def ordinal(value: float, dtype: str = "float64") -> int:
    """The float's position in the ordered sequence of ``dtype`` floats (``-0 == +0 == 0``).

    Adjacent floats have adjacent ordinals; +-inf sit just past the largest finite values.
    ``value`` must be representable in ``dtype`` and not NaN.
    """
    ffmt, ifmt, bits = _check_dtype(dtype)
    if math.isnan(value):
        raise ValueError("NaN has no ordinal")
    (i,) = struct.unpack(ifmt, struct.pack(ffmt, value))
    return i if i >= 0 else -(i & ((1 << (bits - 1)) - 1))


def from_ordinal(n: int, dtype: str = "float64") -> float:
    """The ``dtype`` float at ordinal ``n`` (the inverse of :func:`ordinal`)."""
    ffmt, ifmt, bits = _check_dtype(dtype)
    magnitude = abs(n)
    pattern = magnitude if n >= 0 else magnitude | (1 << (bits - 1))
    unsigned = ifmt.upper()
    return struct.unpack(ffmt, struct.pack(unsigned, pattern))[0]


def ulp_distance(a: float, b: float, dtype: str = "float64") -> int:
    """How many ``dtype`` floats lie between ``a`` and ``b`` (0 when equal)."""
    return abs(ordinal(a, dtype) - ordinal(b, dtype))


def bits_of_error(computed: float, exact_value: float, dtype: str = "float64") -> float:
    """Herbie's bits of error: ``log2(1 + ulps between computed and exact)``.

    ``exact_value`` is the correctly rounded exact result (already a ``dtype`` float, or
    +-inf for an overflow). A NaN result has the dtype's full width (64 or 32 bits).
    """
    _, _, bits = _check_dtype(dtype)
    if math.isnan(computed):
        return float(bits)
    return math.log2(1 + ulp_distance(computed, exact_value, dtype))
