"""The plan stage on its own: the typed tape (symgrad.ir), its passes, save-vs-recompute.

No framework is needed: these read the planned code, they do not run it.
"""

from __future__ import annotations

import pytest
import sympy

from symgrad.derive import derive_function
from symgrad.ir import Role, Tape, Value, parse_expr
from symgrad.plan import (
    _factors_into_branches,
    count_passes,
    emit,
    guarded,
    plan_torch,
    update_in_place,
)
from symgrad.printers import TorchPrinter
from symgrad.spec import load_spec

SPEC = """\
module: m
functions:
  exp:
    inputs: {x: {}}
    output: exp(x)
  hyp:
    inputs: {x: {}, y: {}}
    output: sqrt(x**2 + y**2)
  expxy:
    inputs: {x: {}, y: {}}
    output: exp(x*y)
  scaled:
    inputs: {x: {}, beta: {kind: scalar, default: 2.0}}
    output: log(1 + exp(beta*x))/beta
"""


def _derived(tmp_path, name):
    path = tmp_path / "m.yaml"
    path.write_text(SPEC)
    fn = next(f for f in load_spec(path).functions if f.name == name)
    return derive_function(fn, measure=False)


# ----------------------------------------------------------------------------- the tape
def test_a_tape_knows_what_each_value_is():
    tape = Tape.of(
        ["t0 = torch.exp(x)", "s = nu * 2", "out = t0 * s"],
        inputs={"x": "float"},
        results={"out"},
        numbers={"nu"},
    )
    assert tape.role_of("x") is Role.INPUT and tape.role_of("nu") is Role.NUMBER
    assert tape.role_of("t0") is Role.TEMPORARY and tape.role_of("out") is Role.RESULT
    assert tape.names(Role.RESULT) == {"out"}
    assert tape.nodes[2].reads() == ["t0", "s"]
    assert tape.lines() == ["t0 = torch.exp(x)", "s = nu * 2", "out = t0 * s"]


def test_a_value_takes_named_axes_and_refuses_an_unknown_kind():
    assert Value("x", Role.INPUT, axes=("b", "i")).axes == ("b", "i")
    try:
        Value("x", Role.INPUT, kind="int8")
    except ValueError as error:
        assert "int8" in str(error)
    else:
        raise AssertionError("an unknown kind was accepted")


def test_emit_gives_roles_to_temporaries_numbers_and_results():
    x, beta = sympy.symbols("x beta", real=True)
    printer = TorchPrinter(scalars=frozenset({beta}))
    tape = emit(
        [("a", sympy.exp(x) * beta * (beta + 1)), ("b", sympy.exp(x) * 2)],
        printer,
        values={"x": Value("x", Role.INPUT)},
        group_scalars=True,
    )
    roles = {node.target.name: node.target.role for node in tape}
    assert roles["a"] is roles["b"] is Role.RESULT
    assert Role.NUMBER in roles.values()  # beta*(beta + 1), one Python number
    assert Role.TEMPORARY in roles.values()  # exp(x), shared by both results
    assert tape.values["beta"].role is Role.NUMBER


def test_passes_count_tensor_operations_only():
    tape = Tape.of(["out = torch.exp(x) * (s + 1) + 2"], {"x": "float"}, {"out"}, {"s"})
    assert count_passes(tape) == 3  # exp, *, + (s + 1 is a Python number)


def test_the_in_place_pass_leaves_the_tape_it_was_given_alone():
    tape = Tape.of(["t0 = torch.exp(x)", "out = t0 * 2"], {"x": "float"}, {"out"})
    before = tape.lines()
    assert update_in_place(tape).lines() == ["t0 = torch.exp(x)", "out = t0.mul_(2)"]
    assert tape.lines() == before


def test_guards_run_a_statement_only_for_the_results_that_need_it():
    tape = Tape.of(
        ["t0 = torch.exp(x)", "t1 = torch.sin(x)", "a = t0 * 2", "b = t0 * t1"],
        {"x": "float"},
        {"a", "b"},
    )
    assert guarded(tape, {"a": "need_a", "b": "need_b"}) == [
        "a = b = None",
        "t0 = torch.exp(x)",
        "if need_b:",
        "    t1 = torch.sin(x)",
        "if need_a:",
        "    a = t0 * 2",
        "if need_b:",
        "    b = t0 * t1",
    ]


def test_parse_expr_reads_one_expression():
    assert parse_expr("torch.exp(-x)").func.attr == "exp"


# ----------------------------------------------------------------------------- planning
def test_the_backward_reads_the_saved_output_where_that_is_cheaper(tmp_path):
    d = _derived(tmp_path, "exp")
    main, backward = plan_torch(d).kernels
    assert main.setup.lines[-2:] == ["ctx.save_for_backward(out)", "ctx.save_for_forward(out)"]
    # the derived partials with the output as a variable (d (grad*out) / d out = grad)
    assert backward.inputs == ["out", "grad"]
    assert {
        w: str(e)
        for w, e in d.second_partials[
            sympy.Symbol("grad", real=True) * sympy.Symbol("out", real=True)
        ].items()
    } == {"grad": "out", "out": "grad"}


@pytest.mark.parametrize("name", ["hyp", "expxy"])
def test_an_output_read_beside_a_differentiable_input_is_never_saved(tmp_path, name):
    # grad*x/out, grad*y*out: out would be read beside an input whose gradient it chains
    d = _derived(tmp_path, name)
    assert (
        d.output_symbols()["out"]
        in d.vjps["x"].xreplace({d.outputs[0][1]: d.output_symbols()["out"]}).free_symbols
    )
    assert d.reusable_outputs() == () and d.second_partials == {}
    main = plan_torch(d).kernels[0]
    assert main.setup.lines[0] == "ctx.save_for_backward(*inputs)"  # x and y, not out


def test_scalars_reach_the_backward_through_ctx(tmp_path):
    plan = plan_torch(_derived(tmp_path, "scaled"))
    main = plan.kernels[0]
    assert "ctx.beta = beta" in main.setup.lines
    assert main.inputs == ["x", "beta"]


def test_a_factor_that_cancels_a_written_out_branch_goes_into_it():
    """Compound interest's d/di has (i/n) * log1prel_d(1, i/n); written out, its branch above
    u = 1 is v*(...) with v = n/i, 0 where i/n overflows: inf * 0 = NaN. Moved into the
    branches, i/n * n/i cancels (a factor that cancels nothing stays outside)."""
    import math

    import mpmath
    import torch

    from symgrad import functions as F

    i, n, g = sympy.symbols("i n g", real=True)
    expr = i / n * F.log1prel_d(1, i / n)
    code = "\n".join(emit([("out", expr)], TorchPrinter()).lines())
    at = {"i": 1e210, "n": 1e-100}
    env = {"torch": torch, "math": math} | {
        k: torch.tensor([v], dtype=torch.float64) for k, v in at.items()
    }
    exec(code, env)
    with mpmath.workdps(50):
        u = mpmath.mpf(1e210) / mpmath.mpf(1e-100)
        exact = float(1 / (1 + u) - mpmath.log1p(u) / u)
    assert exact == pytest.approx(-7.13e-308, rel=1e-2)
    assert env["out"].item() == pytest.approx(exact, rel=1e-12)
    written = F.log1prel_d(1, i / n).regimes()
    assert _factors_into_branches(g * written) == g * written


def test_a_written_out_primitives_argument_is_computed_once():
    """exprel's Taylor branch is a Horner scheme in its argument: printed as it is, each
    use computed x * y again (25 of them for compound interest's forward)."""
    from symgrad import functions as F

    x, y = sympy.symbols("x y", real=True)
    code = "\n".join(emit([("out", F.exprel(x * y))], TorchPrinter()).lines())
    assert code.count("x * y") == 1, code
    assert code.count("torch.expm1(") == 1, code


def test_a_temporary_that_only_names_another_is_no_alias():
    """CSE names a primitive's written-out form (t0), and the form grouped as one factor of
    a product becomes t1 = (t0): an alias line, and neither name updated in place (Lanczos'
    kernel had it in each method). A grouped factor bounded by 1 stays, as the printers
    order a product's factors by it."""
    from symgrad.functions import grouped
    from symgrad.plan import _without_aliases

    x, y, z = sympy.symbols("x y z", real=True)
    t0, t1, t2 = sympy.symbols("t0 t1 t2", real=True)
    replacements = [(t0, x * y), (t1, grouped(t0, 0)), (t2, grouped(t0, 1))]
    kept, reduced = _without_aliases(replacements, [t1 + t2 * z, sympy.sin(t1)])
    assert kept == [(t0, x * y), (t2, grouped(t0, 1))]
    assert reduced == [t0 + t2 * z, sympy.sin(t0)]


def test_a_deep_chain_of_updates_is_printed():
    """A statement 400 levels deep (Wilkinson's product's second derivative is 381):
    ast.unparse's recursion ran past Python's default limit of 1000 frames."""
    from symgrad.ir import Node, unparse

    code = "t0" + "".join(f".mul_(x{k % 7})" for k in range(400))
    expr = parse_expr(code)
    node = Node(Value("t1", Role.TEMPORARY), expr)
    assert node.line() == f"t1 = {code}"
    assert unparse(parse_expr("a + b")) == "a + b"
