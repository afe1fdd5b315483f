"""What the derive stage hands on: the formulas of one function, and their measured error.

Plain data: the stages after derive (plan, print, render) read it and import nothing that
differentiates or evaluates.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import sympy

from symgrad.spec import Function


@dataclass(frozen=True)
class Accuracy:
    """Measured error of one formula in float64."""

    mean_bits: float
    max_bits: float
    non_finite: int  # results that are inf/nan where the exact value is finite
    points: int
    #: the point of the largest error (a non-finite result first), as ``x = -1e4, ...``
    worst: str = field(default="", compare=False)
    #: of ``non_finite``, the float64 results (float32's may come from a point that float32
    #: rounds onto a pole or to 0)
    non_finite64: int = field(default=0, compare=False)
    #: the choice's score: the mean bits with a point whose result is non-finite (in
    #: float64, or in float32 where the exact value fits) counted as
    #: :data:`symgrad.choose.NON_FINITE_BITS`
    score: float = field(default=0.0, compare=False)
    #: results that are not the infinity where the exact value overflows (NaN = inf/inf):
    #: the choice's last tie-break, never part of the score
    overflow_misses: int = field(default=0, compare=False)

    def __str__(self) -> str:
        text = f"{self.mean_bits:.1f} bits mean, {self.max_bits:.0f} max over {self.points} points"
        if self.non_finite:
            text += f", {self.non_finite} non-finite"
        return text


@dataclass(frozen=True)
class Derived:
    """Every formula the emitters need for one function, over the input symbols.

    ``vjps[i]`` is the gradient of input ``i`` given the upstream gradients ``grads``;
    ``jacobian[o][i]`` the derivative of output ``o`` w.r.t. input ``i`` (for forward mode);
    ``second[i][w]`` the derivative of ``vjps[i]`` w.r.t. ``w`` (a differentiable input or an
    upstream gradient): the formulas of the double backward. All are total derivatives
    in terms of the inputs, stabilised and simplified.
    """

    function: Function
    symbols: dict[str, sympy.Symbol]  # input name -> symbol
    outputs: tuple[tuple[str, sympy.Expr], ...]  # stable forward
    naive_outputs: tuple[tuple[str, sympy.Expr], ...]  # as the user wrote them
    grads: tuple[sympy.Symbol, ...]  # upstream gradient symbol per output
    vjps: dict[str, sympy.Expr]
    jacobian: dict[str, dict[str, sympy.Expr]]
    second: dict[str, dict[str, sympy.Expr]]
    overridden: frozenset[str]
    accuracy: dict[str, Accuracy] = field(default_factory=dict)  # label -> measured error
    # label -> the fused path's form, where the cheapest for compiled code (arithmetic
    # only) is another than the eager one (passes over memory too); as accurate
    fused: dict[str, sympy.Expr] = field(default_factory=dict)
    #: a VJP that reads outputs as variables of their own (``grad * out``, see
    #: :meth:`reusable_outputs`) -> its derivative w.r.t. each tensor it reads: the second
    #: order the planner uses where it saves an output instead of recomputing it
    second_partials: dict[sympy.Expr, dict[str, sympy.Expr]] = field(default_factory=dict)
    #: the candidate rewrites that raised (a symgrad or SymPy bug) and were left out: the
    #: code is generated without their forms; ``symgrad gen`` prints each as a note
    skipped: tuple[str, ...] = ()

    @property
    def diff_inputs(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.function.inputs if i.gets_gradient)

    @property
    def scalars(self) -> frozenset[sympy.Symbol]:
        return frozenset(self.symbols[i.name] for i in self.function.inputs if not i.is_tensor)

    def for_fused(self) -> Derived:
        """These formulas with the fused path's forms (see ``fused``)."""
        forms = self.fused

        def pick(label: str, expr: sympy.Expr) -> sympy.Expr:
            return forms.get(label, expr)

        return dataclasses.replace(
            self,
            outputs=tuple((name, pick(name, e)) for name, e in self.outputs),
            vjps={
                i: e if i in self.overridden else pick(f"grad_{i}", e) for i, e in self.vjps.items()
            },
            second={
                i: {w: pick(f"d grad_{i} / d {w}", e) for w, e in by_w.items()}
                for i, by_w in self.second.items()
            },
            fused={},
        )

    def outputs_requiring_grad(self) -> tuple[str, ...]:
        """Outputs of some differentiable input: they require grad (one with derivative 0,
        round(x), gets zero gradients, as in torch); so does an output of no tensor input
        where some input is differentiable (``x - x + 3``, a number once SymPy parsed it,
        as ``x * 0 + 3`` in torch). The others, of ``differentiable: false`` tensors only,
        are marked non-differentiable."""
        diff = {self.symbols[i] for i in self.diff_inputs}
        tensors = {self.symbols[i.name] for i in self.function.inputs if i.is_tensor}
        return tuple(
            name
            for name, naive in self.naive_outputs
            if naive.free_symbols & diff or (diff and not naive.free_symbols & tensors)
        )

    def differentiable_outputs(self) -> tuple[str, ...]:
        """Outputs with a nonzero derivative w.r.t. some input (others are marked so)."""
        return tuple(
            name
            for name, _ in self.outputs
            if any(self.jacobian[name][i] != 0 for i in self.diff_inputs)
        )

    def output_symbols(self) -> dict[str, sympy.Symbol]:
        """The symbol of each output, for formulas that read an output as a variable."""
        return {name: sympy.Symbol(name, real=True) for name, _ in self.outputs}

    def reusable_outputs(self) -> tuple[tuple[sympy.Expr, sympy.Symbol], ...]:
        """(formula, symbol) of each output a backward may read instead of recomputing it
        (d exp(x)/dx = grad * out): only an output whose formula reappears in a gradient,
        and never where a gradient would read it beside a differentiable input: a
        ``grad*x/out`` would make the double backward chain two partial derivatives whose
        sum cancels (1/h - x**2/h**3 for hypot) where the derived y**2/h**3 does not."""
        symbols = self.output_symbols()
        diff_syms = {self.symbols[i] for i in self.diff_inputs}
        reusable = []
        for name, expr in self.outputs:
            if expr.is_Atom or expr.has(sympy.Piecewise):
                continue
            out = symbols[name]
            reading = [e.xreplace({expr: out}) for e in self.vjps.values()]
            read = any(out in v.free_symbols for v in reading)
            mixed = any(out in v.free_symbols and v.free_symbols & diff_syms for v in reading)
            if read and not mixed:
                reusable.append((expr, out))
        return tuple(reusable)
