"""Accuracy-driven choice between equivalent formulas (Herbie-style, small).

Candidates are evaluated in float64 with NumPy at points sampled over the bit patterns of
each input's domain, and compared with the exact value (mpmath, via
:func:`symgrad.numerics.mp.exact`). The error measure is Herbie's: bits of error, log2 of
1 + the number of floats between the computed and the correctly rounded exact value.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import sympy

from symgrad import functions as F
from symgrad.derived import Accuracy
from symgrad.numerics.floats import FLOAT_MAX, bits_of_error, round_to
from symgrad.numerics.mp import Unresolved, at_precision, exact
from symgrad.numerics.native import call, evaluator
from symgrad.numerics.points import (
    RANGE_ENDS,
    dtype_extremes,
    sample,
    sample_values,
    scalar_ends,
    scalar_value,
    tame_value,
)
from symgrad.spec import Input

POINTS = 48
#: What a non-finite result (where the exact value is finite) costs in the choice's score,
#: in bits. Herbie counts it as 64 (as bad as a result with no correct digit); a NaN
#: gradient is worse than that, as it poisons every sum it enters (the batch's gradient,
#: then the weights), but not infinitely worse: a form that is finite garbage at half the
#: points must not win over one that overflows at one.
NON_FINITE_BITS = 128.0


#: Of the forms as accurate as the best in float64, those within this many bits of the best
#: float32 score (mean bits of float32 error at float32 points, a non-finite result counted
#: as :data:`NON_FINITE_BITS`) are as accurate in float32: the same formula is emitted for
#: both dtypes, and its float64 error does not rank float32 forms. The derivative of
#: sqrt(x + 1) - sqrt(x) as -1/(2*(x**(3/2) + sqrt(x) + x*sqrt(x + 1))) is as accurate
#: as -(1/sqrt(x + 1) + 1/sqrt(x))/(2*(sqrt(x) + sqrt(x + 1))**2) in float64; in
#: float32, x**(3/2) overflows past x = 4.9e25, where the value is a subnormal: 0.91
#: bits mean to the other's 0.49.
FLOAT32_MARGIN = 0.5


#: A chosen form is computed in float64 for float32 inputs (:func:`in_float64`) where
#: that lowers its mean float32 error at the float32 points by this many bits or more:
#: float32 arithmetic can lose what no form keeps (a sum of large terms of alternating
#: signs, Lanczos' gamma series; exp(a*x) of a rounded a*x), or overflow in an
#: intermediate although the value is a float32 number. The price (a cast of each input
#: and of the value, float64 arithmetic: about twice the time on a CPU, more on GPUs with
#: slow float64) is paid only where float32's own error is 3 ulps or more on average
#: beyond it (2 bits), past what float32 math libraries allow their functions (CUDA's:
#: 1 to 4 ulps). Binary cross-entropy's gradient, sigmoid(z) - target, loses 1 bit where
#: the two are close, and stays in float32.
FLOAT64_GAIN_BITS = 2.0

#: How many bits a form's worst point may be worse than the best form's worst and the form
#: still count as accurate as the best: a mean hides one region (the second derivative of
#: Student's t log-density, (nu + 1)*(x**2 - nu)/(nu + x**2)**2, cancels near x**2 = nu as a
#: difference of two quotients: 0.42 bits mean, 27 max, to the branched form's 0.11, 2).
WORST_SLACK = 8.0

#: float32 results must be finite where the exact value is below this (a margin for the
#: exact value at the float32-rounded point), or, at a point that is a float32 point,
#: where the exact value rounds to a finite float32
_F32_FINITE = 1e38


def _reference(expr: sympy.Expr, point: Mapping[sympy.Symbol, float]) -> float | None:
    """The exact value at ``point``; None where undefined or unknown (not measured)."""
    return _cached_reference(expr, tuple(point.items()))


@functools.lru_cache(maxsize=1 << 14)
def _cached_reference(expr: sympy.Expr, point: tuple) -> float | None:
    """:func:`_reference`, once per formula and point (the choice asks again where it
    splits by regime: :func:`regime_split`)."""
    try:
        return exact(expr, dict(point))
    except Unresolved:
        return None


def _at_float32(expr: sympy.Expr, point: Mapping[sympy.Symbol, float]) -> float | None:
    """The exact value of ``expr`` at ``point`` rounded to float32."""
    return _reference(expr, {s: round_to(v, "float32") for s, v in point.items()})


def _finite_in_float32(
    ref: float, args: Sequence[float], at_rounded: Callable[[], float | None]
) -> bool:
    """The exact value ``ref`` at ``args`` is finite in float32 (at the float32-rounded
    point: with a margin where rounding moves the point). Not known where float32 moves
    two inputs or more onto 0: the value there depends on the way to it (2*p/(x +
    hypot(x, 2*p)) at x = p = 0 is 0/0, and its limits along different ways differ); where
    it moves one, ``ref`` stands for the limit (x*log(x) at x = 0: 0, what xlogy gives),
    unless the exact value there, ``at_rounded()``, is infinite: a pole (log(x) at x =
    1e-300 is -690.8, and -inf at float32's x = 0). Only a pole whose exact value is an
    infinity is seen: one through a division (1/x, x**-0.1) is undefined there (None),
    and the float32 result is still required finite."""
    if not all(abs(a) <= FLOAT_MAX["float32"] for a in args):
        return False
    onto_zero = sum(a != 0 and round_to(a, "float32") == 0 for a in args)
    if onto_zero >= 2:
        return False
    if onto_zero == 1:
        there = at_rounded()
        if there is not None and math.isinf(there):
            return False
    if all(round_to(a, "float32") == a for a in args):
        return math.isfinite(round_to(ref, "float32"))
    return abs(ref) < _F32_FINITE


def _scored(
    expr: sympy.Expr,
    reference_expr: sympy.Expr,
    points: Sequence[Mapping[sympy.Symbol, float]],
    references: Sequence[float | None],
):
    """Per point of ``points``: None where the exact value is unknown; "overflow" or
    "missed" where it overflows and the result is or is not that infinity; else (bits of
    float64 error, non-finite in float64, non-finite in float32 where the exact value fits
    there)."""
    symbols = sorted(reference_expr.free_symbols | expr.free_symbols, key=lambda s: s.name)
    fn = evaluator(expr, symbols)
    with np.errstate(all="ignore"):
        for point, ref in zip(points, references):
            if ref is None:
                yield None
                continue
            args = [point[s] for s in symbols]
            value = call(fn, args, np.float64)
            if not math.isfinite(ref):
                yield "missed" if value != ref else "overflow"
                continue
            bad32 = False
            # float32: only non-finite results count (the error is measured in float64),
            # where the exact value is finite in float32 (asked only then: it can cost an
            # exact value at the float32 point)
            if not math.isfinite(call(fn, args, np.float32)):
                at_rounded = functools.partial(_at_float32, reference_expr, point)
                bad32 = _finite_in_float32(ref, args, at_rounded)
            yield bits_of_error(value, ref), not math.isfinite(value), bad32


def measure(
    expr: sympy.Expr,
    reference_expr: sympy.Expr,
    points: Sequence[Mapping[sympy.Symbol, float]],
    references: Sequence[float | None] | None = None,
) -> Accuracy:
    """Float64 error of ``expr`` against the exact value of ``reference_expr``; non-finite
    results counted in float64 and float32 (where the exact value fits in float32)."""
    symbols = sorted(reference_expr.free_symbols | expr.free_symbols, key=lambda s: s.name)
    if references is None:
        references = [_reference(reference_expr, p) for p in points]
    errors, scores, non_finite, non_finite64, overflow_misses = [], [], 0, 0, 0
    worst, worst_key = "", (-1, -1.0)
    for point, result in zip(points, _scored(expr, reference_expr, points, references)):
        if result is None or result == "overflow":
            continue
        if result == "missed":
            # the exact value overflows and the result is not that infinity. Counted
            # apart, a tie-break (most_accurate): in the score, formulas whose points
            # mostly overflow would be chosen by these points alone
            overflow_misses += 1
            continue
        bits, bad64, bad32 = result
        bad = bad64 or bad32
        errors.append(bits)
        scores.append(NON_FINITE_BITS if bad else bits)
        non_finite += bad64 + bad32
        non_finite64 += bad64
        if (bad, bits) > worst_key:
            worst_key = (bad, bits)
            worst = _point_text(point, symbols)
    if not errors:
        return Accuracy(0.0, 0.0, 0, 0, overflow_misses=overflow_misses)
    mean = sum(errors) / len(errors)
    score = sum(scores) / len(scores)
    return Accuracy(
        mean, max(errors), non_finite, len(errors), worst, non_finite64, score, overflow_misses
    )


#: A split of two forms by the size of one input (:func:`regime_split`) is taken where it
#: lowers the choice's score (mean bits, a non-finite result counted as
#: :data:`NON_FINITE_BITS`) by this many bits, at the choice's points and at more points
#: drawn apart (a threshold drawn from one sample can fit that sample alone).
REGIME_GAIN_BITS = 1.0

#: :func:`regime_split` pairs each of this many forms of the lowest score with every form
REGIME_PAIRED = 4


def _point_scores(
    expr: sympy.Expr,
    reference_expr: sympy.Expr,
    points: Sequence[Mapping[sympy.Symbol, float]],
    references: Sequence[float | None],
) -> list[float | None]:
    """The choice's score of ``expr`` at each point (see :func:`measure`); None where the
    point does not count (the exact value unknown, or overflowing)."""
    scores: list[float | None] = []
    for result in _scored(expr, reference_expr, points, references):
        if result is None or isinstance(result, str):
            scores.append(None)
        else:
            bits, bad64, bad32 = result
            scores.append(NON_FINITE_BITS if bad64 or bad32 else bits)
    return scores


def regime_split(
    reference_expr: sympy.Expr,
    candidates: Sequence[sympy.Expr],
    points: Sequence[Mapping[sympy.Symbol, float]],
    references: Sequence[float | None],
) -> tuple[sympy.Expr, sympy.Expr, sympy.Symbol, float] | None:
    """Herbie's regimes for two forms: the pair of ``candidates`` and the threshold on the
    size of one input that, with one form below it and the other at or above it, has the
    lowest mean score at ``points`` (see :func:`measure`), as (low form, high form, input,
    threshold); None where no split lowers the best single form's by
    :data:`REGIME_GAIN_BITS`. The threshold is a power of 2 between the sizes of the two
    points it parts (the one nearest their geometric mean), a boundary the sample says
    little more about.

    One form can be exact where another's intermediate overflows, and NaN where the
    other is exact: the second derivative of (x + 1)**(1/n) - x**(1/n) in x as a power
    difference, ((1 - 1/n)/n)*(x + 1)**(1/n - 2)*expm1(...), is exact at x = 1e308 but
    inf*0 where n is near 0 (1/n**2 overflows where the power underflows), and as the
    quotients SymPy writes, inf/inf at x = 1e308 and exact near n = 0."""
    table = []
    for candidate in candidates:
        try:
            table.append((candidate, _point_scores(candidate, reference_expr, points, references)))
        except (TypeError, NameError, KeyError, AttributeError):
            continue  # cannot be evaluated with NumPy
    counted = [i for i in range(len(points)) if table and all(t[1][i] is not None for t in table)]
    if len(counted) < 2:
        return None
    symbols = sorted(reference_expr.free_symbols, key=lambda s: s.name)
    varying = [v for v in symbols if len({abs(points[i][v]) for i in counted}) > 1]
    mean = {c: sum(scores[i] for i in counted) / len(counted) for c, scores in table}
    ranked = sorted(table, key=lambda t: mean[t[0]])
    best_single = mean[ranked[0][0]]
    found, lowest = None, best_single - REGIME_GAIN_BITS
    for v in varying:
        order = sorted(counted, key=lambda i: abs(points[i][v]))
        sizes = [abs(points[i][v]) for i in order]
        for a, scores_a in ranked[:REGIME_PAIRED]:
            for b, scores_b in table:
                if b is a:
                    continue
                # a below the threshold and b above, and b below and a above
                for low, high in ((scores_a, scores_b), (scores_b, scores_a)):
                    below, above = 0.0, sum(high[i] for i in order)
                    for k in range(1, len(order)):
                        below += low[order[k - 1]]
                        above -= high[order[k - 1]]
                        if sizes[k - 1] == sizes[k]:
                            continue
                        total = (below + above) / len(order)
                        if total < lowest:
                            lowest = total
                            pair = (a, b) if low is scores_a else (b, a)
                            found = (*pair, v, _threshold(sizes[k - 1], sizes[k]))
    return found


def _threshold(below: float, above: float) -> float:
    """A power of 2 in (below, above], the one nearest their geometric mean."""
    if below == 0:
        return math.ldexp(1.0, math.frexp(above)[1] - 1)
    middle = round((math.log2(below) + math.log2(above)) / 2)
    for e in (middle, middle + 1, middle - 1):
        t = math.ldexp(1.0, e)
        if below < t <= above:
            return t
    return above


def split_form(low: sympy.Expr, high: sympy.Expr, v: sympy.Symbol, at: float) -> sympy.Expr:
    """``low`` where ``|v| < at``, else ``high`` (:func:`regime_split`'s result as a
    formula; NaN inputs take ``high``)."""
    return sympy.Piecewise((low, sympy.Abs(v) < sympy.Float(at)), (high, True))


def float32_score(
    expr: sympy.Expr,
    reference_expr: sympy.Expr,
    points: Sequence[Mapping[sympy.Symbol, float]],
    references: Sequence[float | None],
) -> float:
    """Mean float32 bits of error of ``expr`` at ``points`` (float32 numbers) against the
    exact values ``references``, where they round to a finite float32; a non-finite result
    there counts :data:`NON_FINITE_BITS`. 0 where no point has such a value."""
    symbols = sorted(reference_expr.free_symbols | expr.free_symbols, key=lambda s: s.name)
    fn = evaluator(expr, symbols)
    scores = []
    with np.errstate(all="ignore"):
        for point, ref in zip(points, references):
            exact32 = math.nan if ref is None else round_to(ref, "float32")
            if not math.isfinite(exact32):
                continue
            value = call(fn, [point[s] for s in symbols], np.float32)
            bits = bits_of_error(value, exact32, "float32")
            scores.append(bits if math.isfinite(value) else NON_FINITE_BITS)
    return sum(scores) / len(scores) if scores else 0.0


def widened(expr: sympy.Expr, numbers: frozenset[sympy.Symbol] = frozenset()) -> sympy.Expr:
    """``expr`` computed in float64: each tensor leaf (every free symbol but the Python
    ``numbers``) as :class:`~symgrad.functions.in_float64`, the value rounded back to
    their dtype (:class:`~symgrad.functions.rounded_like`). ``expr`` where it has none."""
    leaves = sorted(expr.free_symbols - numbers, key=lambda s: s.name)
    if not leaves:
        return expr
    inner = expr.xreplace({s: F.in_float64(s) for s in leaves})
    return F.rounded_like(inner, *leaves)


def _float32_values(
    expr: sympy.Expr,
    symbols: Sequence[sympy.Symbol],
    points: Sequence[Mapping[sympy.Symbol, float]],
) -> list[float]:
    """``expr`` evaluated in float32 at each of ``points``."""
    fn = evaluator(expr, symbols)
    with np.errstate(all="ignore"):
        return [call(fn, [point[s] for s in symbols], np.float32) for point in points]


def _float32_bits(values: Sequence[float], against: Sequence[float | None]) -> list[float | None]:
    """Float32 bits of error of each of ``values`` against the float32 numbers
    ``against``; None where either is not finite."""
    return [
        bits_of_error(value, want, "float32")
        if want is not None and math.isfinite(want) and math.isfinite(value)
        else None
        for value, want in zip(values, against)
    ]


def in_float64(
    expr: sympy.Expr,
    reference_expr: sympy.Expr,
    points: Sequence[Mapping[sympy.Symbol, float]],
    fallbacks: Sequence[sympy.Expr] = (),
    numbers: frozenset[sympy.Symbol] = frozenset(),
) -> sympy.Expr:
    """``expr``, or ``expr`` computed in float64 for float32 inputs (:func:`widened`)
    where that lowers its mean float32 bits of error at the float32 ``points`` by
    :data:`FLOAT64_GAIN_BITS` or more against the exact values of ``reference_expr`` (of
    ``fallbacks`` where it has none), at the points where both results are finite: the
    precision float32 arithmetic loses. A float32 overflow in an intermediate is the
    rewrites' to mend, where it is (``4*z*dsigmoid(2*x)`` at z = 1e38), not a reason to
    pay for float64 everywhere. The exact values are asked only where the two forms
    differ by that much in float32: the float64 result rounded is within half an ulp of
    the exact value wherever float64 is accurate, so a form that float32 computes as
    well gains nothing."""
    wide = widened(expr, numbers)
    if wide is expr or not points:
        return expr
    symbols = sorted(reference_expr.free_symbols | expr.free_symbols, key=lambda s: s.name)
    narrow_values = _float32_values(expr, symbols, points)
    wide_values = _float32_values(wide, symbols, points)
    if _mean_known(_float32_bits(narrow_values, wide_values)) < FLOAT64_GAIN_BITS:
        return expr
    exact32 = [
        None if ref is None else round_to(ref, "float32")
        for ref in reference_values(reference_expr, points, fallbacks)
    ]
    both = [
        (a, b)
        for a, b in zip(_float32_bits(narrow_values, exact32), _float32_bits(wide_values, exact32))
        if a is not None and b is not None
    ]
    if not both:
        return expr
    gain = sum(a - b for a, b in both) / len(both)
    return wide if gain >= FLOAT64_GAIN_BITS else expr


def _mean_known(bits: Sequence[float | None]) -> float:
    """The mean of the known ``bits`` (0 where none is)."""
    known = [b for b in bits if b is not None]
    return sum(known) / len(known) if known else 0.0


def _point_text(point: Mapping[sympy.Symbol, float], symbols: Sequence[sympy.Symbol]) -> str:
    """``x = -1e+04, y = 2.5``: the inputs of a point (upstream gradients left out)."""
    return ", ".join(
        f"{s.name} = {point[s]:.4g}"
        for s in symbols
        if s.name != "grad" and not s.name.startswith("grad_")
    )


def most_accurate(
    candidates: Sequence[sympy.Expr],
    points: Sequence[Mapping[sympy.Symbol, float]],
    fallbacks: Sequence[sympy.Expr] = (),
    more: Sequence[Mapping[sympy.Symbol, float]] = (),
    costs: Sequence[Callable[[sympy.Expr], float]] = (),
    edges: Callable[[sympy.Expr], Sequence[Mapping[sympy.Symbol, float]]] | None = None,
    points32: Callable[[sympy.Expr], Sequence[Mapping[sympy.Symbol, float]]] | None = None,
) -> list[tuple[sympy.Expr, Accuracy]]:
    """The candidates as accurate as the best, with their measured accuracy, in the given
    order: within 1/2 bit of the best score (mean bits of error, a non-finite result
    counted as :data:`NON_FINITE_BITS`) and with a worst point at most
    :data:`WORST_SLACK` bits worse than the best's, of those the fewest non-finite
    results, of those the fewest that miss the infinity where the exact value
    overflows, and of those (where there are two or more) the ones within
    :data:`FLOAT32_MARGIN` of the best :func:`float32_score` at the float32 points
    ``points32`` gives for the reference (:func:`float32_points`, and the edges of its
    range at float32's largest number). The first
    candidate is the reference; where its exact value is unknown at a point, the first of
    ``fallbacks`` (other forms of the same formula) that has one. [] where none can be
    evaluated with NumPy.

    A contest is measured again on ``points`` and ``more`` together: where the cheapest of
    the candidates within the margin by one of ``costs`` (the forms the caller will take)
    is not the best measured. The margin lets the cheaper of two forms win on a sample
    that missed the tail where it fails (a split quotient 4.13 bits, the unsplit 4.18 on
    48 points of a two-input domain).

    ``edges`` gives points of a reference formula measured beside ``points`` (see
    :func:`edge_points`)."""
    reference_expr = candidates[0]
    if edges is not None:
        points = [*points, *edges(reference_expr)]
    references = reference_values(reference_expr, points, fallbacks)
    close = _closest(reference_expr, candidates, points, references)
    best = min((accuracy.score for _, accuracy in close), default=0.0)
    if more and any(min(close, key=lambda c: cost(c[0]))[1].score > best for cost in costs):
        references += reference_values(reference_expr, more, fallbacks)
        close = _closest(reference_expr, [c for c, _ in close], [*points, *more], references)
    if points32 is not None and len({c for c, _ in close}) > 1:
        at = points32(reference_expr)
        references32 = reference_values(reference_expr, at, fallbacks)
        scores = [float32_score(c, reference_expr, at, references32) for c, _ in close]
        close = [c for c, score in zip(close, scores) if score <= min(scores) + FLOAT32_MARGIN]
    return close


def reference_values(
    reference_expr: sympy.Expr,
    points: Sequence[Mapping[sympy.Symbol, float]],
    fallbacks: Sequence[sympy.Expr],
) -> list[float | None]:
    """The exact values at ``points`` (see :func:`most_accurate`)."""
    references = []
    for p in points:
        value = _reference(reference_expr, p)
        for other in fallbacks:
            value = _reference(other, p) if value is None else value
        references.append(value)
    return references


def _closest(
    reference_expr: sympy.Expr,
    candidates: Sequence[sympy.Expr],
    points: Sequence[Mapping[sympy.Symbol, float]],
    references: Sequence[float | None],
) -> list[tuple[sympy.Expr, Accuracy]]:
    """:func:`most_accurate` on one sample, ``candidates`` measured against the exact
    values ``references``."""
    scored = []
    for candidate in candidates:
        try:
            accuracy = measure(candidate, reference_expr, points, references)
        except (TypeError, NameError, KeyError, AttributeError):
            continue  # cannot be evaluated with NumPy: not measurable, not chosen
        scored.append((candidate, accuracy))
    if not scored:
        return []
    # Not fewest non-finite first: a form that is exact wherever it does not overflow
    # beats one that is finite garbage at half the points (see NON_FINITE_BITS).
    best = min(scored, key=lambda c: c[1].score)[1]
    close = [
        c
        for c in scored
        if c[1].score <= best.score + 0.5 and c[1].max_bits <= best.max_bits + WORST_SLACK
    ]
    fewest = min(c[1].non_finite for c in close)
    close = [c for c in close if c[1].non_finite == fewest]
    # then the fewest results that are not the infinity where the exact value overflows
    # ((16*x**8 - 105)*exp(x**2)/x**8 is inf/inf = NaN at x = 1e40)
    fewest = min(c[1].overflow_misses for c in close)
    return [c for c in close if c[1].overflow_misses == fewest]


def symbol_points(
    inputs: Sequence[Input],
    symbols: Mapping[str, sympy.Symbol],
    extra: Sequence[sympy.Symbol] = (),
    n: int = POINTS,
    seed: str = "symgrad",
) -> list[dict[sympy.Symbol, float]]:
    """Sample points keyed by symbol; ``extra`` symbols (upstream gradients) are 1."""
    from symgrad.numerics.points import extreme_points

    points = [{symbols[k]: v for k, v in p.items()} for p in sample(inputs, n, seed)]
    base = points[0] if points else {}
    tensors = [inp for inp in inputs if inp.is_tensor]
    # With two tensor inputs or more, each one's extreme points also with the others at
    # their tame value (as the accuracy tables put them; the tests, at a benign one): at
    # the drawn base the others are often extreme too (e = 6e-58), where no form is
    # accurate, and a form that is NaN at x = 710, e = 0.5 went unseen. (Not the range
    # ends there: with them a float32 row of the held-out corpus lost points to NaN.)
    tame = None
    if len(tensors) > 1:
        tame = base | {symbols[i.name]: round_to(tame_value(i), "float32") for i in tensors}
    for inp in tensors:
        lo, hi = inp.domain
        # the test extremes, and the ends of each dtype's range
        edges = [v for v in RANGE_ENDS if lo <= v <= hi]
        extremes = extreme_points(inp)
        points += [{**base, symbols[inp.name]: v} for v in extremes + edges]
        if tame is not None:
            points += [{**tame, symbols[inp.name]: v} for v in extremes + edges]
        # scalars at the ends of their domain too: beta*x overflows for beta = 10
        for scalar in scalar_ends(inputs):
            values = {symbols[name]: v for name, v in scalar.items()}
            points += [{**base, **values, symbols[inp.name]: v} for v in edges]
    for p in points:
        p.update({g: 1.0 for g in extra})
    return points


#: Binades inside an edge of the exact value's range (where it overflows float64, or passes
#: 1e38 for float32) at which the choice measures each input, the others at their tame
#: value: a form whose intermediate overflows before the value does fails in a band just
#: inside the edge, which points drawn over the bit patterns can miss. Rump's polynomial
#: over one denominator, (2*a + b*(... + 22*b**8))/(4*b), has b**9 past b = 2**113.7 where
#: the value overflows past 2**127; x**2 in a value of size x fails 512 binades in.
EDGE_STEPS = (1, 4, 16, 64, 256)

#: Binades inside the edge where the exact value passes float32's largest number at which
#: the float32 tie-break measures (0: the binade of the last power of 2 inside the edge:
#: toward infinity the one the value crosses the limit in, toward 0 the one after it,
#: whose points are all inside), and the mantissas there: an
#: intermediate a few times the value overflows only in the last binades
#: (``1/(x*sqrt(x))`` in a value of ``x**-1.5/4``, where ``x < 2.05e-26``, the value
#: past ``8.3e37``).
FLOAT32_EDGE_STEPS = (0, 1)
FLOAT32_EDGE_MANTISSAS = (1.0417, 1.4142, 1.866)

#: The mantissa of the points put inside an edge (a power of 2 would be a point where
#: products and squares are exact)
_EDGE_MANTISSA = 1.6180339887498949 / 2

#: Working precision of the search for an edge: only the value's size matters there
_EDGE_PREC = 64


def edge_points(
    reference_expr: sympy.Expr,
    base: Mapping[sympy.Symbol, float],
    axes: Mapping[sympy.Symbol, Input],
    limits: Sequence[float] = (math.inf, _F32_FINITE),
    steps: Sequence[int] = EDGE_STEPS,
    mantissas: Sequence[float] = (2 * _EDGE_MANTISSA,),
) -> list[dict[sympy.Symbol, float]]:
    """Points just inside each edge of the range where the exact value of
    ``reference_expr`` is below each of ``limits`` (finite in float64, and below 1e38 for
    float32), along each input of ``axes`` (the others at ``base``): each way (toward
    infinity and toward 0) and sign, the binade of the edge is found by bisection on the
    exponent, and points are put ``steps`` binades inside it (0: in the edge's binade), at
    each of ``mantissas`` (in [1, 2)). No points along an axis where the value has no such
    edge (it stays finite to the end of the float range, or is not finite at the
    axis' start)."""
    points = []
    for symbol, inp in axes.items():
        if symbol not in reference_expr.free_symbols:
            continue
        integer = bool(dict(inp.assumptions).get("integer"))
        for sign in (1.0, -1.0):
            span = _exponents(inp, sign)
            if span is None:
                continue
            lowest, start, highest = span
            size = _size_along(reference_expr, base, symbol, sign)
            if not size(start) < _F32_FINITE:
                continue
            for limit in limits:
                for end in (highest, lowest):
                    if end == start or (end < start and integer) or size(end) < limit:
                        continue
                    inside = _last_below(size, limit, start, end)
                    for x in _inside_edge(inside, start, end, sign, integer, steps, mantissas):
                        if inp.domain[0] <= x <= inp.domain[1]:
                            points.append({**base, symbol: x})
    return points


def _last_below(size: Callable[[int], float], limit: float, start: int, end: int) -> int:
    """The exponent from ``start`` toward ``end`` at which ``size`` is last below
    ``limit``, by bisection (``size(start)`` is below it, ``size(end)`` is not)."""
    inside, outside = start, end
    while abs(outside - inside) > 1:
        middle = (inside + outside) // 2
        if size(middle) < limit:
            inside = middle
        else:
            outside = middle
    return inside


def _inside_edge(
    inside: int,
    start: int,
    end: int,
    sign: float,
    integer: bool,
    steps: Sequence[int],
    mantissas: Sequence[float],
) -> list[float]:
    """The points ``steps`` binades back from the edge's binade ``inside`` toward
    ``start`` (not past it), at each of ``mantissas``, float32 numbers where they are
    (integers for an integer input)."""
    way = 1 if end > start else -1
    values = []
    for k in steps:
        e = inside - way * k
        if (e - start) * way < 0:
            break
        for mantissa in mantissas:
            x = math.ldexp(sign * mantissa, e)
            x32 = round_to(x, "float32")
            x = x32 if x32 != 0 and math.isfinite(x32) else x
            values.append(float(round(x)) if integer else x)
    return values


def _size_along(
    expr: sympy.Expr, base: Mapping[sympy.Symbol, float], symbol: sympy.Symbol, sign: float
) -> Callable[[int], float]:
    """``e -> |expr|`` at ``symbol = sign * 2**e``, the others at ``base`` (infinite where
    undefined), at the working precision of an edge's search; each ``e`` evaluated once."""

    @functools.cache
    def size(e: int) -> float:
        point = {**base, symbol: math.ldexp(sign, e)}
        value = at_precision(expr, point, _EDGE_PREC)[0]
        return math.inf if value is None else abs(value)

    return size


def _exponents(inp: Input, sign: float) -> tuple[int, int, int] | None:
    """The least, a middle and the greatest exponent ``e`` such that ``sign * 2**e`` is in
    ``inp``'s domain (the middle is 0 where it is in the domain); None where none is."""
    lo, hi = (inp.domain[0], inp.domain[1]) if sign > 0 else (-inp.domain[1], -inp.domain[0])
    if hi <= 0:
        return None
    lowest = -1074 if lo <= 0 else math.ceil(math.log2(lo))
    highest = 1023 if math.isinf(hi) else math.floor(math.log2(hi))
    if lowest > highest:
        return None
    return lowest, min(max(0, lowest), highest), highest


def float32_points(
    inputs: Sequence[Input],
    symbols: Mapping[str, sympy.Symbol],
    extra: Sequence[sympy.Symbol] = (),
    n: int = POINTS,
    seed: str = "symgrad",
) -> list[dict[sympy.Symbol, float]]:
    """Float32 points for the choice's float32 tie-break (:func:`most_accurate`), put as
    the accuracy tables' float32 rows put theirs (another draw): each tensor input at its
    float32 extremes with the others at their tame value, then ``n`` points drawn
    uniformly over the float32 bit patterns of each tensor input's domain (the choice's
    own points are drawn over float64's: mostly past float32's range). Scalars at their
    value, ``extra`` symbols (upstream gradients) 1."""
    rng = random.Random(f"{seed}:float32")
    tensors = [inp for inp in inputs if inp.is_tensor]
    fixed = {symbols[i.name]: scalar_value(i) for i in inputs if not i.is_tensor}
    fixed.update({g: 1.0 for g in extra})
    tame = {symbols[i.name]: round_to(tame_value(i), "float32") for i in tensors}
    points = [
        {**tame, **fixed, symbols[inp.name]: v}
        for inp in tensors
        for v in dtype_extremes(inp, "float32")
    ]
    columns = {symbols[i.name]: sample_values(i, n, rng, "float32") for i in tensors}
    points += [{**{s: col[k] for s, col in columns.items()}, **fixed} for k in range(n)]
    return points


def more_points(
    inputs: Sequence[Input],
    symbols: Mapping[str, sympy.Symbol],
    extra: Sequence[sympy.Symbol] = (),
    n: int = POINTS,
    seed: str = "symgrad",
) -> list[dict[sympy.Symbol, float]]:
    """``n`` more points, after :func:`symbol_points`' (the same draw, continued): where
    :func:`most_accurate` settles a contest."""
    drawn = sample(inputs, POINTS + n, seed)[POINTS:]
    return [{**{symbols[k]: v for k, v in p.items()}, **{g: 1.0 for g in extra}} for p in drawn]


_ = F  # the primitives must be registered before lambdify sees their names
