"""The trigonometric cancellation corpus (benchmarks/accuracy/trig.yaml), CI-sized: every
formula's candidate rewrites run without error; a few derive and are finite near 0."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import sympy
import torch

from symgrad.derive import derive_function
from symgrad.expr import parse_formula
from symgrad.numerics.mp import exact
from symgrad.rewrite.phases import phase
from symgrad.rewrite.rules import stabilize
from symgrad.spec import load_spec

CORPUS = Path(__file__).resolve().parent.parent / "benchmarks" / "accuracy" / "trig.yaml"


@pytest.fixture(scope="module")
def corpus():
    return load_spec(CORPUS)


def _naive(fn):
    symbols = {i.name: sympy.Symbol(i.name, real=True) for i in fn.inputs}
    (out,) = fn.outputs
    return parse_formula(out.text, dict(symbols), fn.location), symbols


def test_corpus_is_large_enough_and_cites_its_sources(corpus):
    assert len(corpus.functions) >= 20
    text = CORPUS.read_text()
    for fn in corpus.functions:  # a comment under each function's name
        assert f"  {fn.name}:\n    # " in text, fn.name


def test_whole_formula_rewrites_decline_trigonometric_formulas(corpus):
    """tan(x) rewrites to exp(I*x): no real exponential to split on. exp_rational (a
    candidates-phase rewrite) used to take its complex slope to float ("Cannot convert
    complex to float")."""
    for fn in corpus.functions:
        naive, symbols = _naive(fn)
        x = symbols[fn.inputs[0].name]
        for formula in (naive, sympy.diff(naive, x), sympy.diff(naive, x, 2)):
            stable = stabilize(formula)
            for rewrite in phase("candidates").rewrites:
                rewritten = rewrite(stable)
                assert rewritten is None or not rewritten.has(sympy.I), (fn.name, rewrite)


def _values(module, name, xs, dtype):
    x = torch.tensor(xs, dtype=dtype, requires_grad=True)
    y = getattr(module, name)(x)
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    return [t.detach().tolist() for t in (y, g, h)]


@pytest.mark.parametrize("name", ["sinc", "one_minus_cos_over_square"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_removable_singularities_are_finite_and_accurate_near_zero(
    corpus, generate_module, name, dtype
):
    """sin(x)/x's gradient cos(x)/x - sin(x)/x**2 is inf - inf below 1e-154 (x**2
    underflows); (1 - cos(x))/x**2 is 0/0 there. Near 0 the Taylor polynomial is used."""
    fn = next(f for f in corpus.functions if f.name == name)
    text = CORPUS.read_text()
    block = text[text.index(f"  {name}:") :].split("\n\n")[0]
    module = generate_module(f"module: m\norder: 2\nfunctions:\n{block}\n")
    naive, symbols = _naive(fn)
    x = symbols["x"]
    tiny = torch.finfo(dtype).tiny
    xs = [1e-3, -2e-2, 1e-20, -1e-30, tiny, -tiny * 64]
    if dtype == torch.float64:
        xs += [1e-160, -1e-300]
    eps = torch.finfo(dtype).eps
    for k, got in enumerate(_values(module, name, xs, dtype)):
        for v, g in zip(xs, got):
            want = exact(sympy.diff(naive, x, k), {x: float(torch.tensor(v, dtype=dtype))})
            assert math.isfinite(g), (name, k, v, g)
            assert abs(g - want) <= 8 * eps * abs(want) + tiny, (name, k, v, g, want)


def test_the_issue_formula_derives(corpus):
    """(x - sin(x))/(x - tan(x)) on [-1.5, 1.5] ended in a raw TypeError."""
    fn = next(f for f in corpus.functions if f.name == "x_minus_sin_over_x_minus_tan")
    derived = derive_function(fn, measure=False)
    assert derived.outputs[0][1].has(sympy.Piecewise)  # the series near 0
