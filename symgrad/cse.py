"""Common subexpressions as the generated code computes them, for the code and its model.

The generated code (:func:`symgrad.plan.emit`) and the NumPy evaluation that the accuracy
choice and the generated tests' known errors are measured on
(:func:`symgrad.numerics.native.evaluator`) share their temporaries through
:func:`common_subexpressions`, so that both compute the same partial products: where one
overflows, so does the other.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import sympy

from symgrad.functions import (
    EXP_SHIFT,
    interleaved_product,
    known_nonnegative,
    known_nonpositive,
    varying_power,
)


def fresh_symbols(exprs: Sequence[sympy.Expr], prefix: str) -> Iterator[sympy.Symbol]:
    """``prefix0``, ``prefix1``, ... (real), skipping the names ``exprs`` already use."""
    taken = {s.name for e in exprs for s in e.free_symbols}
    return (
        sympy.Symbol(f"{prefix}{k}", real=True)
        for k in itertools.count()
        if f"{prefix}{k}" not in taken
    )


def common_subexpressions(
    exprs: Sequence[sympy.Expr], temps: Iterator[sympy.Symbol]
) -> tuple[list[tuple[sympy.Symbol, sympy.Expr]], list[sympy.Expr]]:
    """SymPy's CSE of ``exprs`` (new names from ``temps``), with the powers that the
    printers spread out (:func:`~symgrad.functions.interleaved_product`) kept in the
    products they belong to, and each compound base of such a power named first.

    A power shared by two products is a common subexpression to SymPy: ``t = s**-2``, then
    ``a*t`` and ``b*t``. But the power alone underflows where the product does not: at
    ``s = 2.8e25`` in float32, ``s**-2`` is 0 although ``a / s / s`` is 1e-14 for
    ``a = 1e37``. So the power goes back into each product that is spread out, which then
    divides by ``s`` twice; it stays shared where nothing spreads it. The same for a
    shared part of such products (``g * s**-2``, then ``a*t`` and ``b*t``).

    A half-integer power above 1 in magnitude is its integer part times the square root of
    its base, a temporary shared with every other ``sqrt`` of that base: ``x**1.5`` is
    ``x * t`` with ``t = sqrt(x)``, and ``(s + 1)**-1.5`` is ``1 / t0 / t1`` with ``t0 = s
    + 1`` and ``t1 = sqrt(t0)``. Its power form underflows where the spread product does
    not (``t**1.5`` at t = 3e-228 in a product of 1e228), and written out in the printer
    it took the square root again beside the one the code had.

    A power ``b**e`` with an exponent that varies, in a product with an exponential
    ``exp(g)``, is ``h * exp(g) * h`` with ``h = b**(e/2)`` a temporary, where ``b`` is
    known to be >= 0: the two grow against each other in the densities and the
    Stirling-Lanczos products of special functions (``t**(z - 1/2) * exp(-t)``), and the
    power alone overflows long before the product does (``36.5**29.5`` is inf in float32
    where ``Gamma(30) = 8.8e30`` is not). The price is an operation on the exponent and a
    multiply; the error, one rounding more. (Not for a base of either sign: ``(-2)**3`` is
    -8, ``(-2)**1.5`` NaN.)

    The reciprocal of an input is never shared: ``t = 1/k`` is inf for a subnormal k
    (below 5.6e-309), where ``y/k`` is not (0 at y = 0); it costs the same division in
    each product that takes it back. Nor is a shifted exponential with its scale,
    ``e**64 * exp(w - 64)`` (:func:`~symgrad.rewrite.regimes.exp_bounded_product`): that
    is exp(w) again, inf where it overflows; in each product the scale multiplies last,
    after the factor bounded by 1.

    Nor is a product shared into a product with a power whose exponent varies: the
    printers multiply that power first (:func:`~symgrad.functions.varying_power`), 0 or
    inf long before the other factors are, and a shared part of the others is computed
    before it. In the second derivative of ``(x + 1)**(1/n) - x**(1/n)``, ``t = (1 -
    1/n)/n``, shared by ``x**(1/n - 2)*t`` and ``(x + 1)**(1/n - 2)*t``, is -inf at n =
    -1e-228 where both powers are 0 (NaN); put back, each product is ``x**(1/n - 2) / n
    * (1 - 1/n)``, 0. The price is a multiplication per product that takes it back.
    """
    exprs, halves = _powers_halved_beside_exp(exprs, temps)
    replacements, reduced = sympy.cse([*exprs, *halves.values()], symbols=temps)
    if halves:
        reduced, values = reduced[: len(exprs)], reduced[len(exprs) :]
        replacements = _in_dependency_order([*replacements, *zip(halves, values)])
    replacements, reduced = _unshare_reciprocals(replacements, reduced)
    replacements, reduced = _unshare_shifted_exponentials(replacements, reduced)
    replacements, reduced = _unshare_beside_varying_powers(replacements, reduced)
    replacements, reduced = _unshare_spread_powers(replacements, reduced, temps)
    replacements, reduced = _halves_from_roots(replacements, reduced, temps)
    return _signed(*_name_spread_bases(replacements, reduced, temps))


def _powers_halved_beside_exp(
    exprs: Sequence[sympy.Expr], temps: Iterator[sympy.Symbol]
) -> tuple[list[sympy.Expr], dict[sympy.Symbol, sympy.Expr]]:
    """See :func:`common_subexpressions`: ``exprs`` with each power of a base >= 0 and an
    exponent with inputs in it that is a factor of a product with an ``exp`` factor
    written ``h**2``, ``h`` a new temporary; and each ``h`` with its value ``b**(e/2)``."""
    halves: dict[sympy.Expr, sympy.Symbol] = {}

    def halvable(f: sympy.Expr) -> bool:
        return varying_power(f) and not f.base.is_number and known_nonnegative(f.base)

    def splits(node: sympy.Basic) -> bool:
        return (
            isinstance(node, sympy.Mul)
            and any(isinstance(f, sympy.exp) and f.free_symbols for f in node.args)
            and any(halvable(f) for f in node.args)
        )

    def halved(node: sympy.Mul) -> sympy.Expr:
        factors = []
        for f in node.args:
            if halvable(f):
                half = f.base ** (f.exp / 2)
                if half not in halves:
                    halves[half] = next(temps)
                f = halves[half] ** 2
            factors.append(f)
        return sympy.Mul(*factors)

    new = [e.replace(splits, halved) for e in exprs]
    return new, {h: value for value, h in halves.items()}


def _signed(replacements, reduced):
    """Each temporary whose value is known <= 0 (or >= 0) told so: the printers order a
    product's factors bounded by 1 first, and exp(t1) with t1 = -|y/k| is one."""
    signs: dict[sympy.Symbol, sympy.Symbol] = {}
    kept = []
    for temp, value in replacements:
        value = value.xreplace(signs)
        if not isinstance(value, sympy.Expr) or value.is_Boolean:
            pass  # a condition (t8 = x <= 0)
        elif known_nonpositive(value):
            signs[temp] = sympy.Symbol(temp.name, real=True, nonpositive=True)
        elif known_nonnegative(value):
            signs[temp] = sympy.Symbol(temp.name, real=True, nonnegative=True)
        kept.append((signs.get(temp, temp), value))
    return kept, [e.xreplace(signs) for e in reduced]


def _put_back(replacements, reduced, goes_back):
    """``replacements`` and ``reduced`` with each temporary whose value ``goes_back``
    (once the temporaries before it are put back) put back where it is read."""
    inlined: dict[sympy.Symbol, sympy.Expr] = {}
    kept = []
    for temp, value in replacements:
        value = value.xreplace(inlined)
        if goes_back(value):
            inlined[temp] = value
        else:
            kept.append((temp, value))
    return kept, [e.xreplace(inlined) for e in reduced]


def _unshare_reciprocals(replacements, reduced):
    """See :func:`common_subexpressions`: each temporary that is 1/symbol put back."""
    return _put_back(
        replacements,
        reduced,
        lambda v: isinstance(v, sympy.Pow) and v.exp == -1 and v.base.is_Symbol,
    )


def _unshare_shifted_exponentials(replacements, reduced):
    """See :func:`common_subexpressions`: each temporary that is a number times a shifted
    exponential, exp(w - EXP_SHIFT), put back."""

    def scaled_shift(value: sympy.Basic) -> bool:
        if not isinstance(value, sympy.Mul):
            return False
        coeff, rest = value.as_coeff_Mul()
        return (
            coeff != 1
            and isinstance(rest, sympy.exp)
            and rest.args[0].as_coeff_Add()[0] == -EXP_SHIFT
        )

    return _put_back(replacements, reduced, scaled_shift)


def _unshare_beside_varying_powers(replacements, reduced):
    """See :func:`common_subexpressions`: each temporary that is a product of two
    tensors or more, none a power whose exponent varies, put back as factors into the
    products that have such a power (directly, or as a temporary whose value is one);
    kept for its other uses, and dropped where none is left."""
    values = dict(replacements)
    sweeping = {t for t, v in replacements if varying_power(v)}

    def sweeps(f: sympy.Expr) -> bool:
        return varying_power(f) or f in sweeping

    shared = {
        t
        for t, v in replacements
        if isinstance(v, sympy.Mul)
        and sum(not f.is_number for f in v.args) >= 2
        and not any(sweeps(f) for f in v.args)
    }
    if not shared:
        return replacements, reduced

    def product(node: sympy.Expr) -> sympy.Expr:
        if not isinstance(node, sympy.Mul):
            return node
        if not any(sweeps(f) for f in node.args):
            return node
        if not any(f in shared for f in node.args):
            return node
        # (again: a shared product's value may hold another, g*t with t = (1 - 1/n)/n)
        return product(sympy.Mul(*(values[f] if f in shared else f for f in node.args)))

    def inline(expr: sympy.Expr) -> sympy.Expr:
        return expr.replace(lambda e: isinstance(e, sympy.Mul), product)

    reduced = [inline(e) for e in reduced]
    return _without_unread([(t, inline(v)) for t, v in replacements], reduced, shared), reduced


def _without_unread(kept, reduced, droppable):
    """``kept`` without the temporaries of ``droppable`` that nothing reads any more (nor
    those of them that only such a temporary read)."""
    while True:
        read = set().union(*(v.free_symbols for _, v in kept), *(e.free_symbols for e in reduced))
        unread = [(t, v) for t, v in kept if t in droppable and t not in read]
        if not unread:
            return kept
        kept = [pair for pair in kept if pair not in unread]


def _spread_exponent(e: sympy.Expr) -> bool:
    """A power with exponent ``e`` is spread out by the products it is in: an integer of 2
    or more, or a half-integer above 1 (t**-1.5 as / t / sqrt(t))."""
    return (e.is_Integer and abs(e) >= 2) or (e.is_Rational and e.q == 2 and abs(e) > 1)


def _spread(value: sympy.Expr) -> bool:
    """``value`` is a power that a product spreads out (x**2, (1 + t)**-3, t**-1.5), a
    number times one (8 / t**3, 4*y**3), or a product that is spread out itself (a *
    b**-2)."""
    if isinstance(value, sympy.Mul):
        coeff, rest = value.as_coeff_Mul()
        if coeff != 1 and isinstance(rest, sympy.Pow):
            # 8 / t**3: the products divide by t three times; 4*y**3 in -4*y**3/t**3 is
            # (y/t)**3 * -4, where y**3 overflows first (y = 1e250, t = y*x + 2)
            return _spread(rest)
        return interleaved_product(value, roots=True) is not None
    return isinstance(value, sympy.Pow) and _spread_exponent(value.exp) and not value.base.is_number


def _plain_product(value: sympy.Expr) -> bool:
    """``value`` is a product of two or more factors and no denominator: ``(x - 1)*(x +
    1)``, ``g*x``. Shared, it is computed whole, so a product that divides it by a power
    (``t*x/(x**2 + 1)**3``) cannot spread its factors between the divisions: inf where
    x**2 overflows, and inf/inf is NaN where the value is 0."""
    factors = sympy.Mul.make_args(value)
    return len(factors) >= 2 and all(
        not f.is_number and f.as_base_exp()[1].is_positive for f in factors
    )


def _unshare_spread_powers(replacements, reduced, temps):
    """See :func:`common_subexpressions`: the spread temporaries put back, and the plain
    products (:func:`_plain_product`) that some spread product takes back (a dry run
    finds those: a plain product no product spreads stays as CSE wrote it)."""
    plain = {t for t, v in replacements if _plain_product(v)}
    if plain:
        taken = _taken_back(replacements, reduced, temps, plain, dry=True)[0]
        plain = {t for t in plain if t in taken}
    return _taken_back(replacements, reduced, temps, plain)[1:]


def _taken_back(replacements, reduced, temps, plain, dry=False):
    """The temporaries that some product took back, and ``replacements`` and ``reduced``
    with the spread temporaries (and the ``plain`` ones) put back where a product spreads
    them. ``dry``: no new temporaries for the compound factors of what goes back."""
    powers: dict[sympy.Symbol, sympy.Expr] = {}  # the temporaries that go back, as values
    taken: set[sympy.Symbol] = set()

    def inline(expr: sympy.Expr) -> sympy.Expr:
        def product(node: sympy.Mul) -> sympy.Expr:
            # a plain product goes back as a factor of this product (t, t**2), never into
            # a function of a factor (tanh(t/2) is spread as it is)
            own = {f.as_base_exp()[0] for f in node.args}
            used = {t for t in node.free_symbols & powers.keys() if t not in plain or t in own}
            if not used:
                return node
            factors = {t: powers[t] for t in used & plain}
            inlined = sympy.Mul(*(f.xreplace(factors) for f in node.args))
            inlined = inlined.xreplace({t: v for t, v in powers.items() if t not in plain})
            if interleaved_product(inlined, roots=True) is None:
                return node
            taken.update(used)
            return inlined

        return expr.replace(lambda e: isinstance(e, sympy.Mul), product)

    def named_factors(value: sympy.Expr, whole: bool) -> sympy.Expr:
        """``value`` with each compound factor (or base) a temporary of its own: what
        goes back into the products is then multiplications of names alone. ``whole``: a
        factor that is no integer power is named itself (sqrt(|mu|) computed once)."""
        factors = []
        for f in sympy.Mul.make_args(value):
            base, e = f.as_base_exp()
            if whole and not e.is_Integer:
                base, e = f, sympy.S.One
            if not (dry or base.is_Symbol or base.is_number):
                temp = next(temps)
                kept.append((temp, base))
                f = temp**e
            factors.append(f)
        return sympy.Mul(*factors)

    kept = []
    for temp, value in replacements:  # in order: g*t, with t = s**-2, is spread too
        value = inline(value)
        # (and 4*t: a number times a spread temporary, which no product took back alone)
        whole = value.xreplace({t: v for t, v in powers.items() if t not in plain})
        if _spread(value) or (whole != value and _spread(whole)):
            value = named_factors(whole, whole=False)
            powers[temp] = value
        elif temp in plain and _plain_product(value):
            value = named_factors(value, whole=True)
            powers[temp] = value
        kept.append((temp, value))
    reduced = [inline(e) for e in reduced]
    # a temporary that every product took back is no longer read (nor, then, what only
    # it read)
    return taken, _without_unread(kept, reduced, powers.keys()), reduced


def _halves(e: sympy.Expr) -> bool:
    """``e`` is a half-integer of magnitude above 1 (x**1.5, s**-2.5)."""
    return e.is_Rational and e.q == 2 and abs(e) > 1


def _halves_from_roots(replacements, reduced, temps):
    """See :func:`common_subexpressions`: each ``b**(k + 1/2)`` as ``b**k * r``, with ``r =
    sqrt(b)`` a temporary (CSE's own where it has one), and ``b`` one if compound."""
    exprs = [v for _, v in replacements] + list(reduced)
    bases = {
        p.base
        for e in exprs
        for p in sympy.preorder_traversal(e)
        if isinstance(p, sympy.Pow) and _halves(p.exp) and not p.base.is_number
    }
    if not bases:
        return replacements, reduced
    named = {v: t for t, v in replacements}
    added = []
    names: dict[sympy.Expr, sympy.Symbol] = {}  # compound base -> its temporary
    roots: dict[sympy.Expr, sympy.Symbol] = {}  # base or its name -> its square root's
    for base in sorted(bases, key=sympy.default_sort_key):
        name = base
        if not base.is_Symbol:
            name = names[base] = named.get(base) or next(temps)
            if base not in named:
                added.append((name, base))
        root = named.get(sympy.sqrt(base)) or named.get(sympy.sqrt(name))
        if root is None:
            root = next(temps)
            added.append((root, sympy.sqrt(name)))
        roots[base] = roots[name] = root

    def rooted(node: sympy.Pow) -> sympy.Expr:
        sign = 1 if node.exp > 0 else -1
        base = names.get(node.base, node.base)
        return base ** (sign * (abs(node.exp.p) // 2)) * roots[base] ** sign

    def rewrite(temp: sympy.Symbol | None, expr: sympy.Expr) -> sympy.Expr:
        expr = expr.replace(
            lambda n: isinstance(n, sympy.Pow) and _halves(n.exp) and n.base in roots, rooted
        )
        own = {b: n for b, n in names.items() if n != temp}
        own |= {sympy.sqrt(b): r for b, r in roots.items() if r != temp}
        own |= {1 / sympy.sqrt(b): 1 / r for b, r in roots.items() if r != temp}
        return expr.xreplace(own)

    kept = [(t, rewrite(t, v)) for t, v in replacements + added]
    return _in_dependency_order(kept), [rewrite(None, e) for e in reduced]


def _in_dependency_order(replacements):
    """``replacements`` each after the temporaries its value reads, otherwise as given."""
    values = dict(replacements)
    done: set[sympy.Symbol] = set()
    ordered = []

    def place(temp):
        if temp in done:
            return
        done.add(temp)
        for dep in sorted(values[temp].free_symbols & values.keys(), key=sympy.default_sort_key):
            place(dep)
        ordered.append((temp, values[temp]))

    for temp, _ in replacements:
        place(temp)
    return ordered


def _name_spread_bases(replacements, reduced, temps):
    """CSE's output with each compound base of a power that the printers spread out
    (:func:`~symgrad.functions.interleaved_product`: (t0 + 1)**2 * x as
    x / (t0 + 1) / (t0 + 1)... ) named by a temporary first, so that it is computed once."""

    def name_bases(expr, out):
        def spread(node):
            if not isinstance(node, sympy.Mul) or interleaved_product(node) is None:
                return node
            factors = []
            for f in node.args:
                base, e = f.as_base_exp()
                if _spread_exponent(e) and not base.is_Symbol and not base.is_number:
                    temp = next(temps)
                    out.append((temp, base))
                    f = temp**e
                factors.append(f)
            return sympy.Mul(*factors)

        return expr.replace(lambda e: isinstance(e, sympy.Mul), spread)

    named = []
    for temp, value in replacements:
        extra = []
        value = name_bases(value, extra)
        named += [*extra, (temp, value)]
    extra = []
    reduced = [name_bases(e, extra) for e in reduced]
    return named + extra, reduced
