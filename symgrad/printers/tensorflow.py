"""SymPy -> TensorFlow source."""

from __future__ import annotations

import sympy
from sympy.printing.precedence import PRECEDENCE

from symgrad.ops import OPS, spelled
from symgrad.printers.base import FrameworkPrinter

#: Integer powers up to this are written as squares and products (see _print_Pow).
MAX_SQUARINGS_POWER = 16


class TensorFlowPrinter(FrameworkPrinter):
    """Prints SymPy expressions as ``tf.math`` calls (one table, explicit overrides)."""

    framework = "tensorflow"
    sqrt = "tf.math.sqrt"
    rsqrt = "tf.math.rsqrt"
    functions = {op.name: op.tf for op in OPS if spelled(op.tf)}

    def _print_Pow(self, expr, rational=False):
        base, e = expr.as_base_exp()
        if (
            self.is_scalar(expr)
            or not e.is_Integer
            or not 2 <= abs(e) <= MAX_SQUARINGS_POWER
            or self._hypot_ratios(expr) is not None  # hypot**-3 as ratios: no overflow
        ):
            return super()._print_Pow(expr, rational)
        # TF's pow is the generic libm one, even for x**2: 50x a multiply (float32, 1M:
        # 7.8 ms vs 0.15 ms for tf.math.square). Integer powers as squares and products.
        factor = self.parenthesize(base, PRECEDENCE["Pow"], strict=True)
        k = abs(int(e))
        text = self._integer_power(self._print(base), factor, k)
        if k % 2:  # a product standing where a power did: parenthesised
            text = f"({text})"
        return text if e > 0 else f"1 / {text}"

    def power_of_text(self, text: str, k: int) -> str:
        """The printed ``text`` to the integer power ``k`` >= 2, by squaring (a common
        power of an interleaved product, :func:`symgrad.functions.print_interleaved`)."""
        if k > MAX_SQUARINGS_POWER:
            return f"({text})**{k}"
        power = self._integer_power(text, f"({text})", k)
        return f"({power})" if k % 2 else power

    def _integer_power(self, base: str, factor: str, k: int) -> str:
        """base**k (k >= 2) by squaring: x**5 = square(square(x)) * x, unparenthesised;
        ``factor`` is ``base`` parenthesised to stand in a product."""
        half = f"tf.math.square({base if k < 4 else self._integer_power(base, factor, k // 2)})"
        return f"{half} * {factor}" if k % 2 else half

    def _print_in_float64(self, expr):
        if self.is_scalar(expr):
            return self._print(expr.args[0])
        return f"tf.cast({self._print(expr.args[0])}, tf.float64)"

    def _print_rounded_like(self, expr):
        if self.is_scalar(expr):
            return self._print(expr.args[0])
        # TF does not promote: every tensor of a formula has one dtype, the first's
        value, like = expr.args[0], expr.args[1]
        return f"tf.cast({self._print(value)}, {self._print(like)}.dtype)"

    def _print_tan_half_atan(self, expr):
        if self.is_scalar(expr):
            return super()._print_Function(expr)
        # q / (1 + hypot(q, 1)) is inf / inf at q = +-inf, where the value is +-1
        q = self._print(expr.args[0])
        return self.where(
            f"tf.math.is_inf({q})", f"tf.math.sign({q})", super()._print_Function(expr)
        )

    def _print_erfcx(self, expr):
        if self.is_scalar(expr):
            return super()._print_Function(expr)
        # TF has no erfcx: exp(a**2) erfc(a) below a = 9 (finite even in float32), the
        # asymptotic series above (see symgrad.functions.erfcx_series).
        from symgrad.functions import erfcx, erfcx_series

        a = expr.args[0]
        cut = erfcx.SERIES_FROM
        series = erfcx_series(sympy.Max(a, cut))  # Max/Min keep the unused branch finite
        return self._print(
            sympy.Piecewise(
                (sympy.exp(sympy.Min(a, cut) ** 2) * sympy.erfc(sympy.Min(a, cut)), a < cut),
                (series, True),
            )
        )

    def full_like(self, ref: sympy.Symbol, value: sympy.Expr) -> str:
        return f"tf.fill(tf.shape({self._print(ref)}), tf.constant({self._print(value)}, {self._print(ref)}.dtype))"

    def _print_branch(self, value: sympy.Expr) -> str:
        # tf.where converts a Python float to float32 whatever the other branch is.
        if value.is_Number:
            return f"tf.constant({float(value)!r}, {self._print(self._branch_ref)}.dtype)"
        return super()._print_branch(value)

    def where(self, cond: str, a: str, b: str) -> str:
        return f"tf.where({cond}, {a}, {b})"

    def _print_logaddexp(self, expr):
        if self.is_scalar(expr):
            a, b = (self._print(x) for x in expr.args)
            self.uses_math = True
            return f"max({a}, {b}) + math.log1p(math.exp(-abs({a} - {b})))"
        a, b = expr.args
        # TF has no logaddexp: max(a, b) + log1p(exp(-|a - b|)), written with softplus.
        return (
            f"tf.math.maximum({self._print(a)}, {self._print(b)}) + "
            f"tf.math.softplus(-tf.math.abs({self._print(a - b)}))"
        )

    def _print_hypot(self, expr):
        if self.is_scalar(expr):
            return super()._print_Function(expr)
        x, y = (sympy.Abs(a) for a in expr.args)
        # TF has no hypot: big * sqrt(1 + (small/big)**2) does not overflow where the sum of
        # squares would; where() keeps (0, 0) at 0 instead of 0/0.
        big, small = self._print(sympy.Max(x, y)), self._print(sympy.Min(x, y))
        scaled = f"{big} * tf.math.sqrt(1 + tf.math.square({small} / {big}))"
        return self.where(f"{big} > 0", scaled, big)

    def _print_polygamma(self, expr):
        n, x = expr.args
        if n == 0:
            return self.call("tf.math.digamma", x)
        xs = self._print(x)
        return f"tf.math.polygamma(tf.constant({float(n)!r}, {xs}.dtype), {xs})"

    def _print_gamma(self, expr):
        if self.is_scalar(expr):
            return super()._print_Function(expr)
        x = self._print(expr.args[0])
        return (
            f"tf.math.exp(tf.math.lgamma({x})) * (1 - 2 * tf.cast(({x} < 0) & "
            f"(tf.math.floormod(tf.math.floor({x}), 2) == 1), {x}.dtype))"
        )

    def _minmax(self, expr, op: str, py: str) -> str:
        if self.is_scalar(expr):
            return f"{py}({', '.join(self._print(a) for a in expr.args)})"
        # Tensors first: TF converts a leading Python number to int32/float32 on its own.
        args = sorted(expr.args, key=self.is_scalar)
        result = self._print(args[0])
        for a in args[1:]:
            result = f"{op}({result}, {repr(float(a)) if a.is_Number else self._print(a)})"
        return result

    def _print_Max(self, expr):
        return self._minmax(expr, "tf.math.maximum", "max")

    def _print_Min(self, expr):
        return self._minmax(expr, "tf.math.minimum", "min")

    def _print_trunc(self, expr):
        if self.is_scalar(expr):
            return super()._print_Function(expr)
        # tf.math has no trunc (tf.truncatediv is for integers); sign(a) * floor(|a|) would
        # lose the sign of -0.0
        a = self._print(expr.args[0])
        return self.where(f"{a} < 0", f"tf.math.ceil({a})", f"tf.math.floor({a})")

    def _print_clamp(self, expr):
        if self.is_scalar(expr):
            return super()._print_Function(expr)
        x, lo, hi = expr.args
        if not self.is_scalar(x) and lo.is_number and hi.is_number and bool(lo <= hi):
            return f"tf.clip_by_value({self._print(x)}, {float(lo)!r}, {float(hi)!r})"
        # clip_by_value is max(min(x, hi), lo): lo where lo > hi, where torch.clamp gives hi
        return self._print(sympy.Min(sympy.Max(x, lo), hi, evaluate=False))  # (1, 0): not 0

    def _print_Piecewise(self, expr):
        return self.print_piecewise(expr)
