"""Derive forward, VJP, JVP and second-order formulas for each spec function with SymPy."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import itertools
import math
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence

import sympy
from sympy.functions.elementary.hyperbolic import HyperbolicFunction
from sympy.functions.elementary.trigonometric import TrigonometricFunction

from symgrad.choose import (
    FLOAT32_EDGE_MANTISSAS,
    FLOAT32_EDGE_STEPS,
    FLOAT64_GAIN_BITS,
    REGIME_GAIN_BITS,
    WORST_SLACK,
    edge_points,
    float32_points,
    in_float64,
    more_points,
    reference_values,
    regime_split,
    split_form,
    symbol_points,
)
from symgrad.choose import measure as measure_error  # (``measure`` is derive's flag)
from symgrad.cost import eager_cost, op_cost
from symgrad.derived import Accuracy, Derived
from symgrad.errors import DerivationError, Location, SpecError, raise_all
from symgrad.expr import parse_formula
from symgrad.functions import (
    dsigmoid,
    heaviside_as_piecewise,
    hypot,
    hypot_ratio,
    known_functions,
    piecewise_folded,
    real_diff,
    sigmoid,
)
from symgrad.numerics.floats import FLOAT_MAX, round_to
from symgrad.numerics.points import scalar_value, tame_value
from symgrad.rewrite.phases import phase
from symgrad.rewrite.regimes import (
    FACTORED_FIRED,
    FACTORED_TAILS,
    linear_ratios,
    linear_terms_unscaled,
    split_regimes,
)
from symgrad.rewrite.rules import sign_of_factors, stabilize
from symgrad.spec import Function, Spec

#: Formulas larger than this (SymPy op count) are not given to simplify: the bound is on
#: size, not time, so that output never depends on how fast or loaded the machine is.
SIMPLIFY_MAX_OPS = 150
#: Formulas with trigonometric or hyperbolic functions larger than this are not given to
#: simplify either: its trigsimp grows fastest with size (7 s at 104 ops, GELU's second
#: derivative, against 0.3 s at 30).
SIMPLIFY_TRIG_MAX_OPS = 60
#: A last-resort guard against a SymPy hang; never reached by the formulas seen so far
#: (simplify takes < 0.3 s on each of them).
SIMPLIFY_SECONDS = 60.0

#: Set (to anything but "" or "0"), a candidate rewrite that raises fails the derivation,
#: as symgrad's own tests run: unset, the form is left out and the function's ``skipped``
#: says so (:func:`finish`).
STRICT_REWRITES_ENV = "SYMGRAD_STRICT_REWRITES"

#: The candidate rewrites that raised while the current function was derived (see
#: :func:`finish`): lines for a note.
_SKIPPED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "skipped_rewrites", default=None
)


def _skipped(rewrite: Callable, form: sympy.Expr, exc: Exception) -> None:
    """Record (or, under :data:`STRICT_REWRITES_ENV` or outside :func:`derive_function`,
    where nothing would report it, raise) a candidate rewrite that raised on ``form``."""
    skipped = _SKIPPED.get()
    if skipped is None or os.environ.get(STRICT_REWRITES_ENV, "") not in ("", "0"):
        raise exc
    name = getattr(rewrite, "__name__", repr(rewrite))
    first = (str(exc).splitlines() or [""])[0][:120]
    text = str(form) if len(str(form)) <= 100 else f"{str(form)[:97]}..."
    line = f"the candidate rewrite {name} raised {type(exc).__name__} ({first}) on {text}"
    if line not in skipped:
        skipped.append(line)


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise TimeoutError after ``seconds`` (main thread only; elsewhere no limit)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "setitimer"
    ):
        yield
        return

    def _raise(signum, frame):
        raise TimeoutError

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _cost(expr: sympy.Expr) -> int:
    return int(sympy.count_ops(expr, visual=False))


def _simplifiable(expr: sympy.Expr) -> bool:
    """``expr`` is small enough for simplify (see :data:`SIMPLIFY_MAX_OPS`)."""
    trig = expr.has(TrigonometricFunction, HyperbolicFunction)
    return _cost(expr) <= (SIMPLIFY_TRIG_MAX_OPS if trig else SIMPLIFY_MAX_OPS)


def _drop_dirac(expr: sympy.Expr) -> sympy.Expr:
    """Heaviside/sign derivatives: PyTorch's convention is 0, not a Dirac delta."""
    if expr.has(sympy.DiracDelta):
        expr = expr.replace(lambda e: isinstance(e, sympy.DiracDelta), lambda e: sympy.S.Zero)
    return expr


def _simplify(expr: sympy.Expr) -> sympy.Expr:
    """SymPy's simplify, branch values only for Piecewise.

    Simplifying a Piecewise as a whole substitutes Eq(x, 0) conditions into their branch
    (exp(x) -> 1 where x == 0), which is right for the value but makes the derivative of
    that branch 0 instead of the one-sided mean at a tie.
    """
    expr, restore = _opaque_number_powers(expr)
    if not expr.has(sympy.Piecewise):
        return restore(known_functions(sympy.simplify(expr)))
    return restore(
        expr.replace(
            lambda e: isinstance(e, sympy.Piecewise),
            lambda e: sympy.Piecewise(
                *((known_functions(sympy.simplify(v)), c) for v, c in e.args)
            ),
        )
    )


def _opaque_number_powers(expr: sympy.Expr):
    """``expr`` with each power of a number to a variable exponent (``10**(p(x))``) as an
    opaque function of its exponent, and the function that puts the powers back.

    simplify splits ``10**(c + ...)`` into ``10**c * ...``; for a polynomial exponent with
    decimal coefficients, expanded, ``c`` is a rational of fifty digits, and factoring
    ``10**(p/q)`` then computes ``10**p`` (minutes, for nothing: the split is never
    cheaper or more accurate than the power).
    """
    bases = sorted(
        {
            e.base
            for e in expr.atoms(sympy.Pow)
            if e.base.is_Number and e.base.is_positive and not e.exp.is_number
        },
        key=sympy.default_sort_key,
    )
    powers = {b: sympy.Function(f"symgrad_pow_{k}") for k, b in enumerate(bases)}
    if not powers:
        return expr, lambda e: e
    opaque = expr.replace(
        lambda e: e.is_Pow and e.base in powers and not e.exp.is_number,
        lambda e: powers[e.base](e.exp),
    )
    back = {f: b for b, f in powers.items()}

    def restore(e: sympy.Expr) -> sympy.Expr:
        return e.replace(
            lambda a: isinstance(a, sympy.core.function.AppliedUndef) and a.func in back,
            lambda a: back[a.func] ** a.args[0],
        )

    return opaque, restore


def _abs_free(expr: sympy.Expr) -> sympy.Expr | None:
    """``expr`` without Abs(x) of an input symbol: even in x -> f(|x|) with f simplified for
    x > 0, else one simplified branch per sign of x.

    x/(|x| + 1) differentiates to |x|/(x**2 |x| + 2 x**2 + |x|), whose powers overflow for
    |x| > 1e102; for x > 0 it simplifies to 1/(x + 1)**2, so the result is 1/(|x| + 1)**2.
    """
    symbols = sorted(
        {a.args[0] for a in expr.atoms(sympy.Abs) if a.args[0].is_Symbol}, key=lambda s: s.name
    )
    if not _simplifiable(expr):
        return None
    if not symbols:
        return _abs_free_of_one(expr)
    if len(symbols) != 1:
        return None
    (x,) = symbols
    t = sympy.Dummy("t", positive=True)
    plus = stabilize(_simplify(expr.subs(x, t)))
    minus = stabilize(_simplify(expr.subs(x, -t)))
    if plus.has(sympy.Abs) or minus.has(sympy.Abs):
        return None
    if sympy.simplify(plus - minus) == 0:
        return plus.subs(t, sympy.Abs(x))
    return sympy.Piecewise((plus.subs(t, x), x >= 0), (minus.subs(t, -x), True))


def _abs_free_of_one(expr: sympy.Expr) -> sympy.Expr | None:
    """``expr`` with its one Abs(u) (and sign(u)) of a formula u: one simplified branch per
    sign of u. Through |u| simplify cannot see terms cancel: d2/dy2 of sqrt(|1 - y**2/x**2|)
    is -sign(u)/(x**2*sqrt(|u|)) - y**2/(x**4*|u|**(3/2)), two terms that cancel where
    |y| >> |x| (u < 0); for u > 0 it simplifies to -x**2*sqrt(u)/(x**2 - y**2)**2, and for
    u < 0 alike, with no difference left."""
    arguments = {a.args[0] for a in expr.atoms(sympy.Abs, sympy.sign)}
    if len(arguments) != 1:
        return None
    (u,) = arguments
    branches = []
    for s in (1, -1):
        signed = expr.xreplace({sympy.Abs(u): s * u, sympy.sign(u): s})
        if signed.has(sympy.Abs, sympy.sign):
            return None
        branches.append(stabilize(_simplify(signed)))
    if branches[0] == branches[1]:
        return branches[0]
    return sympy.Piecewise((branches[0], u >= 0), (branches[1], True))


def finish(
    expr: sympy.Expr,
    points=None,
    record: list | None = None,
    params: frozenset = frozenset(),
    unsplit: list | None = None,
    positive: frozenset = frozenset(),
    fused: list | None = None,
    also: tuple[sympy.Expr, ...] = (),
    more: Sequence[Mapping[sympy.Symbol, float]] = (),
    written: list | None = None,
    edges: Callable[[sympy.Expr], Sequence[Mapping[sympy.Symbol, float]]] | None = None,
    points32: Callable[[sympy.Expr], Sequence[Mapping[sympy.Symbol, float]]] | None = None,
) -> sympy.Expr:
    """Clean up, stabilise and simplify one formula; pick the most accurate candidate.

    Candidates: the formula as written, stabilised, stabilised after a (size-bounded)
    simplify (also one per sign of x where it has |x|, or of u where it has one |u| of a
    formula u, and one through hypot's naive form), and each with its regime branches
    (:func:`~symgrad.rewrite.regimes.split_regimes`). With ``points``, also each split with
    the factors outside its branches moved in, and the forms of all those that the
    ``candidates`` phase makes (:mod:`symgrad.rewrite.phases`), and the choice is by measured error
    (:func:`~symgrad.choose.most_accurate`: mean bits, a non-finite result in float64 or
    float32 counted as 128; ties to the cheaper for eager code by
    :func:`~symgrad.cost.eager_cost`); ``record`` gets the
    chosen form's :class:`~symgrad.choose.Accuracy`, ``fused`` the tie's cheapest for
    compiled code (:func:`~symgrad.cost.op_cost`: arithmetic only, the passes fuse).
    Without points, the cheapest stable form for both.
    ``unsplit`` gets the chosen form before its regime branches (what to differentiate:
    the branches are float tricks, and their conditions have no derivative). ``params``:
    the scalar inputs' symbols; ``positive``: those known to be positive. ``also``: other
    forms of the same formula, stabilised and offered beside its own (with their regime
    branches); ``expr`` stays the reference the others are measured against. ``more``:
    points where a contest within the choice's margin is measured again; ``edges``: points
    of the formula measured beside ``points`` (:func:`~symgrad.choose.edge_points`);
    ``points32``: a formula's float32 points, where the forms tied in float64 are ranked
    by their float32 error (see :func:`~symgrad.choose.most_accurate`). ``written`` gets
    the chosen form as the ``candidates`` phase wrote it, without its regime branches, or
    None where the choice is not that phase's (its derivative can be better than the
    derivative of the formula it came from: see :func:`derive_function`).
    """
    expr = _drop_dirac(expr)
    if expr.has(sympy.Heaviside):
        # As branches, so that piecewise_fold moves factors into them: exp(x) * H(-x) must
        # be where(x < 0, exp(x), 0), never inf * 0 = NaN where the branch is not taken.
        expr = expr.replace(
            lambda e: isinstance(e, sympy.Heaviside),
            lambda e: heaviside_as_piecewise(*e.args),
        )
    expr = piecewise_folded(expr)
    stable = [stabilize(expr)]
    if 1 < _cost(stable[0]) and _simplifiable(stable[0]):
        try:
            with _time_limit(SIMPLIFY_SECONDS):
                simpler = _simplify(stable[0])
            stable.append(stabilize(simpler))
            with _time_limit(SIMPLIFY_SECONDS):
                unsigned = _abs_free(stable[0])
            if unsigned is not None and unsigned not in stable:
                stable.append(unsigned)
            # SymPy cannot simplify through hypot (hypot(x, y)**2 is not x**2 + y**2 to
            # it): simplify with its naive form, then stabilise again. Only algebraic
            # forms: through sigmoid or softplus, simplify brings back exp(z)**gamma.
            if stable[0].has(hypot, hypot_ratio):
                naive = stable[0].replace(
                    lambda e: isinstance(e, (hypot, hypot_ratio)),
                    lambda e: type(e).naive(*e.args),
                )
                if _simplifiable(naive):
                    with _time_limit(SIMPLIFY_SECONDS):
                        through = stabilize(_simplify(naive))
                    if through not in stable:
                        stable.append(through)
        except TimeoutError:
            pass
    for other in also:
        other = stabilize(piecewise_folded(other))
        if other not in stable:
            stable.append(other)
    stable.sort(key=op_cost)
    candidates = []
    folds: list[sympy.Expr] = []
    sources = {expr: expr}
    phase_forms: dict[sympy.Expr, sympy.Expr] = {}  # candidates-phase form -> as written
    splits: dict[sympy.Expr, sympy.Expr] = {}
    for c in stable:
        fired = FACTORED_FIRED.set([])
        try:
            with _time_limit(SIMPLIFY_SECONDS):
                split = split_regimes(c, params, positive)
        except TimeoutError:
            split = c
        factored = bool(FACTORED_FIRED.get())
        FACTORED_FIRED.reset(fired)
        candidates += [split, c] if split != c else [c]
        splits[c] = split
        sources.setdefault(split, c)
        sources.setdefault(c, c)
        if points is not None and split.has(sympy.Piecewise) and not split.is_Piecewise:
            # the factors outside the branches moved in and the branches stabilised again:
            # 2*p*(sqrt(x**2 + 4*p**2) - x)/(4*p**2) (a conjugate branch of 2*p/(x + ...))
            # is (hypot(x, 2*p) - x)/(2*p), with no p**2 to overflow
            try:
                with _time_limit(SIMPLIFY_SECONDS):
                    folded = stabilize(piecewise_folded(split))
            except TimeoutError:
                folded = split
            if folded not in candidates:
                candidates.append(folded)
                sources.setdefault(folded, c)
                folds.append(folded)
        if points is not None and factored:
            # a quotient's tail both ways (regimes.FACTORED_TAILS): kept factors or
            # expanded, whichever the choice measures the more accurate
            token = FACTORED_TAILS.set(False)
            try:
                with _time_limit(SIMPLIFY_SECONDS):
                    expanded = split_regimes(c, params, positive)
            except TimeoutError:
                expanded = c
            finally:
                FACTORED_TAILS.reset(token)
            if expanded not in (c, split):
                candidates.append(expanded)
                sources.setdefault(expanded, c)
    if points is None:
        best = fused_best = candidates[0]
    else:
        from symgrad.choose import most_accurate

        # One exponential for the whole formula, a rational function without powers: offered
        # only where their error is measured (polynomials may cancel, x/x**2 may overflow);
        # differentiated, if chosen, as the formula they came from.
        # Of every stable form: the simplified one can have a form the cheapest has not
        # (sign(u)/sqrt(|u|) - sqrt(|u|)/x**2 with u = x**2 - 4*y**2 cancels; over one
        # denominator, 4*y**2/(x**2*sqrt(|u|)), it scales)
        for form in [*stable, *folds]:
            if _cost(form) > SIMPLIFY_MAX_OPS:
                continue
            for rewrite in phase("candidates").rewrites:
                try:
                    with _time_limit(SIMPLIFY_SECONDS):
                        rewritten = rewrite(form)
                except TimeoutError:
                    rewritten = None
                except Exception as exc:  # noqa: BLE001 - one optional form, not the formula
                    # (SymPy 1.14's Piecewise recursed without end on a condition once)
                    _skipped(rewrite, form, exc)
                    rewritten = None
                if rewritten is None:
                    continue
                # a form that keeps the formula as written in a range (exp_rational's
                # middle) keeps it with its regime branches too
                split = splits.get(form, form)
                inner = rewritten.xreplace({form: split}) if split != form else rewritten
                for new in (rewritten, inner):
                    if new not in candidates:
                        candidates.append(new)
                        sources.setdefault(new, sources[form])
                        phase_forms.setdefault(new, rewritten)
        # Each candidate with the sums that have a term linear in an input divided by its
        # power-of-two coefficient (regimes.linear_terms_unscaled)
        # (2*r overflows at r = 1e308 in SymPy's (dt**4 + 50)/(dt**4 + 2*r + 50)), then
        # with each input's ratio to a sum it is a term of as one number
        # (regimes.linear_ratios: r/(r + N) as 1/(1 + N/r))
        for rewrite in (linear_terms_unscaled, linear_ratios):
            for c in list(candidates):
                try:
                    with _time_limit(SIMPLIFY_SECONDS):
                        form = rewrite(c)
                except TimeoutError:
                    form = None
                if form is not None and form not in candidates:
                    candidates.append(form)
                    sources.setdefault(form, sources[c])
                    if c in phase_forms:
                        phase_forms.setdefault(form, phase_forms[c])
        # The branch conditions of the regimes and of the candidates phase's forms as the
        # stabilize rules write conditions (rules.sign_of_factors): those phases keep the
        # conditions of the formula they rewrote, (a**2 - b**2)/a**2 >= 0 from the
        # derivative through |u|, NaN where a**2 overflows
        for i, c in enumerate(candidates):
            try:
                with _time_limit(SIMPLIFY_SECONDS):
                    signed = _signs_factored(c)
            except TimeoutError:
                signed = c
            if signed != c and signed not in candidates:
                candidates[i] = signed
                sources.setdefault(signed, sources[c])
                if c in phase_forms:
                    phase_forms.setdefault(signed, phase_forms[c])
        # Eager code only: dsigmoid(a) as sigmoid(a) * sigmoid(-a). torch's sigmoid costs
        # 3 multiplies to its exp's 8 (and shares sigmoid(a) with the formula), where
        # exp(-|a|) / (1 + exp(-|a|))**2 is six passes; chosen where it is as accurate.
        # Compiled, the one exp of dsigmoid is the cheaper (sigmoid(-a) is a second exp).
        # The price: past a = 709.8 (float64; 88.7 in float32) torch's sigmoid(-a) is 0,
        # not the subnormal it should be, so the product is 0 where dsigmoid's exp(-|a|) has
        # a value below 1e-305 (1e-36) left; torch's own silu_backward gives 0 there too.
        eager_only = []
        for c in candidates:
            product = _dsigmoid_as_product(c)
            if product not in (expr, *candidates, *eager_only):  # (none without dsigmoid)
                eager_only.append(product)
                sources.setdefault(product, sources[c])
        # The formula as written is the reference and a candidate in its own right.
        close = most_accurate(
            [expr, *candidates, *eager_only],
            points,
            also,
            more,
            (eager_cost, op_cost),
            edges,
            points32,
        )
        if close:
            best, accuracy = min(close, key=lambda c: eager_cost(c[0]))
            compiled = [c for c in close if c[0] not in eager_only]
            if not compiled:  # only products are close: measured again without them
                compiled = most_accurate(
                    [expr, *candidates], points, also, more, (op_cost,), edges, points32
                )
            fused_best = min(compiled or close, key=lambda c: op_cost(c[0]))[0]
        else:  # nothing measurable: the formula as written
            best, accuracy = expr, Accuracy(math.nan, math.nan, 0, 0)
            fused_best = best
        if close and (accuracy.non_finite or accuracy.score > REGIME_GAIN_BITS):
            at = [*points, *edges(expr)] if edges is not None else list(points)
            split = _split_by_regime(expr, [expr, *candidates], best, at, more, also)
            if split is not None:
                # differentiated as the form it replaces would have been: the split's
                # forms can come from formulas whose derivatives are worse
                form, accuracy = split
                sources[form] = sources.get(best, expr)
                best = fused_best = form
        if record is not None:
            record.append(accuracy)
    if unsplit is not None:
        unsplit.append(sources[best])
    if written is not None:
        written.append(phase_forms.get(best))
    finished = _finished(best)
    if fused is not None:
        fused.append(finished if fused_best is best else _finished(fused_best))
    if points is not None and points32 is not None:
        at = points32(expr)
        at64 = [*points, *edges(expr)] if edges is not None else list(points)
        shared = fused is not None and fused[-1] is finished
        finished, measured = _in_float64(finished, expr, at, at64, also, params)
        if record is not None and measured is not None:
            record[-1] = measured
        if fused is not None:
            fused[-1] = (
                finished if shared else _in_float64(fused[-1], expr, at, at64, also, params)[0]
            )
    return finished


def _split_by_regime(
    expr: sympy.Expr,
    forms: Sequence[sympy.Expr],
    best: sympy.Expr,
    points: Sequence[Mapping[sympy.Symbol, float]],
    more: Sequence[Mapping[sympy.Symbol, float]],
    fallbacks: Sequence[sympy.Expr],
) -> tuple[sympy.Expr, Accuracy] | None:
    """Two of ``forms``, each where the size of one input says
    (:func:`~symgrad.choose.regime_split`), with its accuracy at ``points``: where that
    scores :data:`~symgrad.choose.REGIME_GAIN_BITS` better than ``best`` there, with
    fewer non-finite results or at most half its mean error (both forms are computed: not
    for 24.3 -> 23.0 bits of a gradient that overflows anyway), a worst point at most
    :data:`~symgrad.choose.WORST_SLACK` bits worse than ``best``'s (tuning ``n2h``'s
    gradient traded 2 NaN for a region 55 bits off, and its table row went 0.44 -> 5.43
    bits), and no worse at the ``more`` points; else None."""
    references = reference_values(expr, points, fallbacks)
    found = regime_split(expr, forms, points, references)
    if found is None:
        return None
    form = split_form(*found)
    accuracy = measure_error(form, expr, points, references)
    chosen = measure_error(best, expr, points, references)
    if accuracy.score > chosen.score - REGIME_GAIN_BITS:
        return None
    if accuracy.non_finite >= chosen.non_finite and accuracy.mean_bits > chosen.mean_bits / 2:
        return None  # both forms computed for a few bits of a formula still inaccurate
    if accuracy.max_bits > chosen.max_bits + WORST_SLACK:
        return None  # a region of large errors for the non-finite results it removes
    if more:
        again = reference_values(expr, more, fallbacks)
        if (
            measure_error(form, expr, more, again).score
            > measure_error(best, expr, more, again).score
        ):
            return None
    return form, accuracy


def _in_float64(
    form: sympy.Expr,
    reference: sympy.Expr,
    points32: Sequence[Mapping[sympy.Symbol, float]],
    points64: Sequence[Mapping[sympy.Symbol, float]],
    fallbacks: Sequence[sympy.Expr],
    params: frozenset,
) -> tuple[sympy.Expr, Accuracy | None]:
    """``form`` computed in float64 for float32 inputs where
    :func:`~symgrad.choose.in_float64` finds that better in float32, unless at
    ``points64`` (the choice's) it has more non-finite results than ``form`` or a float64
    error :data:`~symgrad.choose.FLOAT64_GAIN_BITS` worse: the casts rebuild the
    formula, and SymPy may order its terms and factors otherwise (an intermediate product
    can overflow first; where digits cancel, another order rounds otherwise, a bit better
    or worse). Float64 inputs run the rebuilt formula too: its float64
    :class:`~symgrad.choose.Accuracy` is returned (what the docstring reports), None where
    ``form`` stays."""
    wide = in_float64(form, reference, points32, fallbacks, params)
    if wide is form:
        return form, None
    exact = reference_values(reference, points64, fallbacks)
    narrow, widened = (measure_error(f, reference, points64, exact) for f in (form, wide))
    if widened.non_finite > narrow.non_finite or widened.mean_bits > (
        narrow.mean_bits + FLOAT64_GAIN_BITS
    ):
        return form, None
    return wide, widened


def _dsigmoid_as_product(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each dsigmoid(a) written sigmoid(a) * sigmoid(-a)."""
    return expr.replace(
        lambda e: isinstance(e, dsigmoid), lambda e: sigmoid(e.args[0]) * sigmoid(-e.args[0])
    )


def _signs_factored(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each comparison of a rational function with 0 in its branch
    conditions written as the sign of its factors (:func:`rules.sign_of_factors`)."""
    if not expr.has(sympy.Piecewise):
        return expr

    def signed(e: sympy.Basic) -> sympy.Basic:
        new = sign_of_factors(e)
        return e if new is None else new

    return expr.replace(lambda e: isinstance(e, (sympy.Ge, sympy.Gt, sympy.Le, sympy.Lt)), signed)


def _finished(best: sympy.Expr) -> sympy.Expr:
    """The chosen form through the ``tails`` phase's passes (sigmoid tails guarded or
    clamped, impossible branches dropped) and the ``clamp`` phase's rules (selects that
    are a clamp written as one)."""
    for rewrite in phase("tails").rewrites:
        best = rewrite(best)
    return stabilize(best, phase("clamp").rewrites)


def differentiate(expr: sympy.Expr, wrt: sympy.Symbol, points=None, record=None) -> sympy.Expr:
    """d expr / d wrt, finished (stable and simplified)."""
    return finish(real_diff(expr, wrt), points, record)


def _symbol(inp) -> sympy.Symbol:
    assumptions = {name: value for name, value in inp.assumptions}
    return sympy.Symbol(inp.name, real=True, **assumptions)


#: Up to this many outputs, a VJP gets a branch per set of zero upstream gradients.
MASK_MAX_OUTPUTS = 3


def _mask_unused_outputs(vjp: sympy.Expr, grads: tuple[sympy.Symbol, ...]) -> sympy.Expr:
    """Where an output's upstream gradient is 0 (autograd passes zeros for an output that
    was not used), its term is dropped, not computed: 0 * inf is NaN where the output's
    derivative overflows although the used output's does not (sinh_cosh past |x| = 710.5).

    A formula of one upstream gradient is branched too where its factor can overflow
    (``grad_c*cosh(x)``, the second derivative of ``s = sinh(x)`` where only ``c`` is
    used), not where it is a polynomial of the inputs (``grad_b*y``).

    Only values are branched (VJPs, second-order formulas); derivatives are taken of the
    unbranched formulas.
    """
    present = [g for g in grads if vjp.has(g)]
    if len(grads) < 2 or not 0 < len(present) <= MASK_MAX_OUTPUTS:
        return vjp
    if len(present) == 1 and vjp.xreplace({present[0]: sympy.S.One}).is_polynomial():
        return vjp  # (linear in its upstream gradient: the factor is the rest)
    branches = []
    for k in range(len(present), 0, -1):
        for zero in itertools.combinations(present, k):
            value = vjp.xreplace({g: sympy.S.Zero for g in zero})
            branches.append((value, sympy.And(*(sympy.Eq(g, 0) for g in zero))))
    return sympy.Piecewise(*branches, (vjp, True))


def grad_symbol_names(fn: Function) -> tuple[str, ...]:
    """The names of the upstream gradients: ``grad`` or ``grad_<output>``."""
    if fn.single_output:
        return ("grad",)
    return tuple(f"grad_{o.name}" for o in fn.outputs)


def parse_function(
    fn: Function,
) -> tuple[
    dict[str, sympy.Symbol],
    tuple[tuple[str, sympy.Expr], ...],
    tuple[sympy.Symbol, ...],
    dict[str, sympy.Expr],
]:
    """Every formula of ``fn`` parsed: the input symbols, the outputs as written (over the
    inputs), the upstream gradient symbols and the ``gradient:`` overrides. Raises the
    function's first problem as a SpecError; nothing is derived."""
    where = fn.location
    symbols = {inp.name: _symbol(inp) for inp in fn.inputs}
    for inp in fn.inputs:
        if inp.shape is not None:
            raise SpecError(
                where.at(line=inp.line),
                f"input '{inp.name}' has a shape: symgrad handles elementwise functions "
                "only for now (tensor expressions are planned)",
                "write the function elementwise, on tensors that broadcast, and reduce outside it",
            )
    # Outputs may name earlier outputs; substitute them so every formula is over inputs.
    naive: list[tuple[str, sympy.Expr]] = []
    env: dict[str, sympy.Basic] = dict(symbols)
    for out in fn.outputs:
        expr = parse_formula(out.text, env, where.at(line=out.line))
        env[out.name] = expr
        naive.append((out.name, expr))
    grads = tuple(sympy.Symbol(name, real=True) for name in grad_symbol_names(fn))
    genv = {**env, **{g.name: g for g in grads}}
    overrides = {g.name: parse_formula(g.text, genv, where.at(line=g.line)) for g in fn.gradients}
    return symbols, tuple(naive), grads, overrides


def validate_spec(spec: Spec) -> None:
    """Parse every function of ``spec`` before any is derived; raise every problem found
    (one per function) at once."""
    errors: list[SpecError] = []
    for fn in spec.functions:
        try:
            parse_function(fn)
        except SpecError as error:
            errors.append(error)
    raise_all(errors)


def _edges(
    fn: Function,
    symbols: Mapping[str, sympy.Symbol],
    grads: Sequence[sympy.Symbol],
    **where: Sequence,
) -> Callable[[sympy.Expr], list[dict[sympy.Symbol, float]]]:
    """The choice's points inside the edges of a formula's range (see
    :func:`~symgrad.choose.edge_points`, which takes ``where``: ``limits``, ``steps``),
    along each tensor input with the others at their tame value (scalars at theirs,
    upstream gradients 1); found once per formula."""
    base: dict[sympy.Symbol, float] = {g: 1.0 for g in grads}
    for inp in fn.inputs:
        value = round_to(tame_value(inp), "float32") if inp.is_tensor else scalar_value(inp)
        base[symbols[inp.name]] = value
    axes = {symbols[i.name]: i for i in fn.inputs if i.is_tensor}
    return functools.cache(lambda reference_expr: edge_points(reference_expr, base, axes, **where))


def _points32(
    fn: Function, symbols: Mapping[str, sympy.Symbol], grads: Sequence[sympy.Symbol]
) -> Callable[[sympy.Expr], list[dict[sympy.Symbol, float]]]:
    """The choice's float32 points for a formula (see
    :func:`~symgrad.choose.float32_points`), and those inside the edges of its range
    where it passes float32's largest number (:data:`~symgrad.choose.FLOAT32_EDGE_STEPS`
    and ``FLOAT32_EDGE_MANTISSAS``,
    along each tensor input with the others at their tame value: a form whose
    intermediate overflows first, ``1/(x*sqrt(x))`` in a value of ``x**-1.5/4``, fails
    only in the binades next to it); found once per formula."""
    drawn = float32_points(fn.inputs, symbols, grads, seed=f"symgrad:{fn.name}")
    edges = _edges(
        fn,
        symbols,
        grads,
        limits=(FLOAT_MAX["float32"],),
        steps=FLOAT32_EDGE_STEPS,
        mantissas=FLOAT32_EDGE_MANTISSAS,
    )
    tensors = [symbols[i.name] for i in fn.inputs if i.is_tensor]

    def points(reference_expr: sympy.Expr) -> list[dict[sympy.Symbol, float]]:
        inside = [  # (an edge past float32's range has float64 points only)
            p
            for p in edges(reference_expr)
            if all(round_to(p[t], "float32") == p[t] for t in tensors)
        ]
        return [*drawn, *inside]

    return functools.cache(points)


def derive_function(fn: Function, measure: bool = True) -> Derived:
    """All the formulas for one function.

    With ``measure``, each formula's form is chosen by measured error (see
    :mod:`symgrad.choose`) and its float64 error is recorded in ``Derived.accuracy``.
    ``Derived.skipped`` says which candidate rewrites raised (see :func:`finish`).
    """
    token = _SKIPPED.set([])
    try:
        derived = _derive_function(fn, measure)
        return dataclasses.replace(derived, skipped=tuple(_SKIPPED.get() or ()))
    finally:
        _SKIPPED.reset(token)


def _derive_function(fn: Function, measure: bool) -> Derived:
    """:func:`derive_function`'s formulas."""
    where = fn.location
    symbols, naive, grads, parsed_overrides = parse_function(fn)
    env: dict[str, sympy.Basic] = {**symbols, **dict(naive)}
    points = (
        symbol_points(fn.inputs, symbols, grads, seed=f"symgrad:{fn.name}") if measure else None
    )
    more = more_points(fn.inputs, symbols, grads, seed=f"symgrad:{fn.name}") if measure else ()
    edges = _edges(fn, symbols, grads) if measure else None
    points32 = _points32(fn, symbols, grads) if measure else None
    accuracy: dict[str, Accuracy] = {}
    params = frozenset(symbols[i.name] for i in fn.inputs if not i.is_tensor)
    # scalars whose domain is positive (x / sqrt(nu) needs to know, and nu's symbol makes
    # no assumption the spec did not)
    positive = frozenset(symbols[i.name] for i in fn.inputs if not i.is_tensor and i.domain[0] > 0)

    unsplit: dict[str, sympy.Expr] = {}
    # the chosen forms the candidates phase wrote, as it wrote them (see finish)
    written: dict[str, sympy.Expr] = {}

    fused: dict[str, sympy.Expr] = {}

    def chosen(label: str, expr: sympy.Expr, also: tuple[sympy.Expr, ...] = ()) -> sympy.Expr:
        record: list[Accuracy] = []
        before: list[sympy.Expr] = []
        compiled: list[sympy.Expr] = []
        phase_form: list[sympy.Expr | None] = []
        result = finish(
            expr,
            points,
            record,
            params,
            before,
            positive,
            compiled,
            also,
            more,
            phase_form,
            edges,
            points32,
        )
        if record:
            accuracy[label] = record[0]
        unsplit[label] = before[0]
        if phase_form[0] is not None:
            written[label] = phase_form[0]
        if compiled[0] != result:
            fused[label] = compiled[0]
        return result

    diff_names = [i.name for i in fn.inputs if i.gets_gradient]
    overrides = {name: finish(expr) for name, expr in parsed_overrides.items()}

    try:
        # inside: a SymPy failure on the forward is a DerivationError, not a traceback
        outputs = tuple((name, chosen(name, expr)) for name, expr in naive)
        jacobian: dict[str, dict[str, sympy.Expr]] = {}
        plain: dict[str, dict[str, sympy.Expr]] = {}  # the jacobian before regime branches
        for (name, _), grad in zip(outputs, grads):
            expr = unsplit[name]
            jacobian[name], plain[name] = {}, {}
            for i in diff_names:
                before: list[sympy.Expr] = []
                if i in overrides:
                    # Forward mode follows the user's VJP: its coefficient of this output's grad.
                    jacobian[name][i] = finish(real_diff(overrides[i], grad), unsplit=before)
                else:
                    jacobian[name][i] = finish(real_diff(expr, symbols[i]), unsplit=before)
                plain[name][i] = before[0]
        vjps: dict[str, sympy.Expr] = {}
        for i in diff_names:
            if i in overrides:
                vjps[i] = overrides[i]
            else:
                # The chain rule as SymPy writes it (what autograd computes, through the
                # chosen forward), and the Jacobian's cheapest simplified form: simplify
                # can bring in a cancellation (1 + e*cos(f) as e + 1 - 2*e*sin(f/2)**2)
                # that the chain rule does not have, and the chain rule can miss a stable
                # form (erfcx_inv) that simplify finds. The measured choice decides.
                # (stabilised first: sigmoid(x)*sigmoid(-x) as dsigmoid(x), whose product
                # form is for the eager code only)
                # A forward the candidates phase wrote is differentiated as the formula it
                # came from (x/x**2 may overflow, a polynomial may cancel), and also as it
                # was written: compound interest's n*exprel(i*log1prel(i/n))*log1prel(i/n)
                # has a derivative that does not cancel at i = 0 where the derivative of
                # expm1(...)/i, two terms of 100*n/i, does.
                terms = list(zip(outputs, grads))
                chain = sympy.Add(*(g * real_diff(unsplit[o], symbols[i]) for (o, _), g in terms))
                simplified = sympy.Add(*(g * plain[o][i] for (o, _), g in terms))
                own = _through_written(terms, symbols[i], unsplit, written)
                vjps[i] = chosen(f"grad_{i}", stabilize(chain), also=(simplified, *own))
                # Forward mode computes the chosen (measured) form too, the VJP's
                # coefficient of each output's gradient: jvp and backward agree, and
                # neither is the unmeasured cheapest form.
                for (o, _), g in terms:
                    only = {h: sympy.S.One if h == g else sympy.S.Zero for h in grads}
                    coefficient = vjps[i].xreplace(only)
                    if not coefficient.has(sympy.nan, sympy.zoo, *grads):
                        jacobian[o][i] = coefficient
        second: dict[str, dict[str, sympy.Expr]] = {}
        if fn.order >= 2:
            wrt = [symbols[i] for i in diff_names] + list(grads)
            for i in diff_names:
                # differentiate the VJP before its regime branches (see finish's ``unsplit``)
                vjp = unsplit.get(f"grad_{i}", vjps[i])
                as_written = written.get(f"grad_{i}")
                second[i] = {}
                for w in wrt:
                    also = [] if as_written is None else [real_diff(as_written, w)]
                    blockwise = diff_by_blocks(vjp, w) if w not in grads else None
                    if blockwise is not None:
                        also.append(blockwise)
                    second[i][w.name] = chosen(
                        f"d grad_{i} / d {w.name}", real_diff(vjp, w), also=tuple(also)
                    )
    except SpecError:
        raise
    except Exception as exc:  # SymPy raises many kinds; report them with the function
        raise DerivationError(where, f"SymPy could not differentiate: {exc}") from exc
    derived = Derived(
        function=fn,
        symbols=symbols,
        outputs=outputs,
        naive_outputs=tuple(naive),
        grads=grads,
        vjps={i: _mask_unused_outputs(v, grads) for i, v in vjps.items()},
        jacobian=jacobian,
        second={
            i: {w: _mask_unused_outputs(e, grads) for w, e in by_w.items()}
            for i, by_w in second.items()
        },
        overridden=frozenset(overrides),
        accuracy=accuracy,
        fused={  # gradients masked like the eager ones below
            label: e if label in env else _mask_unused_outputs(e, grads)
            for label, e in fused.items()
        },
    )
    return _with_second_partials(derived)


def diff_by_blocks(expr: sympy.Expr, wrt: sympy.Symbol) -> sympy.Expr | None:
    """d expr / d wrt with each block of ``expr`` that depends on ``wrt`` alone (the factors
    of a product, the terms of a sum, or a whole argument) differentiated as one formula
    and simplified, the chain rule through the rest; None where there is no such block.

    The quotient rule as SymPy applies it cancels: d/de of sqrt((e + 1)/(e - 1)) is
    1/(e - 1) - (e + 1)/(e - 1)**2 (times a root), two terms of 3e-39 whose difference is
    -2/(e - 1)**2 = -2e-77 at e = 3e38, nothing left of it in floats. Simplified as a block,
    the numerator (e - 1) - (e + 1) is -2 before any rounding. The blocks are formulas of
    one input (small, and quick to simplify); held-out h2f's mixed second derivative in H
    and e lost all its bits to this (17 bits mean).
    """
    blocks: dict[sympy.Symbol, sympy.Expr] = {}

    def only_wrt(e: sympy.Basic) -> bool:
        return e.free_symbols == {wrt} and e != wrt

    def block(e: sympy.Expr) -> sympy.Expr:
        u = sympy.Dummy(f"block{len(blocks)}", real=True)
        blocks[u] = e
        return u

    def walk(e: sympy.Expr) -> sympy.Expr:
        if only_wrt(e) and not e.is_Atom:
            return block(e)
        if wrt not in e.free_symbols or e.is_Atom or isinstance(e, sympy.Piecewise):
            return e
        if isinstance(e, (sympy.Mul, sympy.Add)):
            alone = [a for a in e.args if only_wrt(a)]
            rest = [walk(a) for a in e.args if not only_wrt(a)]
            if alone:
                rest.append(block(e.func(*alone)))
            return e.func(*rest)
        return e.func(*(walk(a) for a in e.args))

    opaque = walk(expr)
    if not blocks:
        return None
    result = real_diff(opaque, wrt)
    for u, e in blocks.items():
        derivative = real_diff(e, wrt)
        try:
            with _time_limit(SIMPLIFY_SECONDS):
                derivative = _simplify(derivative)
        except TimeoutError:
            pass
        result += real_diff(opaque, u) * derivative
    return result.xreplace(blocks)


def _through_written(
    terms: list, wrt: sympy.Symbol, unsplit: dict[str, sympy.Expr], written: dict[str, sympy.Expr]
) -> tuple[sympy.Expr, ...]:
    """The chain rule through the outputs' forms as the candidates phase wrote them (the
    others as differentiated), or nothing where no output's chosen form is one of those."""
    if not any(o in written for (o, _), _g in terms):
        return ()
    return (sympy.Add(*(g * real_diff(written.get(o, unsplit[o]), wrt) for (o, _), g in terms)),)


def _with_second_partials(derived: Derived) -> Derived:
    """``derived`` with :attr:`~symgrad.derived.Derived.second_partials` for every set of
    reusable outputs (and for the fused path's forms): whichever the planner saves, the
    derivatives it needs are here, so no differentiation happens after derive."""
    if derived.function.order < 2:
        return derived
    partials: dict[sympy.Expr, dict[str, sympy.Expr]] = {}
    outs = set(derived.output_symbols().values())
    non_diff = {i.name for i in derived.function.inputs if not i.gets_gradient}
    variants = [derived, derived.for_fused()] if derived.fused else [derived]
    for variant in variants:
        reusable = variant.reusable_outputs()
        for k in range(1, len(reusable) + 1):
            for subset in itertools.combinations(reusable, k):
                for vjp in variant.vjps.values():
                    reading = vjp.xreplace(dict(subset))
                    if reading in partials or not reading.free_symbols & outs:
                        continue
                    wrt = sorted(
                        (
                            s
                            for s in reading.free_symbols - derived.scalars
                            if s.name not in non_diff
                        ),
                        key=lambda s: s.name,
                    )
                    partials[reading] = {s.name: differentiate(reading, s) for s in wrt}
    return dataclasses.replace(derived, second_partials=partials)


def derive_spec(spec: Spec) -> tuple[Derived, ...]:
    """Derive every function of a spec, in file order, once every formula has parsed.

    A function that cannot be derived does not stop the others: every failure is raised
    at the end, each naming its function. An unexpected exception (a symgrad bug) becomes
    a DerivationError too, never a traceback.
    """
    validate_spec(spec)
    return tuple(each_function(spec.functions, "deriving", derive_function))


def each_function(
    items: Sequence, stage: str, work: Callable, function: Callable = lambda item: item
) -> list:
    """``[work(item) for item in items]``, every failure reported at once, each naming its
    function (``function(item)``): a SpecError without a location gets the function's,
    and an unexpected exception (a symgrad bug) becomes that function's
    :func:`internal_error`, never a traceback nor an error that names another function."""
    results, errors = [], []
    for item in items:
        fn = function(item)
        try:
            results.append(work(item))
        except SpecError as error:
            if error.location is None:
                error = DerivationError(fn.location, error.message, error.hint)
            errors.append(error)
        except Exception as exc:  # noqa: BLE001 - any internal failure, reported per function
            errors.append(internal_error(fn, stage, exc))
    raise_all(errors)
    return results


def internal_error(where: Function | Spec, stage: str, exc: BaseException) -> DerivationError:
    """An unexpected exception while working on ``where`` (a function, or a whole spec for
    the stages that work on its files), as an error a user can act on."""
    first = (str(exc).splitlines() or [""])[0]
    if isinstance(where, Spec):
        location, what, spec = Location(where.path), "this spec", "this spec"
    else:
        location, what, spec = where.location, "this function", "this function's spec"
    return DerivationError(
        location,
        f"internal error while {stage} {what} ({type(exc).__name__}: {first})",
        f"this is a symgrad bug: please report it with {spec}; meanwhile try the "
        "formula written another way, or give the gradient yourself under gradient:",
    )
