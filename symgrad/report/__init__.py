"""``symgrad accuracy``: bits of error of symgrad's generated code vs plain autograd.

For every function of a spec, and for its forward (per output), its gradients (per
output and differentiable input, upstream gradient 1 for that output) and, with
``order: 2``, its second derivatives ``d2 out / d x2``, this module measures over sample
points:

- the mean and max **bits of error** (Herbie's measure): ``log2(1 + d)`` where ``d`` is the
  number of floats of the target dtype between the computed value and the correctly
  rounded exact value (NaN counts as the dtype's full width, 64 or 32 bits);
- how many results are non-finite (NaN or +-inf) where the exact value is finite;

once for symgrad's generated PyTorch module and once, side by side, for plain
``torch.autograd`` of the naive formula exactly as the user wrote it (printed with
:class:`~symgrad.printers.TorchPrinter`, not stabilised; stable primitives the user wrote
by name, such as ``sigmoid``, stay the framework's op).

Exact values come from :func:`symgrad.numerics.mp.exact` on the NAIVE formula and SymPy's
derivatives of it (a user's gradient override is its own reference, as in
:func:`symgrad.cases.reference`). ``exact`` rounds to float64; for float32 that value
is rounded again to float32: a double rounding, off by one float32 ulp (1 bit of error)
only where the exact result lies within one float64 rounding (2**-53 relative) of a
float32 halfway point, which is rare enough to ignore in means over many points.

Rising precision cannot resolve every naive formula: ``log(1 - sigmoid(1e300))`` cancels
2**-1.4e300 against 1 and is ``-inf`` at any precision. Where the naive reference is
suspicious (undefined, infinite or zero) it is cross-checked against the exact value of
symgrad's own stable formula; when the two disagree the naive formula is retried at
16384 and 65536 bits, and a point still in dispute is left out and counted as
``disputed`` (a reference limit or a wrong rewrite: worth a look either way).

Sample points follow Herbie: float bit patterns drawn uniformly between the ends of each
input's domain (so every binade is equally likely: most points are huge or tiny), plus
the fixed extreme points of :func:`symgrad.numerics.points.extreme_points`.

Plots are not drawn (matplotlib is not a dependency); :func:`~symgrad.report.plot.plot` writes the per-point
data as CSV files that any plotting tool reads.
"""

from symgrad.report.measure import (
    DISPUTED,
    Row,
    Sample,
    device_problem,
    measure_function,
    measure_spec,
    reference_value,
    sample_points,
)
from symgrad.report.plot import plot
from symgrad.report.table import format_table, nonfinite, regressions, summary, table_cells, worst
from symgrad.report.tensor import tensor_rows

__all__ = [
    "DISPUTED",
    "Row",
    "Sample",
    "device_problem",
    "format_table",
    "measure_function",
    "measure_spec",
    "nonfinite",
    "plot",
    "reference_value",
    "regressions",
    "sample_points",
    "summary",
    "table_cells",
    "tensor_rows",
    "worst",
]
