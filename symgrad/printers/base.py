"""SymPy -> framework source: the shared printer, strict about what it cannot print."""

from __future__ import annotations

from collections.abc import Iterable

import sympy
from sympy.printing.precedence import PRECEDENCE, precedence
from sympy.printing.str import StrPrinter

from symgrad.errors import DerivationError
from symgrad.functions import (
    ROOT_POWER_HELPER,
    StableFunction,
    Temporaries,
    heaviside_as_piecewise,
    hypot_power_parts,
    print_interleaved,
    root_exponent,
)
from symgrad.ops import OPS, spelled


class UnsupportedError(DerivationError):
    """A SymPy node with no translation for this framework."""

    def __init__(self, framework: str, expr: sympy.Basic):
        super().__init__(
            None,
            f"cannot print {type(expr).__name__} ({expr}) for {framework}",
            "rewrite the formula with the functions listed in docs/spec-language.md",
        )


class FrameworkPrinter(StrPrinter):
    """Prints one expression as framework code.

    Subclasses fill ``functions`` (SymPy class name -> framework function, a view of
    :data:`symgrad.ops.OPS`) and override ``_print_<Class>`` where a plain call is not
    right (the row names the class). Anything without a rule raises
    :class:`UnsupportedError` instead of printing something that merely looks like code.

    ``scalars`` are symbols bound to Python floats at run time: expressions over scalars
    only are printed with the ``math`` module, since framework ops want tensors.
    ``as_written``: a power whose exponent no float holds is the framework's pow, not the
    module's root helper (the naive formula of the reports and generated tests, which
    have no helpers).
    """

    framework = "python"
    functions: dict[str, str] = {}
    #: Python numbers (expressions of scalar inputs only): a function (the rows' ``python``).
    math_functions: dict[str, str] = {
        op.name: op.python for op in OPS if spelled(op.python) and "{" not in op.python
    }
    #: Stable functions of Python floats (scalar inputs only), as Python source formats.
    scalar_formats: dict[str, str] = {
        op.name: op.python for op in OPS if spelled(op.python) and "{" in op.python
    }
    _default_settings = dict(StrPrinter._default_settings)

    def __init__(
        self,
        scalars: Iterable[sympy.Symbol] = (),
        names: dict[sympy.Symbol, str] | None = None,
        as_written: bool = False,
    ):
        super().__init__()
        self.scalars = frozenset(scalars)
        self.as_written = as_written
        self.names = dict(names or {})
        self.uses_math = False
        self.booleans: set[sympy.Symbol] = set()  # temporaries holding conditions
        #: the shared temporaries printed so far (see functions.paired_product)
        self.temporaries = Temporaries()

    # ------------------------------------------------------------------ helpers
    def is_scalar(self, expr: sympy.Basic) -> bool:
        """True when ``expr`` is a Python number at run time (no tensor in it)."""
        return expr.free_symbols <= self.scalars

    def call(self, name: str, *args: sympy.Basic) -> str:
        return f"{name}({', '.join(self._print(a) for a in args)})"

    def emptyPrinter(self, expr):
        raise UnsupportedError(self.framework, expr)

    def _print_Basic(self, expr):
        raise UnsupportedError(self.framework, expr)

    # ------------------------------------------------------------------ atoms
    def _print_Symbol(self, expr):
        return self.names.get(expr, expr.name)

    def _print_Integer(self, expr):
        value = int(expr)
        # Frameworks take int64 at most; past 2**53 a float literal is as exact as float64 gets.
        return str(value) if abs(value) <= 2**53 else repr(float(value))

    def _print_Rational(self, expr):
        return repr(float(expr))

    def _print_Float(self, expr):
        return repr(float(expr))

    def _print_Half(self, expr):
        return "0.5"

    def _print_Pi(self, expr):
        self.uses_math = True
        return "math.pi"

    def _print_Exp1(self, expr):
        self.uses_math = True
        return "math.e"

    def _print_Infinity(self, expr):
        self.uses_math = True
        return "math.inf"

    def _print_NegativeInfinity(self, expr):
        self.uses_math = True
        return "-math.inf"

    def _print_BooleanTrue(self, expr):
        return "True"

    def _print_BooleanFalse(self, expr):
        return "False"

    def _print_NaN(self, expr):
        raise UnsupportedError(self.framework, expr)

    # StrPrinter has text forms for these; none is framework code.
    _print_Sum = _print_Integral = _print_Interval = _print_Order = _print_NaN
    _print_Lambda = _print_MatrixBase = _print_Derivative = _print_Subs = _print_NaN

    _print_ComplexInfinity = _print_NaN
    _print_ImaginaryUnit = _print_NaN

    # ------------------------------------------------------------------ arithmetic
    def _print_Pow(self, expr, rational=False):
        base, e = expr.as_base_exp()
        ratios = None if self.is_scalar(expr) else self._hypot_ratios(expr)
        if ratios is not None:
            return ratios
        if self.is_scalar(expr):
            if e == sympy.S.Half:
                self.uses_math = True
                return self.call("math.sqrt", base)
            if e == -sympy.S.Half:
                self.uses_math = True
                return f"1 / {self.call('math.sqrt', base)}"
            return super()._print_Pow(expr, rational)
        root = None if self.as_written else root_exponent(e)
        if root is not None:
            # the exponent would be rounded: a root within an ulp (functions.root_exponent)
            return f"{ROOT_POWER_HELPER}({self._print(base)}, {root[0]}, {root[1]})"
        if e == sympy.S.Half:
            return self.call(self.sqrt, base)
        if e == -sympy.S.Half:
            return self.call(self.rsqrt, base)
        if e == -1:
            return f"1 / {self.parenthesize(base, PRECEDENCE['Mul'], strict=True)}"
        b = self.parenthesize(base, PRECEDENCE["Pow"], strict=True)
        ee = self.parenthesize(e, PRECEDENCE["Pow"], strict=True)
        if isinstance(e, sympy.Pow) and e.exp.is_negative and not ee.startswith("("):
            # printed as a division (1 / n), which binds looser than ** (SymPy ranks it
            # as a power): x**1 / n would be x / n
            ee = f"({ee})"
        return f"{b}**{ee}"

    def _print_Mul(self, expr):
        ratios = None if self.is_scalar(expr) else self._hypot_ratios(expr)
        if ratios is not None:
            return ratios
        # Fold constant factors (sqrt(2)/sqrt(pi), 1/2*pi, ...) into one literal: each
        # factor left in the code would be one more pass over a whole tensor.
        constants = [f for f in expr.args if not f.free_symbols]
        unwieldy = any(f.is_Rational and max(abs(f.p), f.q) > 10**6 for f in constants)
        if (
            (len(constants) >= 2 or unwieldy)
            and (unwieldy or any(not f.is_Rational for f in constants))
            and len(expr.args) > len(constants)
            and sympy.Mul(*constants).is_extended_real
        ):
            value = sympy.Mul(*constants)
            rest = sympy.Mul(*(f for f in expr.args if f.free_symbols))
            folded = sympy.Float(value.evalf(20), 17)
            # flat, the literal first: scaled first, as the accuracy choice measured it
            expr = sympy.Mul(folded, *sympy.Mul.make_args(rest), evaluate=False)
        # a product with powers interleaved (functions.interleaved_product): no overflow
        return print_interleaved(self, expr) or super()._print_Mul(expr)

    def _hypot_ratios(self, expr: sympy.Expr) -> str | None:
        parts = hypot_power_parts(expr)
        if parts is None:
            return None
        rest, h, k, pairs = parts
        hyp = self._print(h)
        texts = [] if rest == 1 else ["-1"] if rest == -1 else [self._print(rest)]
        texts.append(f"(1 / {hyp})" + (f"**{k}" if k > 1 else ""))
        for b, m in pairs:
            ratio = f"({self._print(b)} / {hyp})"
            texts.append(ratio if m == 1 else f"{ratio}**{m}")
        return " * ".join(texts)

    # ------------------------------------------------------------------ functions
    def _print_grouped(self, expr):
        return f"({self._print(expr.args[0])})"  # one factor of the product around it

    def _print_Function(self, expr):
        regimes = expr.regimes() if isinstance(expr, StableFunction) else None
        if regimes is not None:
            # parenthesised: the result stands where a call did (dsigmoid(x)**2)
            return f"({self._print(regimes)})"
        name = type(expr).__name__
        if self.is_scalar(expr) and name in self.scalar_formats:
            self.uses_math = True
            return self.scalar_formats[name].format(*(self._print(a) for a in expr.args))
        if self.is_scalar(expr):
            if name not in self.math_functions:
                raise DerivationError(
                    None,
                    f"{name}() of scalar inputs only cannot be printed",
                    "make one of its inputs a tensor input",
                )
            target = self.math_functions[name]
            self.uses_math = self.uses_math or target.startswith("math.")
            return self.call(target, *expr.args)
        if name in self.functions:
            return self.call(self.functions[name], *expr.args)
        raise UnsupportedError(self.framework, expr)

    def _print_Relational(self, expr):
        op = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}[expr.rel_op]
        lhs = self.parenthesize(expr.lhs, PRECEDENCE["Relational"] + 1)
        rhs = self.parenthesize(expr.rhs, PRECEDENCE["Relational"] + 1)
        return f"{lhs} {op} {rhs}"

    def _bool_args(self, expr, joiner):
        return f" {joiner} ".join(f"({self._print(a)})" for a in expr.args)

    def _print_And(self, expr):
        return self._bool_args(expr, "&")

    def _print_Or(self, expr):
        return self._bool_args(expr, "|")

    def _print_Not(self, expr):
        return f"~({self._print(expr.args[0])})"

    def parenthesize(self, item, level, strict=False):
        if precedence(item) < level or (not strict and precedence(item) <= level):
            return f"({self._print(item)})"
        return self._print(item)

    # ------------------------------------------------------------------ branches
    def full_like(self, ref: sympy.Symbol, value: sympy.Expr) -> str:  # pragma: no cover
        raise NotImplementedError

    def where(self, cond: str, a: str, b: str) -> str:  # pragma: no cover
        raise NotImplementedError

    def number_as_tensor(self, ref: sympy.Symbol, text: str) -> str:
        """``text``, a printed number, as a tensor like ``ref`` where ``where`` needs one
        (the frameworks whose branches print as tensors already return it as it is)."""
        return text

    def print_piecewise(self, expr: sympy.Piecewise) -> str:
        """Nested where(); values that are all numbers get a tensor of the right dtype."""
        pieces = list(expr.args)
        if pieces[-1].cond == sympy.true:
            otherwise = pieces.pop().expr
        else:
            otherwise = sympy.nan
        if self.is_scalar(expr):
            text = self._print(otherwise)
            for value, cond in reversed(pieces):
                text = f"({self._print(value)} if {self._print(cond)} else {text})"
            return text
        # (a local too: printing a branch that holds a where of its own sets _branch_ref)
        ref = self._branch_ref = self._tensor_ref(expr)
        if otherwise is sympy.nan:
            self.uses_math = True
            text = "math.nan"
        else:
            text = self._print_branch(otherwise)
        # where() of two numbers has no tensor to take its dtype from (Max's derivative:
        # where(a > b, 1, where(a == b, 0.5, 0)) among tensor branches): a tail that is a
        # number before a number branch becomes a tensor of the right dtype
        number_tail = self.is_scalar(otherwise)
        if number_tail and all(self.is_scalar(v) for v, _ in pieces):
            text = self.full_like(
                ref, otherwise if otherwise is not sympy.nan else sympy.Float("nan")
            )
            number_tail = False
        for value, cond in reversed(pieces):
            if self.is_scalar(cond):
                # a Python bool (a condition on scalar inputs only): a Python choice, as
                # where() takes a boolean tensor
                text = f"({self._print_branch(value)} if {self._print(cond)} else {text})"
                number_tail = number_tail and self.is_scalar(value)
                continue
            if number_tail and self.is_scalar(value):
                text = self.number_as_tensor(ref, text)
            text = self.where(self._print(cond), self._print_branch(value), text)
            number_tail = False
        return text

    def _tensor_ref(self, expr: sympy.Basic) -> sympy.Symbol:
        """A floating-point tensor of ``expr`` whose dtype and shape numbers can borrow."""
        candidates = sorted(expr.free_symbols - self.scalars, key=lambda s: s.name)
        floats = [c for c in candidates if c not in self.booleans]
        return (floats or candidates)[0]

    def _print_branch(self, value: sympy.Expr) -> str:
        # A bare integer branch would make TF infer an int dtype: print numbers as floats.
        return repr(float(value)) if value.is_Number else self._print(value)

    # ------------------------------------------------------------------ primitives as formulas
    def _print_one_plus_erf(self, expr):
        # erfc(-x): exact for x << 0 where 1 + erf(x) cancels (unevaluated: SymPy would
        # turn it back into 2 - erfc(x)).
        return self._print(sympy.erfc(-expr.args[0], evaluate=False))

    def _print_log1mexp(self, expr):
        # Maechler's two regimes: log(-expm1(a)) near 0, log1p(-exp(a)) below -log(2).
        from symgrad.functions import expm1, log1p

        a = expr.args[0]
        return self._print(
            sympy.Piecewise(
                (sympy.log(-expm1(a)), a > -sympy.log(2)),
                (log1p(-sympy.exp(a)), True),
            )
        )

    def _print_sinh(self, expr):
        return self._hyperbolic(expr)

    def _print_cosh(self, expr):
        return self._hyperbolic(expr)

    def _hyperbolic(self, expr):
        """sinh/cosh, finite up to |a| = 710.47 (89.4 in float32): the vectorised kernels of
        the frameworks overflow from 709.78 (88.72) on, where exp(|a|) does. Beyond |a| = 88
        they are sign * exp(|a|/2) * (exp(|a|/2) / 2), which only overflows with the value."""
        if self.is_scalar(expr):
            return self._print_Function(expr)
        name = type(expr).__name__
        a = expr.args[0]
        half = self._print(sympy.exp(sympy.Abs(a) / 2))
        big = f"{half} * ({half} / 2)"
        if name == "sinh":
            big = f"{self._print(sympy.sign(a))} * {big}"
        return self.where(
            f"{self._print(sympy.Abs(a))} < 88", self.call(self.functions[name], a), big
        )

    def _print_Heaviside(self, expr):
        return self._print(heaviside_as_piecewise(*expr.args))
