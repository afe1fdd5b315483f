"""Reference cases for the generated tests: exact values of the naive formula at test points.

References are computed from the user's NAIVE formula (and SymPy's derivatives of it),
never from symgrad's rewritten forms, so a wrong rewrite cannot agree with itself. A
consumer of the derived formulas, not a stage of the pipeline.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

import sympy

from symgrad.derived import Derived
from symgrad.functions import real_diff
from symgrad.numerics.mp import Unresolved, exact
from symgrad.numerics.points import extreme_points, sample_points, scalar_value


@dataclass(frozen=True)
class Quantity:
    """One measured quantity of a function: a forward output, a gradient or a second derivative.

    ``reference`` is the naive formula (or its SymPy derivative, or the user's override);
    ``stable`` symgrad's derived formula for the same value, used to cross-check suspicious
    references. ``naive_available`` is False where plain autograd has nothing to compare
    (a gradient the user overrides). A second derivative differentiates the gradient for
    ``input`` again, with respect to ``partner`` (``input`` itself unless it is mixed).
    """

    label: str
    kind: str  # "forward", "grad" or "second"
    output: int
    input: str | None
    reference: sympy.Expr
    stable: sympy.Expr | None
    naive_available: bool
    partner: str | None = None


def quantities(derived: Derived, mixed: bool = False) -> list[Quantity]:
    """Every quantity measured for a function, in table order.

    Second derivatives (``order: 2``) are the Hessian's diagonal, and with ``mixed`` also
    its entries above it: ``d2 out/d a d b`` differentiates the gradient for ``a`` (the
    user's override where there is one) with respect to ``b``, a later input.
    """
    fn = derived.function
    syms = derived.symbols
    result: list[Quantity] = []
    stable_outputs = dict(derived.outputs)
    for k, (out, expr) in enumerate(derived.naive_outputs):
        result.append(
            Quantity(f"forward {out}", "forward", k, None, expr, stable_outputs[out], True)
        )
    for k, ((out, expr), g) in enumerate(zip(derived.naive_outputs, derived.grads)):
        only_this = {h: (sympy.S.One if h == g else sympy.S.Zero) for h in derived.grads}
        for name in derived.diff_inputs:
            overridden = name in derived.overridden
            if overridden:
                d = derived.vjps[name].xreplace(only_this)
            else:
                d = real_diff(expr, syms[name])
            stable = derived.jacobian[out][name]
            result.append(Quantity(f"d {out}/d {name}", "grad", k, name, d, stable, not overridden))
            if fn.order >= 2:
                later = derived.diff_inputs[derived.diff_inputs.index(name) + 1 :]
                for other in [name, *later] if mixed else [name]:
                    second = derived.second.get(name, {}).get(other)
                    label = (
                        f"d2 {out}/d {name}2" if other == name else f"d2 {out}/d {name} d {other}"
                    )
                    result.append(
                        Quantity(
                            label,
                            "second",
                            k,
                            name,
                            real_diff(d, syms[other]),
                            second.xreplace(only_this) if second is not None else None,
                            not overridden,
                            other,
                        )
                    )
    return result


@dataclass(frozen=True)
class Case:
    """One input point and the exact values there (None = undefined, +-inf = overflow)."""

    inputs: dict[str, float]
    values: tuple[float | None, ...]  # per output
    grads: dict[str, float | None]  # "output:input" -> d output / d input
    second: dict[str, float | None]  # "output:input" -> d2 output / d input2


@dataclass(frozen=True)
class Reference:
    """Reference cases for one function, from its naive formula."""

    benign: tuple[Case, ...]
    extreme: tuple[Case, ...]
    extreme32: tuple[Case, ...]  # the same points rounded to float32, exact values there


def _eval_case(derived: Derived, exprs, point: dict[str, float]) -> Case:
    syms = derived.symbols
    env = {syms[k]: v for k, v in point.items()}

    def value(e):
        try:
            return exact(e, env)
        except Unresolved:
            return None  # unknown: the tests check nothing there

    outs, grads, second = exprs
    return Case(
        inputs=dict(point),
        values=tuple(value(e) for e in outs),
        grads={k: value(e) for k, e in grads.items()},
        second={k: value(e) for k, e in second.items()},
    )


def reference(derived: Derived, n_benign: int = 6) -> Reference:
    """Values, gradients and second derivatives of the naive formula at test points.

    Derivatives are per output and input; where the user overrides a gradient, that
    formula (upstream gradient 1 for that output, 0 for the others) is the reference.
    """
    fn = derived.function
    grads, second = {}, {}
    for q in quantities(derived):
        key = f"{derived.naive_outputs[q.output][0]}:{q.input}"
        if q.kind == "grad":
            grads[key] = q.reference
        elif q.kind == "second":
            second[key] = q.reference
    exprs = ([e for _, e in derived.naive_outputs], grads, second)

    rng = random.Random(f"symgrad:{fn.name}")
    tensors = [i for i in fn.inputs if i.is_tensor]
    scalars = {i.name: scalar_value(i) for i in fn.inputs if not i.is_tensor}
    benign = []
    samples = {i.name: sample_points(i, rng, n_benign) for i in tensors}
    for k in range(n_benign):
        point = {name: vals[k] for name, vals in samples.items()} | scalars
        benign.append(_eval_case(derived, exprs, point))
    extreme = []
    # Each input in turn at its extreme points, the others at a benign value.
    for inp in tensors:
        if not inp.gets_gradient and len(tensors) > 1:
            continue
        for v in extreme_points(inp):
            point = {i.name: samples[i.name][0] for i in tensors} | scalars
            point[inp.name] = v
            extreme.append(_eval_case(derived, exprs, point))
    # float32 tests feed float32 inputs: 1 - 1e-8 becomes 1.0, and the exact value
    # must be the one at the rounded input.
    extreme32 = []
    for case in extreme:
        point = {k: (v if k in scalars else _round32(v)) for k, v in case.inputs.items()}
        same = point == case.inputs
        extreme32.append(case if same else _eval_case(derived, exprs, point))
    return Reference(tuple(benign), tuple(extreme), tuple(extreme32))


def _round32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]
