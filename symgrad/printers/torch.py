"""SymPy -> PyTorch source."""

from __future__ import annotations

import sympy
from sympy.printing.precedence import PRECEDENCE

from symgrad.ops import OPS, ROUNDED_HELPER, WIDE_HELPER, spelled
from symgrad.printers.base import FrameworkPrinter


class TorchPrinter(FrameworkPrinter):
    """Prints SymPy expressions as ``torch`` calls (one table, explicit overrides)."""

    framework = "torch"
    sqrt = "torch.sqrt"
    rsqrt = "torch.rsqrt"
    functions = {op.name: op.torch for op in OPS if spelled(op.torch)}

    def _print_Mul(self, expr):
        ratios = None if self.is_scalar(expr) else self._hypot_ratios(expr)
        if ratios is not None:
            return ratios
        # p*x/q is two passes over a tensor, -x/q too: one float factor instead.
        c, rest = expr.as_coeff_Mul()
        if c.is_Rational and not c.is_Integer and (c.p != 1) and not self.is_scalar(rest):
            # flat, the literal first: c*(a*b) would scale the product last, where it
            # may have overflowed (the accuracy choice measured c*a*b)
            expr = sympy.Mul(sympy.Float(c, 17), *sympy.Mul.make_args(rest), evaluate=False)
        return super()._print_Mul(expr)

    def _print_Relational(self, expr):
        # |u| < c as (u < c) & (u > -c): booleans only, no fresh float tensor for |u|.
        lhs, rhs, op = expr.lhs, expr.rhs, expr.rel_op
        if (
            op in ("<", "<=")
            and isinstance(lhs, sympy.Abs)
            and lhs.args[0].is_Symbol
            and not self.is_scalar(lhs)
            and rhs.is_number
            and rhs.is_positive
        ):
            u, flipped = self._print(lhs.args[0]), op.replace("<", ">")
            return f"({u} {op} {self._print(rhs)}) & ({u} {flipped} {self._print(-rhs)})"
        return super()._print_Relational(expr)

    def full_like(self, ref: sympy.Symbol, value: sympy.Expr) -> str:
        return f"torch.full_like({self._print(ref)}, {self._print(value)})"

    def where(self, cond: str, a: str, b: str) -> str:
        return f"torch.where({cond}, {a}, {b})"

    def number_as_tensor(self, ref: sympy.Symbol, text: str) -> str:
        # torch.where of two numbers is a float32 tensor whatever the inputs are
        return f"torch.full_like({self._print(ref)}, {text})"

    def _print_softplus(self, expr):
        if self.is_scalar(expr):
            return super()._print_Function(expr)
        # torch's default threshold (20) returns x where log1p(exp(x)) still differs from x
        # in float64; above 40 the two agree to the last bit in every dtype.
        return f"torch.nn.functional.softplus({self._print(expr.args[0])}, threshold=40.0)"

    def _print_in_float64(self, expr):
        if self.is_scalar(expr):
            return self._print(expr.args[0])
        # the generated module's helper: float64, where the device has it (not MPS)
        return f"{WIDE_HELPER}({self._print(expr.args[0])})"

    def _print_rounded_like(self, expr):
        if self.is_scalar(expr):
            return self._print(expr.args[0])
        # the generated module's helper: the dtype the tensors ``like`` promote to
        return f"{ROUNDED_HELPER}({', '.join(self._print(a) for a in expr.args)})"

    def _print_tan_half_atan(self, expr):
        if self.is_scalar(expr):
            return super()._print_Function(expr)
        # the generated module's helper: q / (1 + hypot(q, 1)), compiled without hypot
        return f"_tan_half_atan({self._print(expr.args[0])})"

    def _tensors_only(self, expr, name: str) -> str:
        """``name(a, b)`` for a torch function that takes tensors only (hypot, atan2): a
        number becomes a 0-d tensor of the other's dtype and device, filled there
        (new_tensor would copy from the host: a device sync)."""
        if self.is_scalar(expr):
            return super()._print_Function(expr)
        tensor = next(a for a in expr.args if not self.is_scalar(a))
        # filled from one of its tensor symbols, not from the argument: that would be
        # computed twice
        ref = next(
            (s for s in sorted(tensor.free_symbols, key=str) if not self.is_scalar(s)), tensor
        )
        args = [
            f"{self.parenthesize(ref, PRECEDENCE['Atom'], strict=True)}.new_full((), {self._print(a)})"
            if self.is_scalar(a)
            else self._print(a)
            for a in expr.args
        ]
        return f"{name}({args[0]}, {args[1]})"

    def _print_hypot(self, expr):
        return self._tensors_only(expr, "torch.hypot")

    def _print_arctan2(self, expr):
        return self._tensors_only(expr, "torch.atan2")

    def _print_polygamma(self, expr):
        n, x = expr.args
        if n == 0:
            return self.call("torch.digamma", x)
        return f"torch.polygamma({int(n)}, {self._print(x)})"

    def _print_gamma(self, expr):
        if self.is_scalar(expr):
            return super()._print_Function(expr)
        x = self._print(expr.args[0])
        # torch has lgamma but no gamma; restore the sign of gamma for negative x.
        return (
            f"torch.exp(torch.lgamma({x})) * "
            f"(1 - 2 * (({x} < 0) & (torch.remainder(torch.floor({x}), 2) == 1)).to({x}.dtype))"
        )

    def _minmax(self, expr, tensor_op: str, clamp_kw: str, py: str) -> str:
        tensors = [a for a in expr.args if not self.is_scalar(a)]
        numbers = [a for a in expr.args if self.is_scalar(a)]
        result = self._print(tensors[0])
        for t in tensors[1:]:
            result = f"{tensor_op}({result}, {self._print(t)})"
        if numbers:
            bound = (
                self._print(numbers[0])
                if len(numbers) == 1
                else f"{py}({', '.join(self._print(n) for n in numbers)})"
            )
            result = f"torch.clamp({result}, {clamp_kw}={bound})"
        return result

    def _print_Max(self, expr):
        if self.is_scalar(expr):
            return f"max({', '.join(self._print(a) for a in expr.args)})"
        return self._minmax(expr, "torch.maximum", "min", "max")

    def _print_Min(self, expr):
        if self.is_scalar(expr):
            return f"min({', '.join(self._print(a) for a in expr.args)})"
        # Min(Max(x, lo), hi): one clamp
        inner = [a for a in expr.args if isinstance(a, sympy.Max)]
        if len(expr.args) == 2 and len(inner) == 1:
            (hi,) = (a for a in expr.args if a is not inner[0])
            lows = [a for a in inner[0].args if self.is_scalar(a)]
            (x, *rest) = [a for a in inner[0].args if not self.is_scalar(a)] or [None]
            if self.is_scalar(hi) and len(lows) == 1 and x is not None and not rest:
                lo, hi = self._print(lows[0]), self._print(hi)
                return f"torch.clamp({self._print(x)}, min={lo}, max={hi})"
        return self._minmax(expr, "torch.minimum", "max", "min")

    def _print_clamp(self, expr):
        if self.is_scalar(expr):
            return super()._print_Function(expr)
        x, lo, hi = expr.args
        if not self.is_scalar(x) and self.is_scalar(lo) and self.is_scalar(hi):
            return f"torch.clamp({self._print(x)}, min={self._print(lo)}, max={self._print(hi)})"
        if not any(self.is_scalar(a) for a in expr.args):
            return self.call("torch.clamp", x, lo, hi)
        # torch.clamp takes tensor bounds or number bounds, not one of each
        return self._print(sympy.Min(sympy.Max(x, lo), hi, evaluate=False))  # (1, 0): not 0

    def _print_Piecewise(self, expr):
        return self.print_piecewise(expr)
