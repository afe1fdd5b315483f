"""Where the generated tests draw random inputs: inside the domain, where the formula is
defined (a precondition that relates inputs is no ``domain:``)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from symgrad.derive import derive_function
from symgrad.spec import load_spec
from symgrad.testgen import finite_difference_step, random_domains

SPEC = """\
module: m
functions:
  everywhere:
    inputs: {x: {}, y: {domain: [0, 10]}}
    output: exp(x) * y
  related:
    inputs: {a: {}, d: {}}
    output: asin(sin(a) / d)
  inner:
    inputs: {v: {}}
    output: acos((1 - 5 * (v * v)) / (v * v - 1))
  wide:
    inputs: {x: {domain: [-1e9, 1e9]}, e: {domain: [-1, 1]}, far: {domain: [1e6, 1e9]}}
    output: (x + e)**2 - x**2 + log(far)
  huge:
    inputs: {t: {domain: [1.9, 2.1]}}
    output: 1.7e308 * t - 1.7e308
"""


@pytest.fixture(scope="module")
def derived(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "m.yaml"
    path.write_text(SPEC)
    return {f.name: derive_function(f, measure=False) for f in load_spec(path).functions}


def test_a_formula_defined_everywhere_keeps_the_benign_intervals(derived):
    assert random_domains(derived["everywhere"]) == {"x": (-2.0, 2.0), "y": (1.0, 9.0)}


def test_a_box_where_the_formula_and_its_derivatives_are_defined(derived):
    box = random_domains(derived["related"])
    a = np.linspace(*box["a"], 101)[:, None]
    d = np.linspace(*box["d"], 101)[None, :]
    # asin's argument stays inside (-1, 1) (its derivative is infinite at the ends)
    assert np.all(np.abs(np.sin(a) / d) < 1)
    assert box["a"] == pytest.approx((-1.9375, 1.9375))  # a itself is not restricted


def test_a_valid_interval_inside_the_benign_one(derived):
    # (1 - 5v^2)/(v^2 - 1) is in [-1, 1] only for |v| <= 1/sqrt(3)
    lo, hi = random_domains(derived["inner"])["v"]
    assert -(3**-0.5) < lo < -0.4 and 0.4 < hi < 3**-0.5


def test_finite_difference_step_follows_the_inputs_scale():
    assert finite_difference_step({"x": (-2.0, 2.0)}) is None
    # per input: a step of 800 is right for x at 8e8 and no derivative at all for e
    steps = finite_difference_step({"x": (-8e8, 8e8), "e": (-0.8, 0.8)})
    assert steps == pytest.approx({"x": 800.0, "e": 1e-6})


def test_random_inputs_are_moderate_where_the_domain_allows(derived):
    """(x + e)**2 - x**2 at x = 8e8: a finite difference in e cancels in x + e, and plain
    autograd's 2(x + e) - 2x too; x is drawn from [-100, 100], an input whose domain does
    not reach there from its own benign interval."""
    box = random_domains(derived["wide"])
    assert box["x"] == (-100.0, 100.0)
    assert box["e"] == pytest.approx((-0.8, 0.8))
    assert box["far"] == pytest.approx((1e6 + 0.1 * (1e9 - 1e6), 1e9 - 0.1 * (1e9 - 1e6)))


def test_where_nothing_is_below_1e100_the_box_where_it_is_finite(tmp_path):
    """1.7e308 * (t - 1) overflows past t = 2.057 (its values are all past 1e100; as
    written, 1.7e308 * t - 1.7e308, it overflows everywhere there)."""
    path = tmp_path / "m.yaml"
    path.write_text(SPEC)
    huge = next(f for f in load_spec(path).functions if f.name == "huge")
    lo, hi = random_domains(derive_function(huge))["t"]
    assert lo == pytest.approx(1.92, abs=0.01) and 2.0 < hi < 1 + np.finfo(np.float64).max / 1.7e308


def test_a_domain_as_wide_as_the_floats_is_sampled_as_an_unbounded_one(tmp_path):
    """Herbie's peicewise-defined has the precondition -1.79e308 <= p <= 1.79e308: the
    benign interval's width overflowed, its ends were inf and -inf, and the generated test
    file wrote NaN inputs (a NameError on import)."""
    from symgrad.numerics.points import domain_interior, sample_points

    path = tmp_path / "w.yaml"
    path.write_text(
        "module: w\nfunctions:\n  f:\n    inputs: {p: {domain: [-1.79e308, 1.79e308]}}\n"
        "    output: p + 1\n"
    )
    (inp,) = load_spec(path).functions[0].inputs
    assert domain_interior(inp) == (-2.0, 2.0)
    assert all(-2 <= v <= 2 for v in sample_points(inp, random.Random(0), 8))
    assert random_domains(derive_function(load_spec(path).functions[0], measure=False)) == {
        "p": (-2.0, 2.0)
    }
