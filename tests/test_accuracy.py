"""The accuracy report: bits of error, Herbie-style sampling, naive vs symgrad, the table."""

from __future__ import annotations

import csv
import math
import random

import pytest
import sympy

from symgrad import report as acc
from symgrad.spec import load_spec

SPEC = """
module: tiny
functions:
  softplus:
    inputs: {x: {}}
    output: log(1 + exp(x))
  shrink:
    order: 1
    inputs: {x: {}}
    output: x - tanh(x)
  ste:
    inputs: {x: {}}
    output: Heaviside(x, 1)
    gradient:
      x: grad * Heaviside(1 - Abs(x), 1)
"""


@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory):
    path = tmp_path_factory.mktemp("accuracy") / "tiny.yaml"
    path.write_text(SPEC)
    return load_spec(path)


@pytest.fixture(scope="module")
def tiny_rows(tiny_spec):
    pytest.importorskip("torch")
    return acc.measure_spec(tiny_spec, "float64", points=8, seed=1, budget=None)


def _row(rows, function, quantity):
    return next(r for r in rows if r.function == function and r.quantity == quantity)


def _positive_x(tmp_path, domain: str, output: str):
    """The function of a one-function spec in a positive input x on ``domain``."""
    path = tmp_path / "f.yaml"
    path.write_text(
        f"module: m\nfunctions:\n  f:\n    inputs: {{x: {{domain: {domain}, positive: true}}}}\n"
        f"    output: {output}\n"
    )
    return load_spec(path).functions[0]


def test_samples_stay_inside_a_bounded_domain(tmp_path):
    fn = _positive_x(tmp_path, "[0, 1]", "log(x/(1 - x))")
    points = acc.sample_points(fn, 5, random.Random(0))
    extremes = [p["x"] for p in points[:-5]]
    assert 1.0 in extremes and min(extremes) > 0  # domain edge, and no 0 (positive)


def test_range_ends_are_extreme_points_inside_the_domain_and_the_dtype(tmp_path):
    fn = _positive_x(tmp_path, "[1, inf]", "log(x + sqrt(x*x - 1))")
    plain = [p["x"] for p in acc.sample_points(fn, 0, random.Random(0), range_ends=False)]
    ends = [p["x"] for p in acc.sample_points(fn, 0, random.Random(0))]
    assert max(plain) < 1e38  # (the test extremes stop at 1e4)
    assert ends[: len(plain)] == plain
    assert set(ends) - set(plain) == {
        1e38,
        3.0000000054977558e38,  # (3e38 in float32)
        3.4028234663852886e38,
        1e308,
        1.7976931348623157e308,
    }
    ends32 = [p["x"] for p in acc.sample_points(fn, 0, random.Random(0), "float32", True)]
    assert max(ends32) == 3.4028234663852886e38 and min(ends32) >= 1  # none negative


# --------------------------------------------------------------------------- references
def test_suspicious_reference_is_resolved_or_disputed():
    x = sympy.Symbol("x", real=True)
    naive = sympy.log(1 - 1 / (1 + sympy.exp(-x)))  # -x - log(1 + exp(-x))
    stable = -x - sympy.log(1 + sympy.exp(-x))
    assert acc.reference_value(naive, stable, {x: 3.0}) == pytest.approx(-3.0485873515737420)
    # exp(-1000) is lost at 1024 bits (-inf twice), found again at 16384.
    assert acc.reference_value(naive, stable, {x: 1000.0}) == -1000.0
    # No precision resolves 1 - sigmoid(1e300): the point is left out, not scored.
    assert acc.reference_value(naive, stable, {x: 1e300}) == acc.DISPUTED
    assert acc.reference_value(sympy.log(x), None, {x: -1.0}) is None


# --------------------------------------------------------------------------- measurement
def test_naive_softplus_gradient_is_nonfinite_but_symgrad_is_not(tiny_rows):
    grad = _row(tiny_rows, "softplus", "d out/d x")
    assert grad.error is None and grad.points >= 8
    assert grad.naive_nonfinite > 0  # exp(x)/(1 + exp(x)) = inf/inf at x = 1e4
    assert grad.symgrad_nonfinite == 0
    assert grad.symgrad_mean_bits < grad.naive_mean_bits
    forward = _row(tiny_rows, "softplus", "forward out")
    assert forward.symgrad_max_bits <= 1.0
    assert forward.naive_nonfinite > 0  # log(1 + inf)
    assert not grad.worse_than_naive
    sample = next(s for s in grad.samples if s.inputs == (1e4,))
    assert sample.exact == 1.0 and sample.symgrad == 1.0 and math.isnan(sample.naive)


def test_rows_follow_order_and_overrides(tiny_rows):
    quantities = [(r.function, r.quantity) for r in tiny_rows]
    assert quantities == [
        ("softplus", "forward out"),
        ("softplus", "d out/d x"),
        ("softplus", "d2 out/d x2"),
        ("shrink", "forward out"),
        ("shrink", "d out/d x"),  # order 1: no second derivative
        ("ste", "forward out"),
        ("ste", "d out/d x"),
        ("ste", "d2 out/d x2"),
    ]
    ste = _row(tiny_rows, "ste", "d out/d x")
    # The user's gradient is its own reference; plain autograd has nothing to compare.
    assert ste.naive_mean_bits is None and ste.symgrad_mean_bits == 0.0
    assert _row(tiny_rows, "shrink", "d out/d x").error is None


def test_float32_rows(tiny_spec):
    pytest.importorskip("torch")
    rows = acc.measure_spec(tiny_spec, "float32", points=4, budget=None, functions=["softplus"])
    assert {r.dtype for r in rows} == {"float32"}
    grad = _row(rows, "softplus", "d out/d x")
    assert grad.symgrad_nonfinite == 0 and grad.naive_nonfinite > 0
    assert grad.symgrad_max_bits <= 32


def test_fused_rows_measure_the_compiled_code(tmp_path, monkeypatch):
    """``fused=True`` measures the module with use_fused() on: what torch.compile built.
    Compiled expm1 near 0 (inductor's own is exp(x) - 1) keeps its digits."""
    torch = pytest.importorskip("torch")
    path = tmp_path / "em.yaml"
    path.write_text(
        "module: em\nfunctions:\n  elu:\n    inputs: {x: {}}\n"
        "    output: Piecewise((x, x > 0), (exp(x) - 1, True))\n"
    )
    compiled, real_compile = [], torch.compile
    monkeypatch.setattr(
        torch, "compile", lambda fn, **kw: compiled.append(fn.__name__) or real_compile(fn, **kw)
    )
    rows = acc.measure_spec(load_spec(path), "float32", points=16, budget=None, fused=True)
    assert "_elu_forward" in compiled and "_elu_grad_x" in compiled
    for row in rows:
        assert row.error is None and row.symgrad_nonfinite == 0
        assert row.symgrad_max_bits <= 2, row  # within 2 ulp: a few bits at most


def test_table_formats(tiny_rows):
    nan = math.nan
    failed = acc.Row("broken", "derive", "float64", 0, nan, nan, 0, None, None, None, error="bad")
    text = acc.format_table([*tiny_rows, failed])
    lines = text.rstrip("\n").split("\n")
    header, rule = lines[0], lines[1]
    assert header.split()[:4] == ["function", "quantity", "dtype", "points"]
    assert set(rule.replace(" ", "")) == {"-"}
    body = lines[2 : 2 + len(tiny_rows) + 1]
    assert any(line.startswith("softplus ") for line in body)
    # Numeric columns are right-aligned under their header.
    end = header.index("points") + len("points")
    assert all(line[end - 1].isdigit() for line in body)
    assert body[-1].startswith("broken ") and body[-1].endswith("  bad")
    assert lines[-1].startswith(f"{len(tiny_rows) + 1} rows (1 without numbers)")
    assert "symgrad worse than naive in 0 rows" in lines[-1]
    ste = _row(tiny_rows, "ste", "d out/d x")
    assert acc.table_cells(ste)[7] == "-"
    top = acc.worst(tiny_rows, 2)

    def badness(row):
        return (row.symgrad_nonfinite, row.symgrad_mean_bits)

    rest = [r for r in tiny_rows if r.ok and r not in top]
    assert len(top) == 2 and rest and badness(top[0]) >= badness(top[1])
    assert all(badness(top[1]) >= badness(r) for r in rest)


def test_plot_writes_csv_per_row(tiny_rows, tmp_path):
    paths = [p for p in acc.plot(tiny_rows, tmp_path / "plots") if p.suffix == ".csv"]
    assert len(paths) == len(tiny_rows)
    path = tmp_path / "plots" / "softplus__d_out_d_x__float64.csv"
    assert path in paths
    with path.open() as handle:
        table = list(csv.DictReader(handle))
    assert set(table[0]) == {"x", "exact", "symgrad", "symgrad_bits", "naive", "naive_bits"}
    assert any(r["x"] == "10000.0" and r["naive_bits"] == "64.0" for r in table)


def test_plot_draws_a_png_per_function(tiny_rows, tmp_path):
    pytest.importorskip("matplotlib")
    paths = [p for p in acc.plot(tiny_rows, tmp_path / "plots") if p.suffix == ".png"]
    functions = {(r.function, r.dtype) for r in tiny_rows if r.samples}
    assert len(paths) == len(functions) > 0
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)


def test_a_failing_side_becomes_an_error_row(tiny_spec):
    pytest.importorskip("torch")
    from symgrad.derive import derive_function

    derived = derive_function(tiny_spec.functions[0])
    rows = acc.measure_function(derived, object(), points=2, budget=None)  # no wrapper in it
    assert [r.quantity for r in rows] == ["forward out", "d out/d x", "d2 out/d x2"]
    assert all(r.error.startswith("symgrad: AttributeError") and not r.ok for r in rows)
    assert all(r.note == r.error for r in rows)


def test_worker_processes_give_the_same_rows(tiny_spec, tiny_rows):
    rows = acc.measure_spec(
        tiny_spec, "float64", points=8, seed=1, budget=None, workers=2, functions=["softplus"]
    )
    assert rows == [r for r in tiny_rows if r.function == "softplus"]


def test_multi_output_labels(tmp_path):
    pytest.importorskip("torch")
    path = tmp_path / "two.yaml"
    path.write_text(
        "module: two\norder: 1\nfunctions:\n  sc:\n    inputs: {x: {}}\n"
        "    outputs: {s: sin(x), c: cos(x)}\n"
    )
    lines = []
    rows = acc.measure_spec(load_spec(path), points=4, budget=None, progress=lines.append)
    assert [r.quantity for r in rows] == ["forward s", "forward c", "d s/d x", "d c/d x"]
    assert all(r.ok and r.symgrad_nonfinite == 0 for r in rows)
    assert lines and lines[0].startswith("sc: ")


def test_plot_shows_every_point_the_table_counts(tmp_path):
    """Inputs from 1e-300 to 1e300 of both signs, errors up to the dtype's width and
    non-finite results: every one lies inside the axes (the symlog axis once collapsed to
    +-1e-3, and errors above 10 bits fell off the top)."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from symgrad.report.plot import _panel

    xs = [-1e300, -3e100, -1.0, -1e-300, 0.0, 1e-300, 1e-5, 2.0, 1e200, 1e300]
    samples = tuple(
        acc.Sample(inputs=(x,), exact=1.0, symgrad=1.0 + k * 1e-10, naive=math.inf)
        for k, x in enumerate(xs)
    )
    row = acc.Row(
        "f",
        "forward out",
        "float64",
        len(xs),
        0.0,
        0.0,
        0,
        64.0,
        64.0,
        len(xs),
        samples=samples,
        input_names=("x",),
    )
    fig, ax = plt.subplots()
    _panel(ax, row)
    (x_lo, x_hi), (y_lo, y_hi) = ax.get_xlim(), ax.get_ylim()
    plotted = [p for c in ax.collections for p in c.get_offsets()]
    assert len(plotted) == 2 * len(xs)  # symgrad's and naive's (non-finite) points
    assert all(x_lo <= px <= x_hi and y_lo <= py <= y_hi for px, py in plotted)
    naive_top = [
        py for c in ax.collections if "non-finite" in c.get_label() for _, py in c.get_offsets()
    ]
    assert naive_top and min(naive_top) > 64  # above the widest finite error
    symgrad_bits = [py for px, py in ax.collections[0].get_offsets()]
    assert max(symgrad_bits) > 10  # 1e-10 relative is ~19 bits: on the axes, not off them
    plt.close(fig)


def test_naive_second_derivative_of_abs_has_numbers(tmp_path):
    """torch's second derivative of abs is an unmaterialised zero tensor; the row reads it."""
    pytest.importorskip("torch")
    path = tmp_path / "f.yaml"
    path.write_text(
        "module: m\nfunctions:\n  f:\n    inputs: {a: {}, b: {}}\n    output: Abs(a - b)/2\n"
    )
    rows = acc.measure_spec(load_spec(path), "float64", points=8, seed=1, budget=None)
    second = _row(rows, "f", "d2 out/d a2")
    assert second.ok, second.error
    assert second.naive_mean_bits == 0.0 and second.naive_nonfinite == 0
