"""Where the generated tests draw random inputs: inside the domain, where the formula is
defined (a precondition that relates inputs is no ``domain:``)."""

from __future__ import annotations

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
