"""Measure what elementwise PyTorch ops cost relative to a multiply (symgrad.cost's weights).

    python benchmarks/op_costs.py            # 1M elements, float32 and float64, 1 thread

Prints, per op, the median time over a multiply's for each dtype next to the weight
``symgrad.cost.OP_COST`` uses, so that the table can be checked (or re-derived) on another
machine. Outputs are preallocated (``out=``) where the op has one, so what is measured is
the arithmetic, not the allocator.

Then the same for symgrad's own primitives that the torch printer writes out as their
regimes (``exprel_d``, ``sinc_d``, ...): the printed code itself, evaluated eagerly on
``3 * randn`` (so that both the series and the far regime run), one row per derivative
order. Their weights are on another scale (they only break ties between equally accurate
forms, and were set relative to each other); compare them with each other, not with the
first table.
"""

from __future__ import annotations

import argparse
import math
import time

import sympy
import torch
import torch.nn.functional as F

from symgrad import functions as SF
from symgrad.cost import OP_COST
from symgrad.printers.torch import TorchPrinter


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e3


def ops(x: torch.Tensor, pos: torch.Tensor, out: torch.Tensor) -> dict:
    """name in symgrad.cost.OP_COST -> a call computing it on ``x`` (``pos``: x > 0)."""
    return {
        "Abs": lambda: torch.abs(x, out=out),
        "clamp": lambda: torch.clamp(x, min=-1.0, max=1.0, out=out),
        "round": lambda: torch.round(x, out=out),
        "floor": lambda: torch.floor(x, out=out),
        "ceil": lambda: torch.ceil(x, out=out),
        "trunc": lambda: torch.trunc(x, out=out),
        "sigmoid": lambda: torch.sigmoid(x, out=out),
        "exp": lambda: torch.exp(x, out=out),
        "expm1": lambda: torch.expm1(x, out=out),
        "log": lambda: torch.log(pos, out=out),
        "log1p": lambda: torch.log1p(pos, out=out),
        "hypot": lambda: torch.hypot(x, pos, out=out),
        "cosh": lambda: torch.cosh(x, out=out),
        "sinh": lambda: torch.sinh(x, out=out),
        "erf": lambda: torch.erf(x, out=out),
        "erfc": lambda: torch.erfc(x, out=out),
        "sin": lambda: torch.sin(x, out=out),
        "cos": lambda: torch.cos(x, out=out),
        "softplus": lambda: F.softplus(x, threshold=40.0),
        "tan": lambda: torch.tan(x, out=out),
        "tanh": lambda: torch.tanh(x, out=out),
        "xlogy": lambda: torch.xlogy(x, pos, out=out),
        "atan": lambda: torch.atan(x, out=out),
        "loggamma": lambda: torch.lgamma(pos, out=out),
        "xlog1py": lambda: torch.special.xlog1py(x, pos, out=out),
        "asinh": lambda: torch.asinh(x, out=out),
        "digamma": lambda: torch.digamma(pos, out=out),
        "erfcx": lambda: torch.special.erfcx(x, out=out),
    }


def regime_primitives() -> list[sympy.Expr]:
    """symgrad primitives the torch printer writes inline as their regimes."""
    x = sympy.Symbol("x", real=True)
    calls = [SF.exprel(x), SF.log1prel(x), SF.logcosh(x), SF.sinpi(x), SF.cospi(x)]
    for family in (SF.exprel_d, SF.log1prel_d, SF.sinc_d, SF.sincpi_d):
        calls += [family(n, x) for n in range(3)]
    return calls


def printed(expr: sympy.Expr):
    """The torch code the printer writes for ``expr``, as a function of ``x``.

    Only symgrad's own printed code is evaluated here (no spec is involved).
    """
    code = TorchPrinter().doprint(expr)
    return eval(f"lambda x: {code}", {"torch": torch, "math": math})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtypes = (torch.float32, torch.float64)
    ratios: dict[str, list[float]] = {}
    for dtype in dtypes:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(args.size, generator=g, dtype=dtype)
        pos = x.abs() + 0.5
        out = torch.empty_like(x)
        mul = median_ms(lambda: torch.mul(x, x, out=out), args.repeats)  # noqa: B023
        for name, fn in ops(x, pos, out).items():
            ratios.setdefault(name, []).append(median_ms(fn, args.repeats) / mul)
    print(f"torch {torch.__version__}, {args.size:,} elements, {args.threads} thread(s)")
    print(f"{'op':10s} {'float32':>8s} {'float64':>8s} {'OP_COST':>8s}")
    for name, (r32, r64) in ratios.items():
        print(f"{name:10s} {r32:8.1f} {r64:8.1f} {OP_COST[name]:8g}")
    regimes: dict[str, list[float]] = {}
    for dtype in dtypes:
        g = torch.Generator().manual_seed(0)
        x = 3 * torch.randn(args.size, generator=g, dtype=dtype)
        out = torch.empty_like(x)
        mul = median_ms(lambda: torch.mul(x, x, out=out), args.repeats)  # noqa: B023
        for call in regime_primitives():
            fn = printed(call)
            regimes.setdefault(str(call), []).append(median_ms(lambda: fn(x), args.repeats) / mul)  # noqa: B023
    print(f"\n{'regimes':16s} {'float32':>8s} {'float64':>8s} {'OP_COST':>8s}")
    for name, (r32, r64) in regimes.items():
        print(f"{name:16s} {r32:8.1f} {r64:8.1f} {OP_COST[name.split('(')[0]]:8g}")


if __name__ == "__main__":
    main()
