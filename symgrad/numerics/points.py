"""Input points: the test extremes, benign intervals and scalar values of spec inputs."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from symgrad.numerics.floats import FLOAT_MAX, from_ordinal, ordinal, round_to
from symgrad.spec import Input

EXTREMES = (
    -1e4,
    -710.0,
    -100.0,
    -89.0,
    -30.0,
    -1.0,
    -1e-8,
    0.0,
    1e-8,
    1.0,
    30.0,
    89.0,
    100.0,
    710.0,
    1e4,
)


def scalar_value(inp: Input) -> float:
    """The value a scalar input takes in tests and measurements: its default, else a point
    inside its domain."""
    if inp.has_default and inp.default is not None:
        return inp.default
    lo, hi = inp.domain
    if math.isfinite(lo) and math.isfinite(hi):
        return (lo + hi) / 2
    if math.isfinite(lo):
        return lo + 1.0
    if math.isfinite(hi):
        return hi - 1.0
    return 1.0


def domain_interior(inp: Input) -> tuple[float, float]:
    """A benign sampling interval inside an input's domain (for gradcheck-style tests)."""
    lo, hi = inp.domain
    if math.isinf(lo) and math.isinf(hi):
        return (-2.0, 2.0)
    if math.isinf(hi):
        return (lo + 0.2, lo + 3.0)
    if math.isinf(lo):
        return (hi - 3.0, hi - 0.2)
    if math.isinf(hi - lo):
        # as wide as the floats ([-1.79e308, 1.79e308]): sampled as an unbounded domain
        # (the interval below was (inf, -inf): NaN samples, and a generated test file
        # that did not import)
        return (-2.0, 2.0)
    width = hi - lo
    return (lo + 0.1 * width, hi - 0.1 * width)


def extreme_points(inp: Input) -> list[float]:
    """Extreme and tricky values inside an input's domain (edges included)."""
    lo, hi = inp.domain
    points = [v for v in EXTREMES if lo <= v <= hi]
    for edge in (lo, hi):
        if math.isfinite(edge):
            points += [edge, edge + 1e-8 if edge == lo else edge - 1e-8]
    if inp.assumptions and dict(inp.assumptions).get("positive"):
        points = [p for p in points if p > 0]
    if dict(inp.assumptions).get("nonnegative"):
        points = [p for p in points if p >= 0]
    return sorted(set(p for p in points if lo <= p <= hi))


def sample_points(inp: Input, rng: random.Random, n: int) -> list[float]:
    """Random benign values inside the domain (rounded, to keep the test files readable)."""
    lo, hi = domain_interior(inp)
    return [round(rng.uniform(lo, hi), 6) for _ in range(n)]


#: Points at the ends of each dtype's range, each a float32 where it fits: where a
#: candidate's intermediate overflows (beta*x, x**2) though the value does not, it loses.
RANGE_ENDS = tuple(
    s * v
    for v in (1e38, round_to(3e38, "float32"), FLOAT_MAX["float32"], 1e308, FLOAT_MAX["float64"])
    for s in (-1.0, 1.0)
)


def sample(inputs: Sequence[Input], n: int, seed: str) -> list[dict[str, float]]:
    """Points drawn uniformly over the float64 bit patterns inside each tensor input's domain.

    Scalars take :func:`symgrad.numerics.points.scalar_value`.
    """
    rng = random.Random(seed)
    points = []
    largest = ordinal(FLOAT_MAX["float64"])
    for _ in range(n):
        point = {}
        for inp in inputs:
            if not inp.is_tensor:
                point[inp.name] = scalar_value(inp)
                continue
            lo, hi = inp.domain
            lo_n = -largest if math.isinf(lo) else ordinal(lo)
            hi_n = largest if math.isinf(hi) else ordinal(hi)
            point[inp.name] = from_ordinal(rng.randint(lo_n, hi_n))
        points.append(point)
    return points


def scalar_ends(inputs: Sequence[Input]) -> list[dict[str, float]]:
    """One point per scalar input and finite end of its domain other than its value."""
    ends = []
    for inp in inputs:
        if not inp.is_tensor:
            for end in inp.domain:
                if math.isfinite(end) and end != scalar_value(inp):
                    ends.append({inp.name: end})
    return ends


def _inside(value: float, lo: float, hi: float, dtype: str) -> float:
    """``value`` rounded to ``dtype``, nudged back inside ``[lo, hi]`` if rounding left it."""
    r = round_to(value, dtype)
    if r < lo:
        r = from_ordinal(ordinal(r, dtype) + 1, dtype)
    elif r > hi:
        r = from_ordinal(ordinal(r, dtype) - 1, dtype)
    return r


def float_domain(inp: Input, dtype: str) -> tuple[float, float]:
    """The domain of ``inp`` clipped to the finite floats of ``dtype`` and its assumptions."""
    big = FLOAT_MAX[dtype]
    lo, hi = (max(inp.domain[0], -big), min(inp.domain[1], big))
    assumptions = dict(inp.assumptions)
    if assumptions.get("positive") and lo <= 0:
        lo = from_ordinal(1, dtype)  # the smallest positive (subnormal) float
    elif assumptions.get("nonnegative") and lo < 0:
        lo = 0.0
    return _inside(lo, lo, hi, dtype), _inside(hi, lo, hi, dtype)


def sample_values(inp: Input, n: int, rng: random.Random, dtype: str = "float64") -> list[float]:
    """``n`` floats of ``dtype`` drawn Herbie-style: uniform over the bit patterns of the domain.

    Every float between the domain's ends is equally likely, so each binade gets about the
    same share of points (for ``[-inf, inf]`` most points are huge or tiny).
    """
    lo, hi = float_domain(inp, dtype)
    a, b = ordinal(lo, dtype), ordinal(hi, dtype)
    values = [from_ordinal(rng.randint(a, b), dtype) for _ in range(n)]
    if dict(inp.assumptions).get("integer"):
        values = [min(max(float(round(v)), math.ceil(lo)), math.floor(hi)) for v in values]
    return values


def dtype_extremes(inp: Input, dtype: str) -> list[float]:
    """The test extremes of ``inp`` that ``dtype`` represents, rounded to it."""
    lo, hi = float_domain(inp, dtype)
    points = {round_to(v, dtype) for v in extreme_points(inp)}
    return sorted(v for v in points if math.isfinite(v) and lo <= v <= hi)


def tame_value(inp: Input) -> float:
    """A tame value inside the domain (other inputs' value while one sits at an extreme)."""
    lo, hi = inp.domain
    if lo <= 0.5 <= hi and not (dict(inp.assumptions).get("integer")):
        return 0.5
    if math.isfinite(lo) and math.isfinite(hi):
        return (lo + hi) / 2
    if math.isfinite(lo):
        return lo + 1.0
    if math.isfinite(hi):
        return hi - 1.0
    return 1.0
