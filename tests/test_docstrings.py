"""The generated docstrings print the formulas as `symgrad show` does (needs neither
torch nor TF)."""

from __future__ import annotations

import sympy

from symgrad.derive import derive_function
from symgrad.docstrings import _pretty_formulas, formula_doc
from symgrad.plan import plan_torch

x, grad = sympy.symbols("x grad", real=True)
RELU_GRAD = sympy.Piecewise((grad, x > 0), (0, True))


def test_a_formula_is_what_sympy_pretty_prints_with_its_label_on_the_baseline():
    assert _pretty_formulas([("grad_x", RELU_GRAD, "")]) == [
        "             /grad  for x > 0",
        "    grad_x = <",
        "             \\ 0    otherwise",
    ]
    shown = [line.rstrip() for line in sympy.pretty(RELU_GRAD, use_unicode=False).split("\n")]
    assert [line[13:] for line in _pretty_formulas([("grad_x", RELU_GRAD, "")])] == shown


def test_formulas_of_several_rows_are_set_apart_and_notes_follow_the_baseline():
    lines = _pretty_formulas(
        [("out", sympy.Max(x, 0), ""), ("grad_x", x**2, "  (user-defined)"), ("d", x, "")]
    )
    assert lines == [
        "    out = Max(0, x)",
        "",
        "              2",
        "    grad_x = x   (user-defined)",
        "",
        "    d = x",
    ]


def test_a_formula_too_wide_for_80_columns_is_one_wrapped_line():
    wide = sympy.Piecewise((sum(x**k / (k + 1) for k in range(30)), x > 1), (0, True))
    lines = _pretty_formulas([("out", wide, "")])
    assert lines[0].startswith("    out = ")
    assert "1 if x > 1 else 0" in " ".join(line.strip() for line in lines)
    assert all(len(line) <= 88 for line in lines) and len(lines) > 1
    assert all(line.startswith("        ") for line in lines[1:])


def test_docstrings_have_no_sympy_reprs(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(
        "module: m\nfunctions:\n  step:\n    inputs: {x: {}}\n"
        "    output: Piecewise((x, x > 0), (0, True))\n"
    )
    from symgrad.spec import load_spec

    derived = derive_function(load_spec(path).functions[0])
    doc = "\n".join(formula_doc(derived))
    assert "Piecewise" not in doc and "/x  for x > 0" in doc
    assert doc.isascii()  # (unicode's e, nu, root sign: ruff's RUF002)
    assert plan_torch(derived).summary == "step: x if x > 0 else 0."
    # errors alike share a line: every label appears once
    labels = ["out", "grad_x", "d grad_x / d x", "d grad_x / d grad"]
    accuracy = doc[doc.index("Measured") :]
    assert all(accuracy.count(f"{label}:") + accuracy.count(f"{label},") == 1 for label in labels)
